"""Under a reduction each rank runs the loop that sums over its own slice of K. Four forms of that loop read other
columns of each rank's slice than of the full K, and built without being read: a block of K columns that starts at
a tile's position, a step counted by another block's width beside columns with no stride, a block pointer made
afresh on each step at a shifted offset, and a masked load that fills the columns past K with anything but zero.
Each is now refused at its line; the forms beside them that do tile K still build. Each refused kernel is also run
plain on the two ranks' slices, to show that their sum is not the kernel's on the full K: the refusal is needed."""

from __future__ import annotations

import pytest
import torch
import triton

from tests.rules.cases import plain_module, rows_of
from tests.rules.test_carried_accumulator import _generate
from tests.rules.test_split_k_steps import SPLIT, STEP
from tilelink.errors import AnnotationError

#: `SPLIT`'s kernel without a split: one program along the grid's third axis, its write-back a store
PLAIN = SPLIT.replace("tl.atomic_add(", "tl.store(")

#: the K columns start at the tile's column position: the first columns of each rank's slice are left out
AT_TILE_POINTERS = '''    offs_k = pid_n * BLOCK_K + lanes
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (offs_k[None, :] < k_remaining), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_remaining) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk'''
#: `{offs}` made on each step of a range by columns
COLUMNS = '''    for k in range(0, K, {step}):
        offs_k = {offs}
''' + STEP
#: A and B read with no column stride (contiguous along K), over a range that moves by `{step}`
UNSTRIDED = '''    for k in range(0, K, {step}):
        offs_k = k + lanes
        a = tl.load(a_ptr + rm[:, None] * K + offs_k[None, :], mask=(rm[:, None] < M) & (offs_k[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] + rn[None, :] * K, mask=(offs_k[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc = tl.dot(a, b, acc)'''
#: block pointers made on each step at `({a_at})` and `({b_at})`
AFRESH = '''    for k in range({range}):
        a_bp = tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), ({a_at}), (BLOCK_M, BLOCK_K), (1, 0))
        b_bp = tl.make_block_ptr(b_ptr, (K, N), (stride_bk, stride_bn), ({b_at}), (BLOCK_K, BLOCK_N), (1, 0))
        a = tl.load(a_bp, boundary_check=(0, 1), padding_option="zero")
        b = tl.load(b_bp, boundary_check=(0, 1), padding_option="zero")
        acc = tl.dot(a, b, acc)'''


def _sliced_sum_error(source: str, tmp_path, K: int = 72, world: int = 2, b_rows_major: bool = True,
                      block_m: int = 16) -> float:
    """How far the sum of the plain kernel run on each of ``world`` ranks' slices of K is from the plain kernel on
    the whole of K: what a reduction of the kernel's partial sums would make of it, were it built."""
    path = tmp_path / "mm_plain.py"
    path.write_text(source)
    kernel = plain_module(str(path)).mm_split
    M, N = 40, 32
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, 16), 1)
    meta = dict(BLOCK_M=block_m, BLOCK_N=16, BLOCK_K=16, SPLIT_K=1)

    def run(ka, kb, k):
        out = torch.zeros(M, N)
        kb = kb if b_rows_major else kb.t().contiguous().t()
        kernel[grid](ka, kb, out, M, N, k, ka.stride(0), 1, kb.stride(0), kb.stride(1), N, 1, **meta)
        return out

    want = run(a.contiguous(), b.contiguous(), K)
    got = sum(run(a[:, lo:hi].contiguous(), b[lo:hi].contiguous(), hi - lo)
              for lo, hi in (rows_of(r, world, K) for r in range(world)))
    return (got - want).abs().max().item()


@pytest.mark.parametrize("loop, term", [
    (AT_TILE_POINTERS, "BLOCK_K * tl.program_id(1)"),
    (COLUMNS.format(step="BLOCK_K", offs="k + pid_n * BLOCK_K + lanes"), "BLOCK_K * tl.program_id(1)"),
    (COLUMNS.format(step="BLOCK_K", offs="k + (pid_m % 2) * BLOCK_K + lanes"), "BLOCK_K * (pid_m % 2)"),
], ids=["pointers", "columns", "alternating"])
def test_k_columns_from_a_tile_s_position_are_refused(loop: str, term: str, tmp_path) -> None:
    """Each built before, and summed 10 to 16 away from the kernel at world 2."""
    source = PLAIN.format(loop=loop)
    with pytest.raises(AnnotationError) as err:
        _generate(source)
    text = str(err.value)
    assert f"reads `a_ptr`'s columns along K from `{term}` on" in text, text
    assert "a program's position" in text and "pid_k * BLOCK_K" in err.value.hint, err.value
    assert _sliced_sum_error(source, tmp_path) > 1.0


@pytest.mark.parametrize("loop", [
    COLUMNS.format(step="BLOCK_K", offs="k + lanes"),
    COLUMNS.format(step="BLOCK_K", offs="k + 0 * pid_n + lanes"),
], ids=["columns", "times-zero"])
def test_k_columns_from_the_step_build(loop: str) -> None:
    assert _generate(PLAIN.format(loop=loop)).plans


@pytest.mark.parametrize("step", ["BLOCK_M + BLOCK_N", "BLOCK_M"])
def test_a_step_counted_by_another_width_beside_unstrided_columns_is_refused(step: str, tmp_path) -> None:
    """`k + tl.arange(0, BLOCK_K)` indexes columns whatever their stride, so a loop moving by another block's width
    leaves out or reads twice columns of each rank's slice. It built where no column stride was written."""
    source = PLAIN.format(loop=UNSTRIDED.format(step=step))
    with pytest.raises(AnnotationError, match=rf"reads `BLOCK_K` columns of `a_ptr` along K on each step .*, and "
                                              rf"moves them by `{step.replace('+', '[+]')}` a step"):
        _generate(source)
    assert _sliced_sum_error(source, tmp_path, b_rows_major=False, block_m=32) > 1.0


def test_unstrided_columns_moved_by_their_own_width_build() -> None:
    assert _generate(PLAIN.format(loop=UNSTRIDED.format(step="BLOCK_K"))).plans


@pytest.mark.parametrize("a_at, b_at, says", [
    ("pid_m * BLOCK_M, k + BLOCK_K", "k + BLOCK_K, pid_n * BLOCK_N", r"from `BLOCK_K` on, past where the step's block"),
    ("pid_m * BLOCK_M, 2 * k", "2 * k, pid_n * BLOCK_N", r"moves them by `2 \* BLOCK_K` a step"),
    ("pid_m * BLOCK_M, k + pid_n * BLOCK_K", "k + pid_n * BLOCK_K, pid_n * BLOCK_N",
     r"from `BLOCK_K \* tl.program_id\(1\)` on"),
], ids=["shifted", "gaps", "at-tile"])
def test_block_pointers_made_afresh_at_other_columns_are_refused(a_at: str, b_at: str, says: str) -> None:
    """A block pointer made on each step is read as a descriptor's load: its offset along K must start at the
    step's block. Each of these built before (the interpreter has no block pointers, so they are not run here)."""
    loop = AFRESH.format(range="0, K, BLOCK_K", a_at=a_at, b_at=b_at)
    with pytest.raises(AnnotationError, match=says):
        _generate(PLAIN.format(loop=loop))


@pytest.mark.parametrize("range_, at, split_steps", [
    ("0, K, BLOCK_K", "k", []),
    ("0, tl.cdiv(K, BLOCK_K)", "k * BLOCK_K", []),
    ("pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K", "k", [("SPLIT_K", 2)]),
], ids=["columns", "tiles", "split"])
def test_block_pointers_made_afresh_at_the_step_build(range_: str, at: str, split_steps: list) -> None:
    source = SPLIT if split_steps else PLAIN
    loop = AFRESH.format(range=range_, a_at=f"pid_m * BLOCK_M, {at}", b_at=f"{at}, pid_n * BLOCK_N")
    built = _generate(source.format(loop=loop))
    assert [e[:2] for e in built.plans[0].launch.split_steps] == split_steps


@pytest.mark.parametrize("other", ["1.0", "-1", "fill"])
def test_a_non_zero_fill_past_k_is_refused(other: str, tmp_path) -> None:
    """The columns a mask by K leaves out are past the end of each rank's slice, not of the full K: a fill there is
    summed once per rank whose slice ends inside a block (at world 2 and K = 72, each rank's 36 columns end inside
    their third block)."""
    loop = COLUMNS.format(step="BLOCK_K", offs="k + lanes").replace("other=0.0", f"other={other}")
    source = PLAIN.format(loop=loop)
    if other == "fill":
        source = source.replace("    acc = tl.zeros", "    fill = 1.0\n    acc = tl.zeros")
    with pytest.raises(AnnotationError, match=rf"is masked by K .* and reads `other={other}` where the mask is "
                                              rf"false") as err:
        _generate(source)
    assert "other=0.0" in err.value.hint
    assert _sliced_sum_error(source, tmp_path) > 1.0


@pytest.mark.parametrize("other", ["0", "0.", "-0.0", "zero", "tl.zeros((1, 1), dtype=tl.float32)",
                                   "tl.full((1, 1), 0, tl.float32)"])
def test_a_zero_fill_past_k_builds(other: str) -> None:
    loop = COLUMNS.format(step="BLOCK_K", offs="k + lanes").replace("other=0.0", f"other={other}")
    source = PLAIN.format(loop=loop).replace("    acc = tl.zeros", "    zero = 0.0\n    acc = tl.zeros")
    assert _generate(source).plans
