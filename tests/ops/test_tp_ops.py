"""AG+GEMM, GEMM+RS and TPMLP in emulated worlds of 1-4 ranks against torch, odd shapes."""

from __future__ import annotations

import os
import sys

import pytest

import tilelink

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_worlds import bad_inputs, mlp_matches_torch, ops_match_torch, uneven_slices_match_torch  # noqa: E402


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ag_gemm_and_gemm_rs_match_torch(world: int) -> None:
    for per_rank in tilelink.spawn(ops_match_torch, world, 37, 20, 33, "float32"):
        assert all(err < 1e-5 for err in per_rank.values()), per_rank


@pytest.mark.parametrize(("world", "N", "K", "persistent"), [
    (3, 10, 12, True),  # AG on the persistent kernel, B columns 4, 4, 2: the last rank's rows are padded
    (3, 2, 12, True),  # AG persistent, B columns 1, 1, 0: a rank with none still serves its rows
    (3, 8, 10, True),  # RS on the persistent kernel, K 4, 4, 2: the last rank's A rows are padded
    (3, 8, 2, True),  # RS persistent, K 1, 1, 0: a rank with none still takes part
    (3, 2, 10, False),  # both on the pointer kernels, B columns 1, 1, 0
    (2, 9, 8, True),  # AG persistent, B columns 5, 4
])
def test_uneven_slices_take_one_kernel_on_every_rank(world: int, N: int, K: int, persistent: bool) -> None:
    # the persistent tensor-descriptor kernels a GPU takes, forced here in the interpreter
    for per_rank in tilelink.spawn(uneven_slices_match_torch, world, 19, N, K, persistent):
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
