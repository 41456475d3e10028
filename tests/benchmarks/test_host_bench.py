"""``tlxform bench host`` on a CPU: the record it writes (every method's host and wall time per round, the
operators checked against the reference, rank 0's profile of their calls) and the table it prints, on one
emulated rank and a tiny MLP (the interpreter's kernels are inside the host time here: a check of the
plumbing, not a measurement)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from click.testing import CliRunner

from tilelink.benchmarks.common import MLPShape
from tilelink.benchmarks.host import PROFILE_TOP, host_times, profile_calls, run, summarize
from tilelink.cli.main import main


def test_host_times_are_per_call_and_the_wall_includes_them() -> None:
    calls = []

    def slow():
        calls.append("slow")
        time.sleep(0.002)

    def broken():
        raise RuntimeError("no collective here")

    barriers = []
    host, cpu, wall, errors = host_times({"slow": slow, "broken": broken, "fast": lambda: calls.append("fast")}, 3, 2,
                                    torch.device("cpu"), lambda: barriers.append(1))
    assert calls == ["slow"] * 3 + ["fast"] * 3 + ["fast"] * 3 + ["slow"] * 3  # the first of a round rotates
    assert len(barriers) == 5  # every rank meets before each method's round (the broken one's first only)
    assert set(host) == set(cpu) == set(wall) == {"slow", "fast"}
    assert errors == {"broken": "RuntimeError: no collective here"}
    assert len(host["slow"]) == 2 and all(2000 <= h <= w for h, w in zip(host["slow"], wall["slow"], strict=True))
    assert max(host["fast"]) < 2000 and max(cpu["slow"]) < 1000  # asleep: no CPU time


def test_the_profile_names_the_call_path_per_call() -> None:
    def inner():
        return sum(range(2000))

    def outer():
        return inner() + inner()

    prof = profile_calls(outer, 4, torch.device("cpu"), top=3)
    assert prof["calls"] == 4 and len(prof["by_own"]) == len(prof["by_cumulative"]) == 3
    rows = {row["function"].rsplit("(", 1)[-1]: row for row in prof["by_cumulative"]}
    assert rows["outer)"]["calls"] == 1 and rows["inner)"]["calls"] == 2  # per call of outer
    assert rows["outer)"]["cum_us"] >= rows["inner)"]["cum_us"] > 0
    assert prof["by_own"][0]["own_us"] >= prof["by_own"][-1]["own_us"]


@pytest.mark.slow  # a rank started with the interpreter's kernels: 10-30 s on two busy cores
def test_the_record_holds_every_method_round_and_profile(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # not under a launcher: the benchmark starts the ranks
    record = run(worlds=(1,), out=tmp_path, dtype="fp32", calls=1, rounds=2, warm=0,
                 custom=MLPShape("tiny", 16, 16, 8, "test"))
    assert json.loads((tmp_path / "host_tiny_fp32.json").read_text()) == record
    assert record["benchmark"] == "host" and record["calls"] == 1 and record["rounds"] == 2
    (world,) = record["worlds"]
    assert world["world"] == 1 and [r["rank"] for r in world["ranks"]] == [0]
    parts = world["ranks"][0]["parts"]
    assert set(parts) == {"ag_gemm", "gemm_rs"}
    for part, baselines in (("ag_gemm", "torch.matmul+all_gather"), ("gemm_rs", "torch.matmul+reduce_scatter")):
        p = parts[part]
        assert p["errors"] == {} and p["rel_err"] < 1e-5, p
        assert set(p["host_us"]) == set(p["cpu_us"]) == set(p["wall_us"]) == {"tilelink", "torch.matmul", baselines}
        for name, host in p["host_us"].items():
            assert len(host) == 2 and all(0 < h <= w for h, w in zip(host, p["wall_us"][name], strict=True))
        prof = p["profile"]
        assert prof["calls"] == 1 and 0 < len(prof["by_own"]) <= PROFILE_TOP
        assert all(set(row) == {"function", "calls", "own_us", "cum_us"} for row in prof["by_own"])
        own = [row["own_us"] for row in prof["by_own"]]
        assert own == sorted(own, reverse=True)
        # the operator itself is on the call path, under the benchmark's call of it
        assert any(row["function"].startswith("ops/tp.py") and row["function"].endswith(f"({part})")
                   for row in prof["by_cumulative"])
    text = summarize(record)
    assert "    1 ag_gemm  tilelink" in text and "torch.matmul+reduce_scatter" in text
    assert "world 1 gemm_rs: rank 0's profile" in text


def test_the_summary_gives_each_method_over_torch_matmul_of_the_same_run() -> None:
    """The slowest rank's median round of each method, and its host time over ``torch.matmul``'s (the steadier number
    on a host whose speed moves from run to run); no ratio where a part has no ``torch.matmul``."""

    def part(tilelink: list[float], matmul: list[float] | None) -> dict:
        times = {"tilelink": tilelink, **({"torch.matmul": matmul} if matmul else {})}
        return {"host_us": times, "cpu_us": times, "wall_us": {k: [v * 10 for v in t] for k, t in times.items()},
                "errors": {}}

    record = {"worlds": [{"world": 2, "ranks": [
        {"rank": 0, "parts": {"gemm_rs": part([100.0, 120.0], [20.0, 20.0]), "ag_gemm": part([50.0, 50.0], None)}},
        {"rank": 1, "parts": {"gemm_rs": part([130.0, 150.0], [19.0, 21.0]), "ag_gemm": part([60.0, 70.0], None)}},
    ]}]}
    lines = summarize(record).splitlines()
    assert lines[0].split()[-2:] == ["/", "matmul"]
    rows = {tuple(line.split()[1:3]): line.split()[3:] for line in lines[1:]}
    assert rows[("gemm_rs", "tilelink")] == ["140.0", "140.0", "1400.0", "7.0x"]
    assert rows[("gemm_rs", "torch.matmul")] == ["20.0", "20.0", "200.0", "1.0x"]
    assert rows[("ag_gemm", "tilelink")] == ["65.0", "65.0", "650.0", "-"]


def test_worlds_must_be_sizes() -> None:
    for bad in ("0", "1,x", ""):
        result = CliRunner().invoke(main, ["bench", "host", "--worlds", bad])
        assert result.exit_code == 2 and "--worlds" in result.output, result.output
