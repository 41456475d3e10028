"""Timing a function that calls collectives: every rank must call it equally often, or the ranks wait for
each other forever. ``benchmarks.common.time_ms(fn, device, group)`` agrees on the counts; checked on
gloo CPU ranks whose calls take different times."""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, queue) -> None:
    sys.path.insert(0, ROOT)
    from benchmarks.common import side_by_side

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    try:
        calls = {"slow_on_one_rank": 0, "collective": 0}
        t = torch.ones(4)

        def slow_on_one_rank():  # each rank's own estimate would ask for a different number of calls
            calls["slow_on_one_rank"] += 1
            time.sleep(0.004 if rank == 1 else 0.0005)

        def collective():
            calls["collective"] += 1
            dist.all_reduce(t)

        times = side_by_side({"slow_on_one_rank": slow_on_one_rank, "collective": collective}, 2, "cpu",
                             group=dist.group.WORLD)
        queue.put((rank, calls, times))
    finally:
        dist.destroy_process_group()


def test_ranks_call_a_collective_function_equally_often() -> None:
    world = 2
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = {rank: (calls, times) for rank, calls, times in (queue.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0][0] == results[1][0]  # the same number of calls of each function on both ranks
    assert results[0][0]["slow_on_one_rank"] >= 2 * (1 + 3 + 1)  # per round: estimate, warm-up, >= 3 timed
    for _calls, times in results.values():
        assert all(len(t) == 2 and all(x > 0 for x in t) for t in times.values())
    assert min(results[1][1]["slow_on_one_rank"]) >= 3.5 > max(results[0][1]["slow_on_one_rank"])
