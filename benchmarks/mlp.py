"""Tensor-parallel MLP benchmark on the paper's Table 4 shapes (Figure 8): AG+GEMM and GEMM+RS.

Two modes:

- ``compute``: one GPU, one rank. The GEMM each rank computes at world size W (see
  :mod:`tilelink.benchmarks.common` for the per-rank shapes), with communication already satisfied: the
  TileLink plain GEMM (:func:`tilelink.ops.gemm.matmul`) against ``torch.matmul`` (cuBLAS), side by
  side in one process; ratio = torch time / TileLink time. With ``--dtype fp8``: the FP8 kernels that
  ``ag_gemm``/``gemm_rs`` launch (:mod:`tilelink.ops.tp_fp8`; as written, and rewritten with every channel
  satisfied) against ``torch._scaled_mm``, e4m3 operands scaled row-wise and per tensor, bf16 out.
- ``dist``: W processes on W GPUs (spawned here, NCCL). Baselines cuBLAS+NCCL
  (``all_gather_into_tensor`` + ``matmul``; ``matmul`` + ``reduce_scatter_tensor``) and PyTorch
  async-TP (``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``), and
  TileLink's ``tilelink.ops.ag_gemm`` / ``gemm_rs``. Speedup over cuBLAS+NCCL and
  overlap ratio ``(comp + comm - overlapped) / comm`` per shape; times are the slowest rank's median.

Run as ``tlxform bench mlp`` or ``python -m tilelink.benchmarks.mlp``; writes ``mlp_<mode>_w<W>_<dtype>.json``
and a PNG bar chart next to it.
"""

from __future__ import annotations

import faulthandler
import math
import os
import statistics
import sys
import zlib
from pathlib import Path

import click

from tilelink.benchmarks.common import (
    PARTS,
    GemmShape,
    MLPShape,
    bar_chart,
    environment,
    per_rank_gemm,
    progress,
    scaled,
    select_shapes,
    side_by_side,
    time_ms,
    write_json,
)

DTYPES = ("bf16", "fp16", "fp32", "fp8")
PART_TITLES = {"ag_gemm": "AG+GEMM", "gemm_rs": "GEMM+RS"}
#: seconds one method of the dist mode may take (warm-up and rounds) before every thread's stack is dumped
METHOD_BUDGET_S = 120

#: NVLink multicast stays off on shared hosts: it can take the host's GPUs out of service
_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _rel_err(out, ref) -> float:
    return float((out.float() - ref).norm() / ref.norm())


# ----------------------------------------------------------------------------------------------
# compute mode: one GPU, the per-rank GEMMs


def run_compute(shapes: list[MLPShape], world: int, dtype: str, variants: list[str], rounds: int,
                scale: int = 1) -> dict:
    """Measure the TileLink GEMM against torch.matmul at the per-rank shapes; returns the record."""
    import torch

    from tilelink.ops import gemm

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tdtype = _torch_dtype(dtype)
    items = [(s, p) for s in shapes for p in PARTS]
    rows = []
    with progress(items, f"GEMM vs torch.matmul ({dtype}, per-rank shapes at W={world})") as bar:
        for shape, part in bar:
            g = per_rank_gemm(scaled(shape, scale, world), part, world)
            gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"{shape.name}/{part}".encode()))
            a = torch.randn(g.M, g.K, device=device, dtype=tdtype, generator=gen)
            b = torch.randn(g.K, g.N, device=device, dtype=tdtype, generator=gen)
            c_torch = torch.empty(g.M, g.N, device=device, dtype=tdtype)
            c_ours = torch.full((g.M, g.N), float("nan"), device=device, dtype=tdtype)
            ref = a.float() @ b.float()
            row = {"shape": shape.name, "part": part, "M": g.M, "N": g.N, "K": g.K, "errors": {},
                   "rel_err": {}, "config": {}}
            row["rel_err"]["torch.matmul"] = _rel_err(torch.matmul(a, b, out=c_torch), ref)
            fns = {"torch.matmul": lambda a=a, b=b, c=c_torch: torch.matmul(a, b, out=c)}
            for v in variants:
                try:
                    c_ours.fill_(float("nan"))
                    gemm.matmul(a, b, out=c_ours, variant=v)
                    err = _rel_err(c_ours, ref)
                    row["rel_err"][v] = err
                    if not err < 2e-2:  # NaN (unwritten) fails too
                        raise AssertionError(f"relative error {err:.3g} against the fp32 reference")
                    fns[v] = lambda a=a, b=b, c=c_ours, v=v: gemm.matmul(a, b, out=c, variant=v)
                    tuned = gemm._autotuned(gemm._AUTO_VARIANT if v == "auto" else v) if device == "cuda" else None
                    if tuned is not None and getattr(tuned, "best_config", None) is not None:
                        row["config"][v] = str(tuned.best_config)
                except Exception as exc:  # one broken variant must not lose the others' numbers
                    row["errors"][v] = f"{type(exc).__name__}: {exc}"[:500]
            times = side_by_side(fns, rounds, device)
            row["ms"] = times
            t_torch = statistics.median(times["torch.matmul"])
            row["median_ms"] = {k: statistics.median(v) for k, v in times.items()}
            row["tflops"] = {k: g.flops / (m * 1e-3) / 1e12 for k, m in row["median_ms"].items()}
            row["ratio"] = {v: t_torch / row["median_ms"][v] for v in variants if v in times}
            row["ratio_per_round"] = {v: [t / o for t, o in zip(times["torch.matmul"], times[v], strict=True)]
                                      for v in variants if v in times}
            rows.append(row)
            cells = [f"{v} {row['median_ms'][v]:.4f} ms ({row['ratio'][v]:.3f}) {row['config'].get(v, '')}"
                     for v in row["ratio"]]
            click.echo(f"  {shape.name} {part} {g.M}x{g.N}x{g.K}: torch {t_torch:.4f} ms; "
                       + ", ".join(cells), err=True)
            del a, b, c_torch, c_ours, ref
    return {"benchmark": "mlp", "mode": "compute", "world": world, "dtype": dtype, "rounds": rounds,
            "scale": scale, "variants": variants, **environment(), "results": rows}


def summarize_compute(record: dict) -> str:
    lines = [f"{'shape':8} {'part':8} {'M':>6} {'N':>6} {'K':>6} {'torch ms':>9} "
             + " ".join(f"{v + ' ms':>15} {'ratio':>6}" for v in record["variants"])]
    for r in record["results"]:
        cells = []
        for v in record["variants"]:
            if v in r["ratio"]:
                cells.append(f"{r['median_ms'][v]:15.4f} {r['ratio'][v]:6.3f}")
            else:
                cells.append(f"{'error':>15} {'-':>6}")
        lines.append(f"{r['shape']:8} {r['part']:8} {r['M']:6d} {r['N']:6d} {r['K']:6d} "
                     f"{r['median_ms']['torch.matmul']:9.4f} " + " ".join(cells))
    for v in record["variants"]:
        ratios = [r["ratio"][v] for r in record["results"] if v in r["ratio"]]
        if ratios:
            lines.append(f"{v}: min ratio {min(ratios):.3f}, geomean "
                         f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over {len(ratios)} GEMMs")
    for r in record["results"]:
        for v, e in r["errors"].items():
            lines.append(f"error {r['shape']} {r['part']} {v}: {e}")
    return "\n".join(lines)


def chart_compute(record: dict, path: Path) -> Path | None:
    groups = [f"{r['shape']}\n{PART_TITLES[r['part']]}" for r in record["results"]]
    series = {"torch.matmul (cuBLAS)": [1.0] * len(groups)}
    for v in record["variants"]:
        series[f"TileLink GEMM ({v})"] = [r["ratio"].get(v, math.nan) for r in record["results"]]
    return bar_chart(path, f"Per-rank GEMM at W={record['world']}, {record['dtype']}, {record['device']}",
                     groups, series, "speed relative to torch.matmul")


# ----------------------------------------------------------------------------------------------
# compute mode on FP8 operands: the operators' FP8 kernels against torch._scaled_mm

#: the scalings measured: A per row and B per column, or one scale per operand
FP8_SCALINGS = ("rowwise", "tensor")


def fp8_inputs(g: GemmShape, scaling: str, device, gen) -> dict:
    """e4m3 operands of one per-rank GEMM and their scales: A (M, K) and the (N, K) weight, each quantised per row
    (``rowwise``: one scale per row of A, one per column of C) or per tensor."""
    import torch

    from tilelink.ops.tp_fp8 import quantize_fp8

    a, a_scale = quantize_fp8(torch.randn(g.M, g.K, device=device, generator=gen), rowwise=scaling == "rowwise")
    w, w_scale = quantize_fp8(torch.randn(g.N, g.K, device=device, generator=gen) / g.K**0.5,
                              rowwise=scaling == "rowwise")
    return {"a": a, "a_scale": a_scale, "w": w, "w_scale": w_scale}


def _scaled_mm(x: dict, out, fast_accum: bool = False):
    """``torch._scaled_mm`` with bf16 out: row-wise scales as (M, 1) and (1, N), per-tensor ones as they are; a K
    that is not a multiple of 16 padded with zeros, which it requires (the sum is the same).
    ``fast_accum``: its ``use_fast_accum`` (the MMA's own accumulation throughout, as Triton's FP8 dots on
    Hopper: promoting every 128 K into fp32 registers beside a 128 x 256 accumulator spills them)."""
    import torch

    row = x["a_scale"].dim() == 1
    sa = x["a_scale"][:, None] if row else x["a_scale"]
    sb = x["w_scale"][None, :] if row else x["w_scale"]
    a, w = x["a"], x["w"]
    if a.shape[1] % 16:  # it takes K in multiples of 16 only: zeros appended, as a user of it would (not timed)
        a, w = (torch.nn.functional.pad(t.view(torch.uint8), (0, -a.shape[1] % 16)).view(t.dtype) for t in (a, w))
    return lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, out=out,
                                    use_fast_accum=fast_accum)


def _fp8_kernels(part: str, g: GemmShape, x: dict, c, world: int, device) -> dict:
    """The FP8 kernel the operator launches for ``part`` on these operands, as written (``plain``) and rewritten
    with every channel of a world of ``world`` ranks already satisfied (``rewritten``: what a rank runs)."""
    import torch

    from tilelink.ops.tp_fp8 import scaled_gemm

    a_scale = x["a_scale"]
    if part == "ag_gemm" and a_scale.numel() == 1:  # the AG kernel takes (gathers) one scale per row
        a_scale = a_scale.reshape(1).expand(g.M).contiguous()
    persistent = g.K % 16 == 0 and (g.N * 2) % 16 == 0  # what the operators take: 16-byte rows of A and C
    okernel, grid, args, meta = scaled_gemm(part, x["a"], a_scale.reshape(-1), x["w"].t(), x["w_scale"].reshape(-1),
                                            c, persistent, torch.device(device))
    rewritten = getattr(okernel.module, okernel.name)
    extra = okernel.launcher.satisfied_args(g.M, world, c.device)
    return {"plain": lambda: okernel.kernel[grid](*args, **meta),
            "rewritten": lambda: rewritten[grid](*args, **meta, **extra),
            "kernel": okernel.name, "meta": {k: v for k, v in meta.items() if isinstance(v, (int, bool))}}


def run_compute_fp8(shapes: list[MLPShape], world: int, rounds: int, scale: int = 1, device: str | None = None) -> dict:
    """Time the FP8 kernels of ``ag_gemm``/``gemm_rs`` (bf16 out) against ``torch._scaled_mm`` (bf16 out) at the
    per-rank shapes of ``world`` ranks, row-wise and per-tensor scaled; ratio = torch time / TileLink time (the
    rewritten kernel, channels satisfied). Returns the record."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    items = [(s, p) for s in shapes for p in PARTS]
    rows = []
    with progress(items, f"FP8 GEMM vs torch._scaled_mm (per-rank shapes at W={world})") as bar:
        for shape, part in bar:
            g = per_rank_gemm(scaled(shape, scale, world), part, world)
            gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"{shape.name}/{part}/fp8".encode()))
            row = {"shape": shape.name, "part": part, "M": g.M, "N": g.N, "K": g.K, "errors": {}, "rel_err": {},
                   "config": {}}
            fns = {}
            for scaling in FP8_SCALINGS:
                x = fp8_inputs(g, scaling, device, gen)
                sa = x["a_scale"][:, None] if x["a_scale"].dim() else x["a_scale"]
                sw = x["w_scale"][:, None] if x["w_scale"].dim() else x["w_scale"]
                ref = (x["a"].float() * sa) @ (x["w"].float() * sw).t()
                outs = {}
                for fast in (False, True):
                    name = f"torch._scaled_mm {scaling}" + (" fast_accum" if fast else "")
                    try:
                        c = torch.empty(g.M, g.N, device=device, dtype=torch.bfloat16)
                        fns[name], outs[name] = _scaled_mm(x, c, fast), c
                    except Exception as exc:  # a build or device without it: recorded, TileLink still measured
                        row["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
                for form in ("rewritten", "plain"):
                    name = f"TileLink {scaling}" + ("" if form == "rewritten" else " (as written)")
                    try:
                        c = torch.full((g.M, g.N), float("nan"), device=device, dtype=torch.bfloat16)
                        launch = _fp8_kernels(part, g, x, c, world, device)
                        fns[name], outs[name] = launch[form], c
                        row["config"][name] = {"kernel": launch["kernel"], **launch["meta"]}
                    except Exception as exc:
                        row["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
                for name, c in outs.items():
                    try:
                        fns[name]()
                        err = _rel_err(c, ref)
                        row["rel_err"][name] = err
                        if not err < 2e-2:  # bf16 out; NaN (unwritten) fails too
                            raise AssertionError(f"relative error {err:.3g} against the dequantised fp32 reference")
                    except Exception as exc:  # one broken method must not lose the others' numbers
                        row["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
                        fns.pop(name, None)
            times = side_by_side(fns, rounds, device)
            row["ms"] = times
            row["median_ms"] = {k: statistics.median(v) for k, v in times.items()}
            row["tflops"] = {k: g.flops / (m * 1e-3) / 1e12 for k, m in row["median_ms"].items()}
            row["ratio"], row["ratio_vs_fast_accum"] = {}, {}
            for name, ms in row["median_ms"].items():
                base = row["median_ms"].get(f"torch._scaled_mm {name.split()[1]}")
                fast = row["median_ms"].get(f"torch._scaled_mm {name.split()[1]} fast_accum")
                if name.startswith("TileLink") and base:
                    row["ratio"][name] = base / ms
                if name.startswith("TileLink") and fast:
                    row["ratio_vs_fast_accum"][name] = fast / ms
            rows.append(row)
            cells = [f"{n} {row['median_ms'][n]:.4f} ms ({r:.3f})" for n, r in row["ratio"].items()]
            click.echo(f"  {shape.name} {part} {g.M}x{g.N}x{g.K}: " + ", ".join(cells), err=True)
    return {"benchmark": "mlp", "mode": "compute", "world": world, "dtype": "fp8", "rounds": rounds, "scale": scale,
            "variants": [f"TileLink {s}" for s in FP8_SCALINGS], **environment(), "results": rows}


def summarize_compute_fp8(record: dict) -> str:
    names = [n for s in FP8_SCALINGS for n in (f"torch._scaled_mm {s}", f"TileLink {s}", f"TileLink {s} (as written)")]
    lines = [f"{'shape':8} {'part':8} {'M':>6} {'N':>6} {'K':>6} " + " ".join(f"{n + ' ms':>30}" for n in names)]
    for r in record["results"]:
        cells = [f"{r['median_ms'][n]:30.4f}" if n in r["median_ms"] else f"{'error':>30}" for n in names]
        lines.append(f"{r['shape']:8} {r['part']:8} {r['M']:6d} {r['N']:6d} {r['K']:6d} " + " ".join(cells))
    for name in [n for n in names if n.startswith("TileLink")]:
        for key, base in (("ratio", "torch._scaled_mm"), ("ratio_vs_fast_accum", "torch._scaled_mm fast_accum")):
            ratios = [r[key][name] for r in record["results"] if name in r.get(key, {})]
            if ratios:
                lines.append(f"{name} / {base}: min {min(ratios):.3f}, geomean "
                             f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over {len(ratios)} GEMMs")
    for r in record["results"]:
        for n, e in r["errors"].items():
            lines.append(f"error {r['shape']} {r['part']} {n}: {e}")
    return "\n".join(lines)


def chart_compute_fp8(record: dict, path: Path) -> Path | None:
    groups = [f"{r['shape']}\n{PART_TITLES[r['part']]}" for r in record["results"]]
    series = {"torch._scaled_mm": [1.0] * len(groups)}
    for s in FP8_SCALINGS:
        series[f"TileLink FP8 ({s})"] = [r["ratio"].get(f"TileLink {s}", math.nan) for r in record["results"]]
    return bar_chart(path, f"Per-rank FP8 GEMM at W={record['world']}, bf16 out, {record['device']}", groups,
                     series, "speed relative to torch._scaled_mm (same scaling)")


# ----------------------------------------------------------------------------------------------
# dist mode: W ranks, W GPUs


def _tilelink_ops():
    """``tilelink.ops.ag_gemm`` / ``gemm_rs`` (None for one the package lacks)."""
    import importlib

    ops = importlib.import_module("tilelink.ops")
    return getattr(ops, "ag_gemm", None), getattr(ops, "gemm_rs", None)


def _dist_part(part: str, g: GemmShape, world: int, dtype, rounds: int) -> dict:
    import torch
    import torch.distributed as dist

    group = dist.group.WORLD
    device = torch.device("cuda", torch.cuda.current_device())
    ag_gemm, gemm_rs = _tilelink_ops()
    out: dict = {"errors": {}}
    fns: dict = {}
    if part == "ag_gemm":
        a_shard = torch.randn(g.M // world, g.K, device=device, dtype=dtype)
        b = torch.randn(g.K, g.N, device=device, dtype=dtype)
        a_full = torch.empty(g.M, g.K, device=device, dtype=dtype)
        c = torch.empty(g.M, g.N, device=device, dtype=dtype)

        def comm():
            dist.all_gather_into_tensor(a_full, a_shard)

        def comp():
            torch.matmul(a_full, b, out=c)

        fns["comm"], fns["comp"] = comm, comp
        fns["cuBLAS+NCCL"] = lambda: (comm(), comp())
        fns["async-TP"] = lambda: torch.ops.symm_mem.fused_all_gather_matmul(
            a_shard, [b], gather_dim=0, group_name=group.group_name)
        if ag_gemm is not None:
            from tilelink.ops import TPContext

            ctx = TPContext(M=g.M)  # created once: no per-call exchange of the shard sizes
            fns["TileLink"] = lambda: ag_gemm(a_shard, b, ctx, path="overlap")
    else:
        a = torch.randn(g.M, g.K, device=device, dtype=dtype)
        b = torch.randn(g.K, g.N, device=device, dtype=dtype)
        c = torch.empty(g.M, g.N, device=device, dtype=dtype)
        c_shard = torch.empty(g.M // world, g.N, device=device, dtype=dtype)

        def comp():
            torch.matmul(a, b, out=c)

        def comm():
            dist.reduce_scatter_tensor(c_shard, c)

        fns["comm"], fns["comp"] = comm, comp
        fns["cuBLAS+NCCL"] = lambda: (comp(), comm())
        fns["async-TP"] = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(
            a, b, "sum", scatter_dim=0, group_name=group.group_name)
        if gemm_rs is not None:
            fns["TileLink"] = lambda: gemm_rs(a, b, path="overlap")
    times: dict[str, float] = {}
    host_ms: dict[str, float] = {}  # the host's time per call (enqueueing): as long as times' when it sets the pace
    for name, fn in fns.items():
        # say what runs, and dump every thread's stack if one method takes unreasonably long: a hang in
        # a collective or a kernel then names its place instead of ending in a silent timeout
        print(f"[rank {dist.get_rank()}] {part} M={g.M} N={g.N} K={g.K}: {name}", file=sys.stderr, flush=True)
        faulthandler.dump_traceback_later(METHOD_BUDGET_S)
        try:
            fn()  # warm-up, and every rank learns here whether a method works
            torch.cuda.synchronize()
            samples, host = [], []
            for _ in range(rounds):
                dist.barrier()
                samples.append(time_ms(fn, "cuda", group, host=host))
            t = torch.tensor([statistics.median(samples), statistics.median(host)], device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[name], host_ms[name] = float(t[0]), float(t[1])
        except Exception as exc:  # async-TP may be missing on some builds: record, go on
            out["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            faulthandler.cancel_dump_traceback_later()
    out["median_ms"] = times
    out["host_ms"] = host_ms
    base = times.get("cuBLAS+NCCL")
    out["speedup"] = {k: base / v for k, v in times.items() if base and k in ("async-TP", "TileLink")}
    if "comm" in times and "comp" in times:
        out["overlap_ratio"] = {k: (times["comp"] + times["comm"] - v) / times["comm"]
                                for k, v in times.items() if k in ("async-TP", "TileLink")}
    return out


def _dist_worker(rank: int, world: int, port: int, shapes: list[MLPShape], dtype: str, rounds: int,
                 scale: int, queue) -> None:
    import torch
    import torch.distributed as dist

    import tilelink

    for k, v in _SAFE_ENV.items():
        os.environ[k] = v
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        try:
            from torch.distributed._symmetric_memory import enable_symm_mem_for_group

            enable_symm_mem_for_group(dist.group.WORLD.group_name)
        except Exception:  # newer torch enables it on demand; older without it: async-TP records an error
            pass
        tilelink.init("nvshmem")  # TileLink's ranks: this NCCL group broadcasts NVSHMEM's unique id
        rows = []
        items = [(s, p) for s in shapes for p in PARTS]
        bar = progress(items, f"MLP over {world} ranks") if rank == 0 else None
        iterator = bar.__enter__() if bar else items
        for shape, part in iterator:
            g = per_rank_gemm(scaled(shape, scale, world), part, world)
            row = {"shape": shape.name, "part": part, "M": g.M, "N": g.N, "K": g.K}
            row.update(_dist_part(part, g, world, _torch_dtype(dtype), rounds))
            rows.append(row)
        if bar:
            bar.__exit__(None, None, None)
        if rank == 0:
            queue.put(rows)
    finally:
        tilelink.finalize()  # before the process group its NVSHMEM world was bootstrapped over
        dist.destroy_process_group()


def run_dist(shapes: list[MLPShape], world: int, dtype: str, rounds: int, scale: int = 1) -> dict:
    """Spawn ``world`` ranks on ``world`` GPUs and measure the baselines (and TileLink if present)."""
    import torch.multiprocessing as mp

    for k, v in _SAFE_ENV.items():
        os.environ.setdefault(k, v)
    from tilelink.runtime.launch import free_port

    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_dist_worker, args=(world, port, shapes, dtype, rounds, scale, queue), nprocs=world,
                       join=True, start_method="spawn")
    rows = queue.get()
    return {"benchmark": "mlp", "mode": "dist", "world": world, "dtype": dtype, "rounds": rounds,
            "scale": scale, **environment(), "results": rows}


def summarize_dist(record: dict) -> str:
    methods = ("cuBLAS+NCCL", "async-TP", "TileLink", "comp", "comm")
    lines = [f"{'shape':8} {'part':8} " + " ".join(f"{m + ' ms':>15}" for m in methods)
             + f" {'async-TP x':>10} {'TileLink x':>10}"]
    for r in record["results"]:
        ms = r["median_ms"]
        cells = " ".join(f"{ms[m]:15.4f}" if m in ms else f"{'-':>15}" for m in methods)
        sp = r["speedup"]
        lines.append(f"{r['shape']:8} {r['part']:8} {cells} {sp.get('async-TP', math.nan):10.3f} "
                     f"{sp.get('TileLink', math.nan):10.3f}")
        for m, e in r["errors"].items():
            lines.append(f"  error {m}: {e}")
    return "\n".join(lines)


def chart_dist(record: dict, path: Path) -> Path | None:
    groups = [f"{r['shape']}\n{PART_TITLES[r['part']]}" for r in record["results"]]
    series = {"cuBLAS+NCCL": [1.0] * len(groups)}
    for m in ("async-TP", "TileLink"):
        series[m] = [r["speedup"].get(m, math.nan) for r in record["results"]]
    return bar_chart(path, f"TP MLP on {record['world']} GPUs, {record['dtype']}, {record['device']}",
                     groups, series, "speedup over cuBLAS+NCCL")


# ----------------------------------------------------------------------------------------------


def run(world: int, shapes: str, out: Path, dtype: str, mode: str = "auto",
        variants: tuple[str, ...] = ("auto",), rounds: int = 3, scale: int = 1) -> dict:
    """Run the MLP benchmark and write ``<out>/mlp_<mode>_w<W>_<dtype>.json`` and ``.png``."""
    import torch

    chosen = select_shapes(shapes)
    if dtype == "fp8" and mode == "auto":  # FP8 is measured per rank (see below)
        mode = "compute"
    if mode == "auto":
        mode = "dist" if world > 1 and torch.cuda.device_count() >= world else "compute"
        if mode == "compute" and world > 1:
            click.echo(f"{torch.cuda.device_count()} GPU(s) here, fewer than --world {world}: measuring the "
                       f"per-rank compute part only (communication already satisfied)", err=True)
    if dtype == "fp8" and mode == "dist":
        raise click.UsageError("--dtype fp8 is measured in --mode compute (the per-rank FP8 GEMMs against "
                               "torch._scaled_mm); the dist mode runs bf16, fp16 and fp32")
    if dtype == "fp8":
        record = run_compute_fp8(chosen, world, rounds, scale)
        text, chart = summarize_compute_fp8(record), chart_compute_fp8
    elif mode == "dist":
        record = run_dist(chosen, world, dtype, rounds, scale)
        text, chart = summarize_dist(record), chart_dist
    else:
        record = run_compute(chosen, world, dtype, list(variants), rounds, scale)
        text, chart = summarize_compute(record), chart_compute
    stem = f"mlp_{mode}_w{world}_{dtype}"
    write_json(out / f"{stem}.json", record)
    chart(record, out / f"{stem}.png")
    click.echo(text)
    click.echo(f"wrote {out / (stem + '.json')}", err=True)
    return record


def main(argv: list[str] | None = None) -> None:
    """``python -m tilelink.benchmarks.mlp``: the same options as ``tlxform bench mlp``."""
    from tilelink.cli.bench_cmd import mlp

    mlp.main(args=argv if argv is not None else sys.argv[1:], prog_name="python -m tilelink.benchmarks.mlp")


if __name__ == "__main__":
    main()
