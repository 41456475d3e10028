"""Rows addressed through a multiple of their offsets: a wait or notify covers the rows `offs`, the access touches the
elements `offs * scale` (`x_ptr + offs * 2`, `offs[:, None] * stride_xm`). They are the same rows only when the scale
is the row stride of the buffer TileLink passes (the gathered rows, the partial sums: contiguous, of the argument's
shape), which each call with more than one rank checks; a scale TileLink cannot read at the launch, or rows added
twice through an alias, is refused at the access."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError
from tilelink.runtime import current_world

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

# pairs of values stored flat: the first of each pair at `offs * 2`, the second one further; `L` rows of x in all
PAIRS = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="L"))
@triton.jit
def pair_sum_kernel(x_ptr, y_ptr, N, L, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    first = tl.load(x_ptr + offs * 2, mask=offs < N, other=0.0)
    second = tl.load(x_ptr + offs * 2 + 1, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, first + second, mask=offs < N)
'''

# rows of a matrix through a stride argument, summed along the columns
ROWS = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def row_sum_kernel(x_ptr, y_ptr, M, D, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :],
                mask=(offs_m[:, None] < M) & (offs_d[None, :] < D), other=0.0)
    tl.store(y_ptr + offs_m, tl.sum(x, axis=1), mask=offs_m < M)
'''


# each row and the row after it: `+ D` on a (M, D) tensor is the next row, which no wait of this tile covers
NEXT_ROW = ROWS.replace("row_sum_kernel", "next_row_sum_kernel").replace(
    "    tl.store(y_ptr + offs_m, tl.sum(x, axis=1), mask=offs_m < M)",
    "    x2 = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :] + D,\n"
    "                 mask=(offs_m[:, None] < M - 1) & (offs_d[None, :] < D), other=0.0)\n"
    "    tl.store(y_ptr + offs_m, tl.sum(x + x2, axis=1), mask=offs_m < M)")


# the same, the shift written in the column vector: its first column is `D`, the first element of the next row
NEXT_ROW_COLUMNS = ROWS.replace("row_sum_kernel", "next_row_sum_kernel").replace(
    "    tl.store(y_ptr + offs_m, tl.sum(x, axis=1), mask=offs_m < M)",
    "    nxt = D + tl.arange(0, BLOCK_D)\n"
    "    x2 = tl.load(x_ptr + offs_m[:, None] * stride_xm + nxt[None, :],\n"
    "                 mask=(offs_m[:, None] < M - 1) & (nxt[None, :] < 2 * D), other=0.0)\n"
    "    tl.store(y_ptr + offs_m, tl.sum(x + x2, axis=1), mask=offs_m < M)")


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pairs(path: str, shape: str) -> float:
    kernel = _load(path, "pair_sum").pair_sum_kernel
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 40, 8
    x = torch.randn(N, 2, generator=torch.Generator().manual_seed(3))
    device = current_world().device
    y = torch.full((N,), float("nan"), device=device)
    # "flat": 2N values of a 1-D tensor, whose rows are the values, this rank's share of them; "pairs": (N, 2)
    flat = shape == "flat"
    full = x.view(-1) if flat else x
    lo, hi = rows_of(rank, world, full.shape[0])
    kernel[(triton.cdiv(N, block),)](full[lo:hi].contiguous().to(device), y, N, full.shape[0], BLOCK=block)
    got = y.cpu() - x.sum(dim=1)
    return float("inf") if got.isnan().any() else got.abs().max().item()


def _rows(path: str, step: int) -> float:
    kernel = _load(path, "row_sum").row_sum_kernel
    rank, world = tilelink.rank(), tilelink.world_size()
    M, D = 36, 8
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(4))
    lo, hi = rows_of(rank, world, M)
    y = torch.full((M,), float("nan"))
    shard = x[lo:hi].contiguous()
    kernel[(triton.cdiv(M, 8),)](shard, y, M, D, shard.stride(0) * step, BLOCK_M=8, BLOCK_D=8)
    got = y - x.sum(dim=1)
    return float("inf") if got.isnan().any() else got.abs().max().item()


def _next_rows(path: str) -> float:
    kernel = _load(path, "next_row_sum").next_row_sum_kernel
    rank, world = tilelink.rank(), tilelink.world_size()
    M, D = 36, 8
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(6))
    lo, hi = rows_of(rank, world, M)
    y = torch.full((M,), float("nan"))
    shard = x[lo:hi].contiguous()
    kernel[(triton.cdiv(M, 8),)](shard, y, M, D, shard.stride(0), BLOCK_M=8, BLOCK_D=8)
    got = y - x.sum(dim=1) - torch.cat([x[1:].sum(dim=1), torch.zeros(1)])
    return float("inf") if got.isnan().any() else got.abs().max().item()


def _written(tmp_path, source: str, name: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(HEAD + textwrap.dedent(source))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_rows_scaled_by_the_row_stride_of_the_view_equal_torch_on_the_race_exposing_schedule(world: int, tmp_path,
                                                                                             monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert all(e < 1e-6 for e in tilelink.spawn(_pairs, world, _written(tmp_path, PAIRS, "pair_sum"), "pairs"))
    assert all(e < 1e-6 for e in tilelink.spawn(_rows, world, _written(tmp_path, ROWS, "row_sum"), 1))


@pytest.mark.slow
def test_a_literal_scale_other_than_the_row_stride_is_refused_at_the_launch(tmp_path, monkeypatch) -> None:
    # the flat 1-D shard: its rows are single values, the kernel steps two of them per offset (it would read the pairs
    # of rows `2 * offs` and `2 * offs + 1` under the wait for rows `offs`)
    monkeypatch.setenv("TILELINK_RACES", "1")
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_pairs, 2, _written(tmp_path, PAIRS, "pair_sum"), "flat")
    said = str(info.value)
    assert "pair_sum_kernel: the rows of 'x_ptr' are addressed 2 elements apart at" in said, said
    assert "x_ptr.stride(0)" in said and "x.view(-1, 2)" in said, said


@pytest.mark.slow
def test_a_stride_argument_other_than_the_row_stride_is_refused_at_the_launch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_rows, 2, _written(tmp_path, ROWS, "row_sum"), 2)
    said = str(info.value)
    assert "row_sum_kernel: the rows of 'x_ptr' are addressed 16 elements apart at" in said, said


# the same, the pointer itself advanced by a row before the access (`x_ptr += D`)
NEXT_ROW_ADVANCED = ROWS.replace("    offs_d = tl.arange(0, BLOCK_D)\n",
                                 "    offs_d = tl.arange(0, BLOCK_D)\n    x_ptr += D\n")


@pytest.mark.slow
def test_a_pointer_advanced_into_the_next_row_is_refused_at_the_launch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_rows, 2, _written(tmp_path, NEXT_ROW_ADVANCED, "row_sum"), 1)
    said = str(info.value)
    assert "adds 8 elements (D=8) to the rows of 'x_ptr'" in said, said


@pytest.mark.slow
def test_a_column_vector_starting_in_the_next_row_is_refused_at_the_launch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_next_rows, 2, _written(tmp_path, NEXT_ROW_COLUMNS, "next_row_sum"))
    said = str(info.value)
    assert "adds 8 elements (D=8) to the rows of 'x_ptr'" in said, said


@pytest.mark.slow
def test_a_scalar_term_reaching_the_next_row_is_refused_at_the_launch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_next_rows, 2, _written(tmp_path, NEXT_ROW, "next_row_sum"))
    said = str(info.value)
    assert "next_row_sum_kernel: the address at" in said, said
    assert "adds 8 elements (D=8) to the rows of 'x_ptr'" in said, said


def _generated(source: str):
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


@pytest.mark.parametrize("address, says", [
    # the alias already holds the rows: the load adds them again, rows `2 * offs`
    ("xp = x_ptr + offs * 1\n    x = tl.load(xp + offs, mask=offs < N, other=0.0)", "more than once"),
    # a scale loaded at run time: nothing to compare at the launch
    ("s = tl.load(s_ptr)\n    x = tl.load(x_ptr + offs * s, mask=offs < N, other=0.0)", "cannot check"),
])
def test_rows_TileLink_cannot_check_are_refused_at_the_access(address: str, says: str) -> None:
    source = '''
    @tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
    @triton.jit
    def scaled_kernel(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        {address}
        tl.store(y_ptr + offs, x, mask=offs < N)
    '''
    with pytest.raises(AnnotationError) as info:
        _generated(textwrap.dedent(source).format(address=address))
    err = info.value
    assert says in str(err) and err.line == 10 + address.count("\n"), err


def test_the_scales_are_read_through_a_local_and_a_product() -> None:
    from tilelink.analysis import analyse, parse_source

    text = HEAD + textwrap.dedent('''
    @tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
    @triton.jit
    def kernel(x_ptr, y_ptr, M, stride_xm, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        step = stride_xm
        cols = tl.arange(0, 4)
        x = tl.load(x_ptr + offs[:, None] * step * 2 + cols[None, :], mask=offs[:, None] < M)
        tl.store(y_ptr + offs, tl.sum(x, axis=1), mask=offs < M)
    ''')
    an = analyse(parse_source(text, "k.py"), "k.py", "kernel", {"x_ptr": (0, None, "M", None)})
    assert [(t, f) for t, f, _ in an.row_scales] == [("x_ptr", ("2", "stride_xm"))], an.row_scales
    # a column vector with no mask: its last element, which each call checks within the row
    assert [(t, terms) for t, terms, _ in an.row_shifts] == [("x_ptr", ((False, ("4",)), (True, ("1",))))], \
        an.row_shifts


def test_the_scalar_terms_along_dim_0_are_kept_when_each_is_known() -> None:
    from tilelink.analysis import analyse, parse_source

    text = HEAD + textwrap.dedent(PAIRS) + textwrap.dedent(NEXT_ROW)
    module = parse_source(text, "k.py")
    pairs = analyse(module, "k.py", "pair_sum_kernel", {"x_ptr": (0, None, "L", None)})
    assert [terms for _, terms, _ in pairs.row_shifts] == [((False, ("1",)),)], pairs.row_shifts
    rows = analyse(module, "k.py", "next_row_sum_kernel", {"x_ptr": (0, None, "M", None)})
    # the second load's shift, and the last column each load's mask lets through, from the start of its row
    assert sorted(terms for _, terms, _ in rows.row_shifts) == sorted([
        ((False, ("D",)), (True, ("1",))), ((False, ("D",)),), ((False, ("D",)), (True, ("1",)), (False, ("D",)))]), \
        rows.row_shifts


def pair_mutants(path: str) -> list[tuple[str, str]]:
    """The mutants of the pairs kernel (each inserted wait dropped in turn) on this rank."""
    import tests.rules.test_row_scales as here
    from tests.rules.mutations import _patcher, _run

    real, patch = _patcher(here, "_load")
    return _run(lambda: real(path, "pair_sum"), patch, lambda: here._pairs(path, "pairs"))


@pytest.mark.slow
def test_dropping_the_wait_of_the_scaled_rows_is_caught(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")
    results = tilelink.spawn(pair_mutants, 2, _written(tmp_path, PAIRS, "pair_sum"), timeout=600)
    assert results[0], "the rewrite inserted no wait"
    caught = {what for outcomes in results for what, outcome in outcomes if outcome.startswith("failed")}
    assert caught == {what for what, _ in results[0]}, results


# every other value of a flat tensor, the step a constexpr parameter the call leaves to its default: the check reads the
# default the kernel runs with
EVERY_OTHER = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="L"))
@triton.jit
def every_other_kernel(x_ptr, y_ptr, N, L, BLOCK: tl.constexpr, STEP: tl.constexpr = 2):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs * STEP, mask=offs < N, other=0.0), mask=offs < N)
'''


def _every_other(path: str) -> float:
    kernel = _load(path, "every_other").every_other_kernel
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 40, 8
    x = torch.randn(2 * N, generator=torch.Generator().manual_seed(5))
    lo, hi = rows_of(rank, world, 2 * N)
    device = current_world().device
    y = torch.full((N,), float("nan"), device=device)
    kernel[(triton.cdiv(N, block),)](x[lo:hi].contiguous().to(device), y, N, 2 * N, BLOCK=block)
    got = y.cpu() - x[::2]
    return float("inf") if got.isnan().any() else got.abs().max().item()


# the stride parameter is bound again in the kernel (every other row): the access's scale is the kernel's value, not
# the argument's
EVERY_OTHER_ROW = ROWS.replace("    offs_m =", "    stride_xm = stride_xm * 2\n    offs_m =")


@pytest.mark.slow
def test_a_scale_left_to_its_constexpr_default_is_checked_at_the_launch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_every_other, 2, _written(tmp_path, EVERY_OTHER, "every_other"))
    said = str(info.value)
    assert "every_other_kernel: the rows of 'x_ptr' are addressed 2 elements apart at" in said, said


def test_a_scale_from_a_parameter_the_kernel_binds_again_is_refused_at_build() -> None:
    with pytest.raises(AnnotationError) as info:
        _generated(EVERY_OTHER_ROW)
    said = str(info.value)
    assert "stride_xm" in said and "bound again" in said, said


@pytest.mark.parametrize("cast", ["stride_xm.to(tl.int64)", "tl.cast(stride_xm, tl.int64)",
                                  "stride_xm.to(dtype=tl.int64)"])
def test_a_stride_parameter_cast_in_the_kernel_is_still_read_from_the_argument(cast: str) -> None:
    from tilelink.analysis import analyse, parse_source

    text = HEAD + textwrap.dedent(ROWS.replace("    offs_m =", f"    stride_xm = {cast}\n    offs_m ="))
    an = analyse(parse_source(text, "k.py"), "k.py", "row_sum_kernel", {"x_ptr": (0, None, "M", None)})
    assert [(t, f) for t, f, _ in an.row_scales] == [("x_ptr", ("stride_xm",))], an.row_scales


@pytest.mark.parametrize("cast", ["stride_xm.to(tl.int16)", "tl.cast(stride_xm, tl.int8)", "stride_xm.to(tl.uint32)"])
def test_a_stride_parameter_narrowed_in_the_kernel_is_refused(cast: str) -> None:
    # 300 cast to int8 is 44: the call's argument is not the stride the kernel steps by
    with pytest.raises(AnnotationError, match="`stride_xm` is bound again in the kernel"):
        _generated(ROWS.replace("    offs_m =", f"    stride_xm = {cast}\n    offs_m ="))


def _float_stride(path: str, stride) -> str:
    rank, world = tilelink.rank(), tilelink.world_size()
    M, D = 32, 8
    lo, hi = rows_of(rank, world, M)
    kernel = _load(path, "float_stride").row_sum_kernel
    try:
        kernel[(M // 8,)](torch.randn(hi - lo, D), torch.zeros(M), M, D, stride, BLOCK_M=8, BLOCK_D=D)
    except LaunchError as refused:
        return str(refused)
    return "ran"


def test_a_float_stride_the_kernel_casts_to_an_int_is_refused_at_the_call(tmp_path) -> None:
    # `tl.cast(4.25, tl.int64)` is 4: the check of the row stride would read 4.25, the kernel steps by 4
    path = tmp_path / "float_stride.py"
    path.write_text(HEAD + textwrap.dedent(ROWS.replace("    offs_m =", "    stride_xm = tl.cast(stride_xm, tl.int64)\n"
                                                                       "    offs_m =")))
    said = tilelink.spawn(_float_stride, 2, str(path), 4.25)
    assert all("argument 'stride_xm' is 4.25, not an int" in s for s in said), said
