"""Every wait and notify the rewrite inserts into the kernels of :mod:`tilelink.ops` is needed, and the
race-exposing schedule sees it go: for each operator, each overlapped kernel it launches in the emulated world
(the pointer kernel, and the persistent tensor-descriptor one on the copy engine that ``persistent=True`` forces),
and each inserted ``tll.consumer_tile_wait*`` / ``tll.producer_tile_notify*`` call of it, the operator run at
world 2 with that one call dropped (``tests.rules.mutations.mutant``) fails: a result that is not torch's (a
poisoned row read), or a wait that times out (a channel never notified). The unmutated kernel gives torch's
result on the same call first. tests/rules/test_mutations.py does the same for the golden cases."""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.operator_mutants import VARIANTS, run_operator_mutants

pytestmark = pytest.mark.slow

#: kernels an operator launches whose rewrite inserts no wait or notify, and why none is needed
NO_POINTS = {
    # the hybrid reduce-scatter (via="copy_engine"): a rank's tokens spread over every expert, so its rows are
    # complete only after the sweep's last tile; the top-k reduction and the copies run behind the whole kernel
    # on its stream (ReduceScatterLauncher._launch_hybrid), not on per-tile notifies (ops/moe_kernels.py)
    "group_gemm_rs_sweep_kernel": "ordered behind the whole kernel on its stream",
}

#: mutants that survive because the protocol does not need the dropped call (none: every one is caught)
COVERED: dict[str, str] = {}


@pytest.mark.parametrize("op", sorted(VARIANTS))
def test_dropping_any_inserted_wait_or_notify_of_an_operator_is_caught(op: str, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")  # a missing notify times out its peer's wait in 2 s
    results = tilelink.spawn(run_operator_mutants, 2, op)
    points = results[0]["points"]
    assert set(points) == {name for _, name, _ in VARIANTS[op]}
    assert {name for name, n in points.items() if n == 0} == set(NO_POINTS) & set(points), points
    assert sum(points.values()) > 0, f"{op}: no kernel it launches has an inserted wait or notify"
    for rank, result in enumerate(results):
        assert result["points"] == points, (rank, result["points"], points)
        for name, outcome in result["baseline"].items():
            assert outcome == "passed", f"rank {rank}: {name} unmutated: {outcome}"
        assert [what for what, _ in result["mutants"]] == [what for what, _ in results[0]["mutants"]]
    assert len(results[0]["mutants"]) == sum(points.values())
    errors = [f"rank {rank}: {what} -> {outcome}" for rank, result in enumerate(results)
              for what, outcome in result["mutants"] if outcome.startswith("error")]
    assert not errors, "\n".join(errors)
    # a mutant is caught when some rank fails with it (the other may read only its own rows, or see nothing
    # missing of the channels it waits for)
    caught = {what for result in results for what, outcome in result["mutants"] if outcome.startswith("failed")}
    missed = [f"rank {rank}: {what} -> {outcome}" for rank, result in enumerate(results)
              for what, outcome in result["mutants"] if what not in caught and what.split(" ")[0] not in COVERED]
    assert not missed, "\n".join(missed)
