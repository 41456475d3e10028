"""Under a reduction each rank runs the loop that sums over its own slice of K. A block pointer the loop moves with
`tl.advance` (Triton 3.6 and before; newer Triton removed block pointers, so the interpreter cannot run these kernels:
tests/gpu/test_block_pointers_gpu.py runs them) reads, on each step, its block's columns from where its offsets
stand: those steps must tile K as any other load's do. An advance by two blocks, or a first block past column 0,
built before and read other columns of each rank's slice than of the full K; the forms that tile K build, a split-K
program's too, with the split count its step asks of the grid."""

from __future__ import annotations

import pytest

from tests.rules.test_carried_accumulator import _generate
from tilelink.errors import AnnotationError

#: a GEMM reading A and B through block pointers that the loop over K moves
BLOCK_POINTERS = '''import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def mm_blocks(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    a_blocks = tl.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                 offsets=(pid_m * BLOCK_M, {start}), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
    b_blocks = tl.make_block_ptr(b_ptr, (K, N), (stride_bk, stride_bn), ({start}, pid_n * BLOCK_N),
                                 (BLOCK_K, BLOCK_N), (1, 0))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, {step})):
        a = tl.load(a_blocks, boundary_check=(0, 1), padding_option="zero")
        b = tl.load(b_blocks, boundary_check=(0, 1), padding_option="zero")
        acc = tl.dot(a, b, acc)
        a_blocks = tl.advance(a_blocks, (0, {advance}))
        b_blocks = tl.advance(b_blocks, ({advance}, 0))
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.atomic_add(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
                  mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


@pytest.mark.parametrize("start, step, advance, splits", [
    ("0", "BLOCK_K", "BLOCK_K", []),
    ("pid_k * BLOCK_K", "BLOCK_K * SPLIT_K", "BLOCK_K * SPLIT_K", [("SPLIT_K", 2)]),
], ids=["whole-k", "split-k"])
def test_block_pointers_that_tile_k_build(start: str, step: str, advance: str, splits: list) -> None:
    built = _generate(BLOCK_POINTERS.format(start=start, step=step, advance=advance))
    assert "producer_tile_notify" in built.text, built.text
    assert [e[:2] for e in built.plans[0].launch.split_steps] == splits


@pytest.mark.parametrize("start, advance, says", [
    ("0", "2 * BLOCK_K", r"the load at line 19 reads `BLOCK_K` columns of `a_ptr` along K on each step of the loop "
                         r"at line 18, .*, and moves them by `2 \* BLOCK_K` a step"),
    ("BLOCK_K", "BLOCK_K", r"the load at line 19 reads `a_ptr`'s columns along K from `BLOCK_K` on, past where the "
                           r"step's block starts"),
    ("pid_k * 2 * BLOCK_K", "BLOCK_K * SPLIT_K", r"the programs along the split axis 2 start `2 \* BLOCK_K` columns "
                                                 r"apart"),
], ids=["gaps", "shifted", "splits-apart"])
def test_block_pointers_that_do_not_tile_k_are_refused(start: str, advance: str, says: str) -> None:
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(BLOCK_POINTERS.format(start=start, step=advance, advance=advance))
    assert "each rank runs that loop over its own slice of K" in str(err.value), err.value


@pytest.mark.parametrize("edit, says", [
    (("        a_blocks = tl.advance(a_blocks, (0, BLOCK_K))",
      "        if k % 2 == 0:\n            a_blocks = tl.advance(a_blocks, (0, BLOCK_K))"),
     "is advanced under an `if`"),
    (("(0, BLOCK_K))\n", "(BLOCK_M, BLOCK_K))\n"), "is advanced along more than one dim"),
    (("        a_blocks = tl.advance(a_blocks, (0, BLOCK_K))",
      "        a_next = tl.advance(a_blocks, (0, BLOCK_K))\n        a_blocks = a_next"),
     r"is bound in the loop otherwise than by `tl.advance\(a_blocks, ...\)` \(`a_next`\)"),
    (("    acc = tl.zeros(", "    a_blocks = tl.advance(a_blocks, (0, BLOCK_K))\n    acc = tl.zeros("),
     "is made or moved more than once outside the loop"),
], ids=["under-if", "both-dims", "through-a-name", "moved-before"])
def test_block_pointers_moved_otherwise_are_refused(edit: tuple[str, str], says: str) -> None:
    """A block pointer moved in a way TileLink does not read: each of these built before, unchecked."""
    source = BLOCK_POINTERS.format(start="0", step="BLOCK_K", advance="BLOCK_K")
    assert edit[0] in source
    with pytest.raises(AnnotationError, match=f"through the block pointer `a_blocks`, which {says}"):
        _generate(source.replace(edit[0], edit[1], 1))
