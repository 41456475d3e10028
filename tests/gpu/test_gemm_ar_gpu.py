"""GEMM + AllReduce on the GPU: ranks sharing one GPU (or one each) through NVSHMEM, compiled kernels.

The rank functions of the emulated tests (``tests/ops/ar_worlds.py``) on CUDA tensors: decode shapes scaled down,
both algorithms and the size's choice, the same bits on every rank, many calls on one context (the epochs), odd
shapes and a rank with no K slice, the TP MLP's decode form. Every kernel is compiled and loaded before one that
spins (the launcher's warm-up runs the GEMM and its partners against scratch channels first).
"""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.ar_worlds import gemm_ar_matches_torch, mlp_all_reduce_matches_torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]

MODES = [None, "one_shot", "two_shot"]


def _check(results: list[dict], tolerance: float) -> None:
    for rank, per_rank in enumerate(results):
        for case, (err, _) in per_rank.items():
            assert err < tolerance, f"rank {rank}, {case}: error {err} (relative to the largest element)"
    for case, (_, digest) in results[0].items():  # every rank sums the ranks in rank order: the same bits
        assert all(per_rank[case][1] == digest for per_rank in results), f"{case}: the ranks' results differ"


@pytest.mark.parametrize("world", [2, 4, 8])
def test_decode_shapes_bf16(world: int, heap_for_ranks) -> None:
    """One token, 16 and 256 tokens of a 4096-wide layer whose K (8192) is split over the ranks."""
    heap_for_ranks(world)
    shapes = [(1, 4096, 8192), (16, 4096, 8192), (256, 4096, 8192)]
    _check(tilelink.spawn(gemm_ar_matches_torch, world, shapes, MODES, "bfloat16", 3, backend="nvshmem"), 2e-2)


def test_many_calls_on_one_context(heap_for_ranks) -> None:
    """Fifty calls per algorithm with new data each: the barrier words keep counting (never reset)."""
    heap_for_ranks(4)
    _check(tilelink.spawn(gemm_ar_matches_torch, 4, [(8, 1024, 512)], MODES, "bfloat16", 50, backend="nvshmem"),
           2e-2)


@pytest.mark.parametrize("world", [2, 3])
def test_odd_shapes_fp16(world: int) -> None:
    """Odd N and K (rows not 16-byte aligned), M = 1 and 37 rows."""
    _check(tilelink.spawn(gemm_ar_matches_torch, world, [(1, 333, 121), (37, 77, 121)], MODES, "float16",
                          backend="nvshmem"), 1e-2)


def test_a_rank_with_no_k_slice() -> None:
    _check(tilelink.spawn(gemm_ar_matches_torch, 3, [(5, 256, 2)], MODES, "float32", backend="nvshmem"), 5e-3)


def test_tp_mlp_all_reduce_output() -> None:
    for err in tilelink.spawn(mlp_all_reduce_matches_torch, 2, 16, 256, 704, backend="nvshmem"):
        assert err < 2e-2, err
