"""``ag_gemm`` and ``gemm_rs`` keep what their checks and choices computed per form of call: a call of a form seen
before is refused, or computed, exactly as a first one."""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.plan_worlds import (
    kept_forms_hold_no_call_tensor,
    kept_plans_compute_the_same,
    one_row_views_of_wider_rows,
    prepared_launches,
    refused_after_kept_calls,
    unkept_without_a_context,
)


def test_a_bad_call_after_kept_calls_is_refused_with_the_same_message() -> None:
    ((fresh, after),) = tilelink.spawn(refused_after_kept_calls, 1)
    assert "NO ERROR" not in fresh.values(), fresh
    assert after == fresh
    assert "inner dimensions differ" in fresh["ag shape"] and "different dtypes" in fresh["ag dtype"]
    assert "not supported" in fresh["ag unsupported"] and "is on meta" in fresh["ag device"]
    assert "contiguous" in fresh["ag contiguous"] and "must hold rows [0, 50)" in fresh["ag rows"]
    assert "TPContext.M=8.0 must be a non-negative int" in fresh["ag M type"]
    assert "path='fast'" in fresh["ag path"] and "path='fast'" in fresh["rs path"]
    assert "is on meta" in fresh["rs device"] and "contiguous" in fresh["rs contiguous"]


def test_kept_plans_compute_the_same_and_the_environment_still_counts() -> None:
    (out,) = tilelink.spawn(kept_plans_compute_the_same, 1)
    assert max(out["errors"].values()) < 1e-5, out["errors"]
    # one plan per operator and kernel: the second call, and the one at an odd address, reused it
    assert out["kept"] == {"ag": 2, "rs": 2}, out
    assert out["persistent"] == {"ag": [False, True], "rs": [False, True]}, out  # both kernels ran
    assert out["new world"] == {"ag": 1, "rs": 1}, out  # a new world made its own
    assert all("TILELINK_PATH='fast'" in m for m in out["path"].values()), out["path"]


@pytest.mark.slow
def test_the_shard_sizes_are_exchanged_at_each_call_without_a_context() -> None:
    for out in tilelink.spawn(unkept_without_a_context, 2, 13, 6, 10):
        assert max(out["errors"]) < 1e-5, out
        assert out["unkept"] == [0, 1] and out["ag kept"] == 1 and out["rs kept"] == 1, out


def test_one_row_views_reach_the_descriptors_as_copies() -> None:
    (errors,) = tilelink.spawn(one_row_views_of_wider_rows, 1)
    assert max(errors) < 1e-4, errors


def test_a_world_of_one_launches_a_kept_form_without_the_launch_path() -> None:
    """A call of a form seen before launches the launch prepared for it, with the wait check at each call; another
    dtype takes the launch path once, a stride is refused, a capture and the call after a timed-out wait take the
    launch path (recorded; refused), a new world starts again."""
    (out,) = tilelink.spawn(prepared_launches, 1)
    assert max(out["errors"].values()) < 1e-3, out["errors"]
    seen = out["seen"]  # (ag_gemm's launch paths, gemm_rs's, wait checks of the step's two calls)
    assert seen["first"][2] == 2 and seen["new form"] == (1, 1, 2), seen  # the fp16 form: the launch path
    for step in ("again", "odd", "float again", "after capture"):  # kept forms, at an odd address too
        assert seen[step][2] == 2, (step, seen)
    assert seen["again"][:2] == seen["odd"][:2] == seen["float again"][:2] == (1, 1), seen
    assert seen["captured"][:2] == (2, 2) and seen["after capture"][:2] == (2, 2), seen
    assert seen["new world"][:2] == (3, 3) and seen["new world again"][:2] == (3, 3), seen
    assert all("must be contiguous" in m for m in out["messages"].values()), out["messages"]
    assert "consumer_tile_wait on channel/tile 1" in out["raised"]["ag timeout"], out["raised"]
    assert "an earlier call on this rank had a wait time out" in out["raised"]["ag after"], out["raised"]
    assert out["kinds"] == [("TritonLaunch", 0)], out["kinds"]  # the interpreter: Triton's own launch, prepared


@pytest.mark.parametrize("world", [1, 2])
def test_kept_forms_let_go_of_each_calls_tensors(world: int) -> None:
    """The launches kept for a form of call (a world of one's, and with peers the all-gather's and the hybrid
    reduce-scatter's) do not keep the operands and results of the call they were made from."""
    for out in tilelink.spawn(kept_forms_hold_no_call_tensor, world):
        assert out["prepared"] == (["AloneLaunch"] * 2 if world == 1 else ["GatherLaunch", "ScatterLaunch"]), out
        assert not any(any(step) for step in out["alive"]), out
