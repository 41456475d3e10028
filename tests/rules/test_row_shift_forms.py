"""The address terms along dim 0 that are not the rows themselves (`+ SHIFT`, a column vector's start) must stay within
one row, or the access touches rows its wait or notify does not cover. Each form is either checked at each call with
more than one rank, or refused when the kernel is built with what to write instead: an alias bound two ways in the
branches of an `if`, a term the kernel computes (a program id, a call), a column vector made from another vector, a
shift only an autotuning configuration sets; and a row start made from the program id itself keeps the kernel's own
tile order (the rotation would move the tile's rows but not that start)."""

from __future__ import annotations

import importlib.util
import textwrap
from types import SimpleNamespace

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
M, D, BLOCK_M, BLOCK_D = 36, 8, 8, 8

# the row sums from column SHIFT on, through an alias the branches of an `if` bind two ways
BRANCHED = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def tail_sum_kernel(x_ptr, y_ptr, M, D, stride_xm, SHIFT, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                    TAIL: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    if TAIL:
        base = x_ptr + SHIFT
    else:
        base = x_ptr
    x = tl.load(base + offs_m[:, None] * stride_xm + offs_d[None, :],
                mask=(offs_m[:, None] < M) & (offs_d[None, :] < D - SHIFT), other=0.0)
    tl.store(y_ptr + offs_m, tl.sum(x, axis=1), mask=offs_m < M)
'''

# the same sums, the shift written in a column vector made from another one
SHIFTED_COLUMNS = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def tail_sum_kernel(x_ptr, y_ptr, M, D, stride_xm, SHIFT, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                    TAIL: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    cols = offs_d + SHIFT
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :],
                mask=(offs_m[:, None] < M) & (cols[None, :] < D), other=0.0)
    tl.store(y_ptr + offs_m, tl.sum(x, axis=1), mask=offs_m < M)
'''

# the same sums, the shift a constexpr only the autotuning configurations set
TUNED = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.autotune(configs=[{configs}], key=["D"])
@triton.jit
def tail_sum_kernel(x_ptr, y_ptr, M, D, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                    SHIFT: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :] + SHIFT,
                mask=(offs_m[:, None] < M) & (offs_d[None, :] < D - SHIFT), other=0.0)
    tl.store(y_ptr + offs_m, tl.sum(x, axis=1), mask=offs_m < M)
'''

# each program sums a column block of the rows, the block's start a program id along grid axis 1, in a column vector
# bounded by the mask (`BOUND`, the row's length D, or past it)
COLUMN_BLOCKS = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def block_sum_kernel(x_ptr, y_ptr, M, D, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :],
                mask=(offs_m[:, None] < M) & (cols[None, :] < BOUND), other=0.0)
    tl.store(y_ptr + offs_m * tl.num_programs(1) + tl.program_id(1), tl.sum(x, axis=1), mask=offs_m < M)
'''

# the gathered rows doubled, written back at a row start made from the program id itself, not from `pid_m`
OWN_START = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def row_sum_kernel(x_ptr, y_ptr, M, D, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row = tl.program_id(0) * BLOCK_M
    offs_d = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :],
                mask=(offs_m[:, None] < M) & (offs_d[None, :] < D), other=0.0)
    out = row + tl.arange(0, BLOCK_M)
    tl.store(y_ptr + out, tl.sum(x, axis=1), mask=out < M)
'''


def _written(tmp_path, source: str, name: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(HEAD + textwrap.dedent(source))
    return str(path)


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _matrix(seed: int) -> torch.Tensor:
    return torch.randn(M, D, generator=torch.Generator().manual_seed(seed))


def _shard(x: torch.Tensor) -> torch.Tensor:
    """This rank's rows of ``x``, where the rank computes."""
    lo, hi = rows_of(tilelink.rank(), tilelink.world_size(), x.shape[0])
    return x[lo:hi].contiguous().to(current_world().device)


def _nans(*shape: int) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=current_world().device)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    got = got.cpu()
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


def _tail_sums(path: str, shift: int, tail: bool) -> float:
    kernel = _load(path, "tail_sum").tail_sum_kernel
    x = _matrix(7)
    shard = _shard(x)
    y = _nans(M)
    kernel[(triton.cdiv(M, BLOCK_M),)](shard, y, M, D, shard.stride(0), shift, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D,
                                      TAIL=tail)
    return _error(y, x[:, shift:].sum(dim=1) if tail else x[:, :D - shift].sum(dim=1))


def _tuned_sums(path: str, shift: int) -> float:
    kernel = _load(path, "tail_sum").tail_sum_kernel
    x = _matrix(8)
    shard = _shard(x)
    y = _nans(M)
    kernel[(triton.cdiv(M, BLOCK_M),)](shard, y, M, D, shard.stride(0), BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)
    return _error(y, x[:, shift:D].sum(dim=1))


def _block_sums(path: str) -> float:
    kernel = _load(path, "block_sum").block_sum_kernel
    x = _matrix(9)
    shard = _shard(x)
    blocks = 2
    y = _nans(M, blocks)
    kernel[(triton.cdiv(M, BLOCK_M), blocks)](shard, y, M, D, shard.stride(0), BLOCK_M=BLOCK_M, BLOCK_D=D // blocks)
    return _error(y, x.view(M, blocks, D // blocks).sum(dim=2))


def _row_sums(path: str) -> float:
    kernel = _load(path, "row_sum").row_sum_kernel
    x = _matrix(10)
    shard = _shard(x)
    y = _nans(M)
    kernel[(triton.cdiv(M, BLOCK_M),)](shard, y, M, D, shard.stride(0), BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)
    return _error(y, x.sum(dim=1))


def _generated(source: str):
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


def _shifts(source: str) -> list:
    return [(tensor, terms) for tensor, terms, _ in _generated(source).plans[0].launch.row_shifts]


# -- quick: what the build keeps for the launch, and what it refuses


def test_an_alias_bound_two_ways_keeps_the_terms_of_each_way() -> None:
    # each way's first element, and the last the mask lets through past it (D - SHIFT - 1 columns further)
    last = ((False, ("D",)), (True, ("SHIFT",)), (True, ("1",)))
    assert sorted(_shifts(BRANCHED)) == sorted([("x_ptr", ((False, ("SHIFT",)),)), ("x_ptr", last + ((False, (
        "SHIFT",)),)), ("x_ptr", last)])  # the other way adds only the columns
    two = BRANCHED.replace("        base = x_ptr\n", "        base = x_ptr + 1\n")
    assert sorted(_shifts(two)) == sorted([("x_ptr", ((False, ("1",)),)), ("x_ptr", ((False, ("SHIFT",)),)), (
        "x_ptr", last + ((False, ("1",)),)), ("x_ptr", last + ((False, ("SHIFT",)),))])


def test_a_column_vector_made_from_another_keeps_its_start() -> None:
    # its first element, and the last its mask lets through
    assert _shifts(SHIFTED_COLUMNS) == [("x_ptr", ((False, ("SHIFT",)),)), ("x_ptr", ((False, ("D",)), (True, ("1",))))]


def test_a_column_vector_at_a_programs_position_keeps_its_mask_bound() -> None:
    # the first column a program can have (none known: 0) and the last one its mask lets through, D - 1
    assert _shifts(COLUMN_BLOCKS.replace("BOUND", "D")) == [("x_ptr", ((False, ("D",)), (True, ("1",))))]


# the row sums over BLOCK_D columns per step, NSTEP steps, the columns bounded by no mask
UNMASKED = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def plain_sum_kernel(x_ptr, y_ptr, M, NSTEP, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for j in range(0, NSTEP):
        acc += tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] + j * BLOCK_D, mask=offs_m[:, None] < M,
                       other=0.0)
    tl.store(y_ptr + offs_m, tl.sum(acc, axis=1), mask=offs_m < M)
'''


def test_an_unmasked_column_vector_reads_up_to_its_last_element(tmp_path) -> None:
    # its first element and its last, BLOCK_D - 1, each with the loop's first and last steps
    last = ((False, ("BLOCK_D",)), (True, ("1",)))
    single = UNMASKED.replace(" + j * BLOCK_D", "")
    assert sorted(_shifts(single)) == [("x_ptr", last)], _shifts(single)
    masked = single.replace("mask=offs_m[:, None] < M,", "mask=(offs_m[:, None] < M) & (cols[None, :] < M),")
    # the mask bounds it, and its bound is checked against the row
    assert _shifts(masked) == [("x_ptr", ((False, ("M",)), (True, ("1",))))], _shifts(masked)
    kernel = _load(_written(tmp_path, UNMASKED, "plain_sum"), "plain_sum").plain_sum_kernel
    launcher = SimpleNamespace(world=lambda: SimpleNamespace(world_size=2))

    def args(nstep: int, block_d: int) -> dict:
        return dict(x_ptr=torch.zeros(M // 2, D), y_ptr=torch.zeros(M), M=M, NSTEP=nstep, stride_xm=D,
                    BLOCK_M=BLOCK_M, BLOCK_D=block_d)

    kernel._check_row_scales(args(2, D // 2), launcher)  # columns 0..7 of 8-wide rows
    for nstep, block_d, says in ((1, 2 * D, "adds 15 elements (BLOCK_D=16 + -1"),
                                 (2, 5, "adds 9 elements")):  # a wider block; blocks of 5 start at 0 and 5
        with pytest.raises(LaunchError) as info:
            kernel._check_row_scales(args(nstep, block_d), launcher)
        said = str(info.value)
        assert says in said and "whose rows are 8 elements long" in said, said


@pytest.mark.parametrize("term", ["tl.program_id(1) * BLOCK_D", "shift_of(D)"])
def test_a_scalar_term_the_kernel_computes_is_refused_at_build(term: str) -> None:
    source = '''
    @triton.jit
    def shift_of(n):
        return n // 2


    @tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
    @triton.jit
    def block_sum_kernel(x_ptr, y_ptr, M, D, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + TERM + offs_d[None, :], mask=offs_m[:, None] < M)
        tl.store(y_ptr + offs_m, tl.sum(x, axis=1), mask=offs_m < M)
    '''.replace("TERM", term)
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    err, said = info.value, str(info.value)
    assert err.file == "user_kernels.py" and err.line == 16, said
    assert f"adds `{term}` along the rows of 'x_ptr', a value the kernel computes" in said, said
    assert "cols[None, :] < D" in said and "tl.arange(0, BLOCK_D)" in said, said


def test_the_pointer_advanced_by_a_program_id_is_refused_at_build() -> None:
    source = BRANCHED.replace("    if TAIL:\n", "    x_ptr += tl.program_id(1) * SHIFT\n    if TAIL:\n")
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    assert "adds `tl.program_id(1) * SHIFT` along the rows of 'x_ptr'" in str(info.value), info.value


def test_a_column_vector_made_from_a_loaded_vector_is_refused_at_build() -> None:
    source = SHIFTED_COLUMNS.replace("x_ptr, y_ptr,", "x_ptr, e_ptr, y_ptr,").replace(
        "    cols = offs_d + SHIFT\n", "    cols = tl.arange(0, BLOCK_D) + tl.load(e_ptr + offs_d)\n")
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    err, said = info.value, str(info.value)
    assert err.line == 13, said
    assert "the columns `cols` of the load at line 13 add the vector `tl.load(e_ptr + offs_d)`" in said, said
    assert "`cols = start + tl.arange(0, BLOCK_D)`" in said and "`cols[None, :] < D`" in said, said


def test_a_row_start_made_from_the_program_id_keeps_the_kernels_order() -> None:
    report = [str(e) for e in _generated(OWN_START).report.entries]
    assert any("order='local_first' not applied: the offsets `out = row + tl.arange(0, BLOCK_M)` start from the "
               "program id" in e for e in report), report
    assert not any("rotated" in e for e in report), report


# -- slow: the emulated world on the race-exposing schedule, against torch; a wrong shift refused at the launch


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_the_forms_checked_at_the_launch_equal_torch_on_the_race_exposing_schedule(world: int, tmp_path,
                                                                                   monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    branched = _written(tmp_path, BRANCHED, "tail_sum")
    assert all(e < 1e-5 for e in tilelink.spawn(_tail_sums, world, branched, 3, True))
    assert all(e < 1e-5 for e in tilelink.spawn(_tail_sums, world, branched, 3, False))
    columns = _written(tmp_path, SHIFTED_COLUMNS, "tail_sum")
    assert all(e < 1e-5 for e in tilelink.spawn(_tail_sums, world, columns, 3, True))
    blocks = _written(tmp_path, COLUMN_BLOCKS.replace("BOUND", "D"), "block_sum")
    assert all(e < 1e-5 for e in tilelink.spawn(_block_sums, world, blocks))
    tuned = _written(tmp_path, TUNED.format(configs='triton.Config({"SHIFT": 3})'), "tail_sum")
    assert all(e < 1e-5 for e in tilelink.spawn(_tuned_sums, world, tuned, 3))
    own = _written(tmp_path, OWN_START, "row_sum")
    assert all(e < 1e-5 for e in tilelink.spawn(_row_sums, world, own))


TWO_CONFIGS = 'triton.Config({"SHIFT": 3}), triton.Config({"SHIFT": 8})'


@pytest.mark.slow
def test_a_shift_past_the_row_is_refused_at_the_launch_in_each_form(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    cases = [
        (_tail_sums, _written(tmp_path, BRANCHED, "branched_sum"), (D, True), "adds 8 elements (SHIFT=8)"),
        # the way the branch does not take is checked too: the check cannot tell which one a call takes
        (_tail_sums, _written(tmp_path, BRANCHED, "branched_sum"), (D, False), "adds 8 elements (SHIFT=8)"),
        (_tail_sums, _written(tmp_path, SHIFTED_COLUMNS, "columns_sum"), (D, True), "adds 8 elements (SHIFT=8)"),
        (_block_sums, _written(tmp_path, COLUMN_BLOCKS.replace("BOUND", "2 * D"), "block_sum"), (),
         "adds 15 elements (2 * D=8 + -1)"),
        (_tuned_sums, _written(tmp_path, TUNED.format(configs=TWO_CONFIGS), "tuned_sum"), (3,),
         "adds 8 elements (SHIFT=8 under the autotuning configuration SHIFT=8)"),
    ]
    for fn, path, args, says in cases:
        with pytest.raises(LaunchError) as info:
            tilelink.spawn(fn, 2, path, *args)
        said = str(info.value)
        assert says in said and "to the rows of 'x_ptr', whose rows are 8 elements long" in said, said
        assert "_sum.py:" in said, said
