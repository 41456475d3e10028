"""AG+GEMM, GEMM+RS and TPMLP in emulated worlds of 1-4 ranks against torch, odd shapes."""

from __future__ import annotations

import os
import sys

import pytest

import tilelink

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_worlds import bad_inputs, mlp_matches_torch, ops_match_torch  # noqa: E402


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ag_gemm_and_gemm_rs_match_torch(world: int) -> None:
    for per_rank in tilelink.spawn(ops_match_torch, world, 37, 20, 33, "float32"):
        assert all(err < 1e-5 for err in per_rank.values()), per_rank


def test_bf16_and_fp16() -> None:
    for dtype in ("bfloat16", "float16"):
        for per_rank in tilelink.spawn(ops_match_torch, 2, 29, 24, 40, dtype):
            assert all(err < 2e-2 for err in per_rank.values()), (dtype, per_rank)


@pytest.mark.parametrize("world", [1, 3])
def test_tp_mlp_matches_torch(world: int) -> None:
    for err in tilelink.spawn(mlp_matches_torch, world, 23, 16, 40):
        assert err < 1e-4


def test_bad_inputs_raise_before_running() -> None:
    (messages,) = tilelink.spawn(bad_inputs, 1)
    assert "NO ERROR" not in messages, messages
    assert "inner dimensions differ" in messages[0] and "different dtypes" in messages[1]
    assert "not supported" in messages[2] and "contiguous" in messages[3] and "2-D" in messages[4]
    assert "must hold rows [0, 50)" in messages[5]
