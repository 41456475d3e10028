"""The layers captured in CUDA graphs on the GPU: ranks sharing one GPU through NVSHMEM, each layer captured once
(after an uncaptured call that makes its contexts and loads its kernels) and replayed 20 times with new bf16 data
written into the captured inputs, then called uncaptured twice and replayed again, every replay against torch in
float64. ``TPMLP`` with a context and ``sp_attention`` are in ``test_graphs_gpu.py``, ``TPMoE`` in
``test_moe_graphs_gpu.py``."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.layer_graph_worlds import layer_replays_match_torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]

REPLAYS = 20


def _replays(world: int, forms: tuple[str, ...]) -> list[dict[str, list[float]]]:
    return tilelink.spawn(layer_replays_match_torch, world, forms, REPLAYS, 0.0, True, backend="nvshmem", timeout=500)


def _check(per_rank: list[dict[str, list[float]]], forms: tuple[str, ...], tolerance: float) -> None:
    for rank, results in enumerate(per_rank):
        for label in forms:
            errors = results[label]
            assert len(errors) == REPLAYS + 3, (rank, label, errors)  # every step ran, no timeout
            assert max(errors) < tolerance, (rank, label, errors)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_captured_layers_replay_with_new_data(world: int, heap_for_ranks) -> None:
    """TPMLP without a context (M exchanged on the host at the capture) and FP8 (tokens and activation quantised
    per row inside the capture; compute capability 8.9 or newer), and SPAttention without seq_len (S exchanged):
    202 tokens, not a multiple of 4; hidden and intermediate 512; 4 query heads, 2 KV heads of 64."""
    heap_for_ranks(world)
    forms = ("TPMLP without context", "SPAttention")
    if torch.cuda.get_device_capability() >= (8, 9):
        forms += ("TPMLP fp8",)
    _check(_replays(world, forms), forms, 2e-2)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_captured_decoders_replay_with_new_data(world: int, heap_for_ranks) -> None:
    """TPDecoderLayer (RoPE tables made before the capture) and TPDecoder whole, the "small" configuration (hidden
    512, 8 heads, 4 KV heads of 64, intermediate 1376) with 2 layers, 2 sequences of 101 tokens: the same contexts
    serve both layers in one graph. bf16 through two layers against the float64 model."""
    heap_for_ranks(world)
    forms = ("TPDecoderLayer", "TPDecoder")
    _check(_replays(world, forms), forms, 5e-2)


@pytest.mark.parametrize("world", [1, 2])
def test_captured_moe_decoder_replays_with_new_data(world: int, heap_for_ranks) -> None:
    """TPDecoder on the "small" configuration made an MoE (4 experts of intermediate 256, every token on all 4:
    the routing weights change with the tokens, no bf16 near-tie can pick another expert than the reference's).
    Its routing's all-gather is a torch.distributed collective: ranks that share one GPU cannot form the NCCL group
    a capture needs, and their capture is refused, saying so."""
    heap_for_ranks(world)
    forms = ("TPDecoder moe",)
    if world > 1 and torch.cuda.device_count() < world:
        with pytest.raises(tilelink.LaunchError, match="share a GPU cannot form an NCCL group"):
            _replays(world, forms)
        return
    _check(_replays(world, forms), forms, 5e-2)
