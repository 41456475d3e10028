"""Every inserted wait and notify is needed, and the race-exposing schedule sees it go: for each golden case,
each mutant that drops ONE of them fails (a wrong result, or a wait that times out naming its channel) in an
emulated world of 2 ranks, where the unmutated rewrite is correct (test_end_to_end.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tilelink
from tests.rules.mutations import run_mutants, run_start_read, run_store_after_notify

HERE = Path(__file__).parent
GOLDEN = sorted(f"{p.parent.name}_{p.name.removesuffix('.before.py')}" for p in HERE.glob("*/*.before.py"))

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", GOLDEN)
def test_dropping_any_inserted_wait_or_notify_is_caught(case: str, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")
    results = tilelink.spawn(run_mutants, 2, case)
    assert results[0], f"{case}: the rewrite inserted no wait or notify"
    missed = [f"rank {rank}: {what} -> {outcome}" for rank, outcomes in enumerate(results)
              for what, outcome in outcomes if not outcome.startswith("failed")]
    caught = {what for outcomes in results for what, outcome in outcomes if outcome.startswith("failed")}
    # a mutant is caught when some rank fails with it (the other may only see its peer's channels stay short)
    assert all(what in caught for what, _ in results[0]), "\n".join(missed)


@pytest.mark.parametrize("case", ["reduce_scatter_pointer_gemm", "reduce_scatter_vector_partial_sums"])
def test_a_store_after_its_notify_is_caught(case: str, monkeypatch) -> None:
    """The race-exposing schedule takes a channel's rows when its notifies complete it: a store moved after the
    notify that publishes it leaves poison in what the consumer reads."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")
    results = tilelink.spawn(run_store_after_notify, 2, case)
    assert any(outcome.startswith("failed") for outcomes in results for _, outcome in outcomes), results


@pytest.mark.parametrize("case", [c for c in GOLDEN if c.startswith("all_gather_")])
def test_reads_after_the_start_read_are_checked_on_its_schedule(case: str, monkeypatch) -> None:
    """On the schedule where every program's read at its start finds its channels (each delivered then), the
    programs pass their waits without polling: the rewrite is still correct, and a read that counts one channel
    fewer than the gather has leaves a program reading poison."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_RACES_START_READ", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")
    results = tilelink.spawn(run_start_read, 2, case)
    for rank, outcomes in enumerate(results):
        assert outcomes[0] == ("as generated", "passed"), (rank, outcomes)
    assert any(outcomes[1][1].startswith("failed") for outcomes in results), results
