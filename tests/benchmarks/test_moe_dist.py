"""The MoE benchmark's dist mode, started by the benchmark itself on 2 emulated ranks (no GPU here), on a
tiny MoE: every method it times (the torch loop, our non-overlapped grouped GEMM with collectives, the
overlapped operators) computes the same result."""

from __future__ import annotations

import pytest
import torch

from tilelink.benchmarks.moe import MoEShape, run_dist

pytestmark = pytest.mark.slow  # 18-33 s a test on two cores


def test_every_method_agrees(monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # not under a launcher: the benchmark starts the ranks
    record = run_dist([MoEShape("tiny", 16, 32, 16, 4, 2)], torch.float32, 1, 2)
    assert record["world"] == 2 and len(record["rows"]) == 1
    (row,) = record["rows"]
    assert set(row["rel_err"]) == {"tilelink_ag", "fused_ag", "tilelink_rs", "fused_rs"}
    assert all(err < 1e-5 for err in row["rel_err"].values()), row["rel_err"]
    assert set(row["speedup"]) == {"tilelink_ag_vs_torch", "tilelink_ag_vs_fused", "tilelink_rs_vs_torch",
                                   "tilelink_rs_vs_fused"}
    assert all(t > 0 for times in row["times_ms"].values() for t in times)


def test_profile_writes_a_trace_per_method_and_rank(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    record = run_dist([MoEShape("tiny", 16, 32, 16, 4, 2)], torch.float32, 1, 2, tmp_path)
    (row,) = record["rows"]
    names = {"tilelink_ag", "fused_ag", "tilelink_rs", "fused_rs"}
    assert set(row["timeline_us"]) == names  # device timelines: empty without a GPU
    assert set(row["host_ms"]) >= names and all(ms > 0 for ms in row["host_ms"].values())
    traces = sorted(p.name for p in tmp_path.iterdir())
    assert traces == sorted(f"tiny_{n}_r{r}.json" for n in names for r in (0, 1))
    assert all((tmp_path / t).stat().st_size > 0 for t in traces)


def test_routing_made_once_gives_the_same_results(monkeypatch) -> None:
    """``routing="once"``: the Routing is made before the timed calls and passed to the operators and to
    the fused path; every method still agrees with the torch loop."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    record = run_dist([MoEShape("tiny", 16, 32, 16, 4, 2)], torch.float32, 1, 2, routing="once")
    assert record["routing"] == "once"
    (row,) = record["rows"]
    assert row["routing"] == "once"
    assert set(row["rel_err"]) == {"tilelink_ag", "fused_ag", "tilelink_rs", "fused_rs"}
    assert all(err < 1e-5 for err in row["rel_err"].values()), row["rel_err"]
