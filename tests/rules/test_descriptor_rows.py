"""A descriptor the kernel makes from a tensor gathered along dim 0 reads its rows at its first offset, `strides[0]`
elements apart, and its other dims up to `(shape[1] - 1) * strides[1]` past the row's start. Each call with more than
one rank checks both against the gathered buffer: a shape wider than the row (`shape=[M, D + COL]` read at column
`COL`) reads the next row, and a row stride other than the buffer's reads other rows, neither of which the tile's wait
covers; within the row the kernel equals torch on the race-exposing schedule. A shape TileLink cannot read at the
launch is refused at the access."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tests.rules.forms_cases import gemm_host_descriptor_ag
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError
from tilelink.runtime import current_world

SHIFTED = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
    @triton.jit
    def shifted_copy(x_ptr, y_ptr, M, D, COL, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        # y[m, :] = the BLOCK_D elements of the row from column COL, zeros past D + COL
        desc = tl.make_tensor_descriptor(x_ptr, shape=[M, D + COL], strides=[stride_xm, 1],
                                         block_shape=[BLOCK_M, BLOCK_D])
        pid = tl.program_id(0)
        x = desc.load([pid * BLOCK_M, COL])
        offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        tl.store(y_ptr + offs_m[:, None] * BLOCK_D + cols[None, :], x)
''')
LOAD_LINE = next(i for i, line in enumerate(SHIFTED.splitlines(), 1) if "x = desc.load(" in line)
M, D = 12, 8
FORMS = Path(__file__).parent / "forms"


def _plan(source: str):
    return generate(source, "shifted_copy.py", requests_in(source, "shifted_copy.py")).plans[0].launch


def test_the_descriptors_row_stride_and_extent_are_launch_facts() -> None:
    plan = _plan(SHIFTED)
    assert plan.row_scales == (("x_ptr", ("stride_xm",), LOAD_LINE),), plan.row_scales
    assert plan.row_shifts == (("x_ptr", ((False, ("D", "1")), (False, ("COL", "1")), (True, ("1",))), LOAD_LINE),), \
        plan.row_shifts


def test_a_shape_tilelink_cannot_read_is_refused() -> None:
    source = SHIFTED.replace("shape=[M, D + COL]", "shape=[M, tl.cdiv(D, 1)]")
    with pytest.raises(AnnotationError) as info:
        _plan(source)
    said = str(info.value)
    assert f"shifted_copy.py:{LOAD_LINE}" in said and "has `tl.cdiv(D, 1)` in its shape or strides" in said, said


def _kernel(path: str):
    spec = importlib.util.spec_from_file_location(f"shifted_copy_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.shifted_copy


class _Launcher:
    """What the row check asks of a launcher: the world it launches on."""

    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound


def _args(col: int, stride: int = D) -> dict:
    return dict(x_ptr=torch.zeros(M // 2, D), y_ptr=torch.zeros(M, D), M=M, D=D - col, COL=col, stride_xm=stride,
                BLOCK_M=4, BLOCK_D=4)


def test_a_shape_past_the_row_or_another_row_stride_is_refused_at_the_launch(tmp_path) -> None:
    path = tmp_path / "shifted_copy.py"
    path.write_text(SHIFTED)
    kernel = _kernel(str(path))
    kernel._check_row_scales(_args(0), _Launcher())
    kernel._check_row_scales(_args(4), _Launcher())  # columns 4..7 of an 8-wide row
    wide = _args(4) | {"D": D}  # shape D + 4 = 12 columns of an 8-wide row
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(wide, _Launcher())
    said = str(info.value)
    assert f"shifted_copy.py:{LOAD_LINE} adds 11 elements" in said and "rows are 8 elements long" in said, said
    with pytest.raises(LaunchError, match="addressed 16 elements apart"):
        kernel._check_row_scales(_args(0, 2 * D), _Launcher())


def _copy(path: str, d: int, col: int) -> float:
    kernel = _kernel(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(4))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((M, 4), float("nan"), device=device)
    kernel[(M // 4,)](x[lo:hi].contiguous().to(device), y, M, d, col, D, BLOCK_M=4, BLOCK_D=4)
    want = x[:, col:col + 4]
    got = y.cpu()
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


@pytest.mark.slow
def test_within_the_row_equals_torch_and_past_it_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "shifted_copy.py"
    path.write_text(SHIFTED)
    assert all(e < 1e-5 for e in tilelink.spawn(_copy, 2, str(path), D - 4, 4))
    with pytest.raises(LaunchError, match="adds 11 elements"):
        tilelink.spawn(_copy, 2, str(path), D, 4)


# along an inner dim: the chunked column sums of a (B, S, D) tensor gathered along S, the descriptor's base moved COL
# elements along the row
CHUNKED = (FORMS / "chunked_rows_descriptor.py").read_text().replace(
    "s_lo * stride_xs, shape=", "s_lo * stride_xs + COL, shape=").replace(
    "def chunked_col_sum_desc(x_ptr, y_ptr, S, D, CHUNK,", "def chunked_col_sum_desc(x_ptr, y_ptr, S, D, CHUNK, COL,")
CHUNKED_LINE = next(i for i, line in enumerate(CHUNKED.splitlines(), 1) if "x = desc.load(" in line)


def test_a_descriptors_base_moved_along_an_inner_dims_row_is_refused_at_the_launch(tmp_path) -> None:
    assert CHUNKED.count("COL") == 2
    plan = generate(CHUNKED, "chunked.py", requests_in(CHUNKED, "chunked.py")).plans[0].launch
    # its last element and its first, each within the row
    assert plan.row_shifts == (("x_ptr", ((False, ("COL",)), (False, ("D", "1")), (True, ("1",))), CHUNKED_LINE),
                               ("x_ptr", ((False, ("COL",)),), CHUNKED_LINE)), plan.row_shifts
    path = tmp_path / "chunked.py"
    path.write_text(CHUNKED)
    spec = importlib.util.spec_from_file_location("chunked_col_sum_desc_inner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = module.chunked_col_sum_desc
    B, S, d = 2, 8, 4

    def args(col: int) -> dict:
        return dict(x_ptr=torch.zeros(B, S // 2, d), y_ptr=torch.zeros(B, d), S=S, D=d, CHUNK=4, COL=col,
                    stride_xb=S * d, stride_xs=d, BLOCK_S=4, BLOCK_D=d)

    class Launcher(_Launcher):
        """The full size along the rows too, `size="S"`."""

        def size_of(self, bound: dict, grid=None) -> int:
            return bound["S"]

    kernel._check_row_scales(args(0), Launcher())
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(args(d), Launcher())
    said = str(info.value)
    assert f"chunked.py:{CHUNKED_LINE} adds 7 elements" in said and "moves it 1 row along dim 1" in said, said


class _SizedLauncher(_Launcher):
    """A world of two whose full size along the rows is the call's `S` (`size="S"`)."""

    def size_of(self, bound: dict, grid=None) -> int:
        return bound["S"]


def _chunked(tmp_path, module_name: str):
    """The chunked descriptor form's kernel, its plan, and the line of its load."""
    source = (FORMS / "chunked_rows_descriptor.py").read_text()
    plan = generate(source, "chunked.py", requests_in(source, "chunked.py")).plans[0].launch
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "x = desc.load(" in text)
    path = tmp_path / "chunked.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.chunked_col_sum_desc, plan, line


def test_a_descriptors_computed_base_term_is_a_step_checked_at_the_launch(tmp_path) -> None:
    # `b * stride_xb` in the base: with the shard's stride (S // 2 * D, not the gathered buffer's S * D) the
    # descriptor of batch 1 starts mid-way through batch 0's rows, which no wait covers
    kernel, plan, line = _chunked(tmp_path, "chunked_col_sum_desc_steps")
    assert plan.row_steps == (("x_ptr", ("stride_xb",), "(tl.program_id(0))", line),), plan.row_steps
    module = SimpleNamespace(chunked_col_sum_desc=kernel)
    B, S, d = 2, 8, 4
    Launcher = _SizedLauncher

    def args(stride_xb: int) -> dict:
        return dict(x_ptr=torch.zeros(B, S // 2, d), y_ptr=torch.zeros(B, d), S=S, D=d, CHUNK=4,
                    stride_xb=stride_xb, stride_xs=d, BLOCK_S=4, BLOCK_D=d)

    module.chunked_col_sum_desc._check_row_scales(args(S * d), Launcher())
    with pytest.raises(LaunchError) as info:
        module.chunked_col_sum_desc._check_row_scales(args(S // 2 * d), Launcher())
    said = str(info.value)
    assert f"chunked.py:{line} adds a value the kernel computes times stride_xb=16" in said and \
        "is 32 elements" in said, said
    # sequence-major, as sp_attention passes K and V: (1, S, B * D), each batch a block of D columns of the row, the
    # batch `b = tl.program_id(0)` bounded by the grid's B programs
    seq = args(d) | {"x_ptr": torch.zeros(1, S // 2, B * d), "stride_xs": B * d}
    module.chunked_col_sum_desc._check_row_scales(seq, Launcher(), (B,))
    module.chunked_col_sum_desc._check_row_scales(seq, Launcher(), lambda meta: (meta["S"] // 4,))
    with pytest.raises(LaunchError) as info:  # 6 columns read from blocks of 4
        module.chunked_col_sum_desc._check_row_scales(seq | {"D": d + 2}, Launcher(), (B,))
    said = str(info.value)
    assert f"chunked.py:{line} steps 'x_ptr' by values the kernel computes, on the grid (2, 1, 1)" in said, said
    assert "`(tl.program_id(0))` in [0, 1] times stride_xb=4, so it reaches element 9 of a row" \
        in said and "has rows of 8 elements" in said, said
    # a program more than the row holds blocks: the last one reads the next row
    with pytest.raises(LaunchError, match="so it reaches element 11 of a row"):
        module.chunked_col_sum_desc._check_row_scales(seq, Launcher(), (B + 1,))
    # no grid to bound the batch by: refused as no whole step
    with pytest.raises(LaunchError, match="a step within the row passes only where the grid bounds"):
        module.chunked_col_sum_desc._check_row_scales(seq, Launcher())


def test_a_descriptors_row_stride_along_an_inner_dim_is_compared_with_the_gathered_buffers(tmp_path) -> None:
    # `strides=[stride_xs, 1]`: a stride other than the gathered buffer's row (a padded row, `2 * D`) steps the
    # descriptor's rows over rows of S the wait of its chunk does not cover
    kernel, plan, line = _chunked(tmp_path, "chunked_col_sum_desc_scales")
    assert plan.row_scales == (("x_ptr", ("stride_xs",), line),), plan.row_scales
    module = SimpleNamespace(chunked_col_sum_desc=kernel)
    B, S, d = 2, 8, 4
    Launcher = _SizedLauncher

    def args(stride_xs: int) -> dict:
        return dict(x_ptr=torch.zeros(B, S // 2, d), y_ptr=torch.zeros(B, d), S=S, D=d, CHUNK=4,
                    stride_xb=S * d, stride_xs=stride_xs, BLOCK_S=4, BLOCK_D=d)

    module.chunked_col_sum_desc._check_row_scales(args(d), Launcher())
    with pytest.raises(LaunchError) as info:
        module.chunked_col_sum_desc._check_row_scales(args(2 * d), Launcher())
    said = str(info.value)
    assert "the rows of 'x_ptr' are addressed 8 elements apart at " in said, said
    assert f"chunked.py:{line} (its offsets times stride_xs=8)" in said, said
    assert "has its dim-1 rows 4 elements apart" in said, said


def test_a_descriptors_row_stride_the_launch_cannot_read_is_refused() -> None:
    # a stride the kernel computes (`row = stride_xs * 2` bound again in the kernel): the launch reads the argument
    source = (FORMS / "chunked_rows_descriptor.py").read_text().replace(
        "    offs_d = tl.arange(0, BLOCK_D)\n", "    offs_d = tl.arange(0, BLOCK_D)\n    stride_xs = stride_xs * 2\n")
    with pytest.raises(AnnotationError) as info:
        generate(source, "chunked.py", requests_in(source, "chunked.py"))
    said = str(info.value)
    assert "the descriptor `desc` of 'x_ptr' steps its rows by `stride_xs`" in said, said
    assert "give the rows' stride as a parameter" in info.value.hint, info.value.hint


@pytest.mark.parametrize("rule", ["all_gather", "reduce_scatter"])
def test_a_constexpr_row_count_counts_the_host_descriptors_tiles(rule: str, tmp_path, monkeypatch) -> None:
    """The block-scaled tutorial declares `M: tl.constexpr`: the tiles' `tl.cdiv(M, BLOCK_M)` names the rows as a plain
    parameter does, which each call reads as passed (it was refused: "cannot find the parameter holding the full size
    of dim 0")."""
    name = "gemm_host_descriptor_ag" if rule == "all_gather" else "gemm_host_descriptor_rs"
    source = (FORMS / f"{name}.py").read_text()
    assert source.count(" M, N, K,") == 1
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(" M, N, K,", " M: tl.constexpr, N, K,"))
    built = tilelink.build(str(path))
    assert built.plans[0].launch.size_param == "M", built.plans[0].launch.size_param
    if rule == "all_gather":
        monkeypatch.setenv("TILELINK_RACES", "1")
        assert max(tilelink.spawn(gemm_host_descriptor_ag, 2, path=str(path))) < 1e-4


#: a descriptor made from a (B, S, D) tensor gathered along S, its axes the tensor's dims: a program copies BLOCK_S
#: rows of batch `b`, twice
BATCHED = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("x_ptr", dim=1))
    @triton.jit
    def batched_copy(x_ptr, y_ptr, B, S, D, stride_xb, stride_xs, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
        pid = tl.program_id(0)
        b = tl.program_id(1)
        desc = tl.make_tensor_descriptor(x_ptr, shape=[B, S, D], strides=[stride_xb, stride_xs, 1],
                                         block_shape=[1, BLOCK_S, BLOCK_D])
        start = pid * BLOCK_S
        x = tl.reshape(desc.load([b, start, 0]), (BLOCK_S, BLOCK_D))
        offs = start + tl.arange(0, BLOCK_S)
        cols = tl.arange(0, BLOCK_D)
        tl.store(y_ptr + b * S * D + offs[:, None] * D + cols[None, :], x * 2,
                 mask=(offs[:, None] < S) & (cols[None, :] < D))
''')
#: the batched copy with its batches in a loop of each program: the descriptor's own shape bounds the batch index
BATCHED_LOOP = BATCHED.replace("    b = tl.program_id(1)\n", "").replace(
    "    x = tl.reshape(desc.load([b, start, 0]), (BLOCK_S, BLOCK_D))\n", "").replace(
    "    offs = start + tl.arange(0, BLOCK_S)\n    cols = tl.arange(0, BLOCK_D)\n",
    "    offs = start + tl.arange(0, BLOCK_S)\n    cols = tl.arange(0, BLOCK_D)\n    for b in range(B):\n"
    "        x = tl.reshape(desc.load([b, start, 0]), (BLOCK_S, BLOCK_D))\n    ").replace(
    "             mask=(offs[:, None] < S)", "                 mask=(offs[:, None] < S)")
#: a descriptor made from a (D, M) tensor gathered along its columns, M: a program copies BLOCK_M of them
COLUMNS = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("a_ptr", dim=1))
    @triton.jit
    def column_copy(a_ptr, y_ptr, M, D, stride_ad, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        pid = tl.program_id(0)
        desc = tl.make_tensor_descriptor(a_ptr, shape=[D, M], strides=[stride_ad, 1], block_shape=[BLOCK_D, BLOCK_M])
        x = desc.load([0, pid * BLOCK_M])
        offs = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(y_ptr + tl.arange(0, BLOCK_D)[:, None] * M + offs[None, :], x, mask=offs[None, :] < M)
''')


def _copied(path: str, form: str, full_stride: bool) -> float | str:
    """The copy at ``path`` on this rank's rows along dim 1, passed the shard's or the full tensor's stride of dim 0,
    against the tensor itself (twice, the race-exposing schedule on); what the call is refused with, where it is."""
    rank, world = tilelink.rank(), tilelink.world_size()
    from tests.rules.cases import module_at

    kernel = getattr(module_at(path), form)
    device = current_world().device  # the CPU in the emulated world, this rank's GPU with NVSHMEM
    if device.type == "cuda":  # a descriptor the kernel makes takes its scratch from Triton's allocator
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    g, error = torch.Generator().manual_seed(11), 0.0
    for _ in range(2):
        if form == "batched_copy":
            B, S, d = 2, 40, 16
            x = torch.randn(B, S, d, generator=g)
            lo, hi = rows_of(rank, world, S)
            shard, y = x[:, lo:hi].contiguous().to(device), torch.zeros(B, S, d, device=device)
            stride = S * d if full_stride else shard.stride(0)
            run = lambda: kernel[(triton.cdiv(S, 8), B)](shard, y, B, S, d, stride, d, BLOCK_S=8, BLOCK_D=16)  # noqa
            want = 2 * x
        else:
            M, d = 64, 16
            x = torch.randn(d, M, generator=g)
            lo, hi = rows_of(rank, world, M)
            shard, y = x[:, lo:hi].contiguous().to(device), torch.zeros(d, M, device=device)
            stride = M if full_stride else shard.stride(0)
            run = lambda: kernel[(triton.cdiv(M, 16),)](shard, y, M, d, stride, BLOCK_M=16, BLOCK_D=16)  # noqa
            want = x
        try:
            run()
        except LaunchError as refused:
            return str(refused)
        error = max(error, (y.cpu() - want).abs().max().item())
    return error


@pytest.mark.parametrize("form, step, at, full", [
    ("batched_copy", "stride_xb", "0", 640), ("batched_loop", "stride_xb", "0", 640),
    ("column_copy", "stride_ad", "0", 64)])
def test_a_descriptors_axes_before_the_rows_step_by_the_gathered_buffers_stride(form: str, step: str, at: str,
                                                                                full: int, tmp_path,
                                                                                monkeypatch) -> None:
    """Made from the tensor itself, a descriptor's axes are its dims: gathered along dim 1, its rows are axis 1, and
    axis 0 steps over whole blocks of the gathered buffer's rows. Given the shard's stride there (S_r * D, not S * D),
    the batched copy built and read batch 1 from other rows than its wait covered (NaN at world 2); the column copy
    took axis 0 for its rows and was refused at every call. Each call now checks axis 0's stride, and with the full
    tensor's each equals the tensor on the race-exposing schedule."""
    source = BATCHED_LOOP if form == "batched_loop" else BATCHED if form == "batched_copy" else COLUMNS
    form = "batched_copy" if form == "batched_loop" else form
    plan = generate(source, f"{form}.py", requests_in(source, f"{form}.py")).plans[0].launch
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "desc.load(" in text)
    assert plan.row_steps == (("x_ptr" if form == "batched_copy" else "a_ptr", (step,), at, line),), plan.row_steps
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"{form}.py"
    path.write_text(source)
    for said in tilelink.spawn(_copied, 2, str(path), form, False):
        assert isinstance(said, str) and f"pass the full tensor's stride of dim 0 ({full} here)" in said, said
    assert tilelink.spawn(_copied, 2, str(path), form, True) == [0.0, 0.0]
