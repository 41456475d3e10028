"""Decode benchmark: the row-parallel linear layers of the paper's models at decode batch sizes, GEMM + AllReduce.

At decode, a tensor-parallel layer's output projection (attention's ``o_proj``: K = heads x head_dim) and its MLP's
down projection (K = intermediate) multiply a few tokens by this rank's K slice of the weight and sum the partial
products over the ranks (N = hidden). TileLink's :func:`tilelink.ops.gemm_ar` overlaps the sum with the GEMM; the
baseline is cuBLAS (``torch.matmul``) then ``torch.distributed.all_reduce`` (NCCL).

Two modes:

- ``compute``: one GPU. The GEMM each rank computes at world size W (M tokens, K / W, N): TileLink's rewritten
  kernel with every channel satisfied (its notifies cost included) against ``torch.matmul``, side by side.
- ``dist``: W ranks (one per GPU: NCCL for the baseline, NVSHMEM for TileLink; without GPUs enough, emulated
  ranks whose baseline is gloo, which checks the plumbing, not the speed). ``gemm_ar`` with the algorithm chosen by
  size, one-shot and two-shot, against cuBLAS + NCCL, and the two halves of the baseline alone; the slowest
  rank's median of each, the speedup over cuBLAS + NCCL and each result's error against the baseline's.

Run as ``tlxform bench decode`` or ``python -m tilelink.benchmarks.decode``; writes
``decode_<mode>_w<W>_<dtype>.json`` and a markdown table beside it (``.md``).
"""

from __future__ import annotations

import math
import os
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from tilelink.benchmarks.common import environment, progress, side_by_side, spawn_backend, write_json

#: the dense models of the paper (``tilelink.ops.models.MODELS``) whose decode layers are measured by default
MODELS = ("llama-2-7b", "llama-3.1-8b", "gemma-2-9b", "gemma-2-27b", "llama-3.1-70b", "qwen-2-72b")
TOKENS = (1, 4, 16, 64, 256)
LINEARS = ("o_proj", "down_proj")
DTYPES = ("bf16", "fp16", "fp32")
#: the methods of the dist mode: TileLink's, then the baseline and its two halves
TILELINK = {"TileLink": None, "TileLink one-shot": "one_shot", "TileLink two-shot": "two_shot"}
BASELINE = "cuBLAS+NCCL"

#: NVLink multicast stays off on shared hosts: it can take the host's GPUs out of service
_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class DecodeShape:
    """One row-parallel linear at decode: ``tokens`` rows, the full inner dimension ``K`` (each rank holds a
    slice), ``N`` output columns."""

    model: str
    linear: str
    tokens: int
    N: int
    K: int

    def __str__(self) -> str:
        return f"{self.model} {self.linear} M={self.tokens}"


def decode_shapes(models: tuple[str, ...], tokens: tuple[int, ...], scale: int = 1) -> list[DecodeShape]:
    """The row-parallel linears of ``models`` at each token count; ``scale`` divides N and K (smoke runs)."""
    from tilelink.ops.models import get_config

    shapes = []
    for name in models:
        config = get_config(name)
        if config.moe:
            raise click.BadParameter(f"{name} is a mixture of experts: its MLP is not one row-parallel linear",
                                     param_hint="--model")
        for linear, K in (("o_proj", config.heads * config.head_dim), ("down_proj", config.intermediate)):
            for m in tokens:
                shapes.append(DecodeShape(config.name, linear, m, max(1, config.hidden // scale), max(1, K // scale)))
    return shapes


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _rel_err(out, ref) -> float:
    return float((out.double() - ref.double()).norm() / max(ref.double().norm(), 1e-30))


# ----------------------------------------------------------------------------------------------
# compute mode: one GPU, the per-rank GEMM


def _compute_row(s: DecodeShape, world: int, dtype: str, rounds: int, device) -> dict:
    import torch
    import triton

    from tilelink.mapping import shard_range
    from tilelink.ops import tp_ar, tp_ar_kernels
    from tilelink.ops.contract import interpreter_inputs

    okernel = tp_ar_kernels.gemm_ar_kernel
    kernel = getattr(okernel.module, okernel.name)  # the rewritten kernel: its notifies run too
    lo, hi = shard_range(s.K, 0, world)
    a = torch.randn(s.tokens, hi - lo, device=device, dtype=_torch_dtype(dtype))
    b = torch.randn(hi - lo, s.N, device=device, dtype=_torch_dtype(dtype))
    a_in, b_in = interpreter_inputs(a, b)
    c = torch.empty(s.tokens, s.N, device=device, dtype=a_in.dtype)
    ref = torch.empty(s.tokens, s.N, device=device, dtype=a.dtype)
    meta = tp_ar._config(s.tokens, s.N, a_in.dtype)
    grid = (triton.cdiv(s.tokens, meta["BLOCK_M"]) * triton.cdiv(s.N, meta["BLOCK_N"]),)
    channels = okernel.launcher.satisfied_args(s.tokens, world, device)
    fns = {"torch.matmul": lambda: torch.matmul(a, b, out=ref),
           "TileLink": lambda: kernel[grid](a_in, b_in, c, s.tokens, s.N, hi - lo, a_in.stride(0), a_in.stride(1),
                                            b_in.stride(0), b_in.stride(1), s.N, 1, **meta, **channels)}
    times = {k: statistics.median(v) for k, v in side_by_side(fns, rounds, device.type).items()}
    return {**asdict(s), "K_per_rank": hi - lo, "median_ms": times, "ratio": times["torch.matmul"] / times["TileLink"],
            "rel_err": _rel_err(c, ref)}


def run_compute(shapes: list[DecodeShape], world: int, dtype: str, rounds: int) -> dict:
    """TileLink's rewritten GEMM (channels satisfied) against torch.matmul at each per-rank shape."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with progress(shapes, f"GEMM vs torch.matmul ({dtype}, per-rank K at W={world})") as bar:
        rows = [_compute_row(s, world, dtype, rounds, device) for s in bar]
    return {"benchmark": "decode", "mode": "compute", "world": world, "dtype": dtype, "rounds": rounds,
            **environment(), "results": rows}


# ----------------------------------------------------------------------------------------------
# dist mode: W ranks


def measure_rank(shapes: list[DecodeShape], dtype: str, rounds: int) -> list[dict]:
    """On every rank of the current world (TileLink's, over a torch.distributed group): each shape's methods,
    timed side by side; the slowest rank's medians, and each TileLink result's error against the baseline's."""
    import torch
    import torch.distributed as dist

    import tilelink.runtime
    from tilelink.mapping import shard_range
    from tilelink.ops import gemm_ar

    world = tilelink.runtime.current_world()
    device, rank, size = world.device, world.rank, world.world_size
    group = dist.group.WORLD
    rows = []
    for s in shapes:
        lo, hi = shard_range(s.K, rank, size)
        g = torch.Generator().manual_seed(17 + rank)
        a = torch.randn(s.tokens, hi - lo, generator=g).to(device=device, dtype=_torch_dtype(dtype))
        b = (torch.randn(hi - lo, s.N, generator=g) / math.sqrt(s.K)).to(device=device, dtype=_torch_dtype(dtype))
        c = torch.empty(s.tokens, s.N, device=device, dtype=a.dtype)

        def comp(a=a, b=b, c=c):
            torch.matmul(a, b, out=c)

        def comm(c=c):
            dist.all_reduce(c, group=group)

        fns = {BASELINE: lambda comp=comp, comm=comm: (comp(), comm()), "comp": comp, "comm": comm}
        for name, mode in TILELINK.items():
            fns[name] = lambda a=a, b=b, mode=mode: gemm_ar(a, b, mode=mode, path="overlap")
        row: dict = {**asdict(s), "K_per_rank": hi - lo, "errors": {}, "rel_err": {}}
        comp(), comm()
        reference = c.clone()
        usable = {}
        for name, fn in fns.items():  # every rank learns here whether a method works, and checks its result
            try:
                out = fn()
                if name in TILELINK:
                    row["rel_err"][name] = _rel_err(out, reference)
                usable[name] = fn
            except Exception as exc:  # noqa: BLE001 - recorded; the other methods still run
                row["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
        times = side_by_side(usable, rounds, device.type, group)
        medians = torch.tensor([statistics.median(times[n]) for n in usable], dtype=torch.float64, device=device)
        dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)
        row["median_ms"] = dict(zip(usable, medians.tolist(), strict=True))
        base = row["median_ms"].get(BASELINE)
        row["speedup"] = {n: base / t for n, t in row["median_ms"].items() if n in TILELINK and base and t}
        rows.append(row)
    return rows


def _gpu_worker(rank: int, world: int, port: int, shapes: list[DecodeShape], dtype: str, rounds: int,
                queue) -> None:
    import torch
    import torch.distributed as dist

    import tilelink

    os.environ.update(_SAFE_ENV)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        tilelink.init("nvshmem")  # TileLink's ranks: this NCCL group broadcasts NVSHMEM's unique id
        rows = measure_rank(shapes, dtype, rounds)
        if rank == 0:
            queue.put(rows)
    finally:
        tilelink.finalize()  # before the process group its NVSHMEM world was bootstrapped over
        dist.destroy_process_group()


def run_dist(shapes: list[DecodeShape], world: int, dtype: str, rounds: int) -> dict:
    """``world`` ranks: one per GPU when there are GPUs enough, else emulated ranks (the plumbing only)."""
    backend = spawn_backend(world)
    if backend == "emulated":
        import tilelink

        if dtype != "fp32":
            click.echo(f"emulated ranks compute in fp32 (Triton's interpreter), not {dtype}", err=True)
            dtype = "fp32"
        rows = tilelink.spawn(measure_rank, world, shapes, dtype, rounds, backend="emulated")[0]
    else:
        import torch.multiprocessing as mp

        from tilelink.runtime.launch import free_port

        for k, v in _SAFE_ENV.items():
            os.environ.setdefault(k, v)
        queue = mp.get_context("spawn").SimpleQueue()
        mp.start_processes(_gpu_worker, args=(world, free_port(), shapes, dtype, rounds, queue), nprocs=world,
                           join=True, start_method="spawn")
        rows = queue.get()
    return {"benchmark": "decode", "mode": "dist", "world": world, "dtype": dtype, "rounds": rounds,
            "backend": backend, **environment(), "results": rows}


# ----------------------------------------------------------------------------------------------
# records


def markdown_table(record: dict) -> str:
    """The record as a markdown table, one row per shape."""
    if record["mode"] == "compute":
        lines = ["| model | linear | M | N | K / rank | torch.matmul ms | TileLink ms | TileLink / torch speed |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in record["results"]:
            ms = r["median_ms"]
            lines.append(f"| {r['model']} | {r['linear']} | {r['tokens']} | {r['N']} | {r['K_per_rank']} | "
                         f"{ms['torch.matmul']:.4f} | {ms['TileLink']:.4f} | {r['ratio']:.3f} |")
        return "\n".join(lines)
    methods = (BASELINE, *TILELINK, "comp", "comm")
    lines = ["| model | linear | M | N | K / rank | " + " | ".join(f"{m} ms" for m in methods)
             + " | speedup (auto / one-shot / two-shot) | max rel. err |",
             "|---|---|---|---|---|" + "---|" * len(methods) + "---|---|"]
    for r in record["results"]:
        ms, sp = r["median_ms"], r["speedup"]
        cells = " | ".join(f"{ms[m]:.4f}" if m in ms else "-" for m in methods)
        speed = " / ".join(f"{sp[m]:.2f}" if m in sp else "-" for m in TILELINK)
        err = max(r["rel_err"].values(), default=math.nan)
        lines.append(f"| {r['model']} | {r['linear']} | {r['tokens']} | {r['N']} | {r['K_per_rank']} | {cells} | "
                     f"{speed} | {err:.1e} |")
        for m, e in r["errors"].items():
            lines.append(f"| | | | | | error {m}: {e[:200]} |" + " |" * (len(methods)))
    return "\n".join(lines)


def record_markdown(record: dict, path: Path) -> Path:
    """Write the table with its command, date and device to ``path``."""
    what = ("per-rank GEMM, TileLink's rewritten kernel (channels satisfied) against torch.matmul" if
            record["mode"] == "compute" else f"GEMM + AllReduce over {record['world']} ranks "
            f"({record['backend']}), against cuBLAS + torch.distributed.all_reduce; the slowest rank's median")
    block = [f"### Decode row-parallel linears, {what}, world {record['world']}, {record['dtype']} — "
             f"{record['date']}", "", f"Device: {record['device']}; torch {record['torch']}, triton "
             f"{record['triton']}. {record['rounds']} rounds per method. Command:", "", "```", record["command"],
             "```", "", markdown_table(record), ""]
    path.write_text("\n".join(block))
    return path


def run(models: tuple[str, ...] = MODELS, tokens: tuple[int, ...] = TOKENS, world: int = 8, dtype: str = "bf16",
        mode: str = "auto", rounds: int = 3, scale: int = 1, out: Path = Path("bench-results"),
        command: str | None = None) -> dict:
    """Run the decode benchmark; writes ``<out>/decode_<mode>_w<W>_<dtype>.json`` and ``.md``."""
    import torch

    shapes = decode_shapes(tuple(models), tuple(tokens), scale)
    if mode == "auto":
        mode = "dist" if world > 1 and torch.cuda.device_count() >= world else "compute"
        if mode == "compute" and world > 1:
            click.echo(f"{torch.cuda.device_count()} GPU(s) here, fewer than --world {world}: measuring the "
                       f"per-rank compute part only (communication already satisfied)", err=True)
    record = run_compute(shapes, world, dtype, rounds) if mode == "compute" else run_dist(shapes, world, dtype,
                                                                                          rounds)
    record["command"] = command or shlex.join(["python", "-m", "tilelink.benchmarks.decode", *sys.argv[1:]])
    stem = f"decode_{mode}_w{world}_{record['dtype']}"
    path = write_json(out / f"{stem}.json", record)
    md = record_markdown(record, out / f"{stem}.md")
    click.echo(markdown_table(record))
    click.echo(f"wrote {path} and {md}", err=True)
    return record


def main(argv: list[str] | None = None) -> None:
    """``python -m tilelink.benchmarks.decode``: the same options as ``tlxform bench decode``."""
    from tilelink.cli.bench_cmd import bench  # first: it registers the command of cli/bench_decode.py

    bench.commands["decode"].main(args=argv if argv is not None else sys.argv[1:],
                                  prog_name="python -m tilelink.benchmarks.decode")


if __name__ == "__main__":
    main()
