"""The overlapped operators on the GPU: ranks sharing one GPU through NVSHMEM.

The same rank functions as the emulated tests (``tests/ops/tp_worlds.py``), on CUDA tensors, with the
compiled kernels: the persistent TMA variants where the shapes allow, the pointer ones otherwise.
"""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.tp_worlds import (
    ag_gemm_back_to_back,
    calls_with_a_late_host,
    mlp_matches_torch,
    ops_match_torch,
    uneven_slices_match_torch,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_ops_bf16_scaled_mlp1(world: int, heap_for_ranks) -> None:
    """MLP-1 scaled down (H=512, I=1376 -> AG N=2*I/R) with M not divisible by the world size."""
    heap_for_ranks(world)
    n = 2 * 1376 // world
    for per_rank in tilelink.spawn(ops_match_torch, world, 1000, n, 512, "bfloat16", backend="nvshmem"):
        assert all(err < 1e-2 for err in per_rank.values()), per_rank


@pytest.mark.parametrize("world", [2, 3])
def test_ops_odd_shapes_pointer_kernels(world: int) -> None:
    """Odd K and N: rows are not 16-byte aligned, so the pointer kernels run."""
    for per_rank in tilelink.spawn(ops_match_torch, world, 333, 77, 121, "float16", backend="nvshmem"):
        assert all(err < 1e-2 for err in per_rank.values()), per_rank


@pytest.mark.parametrize(("N", "K"), [(2, 12), (10, 12), (8, 10), (8, 2)])
def test_uneven_slices_one_kernel_on_every_rank(N: int, K: int) -> None:
    """Three ranks with their own, uneven slices of B's columns (AG) or of K (RS), one of them possibly
    empty, float32: every rank takes the kernel the shared dimension allows (persistent with padding
    where its own slice is not 16-byte aligned), so none waits on a protocol the others do not run."""
    for per_rank in tilelink.spawn(uneven_slices_match_torch, 3, 131, N, K, None, backend="nvshmem"):
        assert all(err < 5e-3 for err in per_rank.values()), per_rank  # tl.dot on fp32 is TF32


def test_tp_mlp_two_ranks() -> None:
    for err in tilelink.spawn(mlp_matches_torch, 2, 300, 256, 704, backend="nvshmem"):
        assert err < 2e-2


@pytest.mark.parametrize("world", [2, 3])
def test_ag_gemm_calls_back_to_back_with_a_lagging_rank_bf16(world: int) -> None:
    """No barrier between all-gather calls: five calls with new data, rank 1's stream a few ms behind before
    each, on the copy engine and on the SM pull; every product right."""
    for rank, per_rank in enumerate(tilelink.spawn(ag_gemm_back_to_back, world, 333, 256, 512, 5, "bfloat16",
                                                   backend="nvshmem")):
        assert all(err < 1e-2 for err in per_rank.values()), (rank, per_rank)


def test_a_rank_late_between_calls_is_waited_for_bf16(monkeypatch) -> None:
    """Rank 1's host 2.5 s late between two calls, the wait budget 1 s: the all-gathers (copy engine, SM pull)
    and the hybrid reduce-scatter wait for it at the call's handshake, and every result is right."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    for rank, per_rank in enumerate(tilelink.spawn(calls_with_a_late_host, 2, 333, 256, 512, 2.5, "bfloat16",
                                                   backend="nvshmem")):
        assert all(err < 1e-2 for err in per_rank.values()), (rank, per_rank)
