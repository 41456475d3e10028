"""AG+GEMM, GEMM+RS and TPMLP in emulated worlds of 1-4 ranks against torch, odd shapes."""

from __future__ import annotations

import math

import pytest

import tilelink
from tests.ops.tp_worlds import (
    ag_gemm_back_to_back,
    bad_inputs,
    calls_with_a_late_host,
    mlp_matches_torch,
    ops_match_torch,
    uneven_slices_match_torch,
)


@pytest.mark.parametrize("world", [1, *(pytest.param(w, marks=pytest.mark.slow) for w in (2, 3, 4, 6))])
def test_ag_gemm_and_gemm_rs_match_torch(world: int) -> None:
    """World 6: the SM pull consumer's second group of four sources, two of them past the world."""
    for per_rank in tilelink.spawn(ops_match_torch, world, 37, 20, 33, "float32"):
        assert all(err < 1e-5 for err in per_rank.values()), per_rank


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize(("world", "M", "N", "K", "split"), [
    (2, 80, 24, 12, 2),  # 5 tiles of 16 rows on 4 programs: one wave, then one tile in two 8-column pieces
    (3, 70, 40, 8, 2),  # per-rank columns 14, 14, 12 (padded to 16 bytes): 4 tiles + the last in two pieces
    (1, 40, 48, 20, 2),  # 3 x 3 tiles on 4 programs: two waves, then one tile in two pieces
])
def test_persistent_ag_gemm_splits_its_last_wave(world: int, M: int, N: int, K: int, split: int) -> None:
    from tilelink.ops.contract import tail_split
    from tilelink.ops.tp import INTERPRETED_SMS

    widest = math.ceil(N / world)  # rank 0's columns, padded to 16 bytes of fp32
    tiles = math.ceil(M / 16) * math.ceil(math.ceil(widest / 4) * 4 / 16)
    assert tail_split(tiles, INTERPRETED_SMS, 16) == split  # the shapes do reach the split last wave
    for per_rank in tilelink.spawn(uneven_slices_match_torch, world, M, N, K, True):
        assert all(err < 1e-5 for err in per_rank.values()), per_rank


def test_tail_split_runs_the_last_wave_at_once() -> None:
    from tilelink.ops.contract import tail_split

    assert tail_split(704, 132, 256, narrowest=64) == 2  # AG+GEMM MLP-1 at world 8: 44 tiles left after 5 waves
    assert tail_split(1856, 132, 256, narrowest=64) == 4  # MLP-6: 8 tiles left
    assert tail_split(896, 132, 256, narrowest=64) == 1  # 104 left: two pieces each would not run at once
    assert tail_split(264, 132, 256, narrowest=64) == 1  # whole waves
    assert tail_split(30, 132, 256, narrowest=64) == 4  # one partial wave
    assert tail_split(1856, 132, 128, narrowest=64) == 2  # pieces of at least 64 columns


@pytest.mark.slow
def test_bf16_and_fp16() -> None:
    for dtype in ("bfloat16", "float16"):
        for per_rank in tilelink.spawn(ops_match_torch, 2, 29, 24, 40, dtype):
            assert all(err < 2e-2 for err in per_rank.values()), (dtype, per_rank)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 3])
def test_tp_mlp_matches_torch(world: int) -> None:
    for err in tilelink.spawn(mlp_matches_torch, world, 23, 16, 40):
        assert err < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ag_gemm_calls_back_to_back_with_a_lagging_rank(world: int) -> None:
    """No barrier between all-gather calls: new data every call, rank 1 behind the others, every product right
    on both the copy engine and the SM pull."""
    for rank, per_rank in enumerate(tilelink.spawn(ag_gemm_back_to_back, world, 37, 24, 32, 3)):
        assert all(err < 1e-5 for err in per_rank.values()), (rank, per_rank)


@pytest.mark.slow
def test_a_rank_late_between_calls_is_waited_for(monkeypatch) -> None:
    """Rank 1's host 2.5 s late between two calls, the wait budget 1 s: the all-gathers and the hybrid
    reduce-scatter wait for it at the call's handshake, longer than a wait's budget, and every result is right."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    for rank, per_rank in enumerate(tilelink.spawn(calls_with_a_late_host, 2, 37, 24, 32, 2.5)):
        assert all(err < 1e-5 for err in per_rank.values()), (rank, per_rank)


def test_bad_inputs_raise_before_running() -> None:
    (messages,) = tilelink.spawn(bad_inputs, 1)
    assert "NO ERROR" not in messages, messages
    assert "inner dimensions differ" in messages[0] and "different dtypes" in messages[1]
    assert "not supported" in messages[2] and "contiguous" in messages[3] and "2-D" in messages[4]
    assert "must hold rows [0, 50)" in messages[5]
