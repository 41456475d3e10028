"""``ag_gemm`` and ``gemm_rs`` keep what their checks and choices computed per form of call: a call of a form seen
before is refused, or computed, exactly as a first one."""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.plan_worlds import (
    kept_plans_compute_the_same,
    one_row_views_of_wider_rows,
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
