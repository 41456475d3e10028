"""Bandwidth of the SM pull partners across ranks, by launch setting.

    python3 -m tilelink.benchmarks.pull_bandwidth --world 2 --out DIR          # one rank per GPU (NVSHMEM)

``rs_pull_consumer`` (the reduce-scatter's default consumer, top-k 1 and 2) sums every rank's partial rows
of this rank's channels; ``ag_pull_producer`` (the all-gather's SM producer) copies every peer's rows. Each
runs on ``--programs`` programs (the rules' ``comm_sms``) against barrier words set far above any target,
so every wait passes at once and what is timed is the pulling. Bandwidth = bytes read from the peers /
time (rank 0's ``tilelink.benchmarks.common.time_ms``, ``triton.testing.do_bench``'s median on a GPU); each result
is compared with the expected sum (relative error of the bf16 output) or rows first. Without a GPU the
ranks run emulated (Triton's interpreter): a check of the harness, with meaningless times.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

#: (BLOCK, num_warps) of each partner to time; the launcher's own setting is marked in the output
CONSUMER_SETTINGS = ((1024, 4), (4096, 4), (8192, 16), (16384, 8))
PRODUCER_SETTINGS = ((1024, 4), (8192, 8), (16384, 8))


def _partial_of(rank: int, rows: int, cols: int, device) -> torch.Tensor:
    """Rank ``rank``'s partial sums, reproducible on every rank (seeded)."""
    gen = torch.Generator(device="cpu").manual_seed(1000 + rank)
    return torch.randn(rows, cols, generator=gen).to(device=device, dtype=torch.bfloat16)


def measure(rows: int, cols: int, programs: int, consumer_settings, producer_settings) -> list[dict] | None:
    """One rank's part (under ``tilelink.spawn``): every setting of both partners; rank 0 returns the rows."""
    import tilelink
    from tilelink.benchmarks.common import time_ms
    from tilelink.mapping import RowSharding
    from tilelink.rules.all_gather.kernels import ag_pull_producer
    from tilelink.rules.launch import Launcher
    from tilelink.rules.reduce_scatter.kernels import rs_pull_consumer
    from tilelink.runtime import current_world, peer_table, symmetric_empty, symmetric_zeros

    world = current_world()
    rank, size, device = world.rank, world.world_size, world.device
    cuda = device.type == "cuda"
    if rows % size:
        raise SystemExit(f"--rows {rows} must be a multiple of the world size {size}")
    sharding = RowSharding(rows, size, -(-(rows // size) // 128))  # 128-row channels, as the rules' default
    rpr, rpc, cpr = sharding.rows_per_rank, sharding.rows_per_channel, sharding.channels_per_rank
    taken_consumer = tuple(Launcher.PULL_CONSUMER_GPU.values())
    taken_producer = tuple(Launcher.PULL_PRODUCER_GPU.values())
    diag = torch.zeros(8, dtype=torch.int64, device=device)
    budget = int(10e9)
    out_rows: list[dict] = []
    for topk in (1, 2):
        partial = symmetric_empty((rows * topk, cols), torch.bfloat16)
        partial.copy_(_partial_of(rank, rows * topk, cols, device))
        barriers = symmetric_zeros((size * cpr,), torch.int64)
        barriers.fill_(1 << 40)
        want = sum(_partial_of(r, rows * topk, cols, device)[rank * rpr * topk:(rank + 1) * rpr * topk].float()
                   .view(rpr, topk, cols).sum(1) for r in range(size))
        out = torch.empty((rpr, cols), dtype=torch.bfloat16, device=device)
        tables = peer_table(partial), peer_table(barriers)
        world.barrier()
        for block, warps in consumer_settings:
            options = {"num_warps": warps} if cuda else {}
            pull = functools.partial(rs_pull_consumer[(programs,)], partial, tables[0], out, barriers, tables[1], 1,
                                     rank, size, rows, rpr, rpc, cpr, cols, diag, budget, TOPK=topk, BLOCK=block,
                                     **options)
            pull()
            error = ((out.float() - want).abs().max() / want.abs().max()).item()  # relative: bf16 output
            world.barrier()
            ms = time_ms(pull, device.type)
            world.barrier()
            remote = (size - 1) * rpr * topk * cols * 2
            out_rows.append({"kernel": "rs_pull_consumer", "topk": topk, "BLOCK": block, "num_warps": warps,
                             "programs": programs, "us": 1e3 * ms, "GB/s": remote / ms / 1e6,
                             "max_rel_error": error, "taken": (block, warps) == taken_consumer})
        tilelink.runtime.free(barriers)
        tilelink.runtime.free(partial)
    full = symmetric_empty((rows, cols), torch.bfloat16)
    full.fill_(rank)
    world.barrier()
    table = peer_table(full)
    local = torch.zeros(size * cpr, dtype=torch.int64, device=device)
    for block, warps in producer_settings:
        options = {"num_warps": warps} if cuda else {}
        gather = functools.partial(ag_pull_producer[(programs,)], full, table, local, 1, rank, size, rows, rpr, rpc,
                                   cpr, cols, 1, rows * cols, BLOCK=block, **options)
        gather()
        expected = torch.arange(size, device=device).repeat_interleave(rpr).to(torch.float32)[:, None]
        error = ((full.float() - expected).abs().max() / expected.abs().max()).item()
        world.barrier()
        ms = time_ms(gather, device.type)
        world.barrier()
        remote = (size - 1) * rpr * cols * 2
        out_rows.append({"kernel": "ag_pull_producer", "topk": 1, "BLOCK": block, "num_warps": warps,
                         "programs": programs, "us": 1e3 * ms, "GB/s": remote / ms / 1e6, "max_rel_error": error,
                         "taken": (block, warps) == taken_producer})
    tilelink.runtime.free(full)
    return out_rows if rank == 0 else None


def run(world: int, rows: int, cols: int, programs: int, out: Path | None,
        consumer_settings=CONSUMER_SETTINGS, producer_settings=PRODUCER_SETTINGS, backend: str | None = None
        ) -> list[dict]:
    """``backend``: by default NVSHMEM with a GPU per rank, else emulated ranks; ``"nvshmem"`` also runs
    ranks that share a GPU (a correctness check; their bandwidth is not the link's)."""
    import tilelink
    from tilelink.benchmarks.common import environment, spawn_backend, write_json

    if backend is None:
        backend = spawn_backend(world)
    results = tilelink.spawn(measure, world, rows, cols, programs, consumer_settings, producer_settings,
                             backend=backend)[0]
    print(f"{'kernel':18} {'topk':>4} {'BLOCK':>6} {'warps':>5} {'us':>9} {'GB/s':>7} {'rel err':>8}")
    for r in results:
        print(f"{r['kernel']:18} {r['topk']:>4} {r['BLOCK']:>6} {r['num_warps']:>5} {r['us']:9.1f} {r['GB/s']:7.1f} "
              f"{r['max_rel_error']:8.3g}{'  <- the launcher' if r['taken'] else ''}")
    if out is not None:
        record = {"benchmark": "pull_bandwidth", "backend": backend, "world": world, "rows": rows, "cols": cols,
                  **environment(), "results": results}
        print(f"wrote {write_json(Path(out) / f'pull_bandwidth_w{world}.json', record)}")
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--programs", type=int, default=16, help="programs of each partner (the rules' comm_sms)")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    run(a.world, a.rows, a.cols, a.programs, a.out)


if __name__ == "__main__":
    main()
