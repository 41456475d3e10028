"""Every golden case, launched per the contract in emulated worlds of 1-4 ranks (non-divisible
sizes: M=50, K=40, 37 KV rows, 77 elements ...), equals torch on the full problem; also after the GPU's
first-call warm-up (every kernel run once against scratch channels), which must change nothing. The worlds run
on the race-exposing schedule (tests/conftest.py), and once on the partner kernels' own schedule (the SM
producers and consumers, which the race-exposing schedule stands in for)."""

from __future__ import annotations

import pytest

import tilelink
from tests.rules.cases import CASES, run_cases, run_cases_warmed_up

pytestmark = pytest.mark.slow  # 13-43 s a test on two cores


@pytest.mark.parametrize(("world", "warm_up", "races"), [
    (1, False, "1"), (2, False, "1"), (3, False, "1"), (4, False, "1"), (2, True, "1"), (3, False, "0")])
def test_every_case_matches_torch(world: int, warm_up: bool, races: str, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", races)
    names = sorted(CASES)
    results = tilelink.spawn(run_cases_warmed_up if warm_up else run_cases, world, names)
    failures = []
    for name in names:
        for rank, per_rank in enumerate(results):
            value = per_rank[name]
            if not isinstance(value, float):
                failures.append(f"{name} rank {rank} raised:\n{value}")
            elif not value < 1e-3:
                failures.append(f"{name} rank {rank}: max error {value}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("world", "races"), [(2, "1"), (3, "0")])
def test_all_gather_calls_back_to_back_with_a_slow_rank(world: int, races: str, monkeypatch) -> None:
    """No barrier between all-gather calls: new data every call, one rank a call behind, every result right."""
    monkeypatch.setenv("TILELINK_RACES", races)
    from tests.rules.cases import back_to_back_all_gathers

    wrong = [f"{case}, rank {rank} of {world}: max error {err}"
             for rank, errors in enumerate(tilelink.spawn(back_to_back_all_gathers, world))
             for case, err in errors.items() if not err < 1e-3]
    assert not wrong, "\n".join(wrong)
