"""GEMM + AllReduce (``tilelink.ops.gemm_ar``) and TPMLP's decode form in emulated worlds of 1-4 ranks against
torch: odd shapes, a single decode row, a rank with an empty K slice, both algorithms and the size's choice, the
same bits on every rank; the mutation test of its kernel's notify; the algorithm chosen by size."""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.ar_worlds import (
    empty_and_bad_inputs,
    gemm_ar_matches_torch,
    gemm_ar_mutants,
    mlp_all_reduce_matches_torch,
)

#: (M, N, K): one decode row, a few rows of odd sizes, more rows than a 16-row tile with a K that splits unevenly
SHAPES = [(1, 33, 50), (7, 40, 19), (37, 20, 9)]
MODES = [None, "one_shot", "two_shot"]


def _check(results: list[dict]) -> None:
    for rank, per_rank in enumerate(results):
        for case, (err, _) in per_rank.items():
            assert err < 1e-5, f"rank {rank}, {case}: relative error {err}"
    for case, (_, digest) in results[0].items():  # every rank sums the ranks in the same order
        assert all(per_rank[case][1] == digest for per_rank in results), f"{case}: the ranks' results differ"


def test_gemm_ar_matches_torch_alone() -> None:
    _check(tilelink.spawn(gemm_ar_matches_torch, 1, SHAPES[:2], MODES))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_gemm_ar_matches_torch(world: int) -> None:
    """World 4 with M = 1: the two-shot's rows are all rank 0's (the other ranks own no channel with a row)."""
    _check(tilelink.spawn(gemm_ar_matches_torch, world, SHAPES, MODES))


@pytest.mark.slow
def test_a_rank_with_no_k_slice_takes_part() -> None:
    """K = 2 over 3 ranks: slices of 1, 1 and 0 columns; the last rank adds zeros and gets the sum."""
    _check(tilelink.spawn(gemm_ar_matches_torch, 3, [(3, 17, 2)], ["one_shot", "two_shot"]))


@pytest.mark.slow
def test_gemm_ar_in_half_precision() -> None:
    results = tilelink.spawn(gemm_ar_matches_torch, 2, [(2, 24, 16)], MODES, "bfloat16")
    for per_rank in results:
        assert all(err < 2e-2 for err, _ in per_rank.values()), per_rank
    assert len({per_rank["M=2 N=24 K=16 mode=None"][1] for per_rank in results}) == 1


def test_empty_rows_and_bad_inputs() -> None:
    (out,) = tilelink.spawn(empty_and_bad_inputs, 1)
    assert out.pop("empty") == "(0, 5)"
    assert "output='all_gather'" in out.pop("mlp_output")
    for name, message in out.items():
        assert message.startswith("gemm_ar: "), (name, message)
    assert "three_shot" in out["mode"] and "TPContext.M=5" in out["ctx"] and "K slices differ" in out["inner"]


@pytest.mark.slow
def test_tp_mlp_all_reduce_output_matches_torch() -> None:
    errors = tilelink.spawn(mlp_all_reduce_matches_torch, 2, 3, 24, 40)
    assert all(err < 1e-5 for err in errors), errors


def test_the_algorithm_follows_the_message_size() -> None:
    from tilelink.rules.all_reduce.launcher import ONE_SHOT_PULL_BYTES, choose_mode

    assert choose_mode(16 * 1024, 8) == "one_shot"  # one decode token of 8192 bf16 columns
    assert choose_mode(256 * 8192 * 2, 8) == "two_shot"  # 256 tokens
    assert choose_mode(ONE_SHOT_PULL_BYTES, 2) == "one_shot" and choose_mode(ONE_SHOT_PULL_BYTES + 2, 2) == "two_shot"
    assert choose_mode(ONE_SHOT_PULL_BYTES // 3, 4) == "one_shot" and choose_mode(ONE_SHOT_PULL_BYTES // 2, 4) == \
        "two_shot"


@pytest.mark.slow
def test_dropping_the_inserted_notify_is_caught(monkeypatch) -> None:
    """Each algorithm at world 2, with the kernel's one inserted notify dropped: the reduction's wait for that
    channel times out (or reads rows never published)."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")
    results = tilelink.spawn(gemm_ar_mutants, 2, timeout=900)  # each mutant's waits run out their budget
    assert set(results[0]) == {"one_shot", "two_shot"}
    for mode, entry in results[0].items():
        assert entry["points"] >= 1, (mode, entry)
        for rank, result in enumerate(results):
            assert result[mode]["baseline"] == "passed", (rank, mode, result[mode]["baseline"])
        caught = {what for result in results for what, outcome in result[mode]["mutants"]
                  if outcome.startswith("failed")}
        assert len(caught) == entry["points"], (mode, [result[mode]["mutants"] for result in results])
