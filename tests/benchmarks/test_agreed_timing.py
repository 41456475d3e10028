"""Timing a function that calls collectives: every rank must call it equally often, or the ranks wait for
each other forever. ``tilelink.benchmarks.common.time_ms(fn, device, group)`` agrees on the counts; checked on
gloo CPU ranks whose calls take different times."""

from __future__ import annotations

import time

import pytest

from tests.benchmarks.gloo_ranks import run_on_gloo_ranks

pytestmark = pytest.mark.slow  # about 7 s on two cores


def _time_both(rank: int, world: int) -> tuple[dict, dict, dict]:
    import torch
    import torch.distributed as dist

    from tilelink.benchmarks.common import side_by_side

    calls = {"slow_on_one_rank": 0, "collective": 0}
    t = torch.ones(4)

    def slow_on_one_rank():  # each rank's own estimate would ask for a different number of calls
        calls["slow_on_one_rank"] += 1
        time.sleep(0.004 if rank == 1 else 0.0005)

    def collective():
        calls["collective"] += 1
        dist.all_reduce(t)

    host: dict = {}
    times = side_by_side({"slow_on_one_rank": slow_on_one_rank, "collective": collective}, 2, "cpu",
                         group=dist.group.WORLD, host=host)
    return calls, times, host


def test_ranks_call_a_collective_function_equally_often() -> None:
    results = run_on_gloo_ranks(_time_both, 2)
    assert results[0][0] == results[1][0]  # the same number of calls of each function on both ranks
    assert results[0][0]["slow_on_one_rank"] >= 2 * (1 + 3 + 1)  # per round: estimate, warm-up, >= 3 timed
    for _calls, times, host in results.values():
        assert all(len(t) == 2 and all(x > 0 for x in t) for t in times.values())
        assert set(host) == set(times) and all(len(h) == 2 for h in host.values())  # the host's time per call
    assert min(results[1][1]["slow_on_one_rank"]) >= 3.5 > max(results[0][1]["slow_on_one_rank"])
    assert min(results[1][2]["slow_on_one_rank"]) >= 3.5 > max(results[0][2]["slow_on_one_rank"])
