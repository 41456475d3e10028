"""Run a function on a few CPU ranks of a gloo group (spawned processes) and collect what each returns:
for the benchmarks' multi-rank code, which a GPU-less machine can still check."""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(fn, rank: int, world: int, port: int, args: tuple, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        queue.put((rank, fn(rank, world, *args)))
    finally:
        dist.destroy_process_group()


def run_on_gloo_ranks(fn, world: int, *args) -> dict:
    """``{rank: fn(rank, world, *args)}`` from ``world`` processes joined in one gloo group (``fn`` must
    be importable: a module-level function); every process must exit cleanly."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    from tilelink.runtime.launch import free_port

    port = free_port()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(results) == list(range(world))
    return results
