"""Run the generated Triton forms of tilelink.mapping under the interpreter; compare with the Python forms.

Run as a script (``test_mapping_triton.py`` starts it in a subprocess, so that TRITON_INTERPRET=1 is
set before triton is imported). Usage: ``python interpret_mapping.py [cases] [seed]``. Prints one
line per failure and exits 1 if any; prints ``ok <checked values>`` otherwise.

Two kernels: a *block* kernel evaluates every static ``tl_`` function on a block of sampled inputs
(int64), a *scalar* kernel evaluates them per program id (int32 scalars, as a rewritten kernel does);
a *table* kernel reads :class:`LookupTables` through ``tl_table_*``.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import tilelink.mapping as mp  # noqa: E402
from tilelink.mapping import (  # noqa: E402
    tl_channel_of_row,
    tl_channel_overlap,
    tl_channel_range,
    tl_channel_rank,
    tl_channel_rows,
    tl_channels_of_rows,
    tl_rank_range,
    tl_remap_tile,
    tl_table_rows,
    tl_table_wait_channel,
    tl_table_wait_range,
    tl_tile_range,
    tl_tile_shift,
)

BLOCK = 256
INPUTS = ("row", "ch", "rank", "lo", "hi", "t", "shift", "step")
OUTPUTS = ("channel_of_row", "channel_rank", "rank_lo", "rank_hi", "ch_lo", "ch_hi", "ch_rows",
           "span_first", "span_count", "overlap", "tile_lo", "tile_hi", "tile_shift", "remap", "remap_any")


@triton.jit
def block_kernel(in_ptr, out_ptr, M, rpr, rpc, C, tile, num_tiles, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    row = tl.load(in_ptr + 0 * BLOCK + i)
    ch = tl.load(in_ptr + 1 * BLOCK + i)
    rank = tl.load(in_ptr + 2 * BLOCK + i)
    lo = tl.load(in_ptr + 3 * BLOCK + i)
    hi = tl.load(in_ptr + 4 * BLOCK + i)
    t = tl.load(in_ptr + 5 * BLOCK + i)
    shift = tl.load(in_ptr + 6 * BLOCK + i)
    step = tl.load(in_ptr + 7 * BLOCK + i)
    tl.store(out_ptr + 0 * BLOCK + i, tl_channel_of_row(row, rpr, rpc, C))
    tl.store(out_ptr + 1 * BLOCK + i, tl_channel_rank(ch, C))
    r_lo, r_hi = tl_rank_range(rank, M, rpr)
    tl.store(out_ptr + 2 * BLOCK + i, r_lo)
    tl.store(out_ptr + 3 * BLOCK + i, r_hi)
    c_lo, c_hi = tl_channel_range(ch, M, rpr, rpc, C)
    tl.store(out_ptr + 4 * BLOCK + i, c_lo)
    tl.store(out_ptr + 5 * BLOCK + i, c_hi)
    tl.store(out_ptr + 6 * BLOCK + i, tl_channel_rows(ch, M, rpr, rpc, C))
    first, count = tl_channels_of_rows(lo, hi, M, rpr, rpc, C)
    tl.store(out_ptr + 7 * BLOCK + i, first)
    tl.store(out_ptr + 8 * BLOCK + i, count)
    tl.store(out_ptr + 9 * BLOCK + i, tl_channel_overlap(ch, lo, hi, M, rpr, rpc, C))
    t_lo, t_hi = tl_tile_range(t, tile, M)
    tl.store(out_ptr + 10 * BLOCK + i, t_lo)
    tl.store(out_ptr + 11 * BLOCK + i, t_hi)
    tl.store(out_ptr + 12 * BLOCK + i, tl_tile_shift(rank, rpr, tile))
    tl.store(out_ptr + 13 * BLOCK + i, tl_remap_tile(t, num_tiles, shift))
    # a program before the first tile or past the last (an idle one of a larger grid) is left where it is
    tl.store(out_ptr + 14 * BLOCK + i, tl_remap_tile(step, num_tiles, shift))


@triton.jit
def scalar_kernel(out_ptr, M, rpr, rpc, C, tile, num_tiles, shift):
    # one program per consumer tile, int32 scalars: what a rewritten GEMM computes
    pid = tl.program_id(0)
    t = tl_remap_tile(pid, num_tiles, shift)
    lo, hi = tl_tile_range(t, tile, M)
    first, count = tl_channels_of_rows(lo, hi, M, rpr, rpc, C)
    tl.store(out_ptr + pid * 4 + 0, t)
    tl.store(out_ptr + pid * 4 + 1, first)
    tl.store(out_ptr + pid * 4 + 2, count)
    tl.store(out_ptr + pid * 4 + 3, tl_channel_overlap(first, lo, hi, M, rpr, rpc, C))


@triton.jit
def table_kernel(wait_ptr, channels_ptr, low_ptr, high_ptr, out_ptr, nnz):
    t = tl.program_id(0)
    start, end = tl_table_wait_range(wait_ptr, t)
    low, high = tl_table_rows(low_ptr, high_ptr, t)
    first = tl_table_wait_channel(channels_ptr, tl.minimum(start, nnz - 1))
    tl.store(out_ptr + t * 5 + 0, start)
    tl.store(out_ptr + t * 5 + 1, end)
    tl.store(out_ptr + t * 5 + 2, low)
    tl.store(out_ptr + t * 5 + 3, high)
    tl.store(out_ptr + t * 5 + 4, first)


def _sample_sharding(rng: np.random.Generator) -> mp.RowSharding:
    world = int(rng.integers(1, 17))
    size = int(rng.choice([rng.integers(1, 65), rng.integers(1, 2001), rng.integers(1, 100_001)]))
    rpr = -(-size // world)
    return mp.RowSharding(size, world, int(rng.integers(1, min(8, rpr) + 1)))


def check(cases: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    failures: list[str] = []
    checked = 0
    for case in range(cases):
        s = _sample_sharding(rng)
        M, rpr, rpc, C = s.args
        tile = int(rng.integers(16, 257))
        n = s.num_tiles(tile)
        lo = rng.integers(-300, M + 300, size=BLOCK)
        inputs = {
            "row": rng.integers(0, M, size=BLOCK),
            "ch": rng.integers(0, s.num_channels, size=BLOCK),
            "rank": rng.integers(0, s.world, size=BLOCK),
            "lo": lo,
            "hi": lo + rng.integers(-10, 3 * tile, size=BLOCK),
            "t": rng.integers(0, n, size=BLOCK),
            "shift": rng.integers(0, 10**6, size=BLOCK),
            "step": rng.integers(-n - 3, 2 * n + 3, size=BLOCK),
        }
        x = torch.from_numpy(np.stack([inputs[k] for k in INPUTS]).astype(np.int64))
        out = torch.zeros((len(OUTPUTS), BLOCK), dtype=torch.int64)
        block_kernel[(1,)](x, out, M, rpr, rpc, C, tile, n, BLOCK=BLOCK)
        v = inputs
        model = {
            "channel_of_row": mp.channel_of_row(v["row"], rpr, rpc, C),
            "channel_rank": mp.channel_rank(v["ch"], C),
            "rank_lo": mp.rank_range(v["rank"], M, rpr)[0],
            "rank_hi": mp.rank_range(v["rank"], M, rpr)[1],
            "ch_lo": mp.channel_range(v["ch"], *s.args)[0],
            "ch_hi": mp.channel_range(v["ch"], *s.args)[1],
            "ch_rows": mp.channel_rows(v["ch"], *s.args),
            "span_first": mp.channels_of_rows(v["lo"], v["hi"], *s.args)[0],
            "span_count": mp.channels_of_rows(v["lo"], v["hi"], *s.args)[1],
            "overlap": mp.channel_overlap(v["ch"], v["lo"], v["hi"], *s.args),
            "tile_lo": mp.tile_range(v["t"], tile, M)[0],
            "tile_hi": mp.tile_range(v["t"], tile, M)[1],
            "tile_shift": mp.tile_shift(v["rank"], rpr, tile),
            "remap": mp.rotate_tile(v["t"], n, v["shift"]),
            "remap_any": mp.rotate_tile(v["step"], n, v["shift"]),
        }
        for k, name in enumerate(OUTPUTS):
            got = out[k].numpy()
            bad = np.nonzero(got != model[name])[0]
            checked += BLOCK
            if len(bad):
                j = bad[0]
                at = {i: int(v[i][j]) for i in INPUTS}
                failures.append(f"case {case} {s} tile={tile}: {name} at {at}: triton {got[j]} "
                                f"!= python {model[name][j]}")

        shift = mp.tile_shift(int(rng.integers(0, s.world)), rpr, tile)
        grid = min(n, 64)
        res = torch.zeros((grid, 4), dtype=torch.int32)
        scalar_kernel[(grid,)](res, M, rpr, rpc, C, tile, n, shift)
        for pid in range(grid):
            t = mp.rotate_tile(pid, n, shift)
            first, count = s.consumer_channels(t, tile)
            want = [t, first, count, mp.channel_overlap(first, *s.tile_range(t, tile), *s.args)]
            checked += 4
            if res[pid].tolist() != want:
                failures.append(f"case {case} {s} tile={tile} scalar pid {pid}: triton {res[pid].tolist()} "
                                f"!= python {want}")

        index = torch.from_numpy(rng.integers(-1, M, size=int(rng.integers(1, 4 * tile))))
        tables = mp.LookupTables.build(index, s, tile)
        nnz = max(1, tables.wait_channels.numel())
        channels = tables.wait_channels if tables.wait_channels.numel() else torch.zeros(1, dtype=torch.int32)
        res = torch.zeros((tables.num_tiles, 5), dtype=torch.int64)
        table_kernel[(tables.num_tiles,)](tables.wait_ptr, channels, tables.low, tables.high, res, nnz)
        for t in range(tables.num_tiles):
            start, end = tables.wait_range(t)
            want = [start, end, *tables.rows(t), int(channels[min(start, nnz - 1)])]
            checked += 5
            if res[t].tolist() != want:
                failures.append(f"case {case} tables tile {t}: triton {res[t].tolist()} != python {want}")
    if not failures:
        print(f"ok {checked}")
    return failures


if __name__ == "__main__":
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    problems = check(cases, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    for line in problems[:20]:
        print(line)
    sys.exit(1 if problems else 0)
