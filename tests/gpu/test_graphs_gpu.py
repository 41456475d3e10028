"""The operators captured in CUDA graphs on the GPU: ranks sharing one GPU through NVSHMEM, each form captured
once and replayed 20 times with new data written into the captured inputs, every replay against torch."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.graph_worlds import cuda_all_reduce_replays_match_torch, cuda_replays_match_torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_captured_operators_replay_with_new_data(world: int, heap_for_ranks) -> None:
    """ag_gemm (copy engine, SM pull), gemm_rs (hybrid, SM pull), sp_attention and TPMLP; M = 1000 rows is not
    a multiple of the world size."""
    heap_for_ranks(world)
    for rank, per_rank in enumerate(tilelink.spawn(cuda_replays_match_torch, world, 1000, 256, 512, 20,
                                                   backend="nvshmem")):
        assert all(err < 2e-2 for err in per_rank.values()), (rank, per_rank)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_captured_gemm_all_reduce_replays_with_new_data(world: int, heap_for_ranks) -> None:
    """gemm_ar one-shot and two-shot (the fused kernel) and TPMLP(output="all_reduce"), each captured once and
    replayed 20 times with new data, then called uncaptured and replayed again: a decode batch of 4 tokens, and 300
    rows (two channels a rank at world 2); K = 1000 splits unevenly over 3 ranks."""
    heap_for_ranks(world)
    shapes = [(4, 512, 1000), (300, 512, 1000)]
    for rank, per_rank in enumerate(tilelink.spawn(cuda_all_reduce_replays_match_torch, world, shapes, 20,
                                                   backend="nvshmem")):
        assert len(per_rank) == 6 and all(err < 2e-2 for err in per_rank.values()), (rank, per_rank)
