"""ag_moe, moe_rs and TPMoE captured in emulated graphs (:class:`tilelink.runtime.graphs.EmulatedGraph`) and
replayed with new tokens and a new routing each time: the routing of fixed sizes (counted on the device, the grid
of the shape's worst case) against torch, on the race-exposing schedule."""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.moe_graph_worlds import (
    captured_ids_out_of_range,
    layer_captured_after_other_shapes,
    layer_replays_match_torch,
    moe_replays_match_torch,
    out_of_range_then_finalize,
)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_moe_operators_replay_new_routings(world: int) -> None:
    """Five replays, each with another routing (an expert with no slot, every token on expert 0, every token on
    experts 0 and 1 alone), then an uncaptured call and a replay again; M = 10 tokens, top_k = 2 of 4 experts, an
    intermediate size of 24 split unevenly over 3 ranks."""
    for per_rank in tilelink.spawn(moe_replays_match_torch, world, 10, 16, 24, 4, 2, 5):
        assert all(len(errors) == 7 for errors in per_rank.values()), per_rank
        assert all(err < 1e-5 for errors in per_rank.values() for err in errors), per_rank


@pytest.mark.slow
def test_moe_tensor_descriptor_kernels_replay_new_routings() -> None:
    """The same with the persistent AG kernel (copy-engine gather) and the RS column sweep (hybrid reduction)."""
    for per_rank in tilelink.spawn(moe_replays_match_torch, 2, 10, 16, 24, 4, 2, 5, True):
        assert all(err < 1e-5 for errors in per_rank.values() for err in errors), per_rank


@pytest.mark.slow
def test_the_plain_path_replays_new_routings_in_a_world_of_one() -> None:
    """path="plain" (the grouped GEMM as written, launched without a launcher): its launch is a step of the
    capture too."""
    (per_rank,) = tilelink.spawn(moe_replays_match_torch, 1, 10, 16, 24, 4, 2, 5, None, None, "plain")
    assert all(err < 1e-5 for errors in per_rank.values() for err in errors), per_rank


@pytest.mark.slow
def test_one_expert_per_token_replays_every_token_on_one_expert() -> None:
    """top_k = 1: a replay sends every token to expert 0, the other experts none."""
    for per_rank in tilelink.spawn(moe_replays_match_torch, 2, 9, 16, 24, 4, 1, 5):
        assert all(err < 1e-5 for errors in per_rank.values() for err in errors), per_rank


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_moe_layer_replays_new_routings(world: int) -> None:
    """TPMoE captured whole (router, top-k, the routing's all-gather, both grouped GEMMs): five replays with new
    tokens and a new router (an expert no token picks, every token's first choice expert 0), then an uncaptured call
    and a replay again."""
    for per_rank in tilelink.spawn(layer_replays_match_torch, world, 10, 16, 24, 4, 2, 5):
        assert len(per_rank) == 7 and all(err < 1e-5 for err in per_rank), per_rank


@pytest.mark.slow
def test_an_id_out_of_range_in_a_replay_is_raised_by_the_next_call() -> None:
    """A replay that routes an id past the last expert runs (the id clamped into range); the next uncaptured call
    raises it, naming the range; the call after it runs."""
    for first, second in tilelink.spawn(captured_ids_out_of_range, 2, 6, 16, 4):
        assert "replay of a captured MoE call" in first and "outside [0, 4)" in first and "max 6" in first, first
        assert second == "no error", second


@pytest.mark.slow
def test_an_id_out_of_range_in_the_last_replay_is_raised_by_finalize() -> None:
    """A replay that routes an id below expert 0 and no uncaptured call after it: tilelink.finalize() raises it on
    every rank, naming the range."""
    for message in tilelink.spawn(out_of_range_then_finalize, 2, 6, 16, 4):
        assert "replay of a captured MoE call" in message and "outside [0, 4)" in message, message
        assert "min -3" in message, message


@pytest.mark.slow
def test_the_layer_captured_after_calls_of_other_row_counts_replays() -> None:
    """TPMoE called on 8 tokens (rows 4 | 4 at 2 ranks), then on 7 (4 | 3), then captured on 8 and replayed: every
    rank gathers the counts the ranks hold at the capture (rank 0's own count, 4, was also its count at 7 tokens)."""
    for per_rank in tilelink.spawn(layer_captured_after_other_shapes, 2, (8, 7, 8), 16, 24, 4, 2, 2):
        assert len(per_rank) == 4 and all(err < 1e-5 for err in per_rank), per_rank
