"""A pointer advanced in place inside a loop moves by its step on every iteration: along another dimension than the
rows, what it adds over the loop leaves the row unless the access's mask bounds the columns on each step, and then
reads the next rows, which the tile's wait does not cover. The matmul form (`x_ptrs += BLOCK_D * stride_xd` after
the load, the loop counting `j` from 0 and `cols[None, :] < D - j * BLOCK_D` in the mask) builds and equals torch on
the race-exposing schedule; a step no column stride scales, an unmasked advance, an advance before the access, an
access after the loop and a `while` loop are refused at the access. So are the forms that leave the row although each
advance alone reads as the matmul form: two advances in one loop, a step back (`x_ptrs = x_ptrs - ...`), an outer loop
that runs the loop again without binding the pointer afresh, a mask or step factor that is not the same on every step,
and a mask over columns bound again after the address was made from them. An outer loop that binds the pointer afresh
before the loop (a persistent matmul) builds and equals torch. The mask's bound (`D`) is kept for the launch, which
refuses a bound past the row (`D + BLOCK_D`) or a column stride that takes the columns past it; a bound the kernel
computes is refused at the access."""

from __future__ import annotations

import importlib.util
import textwrap
from types import SimpleNamespace

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError
from tilelink.runtime import current_world

STRIDED = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
    @triton.jit
    def strip_sum(x_ptr, y_ptr, M, D, NSTEP, stride_xm, stride_xd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        # y[m, d] = the sum of x[m, d + j * BLOCK_D] over the steps j that stay in the row
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + cols[None, :] * stride_xd
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for j in range(0, NSTEP):
            acc += tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (cols[None, :] < D - j * BLOCK_D), other=0.0)
            x_ptrs += BLOCK_D * stride_xd
        tl.store(y_ptr + offs_m[:, None] * BLOCK_D + cols[None, :], acc, mask=offs_m[:, None] < M)
''')
LOAD = "        acc += tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (cols[None, :] < D - j * BLOCK_D), other=0.0)\n"
ADVANCE = "        x_ptrs += BLOCK_D * stride_xd\n"
LOOP = "    for j in range(0, NSTEP):\n"
LOAD_LINE = next(i for i, line in enumerate(STRIDED.splitlines(), 1) if "acc += tl.load(" in line)
# what is left of the row through a local bound in the loop, as the tutorial's `k_remaining`
REMAINING = STRIDED.replace(LOAD, "        left = D - j * BLOCK_D\n" + LOAD.replace("D - j * BLOCK_D", "left"))

REFUSED = {
    # by a parameter no column vector's stride scales: `step` may be a whole row
    "unplaced_step": (STRIDED.replace(ADVANCE, "        x_ptrs += step\n").replace("stride_xd, BLOCK_M",
                                                                                  "stride_xd, step, BLOCK_M"),
                      "by a step TileLink cannot place on a column vector"),
    # no mask on the columns: the later steps read the next rows
    "unmasked": (STRIDED.replace(" & (cols[None, :] < D - j * BLOCK_D)", ""), "the mask does not bound the columns"),
    # a mask that does not shrink with the steps
    "fixed_mask": (STRIDED.replace("D - j * BLOCK_D", "D"), "the mask does not bound the columns"),
    # two blocks a step under a mask for one
    "double_step": (STRIDED.replace(ADVANCE, "        x_ptrs += 2 * BLOCK_D * stride_xd\n"),
                    "the mask does not bound the columns"),
    # advanced before the load: the mask is a step behind
    "advanced_first": (STRIDED.replace(LOAD + ADVANCE, ADVANCE + LOAD), "the access is not in that loop before"),
    # the load after the loop reads where the loop left the pointer
    "after_the_loop": (STRIDED.replace(LOAD + ADVANCE, ADVANCE).replace(
        "    tl.store(", LOAD.replace("        acc += ", "    acc += ") + "    tl.store("),
        "the access is not in that loop before"),
    # a loop that does not count from 0
    "offset_loop": (STRIDED.replace(LOOP, "    for j in range(1, NSTEP):\n"),
                    "does not count up from 0 by a literal or a parameter"),
    "keyword_step": (STRIDED.replace(LOOP, "    for j in tl.range(0, NSTEP, step=2):\n"),
                     "whose variable goes up by `2`, which does not divide the step"),
    "while_loop": (STRIDED.replace(LOOP, "    j = 0\n    while j < NSTEP:\n").replace(
        ADVANCE, ADVANCE + "        j += 1\n"), "does not count up from 0 by a literal or a parameter"),
}


# an outer loop around the loop: it must bind the pointer afresh before it, on every pass
NESTED = STRIDED.replace(LOOP + LOAD + ADVANCE, "    for r in range(0, 2):\nRESET    " + LOOP + "    " + LOAD + "    "
                         + ADVANCE).replace("    x_ptrs = x_ptr", "    x_start = x_ptr")
FRESH = NESTED.replace("RESET", "        x_ptrs = x_start\n")

# forms that leave the row although each advance alone reads as the matmul form: (source, the refusal says, its hint
# says)
LEAVING = {
    # two advances under a mask for one: the pointer moves two blocks a step
    "two_advances": (STRIDED.replace(ADVANCE, ADVANCE + ADVANCE),
                     f"once for each of its advances in that loop (lines {LOAD_LINE + 1}, {LOAD_LINE + 2})",
                     "by the whole step of an iteration"),
    # a step back, in each way of writing it: the first one reads the end of the row before
    "subtract_assign": (STRIDED.replace(ADVANCE, "        x_ptrs = x_ptrs - BLOCK_D * stride_xd\n"),
                        "moves back along `stride_xd` on every iteration", "walk the columns forward"),
    "subtract_in_place": (STRIDED.replace(ADVANCE, "        x_ptrs -= BLOCK_D * stride_xd\n"),
                          "moves back along `stride_xd` on every iteration", "walk the columns forward"),
    "negative_factor": (STRIDED.replace(ADVANCE, "        x_ptrs += -BLOCK_D * stride_xd\n").replace(
        "D - j * BLOCK_D", "D - j * -BLOCK_D"), "moves back along `stride_xd` on every iteration",
        "walk the columns forward"),
    # the second pass of the outer loop starts where the first left the pointer
    "nested_no_reset": (NESTED.replace("RESET", "").replace("x_start = x_ptr", "x_ptrs = x_ptr"),
                        "runs that loop again without binding `x_ptrs` afresh",
                        "bind `x_ptrs` afresh in the loop at line"),
    "nested_reset_in_a_branch": (NESTED.replace("RESET", "        if r == 0:\n            x_ptrs = x_start\n"),
                                 "runs that loop again without binding `x_ptrs` afresh",
                                 "bind `x_ptrs` afresh in the loop at line"),
    # what is left of the row, bound before the loop: the value of step 0 on every step
    "remaining_before_the_loop": (STRIDED.replace(LOOP, "    j = 0\n    left = D - j * BLOCK_D\n" + LOOP).replace(
        "D - j * BLOCK_D), other", "left), other"), "the mask does not bound the columns",
        "offs_k[None, :] < K - k * BLOCK_K"),
    # a step factor that changes with the iteration, or a negative one the kernel binds
    "varying_factor": (STRIDED.replace(ADVANCE, "        s = j % 2\n        x_ptrs += s * BLOCK_D * stride_xd\n")
                       .replace("D - j * BLOCK_D", "D - j * s * BLOCK_D"),
                       "by `s` times `stride_xd` on every iteration, a factor that is not a parameter",
                       "offs_k[None, :] < K - k * BLOCK_K"),
    "bound_factor": (STRIDED.replace(LOOP, "    s = -1\n" + LOOP).replace(
        ADVANCE, "        x_ptrs += s * BLOCK_D * stride_xd\n").replace("D - j * BLOCK_D", "D - j * s * BLOCK_D"),
        "by `s` times `stride_xd` on every iteration, a factor that is not a parameter",
        "offs_k[None, :] < K - k * BLOCK_K"),
    # a mask bound the loop changes (`lim` of the last step on the next)
    "varying_bound": (STRIDED.replace(LOOP, "    lim = D\n" + LOOP).replace("D - j * BLOCK_D", "lim - j * BLOCK_D")
                      .replace(ADVANCE, ADVANCE + "        lim = lim + BLOCK_D\n"),
                      "the mask does not bound the columns", "offs_k[None, :] < K - k * BLOCK_K"),
    # the column vector scaled by more than its stride: the address reads the columns 2 * cols, the mask bounds cols
    "scaled_columns": (STRIDED.replace("cols[None, :] * stride_xd\n", "cols[None, :] * stride_xd * 2\n"),
                       "the address reads the columns `cols[None, :] * stride_xd * 2`, not a column vector times "
                       "that stride alone", "make the columns one vector times the column stride"),
    "scaled_columns_inside": (STRIDED.replace("cols[None, :] * stride_xd\n", "cols[None, :] * 2 * stride_xd\n"),
                              "the address reads the columns `cols[None, :] * 2 * stride_xd`",
                              "make the columns one vector times the column stride"),
    # the pointer starts past the row's first column (the next row, two columns on, moved before the loop): the mask
    # bounds the columns from the first, so the last steps read the next row
    "starts_a_row_on": (STRIDED.replace("cols[None, :] * stride_xd\n", "cols[None, :] * stride_xd + D\n"),
                        "which adds `D` to the row's first column", "bind `x_ptrs` to the row's first column"),
    "starts_two_columns_on": (STRIDED.replace("cols[None, :] * stride_xd\n",
                                              "cols[None, :] * stride_xd + 2 * stride_xd\n"),
                              "which adds `2 * stride_xd` to the row's first column",
                              "`cols = start + tl.arange(0, BLOCK_K)`"),
    "moved_before_the_loop": (STRIDED.replace(LOOP, "    x_ptrs += D * stride_xd\n" + LOOP),
                              f"`x_ptrs` is moved outside that loop too (line {LOAD_LINE - 1})",
                              "advance it only in the loop at line"),
    "base_moved_before_the_loop": (STRIDED.replace("    x_ptrs = x_ptr",
                                                   "    x_ptr += D * stride_xd\n    x_ptrs = x_ptr"),
                                   f"`x_ptr` is moved outside that loop too (line {LOAD_LINE - 3})",
                                   "advance it only in the loop at line"),
    # the mask bounds other columns than the address reads
    "columns_moved_before": (STRIDED.replace(LOOP, "    cols = cols - BLOCK_D\n" + LOOP),
                             f"the columns `cols` its mask bounds are bound again at line {LOAD_LINE - 1}",
                             "bind `cols` once before the pointer is made from it"),
    "columns_moved_inside": (STRIDED.replace(ADVANCE, ADVANCE + "        cols = cols - BLOCK_D\n"),
                             f"the columns `cols` its mask bounds are bound again at line {LOAD_LINE + 2}",
                             "bind `cols` once before the pointer is made from it"),
}


def _generated(source: str):
    return generate(source, "strip_sum.py", requests_in(source, "strip_sum.py"))


@pytest.mark.parametrize("form", sorted(REFUSED))
def test_a_pointer_advanced_in_a_loop_past_what_the_mask_bounds_is_refused(form: str) -> None:
    source, says = REFUSED[form]
    assert source != STRIDED, form
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    said = str(info.value)
    assert "`x_ptrs` is advanced by" in said and says in said, said
    assert "may touch rows of 'x_ptr' its wait does not cover" in said, said
    assert "offs_k[None, :] < K - k * BLOCK_K" in info.value.hint, info.value.hint


@pytest.mark.parametrize("form", sorted(LEAVING))
def test_an_advance_that_leaves_the_row_over_the_loop_is_refused(form: str) -> None:
    source, says, hint = LEAVING[form]
    assert source != STRIDED and "RESET" not in source, form
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    said = str(info.value)
    assert says in said and "may touch rows of 'x_ptr' its wait does not cover" in said, said
    assert f"strip_sum.py:{info.value.line}:" in said and "cannot place on a column vector" not in said, said
    assert hint in info.value.hint, info.value.hint


@pytest.mark.parametrize("source", [STRIDED, REMAINING, FRESH], ids=["masked", "remaining", "fresh_each_pass"])
def test_the_matmul_form_of_an_advance_builds(source: str) -> None:
    (entry, *_) = [str(e) for e in _generated(source).report.entries if e.message.startswith("consumer_tile_wait")]
    assert entry.startswith("[applied]"), entry


# the mask's bound goes one block past the row: the last step reads the first columns of the next row
PAST = STRIDED.replace("D - j * BLOCK_D", "D + BLOCK_D - j * BLOCK_D")


def _launch_plan(source: str):
    return _generated(source).plans[0].launch


def test_a_pointer_advanced_once_with_no_loop_is_refused() -> None:
    # `x_ptrs += D * stride_xd` starts the columns the mask bounds by `cols < D` one row on: the load reads the next
    # row, which no wait covers, and no loop check reads the advance
    source = STRIDED.replace(LOOP + LOAD + ADVANCE, "    x_ptrs += D * stride_xd\n" + LOAD.replace(
        "        ", "    ", 1).replace("D - j * BLOCK_D", "D"))
    assert "for j" not in source, source
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    said = str(info.value)
    assert f"strip_sum.py:{LOAD_LINE}:" in said, said
    assert f"`x_ptrs`, the pointer of the load at line {LOAD_LINE}, is advanced in place at line {LOAD_LINE - 1}, " \
           "outside any loop" in said, said
    assert "write the whole address in one binding" in info.value.hint, info.value.hint


def test_the_mask_bound_of_an_advance_is_kept_for_the_launch() -> None:
    kept = (("x_ptr", ((False, ("D",)),), "stride_xd", LOAD_LINE),)
    assert _launch_plan(STRIDED).row_bounds == kept, _launch_plan(STRIDED).row_bounds
    assert _launch_plan(REMAINING).row_bounds == tuple((t, x, s, line + 1) for t, x, s, line in kept)
    past = _launch_plan(PAST).row_bounds
    assert past == (("x_ptr", ((False, ("D",)), (False, ("BLOCK_D",))), "stride_xd", LOAD_LINE),), past


def test_a_mask_bound_the_launch_cannot_read_is_refused_at_build() -> None:
    # a bound the kernel computes: the launch cannot compare it with the row
    source = STRIDED.replace(LOOP, "    n = tl.maximum(D, BLOCK_D)\n" + LOOP).replace("D - j * BLOCK_D",
                                                                                   "n - j * BLOCK_D")
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    said = str(info.value)
    assert f"strip_sum.py:{LOAD_LINE + 1}:" in said, said
    assert "the mask bounds the columns `cols` by `n`, which is not a sum of products of int literals and " \
           "parameters" in said, said
    assert "`cols[None, :] < K - j * BLOCK_D`" in info.value.hint, info.value.hint


def _strip_kernel(tmp_path, source: str):
    path = tmp_path / "strip_sum.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("strip_sum_launch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.strip_sum


class _Launcher:
    """What the row check asks of a launcher along dim 0: the world."""

    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound


def _call(stride_xd: int = 1) -> dict:
    return dict(x_ptr=torch.zeros(6, 8), y_ptr=torch.zeros(12, 4), M=12, D=8, NSTEP=4, stride_xm=8,
                stride_xd=stride_xd, BLOCK_M=4, BLOCK_D=4)


def test_a_mask_bound_past_the_row_is_refused_at_the_launch(tmp_path) -> None:
    _strip_kernel(tmp_path, STRIDED)._check_row_scales(_call(), _Launcher())  # D = 8 columns: the row
    # one block past the row, or the row's columns two elements apart: both reach the next row
    for source, stride_xd, bound in ((PAST, 1, "D=8 + BLOCK_D=4 = 12"), (STRIDED, 2, "D=8 = 8")):
        with pytest.raises(LaunchError) as info:
            _strip_kernel(tmp_path, source)._check_row_scales(_call(stride_xd), _Launcher())
        said = str(info.value)
        assert said.startswith("strip_sum: the load or store at "), said
        assert f"strip_sum.py:{LOAD_LINE} walks the columns of 'x_ptr'" in said, said
        assert f"up to the mask's bound {bound}" in said and f"at argument 'stride_xd' = {stride_xd}" in said, said
        assert "are 8 elements long" in said and "make the mask's bound at most" in said, said


def test_a_column_stride_that_is_not_positive_is_refused_at_the_launch(tmp_path) -> None:
    # a negative column stride walks back from the row's first column into the rows before: `D * stride` never
    # passes the row's length, so the bound alone lets it by
    for stride_xd in (-1, 0):
        with pytest.raises(LaunchError) as info:
            _strip_kernel(tmp_path, STRIDED)._check_row_scales(_call(stride_xd), _Launcher())
        said = str(info.value)
        assert f"strip_sum.py:{LOAD_LINE} walks the columns of 'x_ptr'" in said, said
        assert f"along argument 'stride_xd' = {stride_xd}, which is not positive" in said, said
        assert "pass 'stride_xd' the stride of the columns in the row" in said, said


# a term along the rows that a `while` counter makes: the later steps read the next rows
COUNTED = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
    @triton.jit
    def counted_sum(x_ptr, y_ptr, M, NSTEP, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        j = 0
        while j < NSTEP:
            acc += tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] + j * BLOCK_D,
                           mask=offs_m[:, None] < M, other=0.0)
            j += 1
        tl.store(y_ptr + offs_m[:, None] * BLOCK_D + cols[None, :], acc, mask=offs_m[:, None] < M)
''')


def test_a_term_along_the_rows_a_loop_moves_without_bound_is_refused() -> None:
    with pytest.raises(AnnotationError) as info:
        generate(COUNTED, "counted_sum.py", requests_in(COUNTED, "counted_sum.py"))
    said = str(info.value)
    assert "adds `j * BLOCK_D` along the rows of 'x_ptr', which changes from one step of a loop to the next" in said, \
        said
    assert "for j in range(a, b)" in info.value.hint, info.value.hint


M, D, BLOCK_D = 12, 8, 4


def _strip_sums(path: str, nstep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel ``strip_sum`` of ``path`` run over this rank's rows of a random (M, D) ``x``: ``x`` whole and the
    result (NaN where nothing was written)."""
    spec = importlib.util.spec_from_file_location(f"strip_sum_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(3))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((M, BLOCK_D), float("nan"), device=device)
    module.strip_sum[(M // 4,)](x[lo:hi].contiguous().to(device), y, M, D, nstep, D, 1, BLOCK_M=4, BLOCK_D=BLOCK_D)
    return x, y.cpu()


def _strips(path: str, nstep: int, passes: int = 1) -> float:
    x, got = _strip_sums(path, nstep)
    want = passes * sum(x[:, j * BLOCK_D:(j + 1) * BLOCK_D] for j in range(min(nstep, D // BLOCK_D)))
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_the_matmul_form_past_the_row_equals_torch_on_the_race_exposing_schedule(world: int, tmp_path,
                                                                                 monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "strip_sum.py"
    path.write_text(STRIDED)
    # four steps over a row of two blocks: the mask stops the last two at the row's end
    errors = tilelink.spawn(_strips, world, str(path), 4)
    assert all(e < 1e-5 for e in errors), errors


@pytest.mark.slow
def test_a_mask_bound_past_the_row_is_refused_at_two_ranks(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "strip_sum_past.py"
    path.write_text(PAST)
    # one block past the row: the last step would read the next row, which no wait covers
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_strips, 2, str(path), 4)
    assert "up to the mask's bound D=8 + BLOCK_D=4 = 12" in str(info.value), info.value


@pytest.mark.slow
def test_an_outer_loop_that_binds_the_pointer_afresh_equals_torch_on_the_race_exposing_schedule(tmp_path,
                                                                                                monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "strip_sum_fresh.py"
    path.write_text(FRESH)
    # each of the two passes starts at the row's first column: twice the sum of one
    errors = tilelink.spawn(_strips, 3, str(path), 4, 2)
    assert all(e < 1e-5 for e in errors), errors


# what the refusal of a start past the row's first column says to write: the start in the column vector, which the
# mask bounds by the row
SHIFTED = STRIDED.replace("    cols = tl.arange(0, BLOCK_D)\n", "    cols = 2 + tl.arange(0, BLOCK_D)\n").replace(
    "* BLOCK_D + cols[None, :], acc", "* BLOCK_D + (cols[None, :] - 2), acc")


def _shifted_strips(path: str, nstep: int) -> float:
    x, got = _strip_sums(path, nstep)
    # y[m, c] = the sum of x[m, 2 + c + j * BLOCK_D] over the steps that stay in the row; the rest are masked off
    padded = torch.cat([x, torch.zeros(M, 2 + nstep * BLOCK_D)], dim=1)
    want = sum(padded[:, 2 + j * BLOCK_D:2 + (j + 1) * BLOCK_D] for j in range(nstep))
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


@pytest.mark.slow
def test_columns_started_in_the_vector_equal_torch_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert SHIFTED.count("2") == STRIDED.count("2") + 2, SHIFTED
    path = tmp_path / "strip_sum_shifted.py"
    path.write_text(SHIFTED)
    # the mask stops each step at the row's end, two columns earlier than the unshifted sweep's
    errors = tilelink.spawn(_shifted_strips, 2, str(path), 3)
    assert all(e < 1e-5 for e in errors), errors


# the address made afresh on each step, the columns moved by the loop variable (`+ j * BLOCK_D * stride_xd`) under a
# loop whose bound the kernel computes: read as the advance in place is, the mask's bound kept for the launch
REBUILT = STRIDED.replace(LOOP, "    for j in range(0, tl.cdiv(NSTEP, 1)):\n").replace(ADVANCE, "").replace(
    "tl.load(x_ptrs,", "tl.load(x_ptrs + j * BLOCK_D * stride_xd,")


def test_an_address_made_afresh_each_step_under_a_mask_for_its_step_is_checked_by_the_mask() -> None:
    assert "x_ptrs +=" not in REBUILT and "j * BLOCK_D * stride_xd" in REBUILT
    plan = _launch_plan(REBUILT)
    assert plan.row_bounds == (("x_ptr", ((False, ("D",)),), "stride_xd", LOAD_LINE),), plan.row_bounds


#: a term the loop moves with no mask for its step (or beside another term, or twice): each call bounds it over every
#: step of the loop, whose bound the kernel computes (`tl.cdiv(NSTEP, 1)`); NSTEP of the call that stays in the row of
#: D = 8 columns, and of one that reaches past it
MOVED = [
    ((" & (cols[None, :] < D - j * BLOCK_D)", ""), 2, 3),
    (("j * BLOCK_D * stride_xd,", "j * 2 * BLOCK_D * stride_xd,"), 1, 2),
    (("range(0, tl.cdiv", "range(1, tl.cdiv"), 2, 3),
    (("j * BLOCK_D * stride_xd,", "j * BLOCK_D * stride_xd + j * BLOCK_D * stride_xd,"), 1, 2),
    (("j * BLOCK_D * stride_xd,", "j * BLOCK_D * stride_xd + 2 * stride_xd,"), 1, 2),
]


@pytest.mark.parametrize("change, fits, past", MOVED,
                         ids=["unmasked", "two_blocks_a_step", "counting_from_one", "two_steps", "shifted"])
def test_a_term_a_loop_moves_is_bounded_over_the_loop_at_each_call(change, fits: int, past: int, tmp_path) -> None:
    source = REBUILT.replace(*change)
    assert source != REBUILT
    shifts = _launch_plan(source).row_shifts
    assert shifts and all(t == "x_ptr" and line == LOAD_LINE for t, _, line in shifts), shifts
    assert all(any(f[0].startswith("(") and "tl.range(" in f[0] and "tl.cdiv(NSTEP, 1)" in f[0] for _, f in terms)
               for _, terms, _ in shifts), shifts
    kernel = _strip_kernel(tmp_path, source)
    kernel._check_row_scales(dict(_call(), NSTEP=fits), _Launcher())
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(dict(_call(), NSTEP=past), _Launcher())
    said = str(info.value)
    assert f"strip_sum.py:{LOAD_LINE} adds " in said and "to the rows of 'x_ptr', from " in said, said
    assert "over the steps of its loop and the programs of the grid" in said and "8 elements long" in said, said


@pytest.mark.slow
def test_a_term_a_loop_moves_without_a_mask_equals_torch_or_is_refused_on_the_race_exposing_schedule(
        tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "strip_sum_unmasked.py"
    path.write_text(REBUILT.replace(*MOVED[0][0]))
    # two steps are the row's two blocks; a third would read the next row, which no wait covers
    errors = tilelink.spawn(_strips, 2, str(path), 2)
    assert all(e < 1e-5 for e in errors), errors
    with pytest.raises(LaunchError, match="over the steps of its loop and the programs of the grid"):
        tilelink.spawn(_strips, 2, str(path), 3)


# the same walk with a loop bound the launch reads, and with the columns added as they are (`cols[None, :] + j *
# BLOCK_D`): the mask's bound is what the launch checks, not the loop's last step, which the mask may stop short
READABLE = REBUILT.replace("    for j in range(0, tl.cdiv(NSTEP, 1)):\n", LOOP)
UNSTRIDED = READABLE.replace("tl.load(x_ptrs + j * BLOCK_D * stride_xd,",
                             "tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] + j * BLOCK_D,")


@pytest.mark.parametrize("source", [REBUILT, READABLE, UNSTRIDED], ids=["computed_bound", "readable_bound",
                                                                         "unstrided"])
def test_a_walk_the_mask_bounds_is_checked_by_the_mask_s_bound(source: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert "j * BLOCK_D" in source and "x_ptrs +=" not in source
    stride = "1" if source is UNSTRIDED else "stride_xd"
    plan = _launch_plan(source)
    assert plan.row_bounds == (("x_ptr", ((False, ("D",)),), stride, LOAD_LINE),), plan.row_bounds
    assert not plan.row_shifts, plan.row_shifts  # the loop's last step is the mask's to stop
    path, past = tmp_path / "strip_sum_walk.py", tmp_path / "strip_sum_walk_past.py"
    path.write_text(source)
    past.write_text(source.replace("D - j * BLOCK_D", "D + BLOCK_D - j * BLOCK_D"))
    # four steps over a row of two blocks: the mask stops the last two at the row's end
    errors = tilelink.spawn(_strips, 2, str(path), 4)
    assert all(e < 1e-5 for e in errors), errors
    with pytest.raises(LaunchError, match=r"up to the mask's bound D=8 \+ BLOCK_D=4 = 12"):
        tilelink.spawn(_strips, 2, str(past), 4)


def test_a_walk_that_starts_past_the_row_s_first_column_is_checked_at_its_ends() -> None:
    """`+ 2` beside the walk: the mask's bound counts from the row's first column, so the columns' own ends and the
    loop's are checked instead (conservatively, at every step)."""
    plan = _launch_plan(UNSTRIDED.replace("+ j * BLOCK_D,", "+ j * BLOCK_D + 2,"))
    assert not plan.row_bounds and plan.row_shifts, plan


def test_columns_a_varying_mask_does_not_move_are_bounded_by_their_own_end() -> None:
    """No advance and no term of the loop's variable: the mask `cols[None, :] < D - j * BLOCK_D` bounds nothing the
    address moves, so the columns' own end (`BLOCK_D - 1`) is what the launch checks."""
    plan = _launch_plan(STRIDED.replace(ADVANCE, ""))
    assert not plan.row_bounds, plan.row_bounds
    assert ("x_ptr", ((False, ("BLOCK_D", "stride_xd")), (True, ("1", "stride_xd"))), LOAD_LINE) in plan.row_shifts, \
        plan.row_shifts


# the loop's variable stepping by the block (`range(0, NSTEP * BLOCK_D, BLOCK_D)`, mask `cols < D - j`), and the
# mask written with the step on the columns' side (`cols[None, :] + j * BLOCK_D < D`): the same walk
STEPPED = STRIDED.replace(LOOP, "    for j in range(0, NSTEP * BLOCK_D, BLOCK_D):\n").replace(
    "D - j * BLOCK_D", "D - j")
PLUS_MASK = STRIDED.replace("(cols[None, :] < D - j * BLOCK_D)", "(cols[None, :] + j * BLOCK_D < D)")


@pytest.mark.parametrize("source", [STEPPED, PLUS_MASK], ids=["stepped_loop", "step_beside_the_columns"])
def test_other_spellings_of_the_matmul_walk_build_and_equal_torch(source: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert source != STRIDED
    plan = _launch_plan(source)
    assert plan.row_bounds == (("x_ptr", ((False, ("D",)),), "stride_xd", LOAD_LINE),), plan.row_bounds
    path = tmp_path / "strip_sum_spelled.py"
    path.write_text(source)
    errors = tilelink.spawn(_strips, 2, str(path), 4)
    assert all(e < 1e-5 for e in errors), errors


def test_a_loop_step_that_does_not_divide_the_advance_is_refused() -> None:
    with pytest.raises(AnnotationError, match="whose variable goes up by `2 \\* BLOCK_D`, which does not divide"):
        _generated(STEPPED.replace("range(0, NSTEP * BLOCK_D, BLOCK_D)", "range(0, NSTEP * BLOCK_D, 2 * BLOCK_D)"))


def test_a_term_the_access_adds_beside_an_advance_is_refused() -> None:
    """`tl.load(x_ptrs + D * stride_xd, ...)`: the mask bounds the columns from the row's first column, and the access
    starts them `D` further along."""
    with pytest.raises(AnnotationError, match="adds `2 \\* stride_xd` to it"):
        _generated(STRIDED.replace("tl.load(x_ptrs,", "tl.load(x_ptrs + 2 * stride_xd,"))
