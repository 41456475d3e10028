"""Under a reduction each rank runs a split-K kernel's loop over its own slice of K, and the programs along the split
axis share that slice: each starts at its split index's block (`pid_k * BLOCK_K + tl.arange(0, BLOCK_K)`, or a range
from `pid_k * BLOCK_K`, or from `pid_k` over a count of tiles) and moves by the split count's blocks a step. Those
steps tile K only where the programs start a step's blocks apart and the grid has as many of them along the split
axis as the step counts: otherwise they leave out or repeat columns, other columns on each rank's slice than on the
full K, and the sum over the ranks is not the kernel's. Each refused form below built before and summed 14 to 39
away from the kernel at world 2; the forms that tile K build and equal it on the race-exposing schedule."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import launch_refusal, module_at, plain_module, rows_of
from tests.rules.test_carried_accumulator import _generate
from tilelink.errors import AnnotationError

#: a split-K GEMM whose programs along the grid's second axis share K; `{loop}` is the loop that sums
SPLIT = '''import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def mm_split(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    lanes = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{loop}
    tl.atomic_add(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
                  mask=(rm[:, None] < M) & (rn[None, :] < N))
'''
#: one step's loads, at the columns `offs_k`, masked by K
STEP = '''        a = tl.load(a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(offs_k[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)'''
#: triton.ops.matmul's form: pointers that start at the split's block and move by the split count's blocks
POINTERS = '''    offs_k = pid_k * {start} + lanes
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        k_remaining = K - k * (BLOCK_K * SPLIT_K)
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (offs_k[None, :] < k_remaining), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_remaining) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += {advance} * stride_ak
        b_ptrs += {advance} * stride_bk'''
#: a range from the split's first column, by columns
COLUMNS = '''    for k in range({start}, K, {step}):
        offs_k = k + lanes
''' + STEP
#: a range from the split's first tile, over a count of tiles
TILES = '''    k_tiles = tl.cdiv(K, BLOCK_K)
    for ki in range(pid_k, k_tiles, {step}):
        offs_k = ki * BLOCK_K + lanes
''' + STEP


def _split_on(path: str, splits: int, split_k: int) -> float:
    """The kernel at ``path`` at this rank's slice of K (96 columns in all), with ``splits`` programs along the split
    axis and ``SPLIT_K=split_k``, against the plain kernel on the whole of K with the same grid."""
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 40, 32, 96
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    grid, meta = (triton.cdiv(M, 16), triton.cdiv(N, 16), splits), dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
                                                                         SPLIT_K=split_k)
    want = torch.zeros(M, N)
    plain_module(path).mm_split[grid](a, b, want, M, N, K, K, 1, N, 1, N, 1, **meta)
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    got = torch.full((hi - lo, N), float("nan"))
    kernel = module_at(path).mm_split
    refused = launch_refusal(lambda: kernel[grid](ar, br, got, M, N, khi - klo, khi - klo, 1, N, 1, N, 1, **meta))
    if refused != "ran":
        return refused
    return (got - want[lo:hi]).abs().max().item()


@pytest.mark.parametrize("loop", [
    POINTERS.format(start="BLOCK_K", advance="BLOCK_K * SPLIT_K"),
    COLUMNS.format(start="pid_k * BLOCK_K", step="BLOCK_K * SPLIT_K"),
    TILES.format(step="SPLIT_K"),
], ids=["pointers", "columns", "tiles"])
def test_split_k_steps_that_tile_k_equal_the_kernel(loop: str, tmp_path, monkeypatch) -> None:
    """The three forms build (the range over tiles with masks by K was refused before), tell the launch the split
    count their step counts, and equal the kernel at world 2 with three splits of each rank's 48 columns."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_split.py"
    path.write_text(SPLIT.format(loop=loop))
    built = _generate(SPLIT.format(loop=loop))
    assert [e[:2] for e in built.plans[0].launch.split_steps] == [("SPLIT_K", 2)], built.plans[0].launch
    errors = tilelink.spawn(_split_on, 2, str(path), 3, 3)
    assert all(e < 1e-4 for e in errors), errors


def test_a_grid_with_other_than_the_step_s_split_count_is_refused_at_the_call(tmp_path, monkeypatch) -> None:
    """Four programs along the split axis where the step moves by two splits' blocks: built, the plain kernel reads
    some columns twice, and the ranks' sum was 17 to 20 away from it. The call is refused before anything runs,
    saying both counts; at world 1 it is the kernel itself and runs."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_split.py"
    path.write_text(SPLIT.format(loop=POINTERS.format(start="BLOCK_K", advance="BLOCK_K * SPLIT_K")))
    said = tilelink.spawn(_split_on, 2, str(path), 4, 2)
    for text in said:
        assert isinstance(text, str) and "the grid has 4 programs along axis 2" in text, said
        assert "steps over 2 of them" in text and "`BLOCK_K * SPLIT_K`" in text, text
    assert all(e < 1e-4 for e in tilelink.spawn(_split_on, 1, str(path), 4, 2))


@pytest.mark.parametrize("loop, says", [
    # each program moves by one block: the programs overlap
    (POINTERS.format(start="BLOCK_K", advance="BLOCK_K"),
     r"the loop at line 20, .* moves by `BLOCK_K \* SPLIT_K` a step .* while the load at line 22 reads `BLOCK_K` "
     r"columns along K a step"),
    # the programs start two blocks apart
    (POINTERS.format(start="2 * BLOCK_K", advance="BLOCK_K * SPLIT_K"),
     r"the load at line 22 reads `BLOCK_K` columns of `a_ptr` along K on each step .*, and the programs along the "
     r"split axis 2 start `2 \* BLOCK_K` columns apart"),
    # a step that is no whole number of the programs' blocks
    (COLUMNS.format(start="pid_k * BLOCK_K", step="3 * SPLIT_K"),
     r"each program along the split axis 2 moves them by `3 \* SPLIT_K` a step, no whole number of the programs' "
     r"blocks"),
    # B's columns the same in every program along the split axis
    (POINTERS.format(start="BLOCK_K", advance="BLOCK_K * SPLIT_K").replace(
        "b_ptr + offs_k[:, None]", "b_ptr + lanes[:, None]"),
     r"the load at line 23 reads `BLOCK_K` columns of `b_ptr` along K .* moves them by `BLOCK_K \* SPLIT_K` a step"),
    # a triangular product's start at the tile's row: the first columns of each rank's slice left out
    (COLUMNS.format(start="pid_m * BLOCK_M", step="BLOCK_K"),
     r"the loop at line 17, .* starts at `pid_m \* BLOCK_M` \(`range\(pid_m \* BLOCK_M, K, BLOCK_K\)`\), not at 0"),
    # the split's position both in the range's start and in the address
    (COLUMNS.format(start="pid_k * BLOCK_K", step="BLOCK_K * SPLIT_K").replace("offs_k = k + lanes",
                                                                           "offs_k = k + pid_k * BLOCK_K + lanes"),
     r"starts at a split-K program's position .* and the load at line 19 adds that position again"),
    # a step unrolled through one name made twice
    (COLUMNS.format(start="pid_k * BLOCK_K", step="2 * BLOCK_K * SPLIT_K").replace(
        "        acc = tl.dot(a, b, acc)", "        acc = tl.dot(a, b, acc)\n        offs_k = k + BLOCK_K + lanes\n"
        + STEP), r"reads `a_ptr` at offsets made more than once in the loop \(`offs_k`\)"),
], ids=["overlapping", "apart", "uneven", "b-not-split", "triangular", "split-twice", "unrolled-one-name"])
def test_split_k_steps_that_do_not_tile_k_are_refused(loop: str, says: str) -> None:
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(SPLIT.format(loop=loop))
    assert "each rank" in str(err.value) and err.value.hint, err.value
