"""ag_moe, moe_rs and TPMoE captured in CUDA graphs on the GPU: ranks sharing one GPU through NVSHMEM, each
captured once (after an uncaptured call that compiles and loads every kernel, those of the captured form too) and
replayed 20 times with new data and a new routing (an expert with no slot, every token on expert 0, every token on
experts 0 and 1 alone), then called uncaptured and replayed again, every replay against torch."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.moe_graph_worlds import layer_replays_match_torch, moe_replays_match_torch, warm_up_launches_once

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("persistent", [None, False])
@pytest.mark.parametrize("M", [4, 600])
@pytest.mark.parametrize("world", [1, 2])
def test_captured_moe_operators_replay_new_routings(world: int, M: int, persistent, heap_for_ranks) -> None:
    """A decode batch of 4 tokens and 600 (not a multiple of the world size); 8 experts, top_k 2, hidden 512,
    intermediate 512 (the RS part's inner dimension 256 a rank at world 2). ``persistent=None``: the GPU's kernels
    (the persistent AG kernel with the copy-engine gather, the RS column sweep); ``False``: the pointer kernels."""
    heap_for_ranks(world)
    for rank, per_rank in enumerate(tilelink.spawn(moe_replays_match_torch, world, M, 512, 512, 8, 2, 20, persistent,
                                                   True, backend="nvshmem")):
        assert all(len(errors) == 22 for errors in per_rank.values()), (rank, per_rank)
        assert all(err < 2e-2 for errors in per_rank.values() for err in errors), (rank, per_rank)


@pytest.mark.parametrize("world", [1, 2])
def test_captured_moe_layer_replays_new_routings(world: int, heap_for_ranks) -> None:
    """TPMoE, 64 tokens. Its routing's all-gather is a torch.distributed collective: with a GPU per rank an NCCL
    group captures it; ranks that share one GPU cannot form one, and their capture is refused, saying so."""
    heap_for_ranks(world)
    if torch.cuda.device_count() < world:
        with pytest.raises(tilelink.LaunchError, match="share a GPU cannot form an NCCL group"):
            tilelink.spawn(layer_replays_match_torch, world, 64, 512, 512, 8, 2, 20, True, backend="nvshmem")
        return
    for rank, per_rank in enumerate(tilelink.spawn(layer_replays_match_torch, world, 64, 512, 512, 8, 2, 20, True,
                                                   backend="nvshmem")):
        assert len(per_rank) == 22 and all(err < 2e-2 for err in per_rank), (rank, per_rank)


@pytest.mark.parametrize("persistent", [None, False])
@pytest.mark.parametrize("world", [1, 2])
def test_the_first_call_loads_the_captured_form_without_running_it(world: int, persistent, heap_for_ranks) -> None:
    """The first uncaptured call of a shape launches each grouped GEMM once: the captured form's kernels (the
    worst-case grid and tile, the fixed routing's) are compiled and loaded, not run, and the capture after it
    finds them loaded; one replay and an uncaptured call after it against torch."""
    heap_for_ranks(world)
    for rank, (counts, errors) in enumerate(tilelink.spawn(warm_up_launches_once, world, 600, 512, 512, 8, 2,
                                                           persistent, backend="nvshmem")):
        assert len(counts) == 2 and all(n == 3 for n in counts.values()), (rank, counts)
        assert all(err < 2e-2 for errs in errors.values() for err in errs), (rank, errors)
