"""The layers captured in emulated graphs (:class:`tilelink.runtime.graphs.EmulatedGraph`): ``TPMLP`` (with a
context, without, FP8), ``sp_attention`` and ``SPAttention``, ``TPDecoderLayer`` and ``TPDecoder`` (dense and MoE),
each recorded once and replayed with new data written into the captured inputs, rank 1 late on the second replay,
then called uncaptured and replayed again, every replay against torch in float64, on the race-exposing schedule."""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.layer_graph_worlds import layer_replays_match_torch

#: the forms without a decoder (any world size: the attention's heads are not split)
LAYERS = ("TPMLP", "TPMLP without context", "TPMLP fp8", "sp_attention", "SPAttention")


def _check(per_rank: list[dict[str, list[float]]], forms: tuple[str, ...], replays: int) -> None:
    for label in forms:
        for errors in (r[label] for r in per_rank):
            assert len(errors) == replays + 3, (label, per_rank)  # every step ran, no timeout
            assert max(errors) < 1e-5, (label, per_rank)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 3])
def test_layers_replay_with_new_data_match_torch(world: int) -> None:
    """14 tokens over 3 ranks (5, 5, 4 rows); the MLP's intermediate size 20 splits unevenly; the attention has 2
    query heads and 1 KV head. Without a context the MLP's M and the attention's S are exchanged on the host at the
    capture, which a replay keeps (the shapes do not change)."""
    per_rank = tilelink.spawn(layer_replays_match_torch, world, LAYERS, 3, 0.5 if world > 1 else 0.0)
    _check(per_rank, LAYERS, 3)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_decoders_replay_with_new_data_match_torch(world: int) -> None:
    """One decoder layer (RoPE tables the caller made before the capture) and the 2-layer decoder whole (its RoPE
    tables made inside it, on each replay), the "tiny" configuration (GQA: 4 heads, 2 KV heads), 2 sequences of 7
    tokens; the same contexts serve both layers in one graph."""
    forms = ("TPDecoderLayer", "TPDecoder")
    _check(tilelink.spawn(layer_replays_match_torch, world, forms, 3, 0.5 if world > 1 else 0.0), forms, 3)


@pytest.mark.slow
def test_moe_decoder_replays_with_new_data_match_torch() -> None:
    """The "tiny-moe" decoder (8 experts, top-2) captured whole at 2 ranks: each layer's router, the routing's
    all-gather and both grouped GEMMs replay with the new tokens' routing."""
    forms = ("TPDecoder moe",)
    _check(tilelink.spawn(layer_replays_match_torch, 2, forms, 3, 0.5), forms, 3)
