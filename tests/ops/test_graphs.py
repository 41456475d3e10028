"""Captured calls in emulated worlds: a call recorded once (:class:`tilelink.runtime.graphs.EmulatedGraph`) and
replayed with its recorded arguments, new data written into the captured tensors before each replay, as a CUDA
graph replays its nodes."""

from __future__ import annotations

import math

import pytest

import tilelink
from tests.ops.graph_worlds import (
    AR_FORMS,
    FORMS,
    a_replay_a_peer_skips_times_out,
    all_reduce_replays_match_torch,
    operators_replay_their_own_tensor_work,
    refusals,
    replays_match_torch,
)


def _worst(per_rank: list[dict[str, list[float]]], label: str) -> float:
    return max(max(errors) for errors in (r[label] for r in per_rank))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_replays_with_new_data_match_torch(world: int) -> None:
    """Every form of ag_gemm and gemm_rs, three replays with new data, rank 1 late on the second: each replay waits
    for the peers' data of that replay, not the last one's; then uncaptured calls and a replay again. K = 48: every
    rank's slice of K suits the persistent kernels' descriptors."""
    per_rank = tilelink.spawn(replays_match_torch, world, 37, 20, 48, 3, 0.5)
    for label in FORMS:
        assert _worst(per_rank, label) < 1e-5, (label, per_rank)


@pytest.mark.slow
def test_operators_replay_their_own_tensor_work() -> None:
    """The operators captured whole: the work they do to tensors around their launches (casts, a per-tensor FP8
    scale expanded per row) runs again on each replay, with the new inputs and scale, as on a GPU."""
    for per_rank in tilelink.spawn(operators_replay_their_own_tensor_work, 2, 13, 16, 32):
        assert all(err < 1e-2 for err in per_rank.values()), per_rank


@pytest.mark.slow
def test_one_rank_replays_match_torch() -> None:
    """A world of one: the captured call runs the kernel against satisfied channels, nothing counted."""
    per_rank = tilelink.spawn(replays_match_torch, 1, 19, 12, 16, 2, 0.0, ("ag_gemm sm_pull", "gemm_rs sm_pull"))
    assert _worst(per_rank, "ag_gemm sm_pull") < 1e-5 and _worst(per_rank, "gemm_rs sm_pull") < 1e-5, per_rank


@pytest.mark.slow
def test_a_count_frozen_at_capture_is_seen(monkeypatch) -> None:
    """The same replays with the call count left as it was at capture (what a count kept on the host would give a
    graph): every form gives a wrong result or a timed-out wait, so the replays above prove the count advances."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    per_rank = tilelink.spawn(replays_match_torch, 2, 37, 20, 48, 3, 0.5, tuple(FORMS), False)
    for label in FORMS:
        assert _worst(per_rank, label) > 1e-3 or math.isinf(_worst(per_rank, label)), (label, per_rank)


@pytest.mark.slow
def test_a_wait_inside_a_replay_is_bounded_and_raised_at_the_next_check() -> None:
    """Rank 1 never replays: rank 0's replay ends anyway (its waits are bounded on the device), and the record
    is raised as WaitTimeout by the next uncaptured check, naming the handshake with rank 1."""
    message, skipped = tilelink.spawn(a_replay_a_peer_skips_times_out, 2, 16, 8, 16)
    assert skipped == "skipped"
    assert "handshake" in message and "NO TIMEOUT" not in message, message


@pytest.mark.slow
def test_a_replay_timeout_left_unchecked_is_raised_by_finalize() -> None:
    message, skipped = tilelink.spawn(a_replay_a_peer_skips_times_out, 2, 16, 8, 16, False)
    assert skipped == "skipped"
    assert "handshake" in message and "NO TIMEOUT" not in message, message


def test_what_cannot_be_captured_is_refused_and_says_why() -> None:
    """A first call with new shapes (it would allocate and load kernels: ag_gemm's, gemm_ar's) and MoE on a routing
    made outside the capture (its counts were read on the host: a replay would reuse them)."""
    (messages,) = tilelink.spawn(refusals, 1)
    assert "call it once outside the capture" in messages[0], messages
    assert "cannot be captured" in messages[1] and "pass topk_ids itself" in messages[1], messages
    assert "cannot be captured" in messages[2] and "call it once outside the capture" in messages[2], messages


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_gemm_all_reduce_replays_with_new_data_match_torch(world: int, monkeypatch) -> None:
    """gemm_ar one-shot and two-shot and TPMLP(output="all_reduce"), the fused kernel: three replays with new data,
    rank 1 late on the second (each replay sums the peers' partial sums of that replay, and the two-shot's shared
    rows of that replay); then uncaptured calls and a replay again. M = 19 rows over 2 row tiles; gemm_ar's K = 26
    and the MLP's intermediate size N = 20 split unevenly over 3 ranks."""
    monkeypatch.setenv("TILELINK_PATH", "overlap")  # the MLP's gemm_ar: the fused kernel, not the plain path
    per_rank = tilelink.spawn(all_reduce_replays_match_torch, world, 19, 20, 26, 3, 0.5 if world > 1 else 0.0)
    for label in AR_FORMS:
        assert _worst(per_rank, label) < 1e-5, (label, per_rank)
        assert all(len(r[label]) == 6 for r in per_rank), (label, per_rank)  # every step ran, no timeout


@pytest.mark.slow
def test_a_gemm_all_reduce_count_frozen_at_capture_is_seen(monkeypatch) -> None:
    """gemm_ar's replays with the call count left as it was at capture: a wrong result or a timed-out wait in each
    algorithm, so the replays above prove that the partial sums' channels and the two-shot's share flags count on
    the device."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    forms = ("gemm_ar one_shot", "gemm_ar two_shot")
    per_rank = tilelink.spawn(all_reduce_replays_match_torch, 2, 19, 20, 26, 3, 0.5, forms, False)
    for label in forms:
        assert _worst(per_rank, label) > 1e-3 or math.isinf(_worst(per_rank, label)), (label, per_rank)


@pytest.mark.slow
def test_a_gemm_all_reduce_wait_inside_a_replay_is_raised_at_the_next_check() -> None:
    """Rank 1 never replays gemm_ar: rank 0's replay ends anyway and its record is raised as WaitTimeout by the
    kernel's next check, naming the device barrier's handshake with rank 1."""
    message, skipped = tilelink.spawn(a_replay_a_peer_skips_times_out, 2, 5, 8, 16, True, "gemm_ar")
    assert skipped == "skipped"
    assert "handshake" in message and "NO TIMEOUT" not in message, message
