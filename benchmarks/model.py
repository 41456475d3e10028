"""The cost model (:mod:`tilelink.cost`) against the measurements: its calibration from the records, its
validation, its predictions, and the calibration of this machine.

- :func:`calibration_from_records`: the parts from the records in ``docs/perf`` (how each part is read from
  which record is in its ``sources`` entry); the shipped ``cost_h200.json`` is its output.
- :func:`validation_rows`: the model's plain and overlapped times against every measured multi-GPU run.
- :func:`prediction_rows`: the model's predictions for the paper's shapes at a world size.
- :func:`calibrate`: measures the parts on this machine (cuBLAS, memory, launch, SDPA and each operator's
  kernel at world 1 on one GPU; with two GPUs the copy engine and NCCL too) and returns the calibration;
  each measurement is a function of :data:`MEASUREMENTS`, replaceable for a check without a GPU.

Run as ``tlxform bench model`` (``--validate``, ``--calibrate``) or ``python -m tilelink.benchmarks.model``.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tilelink import cost
from tilelink.benchmarks.common import MLP_SHAPES, per_rank_gemm

#: the records the shipped calibration is read from, and the runs the model is validated against
RECORDS = Path(__file__).resolve().parent.parent / "docs" / "perf"

#: the paper's MoE and attention shapes (benchmarks.moe and benchmarks.attention hold them too; those load torch)
MOE = {"MoE-1": (8192, 2048, 1536, 8, 2), "MoE-2": (8192, 2048, 1536, 32, 2), "MoE-3": (8192, 2048, 1536, 32, 5),
       "MoE-4": (8192, 4096, 2048, 8, 2), "MoE-5": (8192, 4096, 2048, 32, 2), "MoE-6": (8192, 4096, 2048, 32, 5)}
ATTENTION = {"Attn-1": 32, "Attn-2": 64}  # heads, head dim 128
ATTENTION_SEQS = (16384, 32768, 65536, 131072)


#: cuBLAS times shorter than this (ms) are left out of the GEMM rate's fit
LAUNCH_BOUND_MS = 0.05


def _records(folder: Path) -> list[tuple[Path, dict]]:
    out = []
    for name in sorted(glob.glob(str(Path(folder) / "*.json"))):
        with open(name) as f:
            out.append((Path(name), json.load(f)))
    return out


def _median(xs) -> float:
    xs = list(xs)
    if not xs:
        raise ValueError("no measurement of this part in the records")
    return float(statistics.median(xs))


def _fit2(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of ``y = a*x1 + b*x2`` in relative error (each row divided by its y)."""
    s11 = sum((x1 / y) ** 2 for x1, _, y in rows)
    s22 = sum((x2 / y) ** 2 for _, x2, y in rows)
    s12 = sum(x1 * x2 / y**2 for x1, x2, y in rows)
    t1 = sum(x1 / y for x1, _, y in rows)
    t2 = sum(x2 / y for _, x2, y in rows)
    det = s11 * s22 - s12 * s12
    return (t1 * s22 - t2 * s12) / det, (t2 * s11 - t1 * s12) / det


def fit_gemm(samples: list[tuple[int, int, int, float]], e: int = 2) -> tuple[float, float]:
    """(TFLOP/s, epilogue GB/s) of ``t = 2MNK / rate + MN*e / epilogue`` over (M, N, K, ms) samples."""
    a, b = _fit2([(2 * M * N * K * 1e-9, M * N * e * 1e-6, t) for M, N, K, t in samples])
    return 1.0 / a, 1.0 / b  # ms per GFLOP -> TFLOP/s, ms per MB -> GB/s


def fit_collective(samples: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(GB/s, latency us) of ``t = latency + (R - 1) * bytes / bw`` over (R, per-peer bytes, ms) samples."""
    a, b = _fit2([(1.0, (R - 1) * nbytes * 1e-6, t) for R, nbytes, t in samples])
    return 1.0 / b, a * 1e3


def fit_host_per_peer(worlds: dict[int, list[float]]) -> tuple[float, str]:
    """What each rank past two adds to a call's host time (ms), and its source: the least-squares slope, through
    world 2's median, of the medians of the larger worlds (``worlds``: world size -> ms per call); never below 0
    (a host's noise must not make more peers cheaper)."""
    if 2 not in worlds:
        return 0.0, "no host record of two ranks"
    if not any(R > 2 for R in worlds):
        return 0.0, "no host record of more than two ranks"
    base = _median(worlds[2])
    points = [(R - 2, _median(ms) - base) for R, ms in sorted(worlds.items()) if R > 2]
    slope = sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    sizes = ", ".join(str(R) for R in sorted(worlds))
    return max(slope, 0.0), f"least squares over the host record's medians at worlds {sizes}"


def host_record(rec: dict) -> dict[str, dict[int, list[float]]]:
    """A host-benchmark record's host times per call (ms): operator (``plain``: ``torch.matmul`` and the collective;
    ``matmul``: ``torch.matmul`` alone) -> world size -> every rank's rounds. A rank whose result was wrong is left
    out."""
    out: dict[str, dict[int, list[float]]] = {}
    for w in rec["worlds"]:
        for rank in w["ranks"]:
            for part, got in rank["parts"].items():
                if "tilelink" in got.get("errors", {}):
                    continue
                for method, values in got["host_us"].items():
                    name = {"tilelink": part, "torch.matmul": "matmul"}.get(method, "plain" if "+" in method else None)
                    if name is not None and values and (w["world"] > 1 or name != part):
                        out.setdefault(name, {}).setdefault(w["world"], []).extend(us / 1e3 for us in values)
    return out


def calibration_from_records(folder: Path = RECORDS) -> cost.Calibration:
    """The H200's parts from the records in ``folder`` (see each part's source); records of other GPUs (an H100's
    host times, kept beside them for the docs) are left out."""
    recs = [(path, rec) for path, rec in _records(folder)
            if re.search(r"\bH200\b", str(rec.get("device", "NVIDIA H200")))]  # not an H100's, nor a GH200's
    parts: dict[str, float] = {}
    src: dict[str, str] = {}
    gemm, ag, rs = [], [], []
    ratio = {"ag_gemm": [], "gemm_rs": [], "ag_moe": [], "moe_rs": [], "sp_attention": [], "gemm_ar": []}
    attention, pulls = [], {}
    host = {k: [] for k in ("ag_gemm", "gemm_rs", "ag_moe", "moe_rs", "plain", "plain_moe")}
    hosts: list[tuple[str, dict[str, dict[int, list[float]]]]] = []  # host records: name, op -> world -> ms
    names = []
    for path, rec in recs:
        kind, rows = rec.get("benchmark"), rec.get("results") or rec.get("rows") or []
        if kind == "mlp" and rec.get("mode") == "dist":
            names.append(path.name)
            R = rec["world"]
            for r in rows:
                ms = r["median_ms"]
                gemm.append((r["M"], r["N"], r["K"], ms["comp"]))
                if r["part"] == "ag_gemm":
                    ag.append((R, -(-r["M"] // R) * r["K"] * 2, ms["comm"]))
                else:
                    rs.append((R, -(-r["M"] // R) * r["N"] * 2, ms["comm"]))
                for k, v in r.get("host_ms", {}).items():
                    if k == "TileLink":
                        host[r["part"]].append(v)
                    elif k == "cuBLAS+NCCL":
                        host["plain"].append(v)
        elif kind == "moe" and rec.get("mode") == "dist":
            names.append(path.name)
            for r in rows:
                for k, v in r["host_ms"].items():
                    dest = {"tilelink_ag": "ag_moe", "tilelink_rs": "moe_rs", "fused_ag": "plain_moe",
                            "fused_rs": "plain_moe"}.get(k)
                    if dest:
                        host[dest].append(v)
        elif kind == "moe" and rec.get("mode") == "compute" and rec.get("expert_routing") == "random":
            names.append(path.name)
            for r in rows:
                gemm.append((r["slots"], r["N"], r["K"], r["ms"]["cublas_dense"]))
                pad = r.get("padded_rows", {}).get("persistent", 0)
                best = r["ms"].get("persistent_rewritten") or r["ms"]["persistent"]
                ratio[r["part"]].append((r["ms"]["cublas_dense"] / best * (r["slots"] + pad) / r["slots"],
                                         r["ms"]["cublas_dense"]))
        elif kind == "attention":
            names.append(path.name)
            for r in rows:
                base = r["ms"][r["baseline"]]
                attention.append(4 * r["q_rows"] * r["S"] * r["heads"] * r["head_dim"] / (base * 1e9))
                ratio["sp_attention"].append((base / r["ms"]["rewritten"], base))
        elif kind == "host" and not str(rec.get("device", "")).startswith("cpu"):
            # benchmarks.host on a GPU: the operators' host time per call, per world size. One record serves the
            # operators, the latest that timed one with peers: hosts differ in speed from run to run, and the paths
            # are compared within one run
            hosts.append((path.name, host_record(rec)))
        elif kind == "pull_bandwidth":
            names.append(path.name)
            for r in rows:
                if r.get("taken") and r.get("topk", 1) == 1:
                    pulls[r["kernel"]] = r["GB/s"]
        elif kind == "decode" and rec.get("mode") == "compute":
            names.append(path.name)
            # launch-bound at these sizes: no GEMM rate is fitted
            ratio["gemm_ar"] += [(r["ratio"], r["median_ms"]["torch.matmul"]) for r in rows]
        elif "rows" in rec and rows and "rewritten/torch" in rows[0]:  # benchmarks.overlap_cost
            names.append(path.name)
            for r in rows:
                ratio[r["kind"]].append((r["rewritten/torch"], _median(x["ms"]["torch"] for x in r["rounds"])))
                gemm.append((r["M"], r["N"], r["K"], _median(x["ms"]["torch"] for x in r["rounds"])))
    # a GEMM this short is launch-bound (MoE-1/2's 32-40 us): its time says little of the rate or the epilogue
    gemm = [g for g in gemm if g[3] >= LAUNCH_BOUND_MS]
    parts["gemm_tflops"], parts["gemm_epilogue_gb_s"] = fit_gemm(gemm)
    src["gemm_tflops"] = src["gemm_epilogue_gb_s"] = (
        f"least squares over {len(gemm)} cuBLAS times of at least {LAUNCH_BOUND_MS} ms (mlp dist 'comp', "
        f"overlap-cost 'torch', moe compute 'cublas_dense')")
    parts["hbm_gb_s"] = 3400.0
    src["hbm_gb_s"] = "the top-k reduce's 3.1-3.7 TB/s on an H200 (ARCHITECTURE.md); no record times a plain copy"
    parts["attention_tflops"] = _median(attention)
    src["attention_tflops"] = "median TFLOP/s of the fastest SDPA backend (cuDNN), attention compute record"
    for op, values in ratio.items():
        if values:
            # the vendor's total time over ours: each row weighs as much as its time, so the long GEMMs where an
            # overlap choice is close are predicted from their own rate, not from the short ones' lower one
            parts[f"tile_ratio.{op}"] = sum(w for _, w in values) / sum(w / r for r, w in values)
            src[f"tile_ratio.{op}"] = (f"vendor time / rewritten time over {len(values)} rows (compute-mode records), "
                                       f"each row weighted by its time")
    if not ratio["gemm_ar"]:
        parts["tile_ratio.gemm_ar"] = parts["tile_ratio.gemm_rs"]
        src["tile_ratio.gemm_ar"] = "GEMM+RS's (no decode compute record)"
    parts["nccl_all_gather_gb_s"], parts["nccl_all_gather_latency_us"] = fit_collective(ag)
    parts["nccl_reduce_scatter_gb_s"], parts["nccl_reduce_scatter_latency_us"] = fit_collective(rs)
    for k in ("all_gather", "reduce_scatter"):
        src[f"nccl_{k}_gb_s"] = src[f"nccl_{k}_latency_us"] = f"least squares over the mlp dist records' 'comm' ({k})"
    parts["copy_engine_gb_s"] = parts["nccl_all_gather_gb_s"]
    src["copy_engine_gb_s"] = ("NCCL all-gather's (no record times the copy engine alone; --calibrate on two GPUs "
                               "measures it)")
    parts["sm_pull_ag_gb_s"] = pulls["ag_pull_producer"]
    parts["sm_pull_rs_gb_s"] = pulls["rs_pull_consumer"]
    src["sm_pull_ag_gb_s"] = src["sm_pull_rs_gb_s"] = "the pull-bandwidth record's settings taken (top-k 1)"
    parts["link_latency_us"] = 2.0
    src["link_latency_us"] = "NVLink's flag round trip, about 2 us (no record; only a --link latency moves it)"
    parts["handshake_us"] = 10.0
    src["handshake_us"] = ("a word to each peer and a stream wait, about 10 us (the records predate the handshake; "
                           "--calibrate measures a world of one's)")
    parts["kernel_launch_us"] = 4.0
    src["kernel_launch_us"] = "a launch back to back, about 4 us (no record; --calibrate measures it)"
    for k, values in host.items():
        parts[f"host_ms.{k}"] = _median(values)
        src[f"host_ms.{k}"] = f"median host_ms of {len(values)} dist measurements"
    for op in ("ag_gemm", "gemm_rs", "ag_moe", "moe_rs"):
        parts[f"host_peer_ms.{op}"] = 0.0
        src[f"host_peer_ms.{op}"] = "no host record"
    host_worlds: dict[str, dict[int, list[float]]] = {}
    baselines = ("matmul", "plain")  # the host record's methods that are not operators
    # the operators from the latest host record that timed one with peers (a run of world 1 alone times none)
    ops_run = next(((name, rec) for name, rec in reversed(hosts)
                    if any(R >= 2 for op, worlds in rec.items() if op not in baselines for R in worlds)),
                   None)
    if ops_run is not None:
        host_name, host_worlds = ops_run
        host_worlds = {op: worlds for op, worlds in host_worlds.items() if op not in baselines}
        names.append(host_name)
        matmul_run = [v for values in ops_run[1].get("matmul", {}).values() for v in values]
        # the plain path (torch.matmul and the collective: NCCL needs a GPU per rank, so a world of one on a single
        # GPU) from the latest record that has both at world 1, as a multiple of torch.matmul's host time in that
        # run, applied to torch.matmul's in the operators' run: a host's speed moves every method of a run alike
        plain = next(((name, rec) for name, rec in reversed(hosts)
                      if rec.get("plain", {}).get(1) and rec.get("matmul", {}).get(1)), None)
        if plain is not None and matmul_run:
            name, rec = plain
            over_matmul = _median(rec["plain"][1]) / _median(rec["matmul"][1])
            parts["host_ms.plain"] = over_matmul * _median(matmul_run)
            src["host_ms.plain"] = (f"torch.matmul + the collective at world 1 over torch.matmul in {name} "
                                    f"({over_matmul:.2f}x), times torch.matmul's host time in {host_name}")
            if name != host_name:
                names.append(name)
    for op, worlds in host_worlds.items():
        # the host benchmark measures the operators as they are now: its times replace the dist records' (which
        # timed the code of their day), and its larger worlds give what each further peer adds
        if 2 in worlds:
            parts[f"host_ms.{op}"] = _median(worlds[2])
            src[f"host_ms.{op}"] = f"median of the host record's {len(worlds[2])} rounds (ranks x rounds) at world 2"
        parts[f"host_peer_ms.{op}"], src[f"host_peer_ms.{op}"] = fit_host_per_peer(worlds)
    for op, like in (("ag_moe", "ag_gemm"), ("moe_rs", "gemm_rs")):
        if op not in host_worlds and like in host_worlds:  # the same launchers move their rows
            parts[f"host_peer_ms.{op}"] = parts[f"host_peer_ms.{like}"]
            src[f"host_peer_ms.{op}"] = f"{like}'s (the same launcher; no host record of {op})"
    for op, like, why in (("gemm_ar", "gemm_rs", "no record of gemm_ar yet"),
                          ("sp_attention", "ag_gemm", "no host record of sp_attention")):
        for kind in ("host_ms", "host_peer_ms"):
            parts[f"{kind}.{op}"] = parts[f"{kind}.{like}"]
            src[f"{kind}.{op}"] = f"{like}'s ({why})"
    parts["choice_margin"] = 0.02
    src["choice_margin"] = "a choice within 2% goes to the plain path (no symmetric memory, less host work)"
    device = next((rec.get("device") for _, rec in recs if rec.get("device")), "NVIDIA H200")
    env = next((rec for _, rec in recs if rec.get("torch")), {})
    machine = {"device": device.split(" x")[0], "sms": 132, "link": "NVLink, 2 GPUs of one host",
               "torch": env.get("torch"), "triton": env.get("triton"), "records": sorted(set(names))}
    return cost.Calibration(machine, {k: round(v, 6) for k, v in parts.items()}, src)


# ----------------------------------------------------------------------------------------------
# validation and predictions


def _mlp_shape(name: str, part: str, R: int) -> dict:
    g = per_rank_gemm(MLP_SHAPES[name], part, R)
    return dict(M=g.M, N=g.N, K=g.K)


def _moe_shape(name: str, part: str, R: int) -> dict:
    S, H, inter, E, topk = MOE[name]
    if part == "ag_moe":
        return dict(S=S, H=H, N=2 * inter // R, E=E, topk=topk)
    return dict(S=S, H=H, K=inter // R, E=E, topk=topk)


def validation_rows(cal: cost.Calibration, folder: Path = RECORDS) -> list[dict]:
    """One row per measured multi-GPU run of an operator: measured and predicted plain / overlapped ms."""
    rows = []
    for path, rec in _records(folder):
        if rec.get("mode") != "dist" or rec.get("benchmark") not in ("mlp", "moe"):
            continue
        R = rec["world"]
        run = path.stem.rsplit("-", 1)[-1] if "run" in path.stem else "1"
        for r in rec.get("results") or rec.get("rows"):
            if rec["benchmark"] == "mlp":
                ms = r["median_ms"]
                cases = [(r["part"], _mlp_shape(r["shape"], r["part"], R), ms.get("cuBLAS+NCCL"), ms.get("TileLink"),
                          "cuBLAS+NCCL")]
            else:
                ms = r["ms"]
                cases = [(p, _moe_shape(r["shape"], p, R), ms.get(f"fused_{s}"), ms.get(f"tilelink_{s}"), "fused")
                         for p, s in (("ag_moe", "ag"), ("moe_rs", "rs"))]
            for op, shape, plain, ours, baseline in cases:
                if plain is None or ours is None:
                    continue
                pred = cost.predict(op, shape, R, calibration=cal)
                # what the automatic choice would have cost on this run: its path's measured time over the faster one
                auto = cost.decide(op, shape, R, calibration=cal).path
                rows.append({"shape": r["shape"], "op": op, "run": run.removeprefix("run"), "date": rec.get("date"),
                             "auto": auto, "auto_loss": (plain if auto == "plain" else ours) / min(plain, ours) - 1,
                             "world": R, "baseline": baseline, "plain_ms": plain, "plain_pred": pred.plain,
                             "plain_err": pred.plain / plain - 1, "overlap_ms": ours, "overlap_pred": pred.overlap,
                             "overlap_err": pred.overlap / ours - 1, "speedup": plain / ours,
                             "speedup_pred": pred.speedup, "host_bound": pred.host_overlap > pred.overlap_gpu})
    return rows


def prediction_rows(cal: cost.Calibration, world: int, link: cost.Link | None = None) -> list[dict]:
    """The model's predictions for the paper's MLP, MoE and attention shapes at ``world`` ranks."""
    out = []
    for name in MLP_SHAPES:
        for op in ("ag_gemm", "gemm_rs"):
            out.append((name, op, _mlp_shape(name, op, world)))
    for name in MOE:
        for op in ("ag_moe", "moe_rs"):
            out.append((name, op, _moe_shape(name, op, world)))
    for name, heads in ATTENTION.items():
        for S in ATTENTION_SEQS:
            out.append((f"{name} {S // 1024}k", "sp_attention", dict(S=S, heads=heads, kv_heads=heads, head_dim=128)))
    rows = []
    for name, op, shape in out:
        p = cost.predict(op, shape, world, calibration=cal, link=link)
        rows.append({"shape": name, "op": op, "world": world, "plain": p.plain, "overlap": p.overlap,
                     "ideal": p.ideal, "compute": p.compute, "comm": p.comm, "speedup": p.speedup,
                     "speedup_device": p.plain_gpu / p.overlap_gpu,
                     "bound": p.plain / p.ideal, "choice": cost.decide(op, shape, world, calibration=cal).path})
    return rows


def validation_table(rows: list[dict]) -> str:
    lines = ["| shape | part | run | baseline | baseline ms | predicted | error | TileLink ms | predicted | error "
             "| auto picks | slower than the faster |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['op']} | {r['run']} ({r['date']}) | {r['baseline']} | {r['plain_ms']:.3f} | "
                     f"{r['plain_pred']:.3f} | {r['plain_err']:+.1%} | {r['overlap_ms']:.3f} | "
                     f"{r['overlap_pred']:.3f} | {r['overlap_err']:+.1%}{' (host)' if r['host_bound'] else ''} | "
                     f"{r['auto']} | {r['auto_loss']:.1%} |")
    return "\n".join(lines)


def prediction_table(rows: list[dict]) -> str:
    lines = ["| shape | part | plain ms | overlapped ms | ideal ms | predicted speedup | device only "
             "| bound (plain / ideal) | auto picks |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['op']} | {r['plain']:.3f} | {r['overlap']:.3f} | {r['ideal']:.3f} | "
                     f"{r['speedup']:.2f} | {r['speedup_device']:.2f} | {r['bound']:.2f} | {r['choice']} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    errs = [abs(r[k]) for r in rows for k in ("plain_err", "overlap_err")]
    within = sum(e <= 0.10 for e in errs)
    close = sum(r["auto_loss"] <= 0.02 for r in rows)
    return (f"{within} of {len(errs)} predicted times within 10% (median error {statistics.median(errs):.1%}, "
            f"largest {max(errs):.1%}); the automatic choice within 2% of the faster path on {close} of {len(rows)} "
            f"runs (largest loss {max(r['auto_loss'] for r in rows):.1%})")


# ----------------------------------------------------------------------------------------------
# calibration of this machine


def _cuda_timer(fn: Callable[[], object], reps: int = 20) -> float:
    """Median ms of ``fn`` between CUDA events, after a warm-up call."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _host_timer(fn: Callable[[], object], reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


#: the GEMMs timed for cuBLAS's rate (per-rank MLP shapes at worlds 2 and 8, and a short K)
GEMM_SHAPES = ((8192, 11008, 4096), (8192, 4096, 5504), (8192, 2752, 4096), (8192, 4096, 1376), (16384, 4096, 256),
               (8192, 7168, 8192))


def measure_gemm(env: dict) -> dict:
    import torch

    samples = []
    for M, N, K in env["gemm_shapes"]:
        a = torch.randn(M, K, device=env["device"], dtype=env["dtype"])
        b = torch.randn(K, N, device=env["device"], dtype=env["dtype"])
        samples.append((M, N, K, env["timer"](lambda a=a, b=b: torch.matmul(a, b))))
    rate, epilogue = fit_gemm(samples, env["dtype"].itemsize)
    return {"gemm_tflops": rate, "gemm_epilogue_gb_s": epilogue}


def measure_memory(env: dict) -> dict:
    import torch

    n = env["copy_bytes"] // 2
    src = torch.empty(n, device=env["device"], dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = env["timer"](lambda: dst.copy_(src))
    return {"hbm_gb_s": 2 * n * 2 / (ms * 1e6)}


def measure_launch(env: dict) -> dict:
    import torch

    x = torch.zeros(1, device=env["device"])
    calls = 200
    ms = env["timer"](lambda: [x.add_(1) for _ in range(calls)])
    return {"kernel_launch_us": ms * 1e3 / calls}


def measure_attention(env: dict) -> dict:
    import torch
    import torch.nn.functional as F

    rows, S, heads = env["attention_shape"]
    q = torch.randn(1, heads, rows, 128, device=env["device"], dtype=env["dtype"])
    k = torch.randn(1, heads, S, 128, device=env["device"], dtype=env["dtype"])
    ms = env["timer"](lambda: F.scaled_dot_product_attention(q, k, k))
    return {"attention_tflops": 4 * rows * S * heads * 128 / (ms * 1e9)}


def measure_operators(env: dict) -> dict:
    """Each operator at world 1 (its rewritten kernel with channels satisfied) against the vendor compute, and
    the host's time per call (a world of one: the operators' checks and launches, not the handshake)."""
    import torch

    import tilelink
    from tilelink.ops import ag_gemm, gemm_rs, sp_attention

    tilelink.init()
    try:
        out = {}
        M, N, K = env["operator_gemm"]
        a = torch.randn(M, K, device=env["device"], dtype=env["dtype"])
        b = torch.randn(K, N, device=env["device"], dtype=env["dtype"])
        base = env["timer"](lambda: torch.matmul(a, b))
        for op, fn in (("ag_gemm", lambda: ag_gemm(a, b, path="overlap")),
                       ("gemm_rs", lambda: gemm_rs(a, b, path="overlap"))):
            out[f"tile_ratio.{op}"] = base / env["timer"](fn)
            out[f"host_ms.{op}"] = _host_timer(fn)
        out["host_ms.plain"] = _host_timer(lambda: torch.matmul(a, b))
        rows, _, heads = env["attention_shape"]
        q = torch.randn(1, heads, rows, 128, device=env["device"], dtype=env["dtype"])
        import torch.nn.functional as F

        sdpa = env["timer"](lambda: F.scaled_dot_product_attention(q, q, q))
        fn = lambda: sp_attention(q, q, q)  # noqa: E731
        out["tile_ratio.sp_attention"] = sdpa / env["timer"](fn)
        out["host_ms.sp_attention"] = _host_timer(fn)
        return out
    finally:
        tilelink.finalize()


def measure_peers(env: dict) -> dict:
    """The copy engine from GPU 0 to GPU 1 (a cross-device copy), with two GPUs; nothing otherwise."""
    import torch

    if torch.cuda.device_count() < 2:
        return {}
    n = env["copy_bytes"] // 2
    src = torch.empty(n, device="cuda:0", dtype=torch.bfloat16)
    dst = torch.empty(n, device="cuda:1", dtype=torch.bfloat16)
    ms = env["timer"](lambda: dst.copy_(src, non_blocking=True))
    return {"copy_engine_gb_s": n * 2 / (ms * 1e6)}


def _nccl_worker(rank: int, world: int, port: int, sizes, queue) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        got = {"all_gather": [], "reduce_scatter": []}
        for nbytes in sizes:
            shard = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16)
            full = torch.empty(world * shard.numel(), device="cuda", dtype=torch.bfloat16)
            for kind, fn in (("all_gather", lambda f=full, s=shard: dist.all_gather_into_tensor(f, s)),
                             ("reduce_scatter", lambda f=full, s=shard: dist.reduce_scatter_tensor(s, f))):
                dist.barrier()
                ms = torch.tensor([_cuda_timer(fn)], device="cuda")
                dist.all_reduce(ms, op=dist.ReduceOp.MAX)
                got[kind].append((world, nbytes, float(ms)))
        if rank == 0:
            queue.put(got)
    finally:
        dist.destroy_process_group()


def measure_nccl(env: dict) -> dict:
    """NCCL's all-gather and reduce-scatter over every GPU here (two at least): latency + bytes / bandwidth."""
    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    if world < 2:
        return {}
    from tilelink.runtime.launch import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_nccl_worker, args=(world, free_port(), env["nccl_bytes"], queue), nprocs=world, join=True,
                       start_method="spawn")
    got = queue.get()
    out = {}
    for kind, samples in got.items():
        out[f"nccl_{kind}_gb_s"], out[f"nccl_{kind}_latency_us"] = fit_collective(samples)
    return out


#: what --calibrate measures, in order; each takes the environment and returns parts
MEASUREMENTS: dict[str, Callable[[dict], dict]] = {
    "gemm": measure_gemm, "memory": measure_memory, "launch": measure_launch, "attention": measure_attention,
    "operators": measure_operators, "peers": measure_peers, "nccl": measure_nccl,
}


def default_env() -> dict:
    import torch

    return {"device": "cuda", "dtype": torch.bfloat16, "timer": _cuda_timer, "gemm_shapes": GEMM_SHAPES,
            "copy_bytes": 1 << 30, "attention_shape": (2048, 16384, 32), "operator_gemm": (8192, 4096, 4096),
            "nccl_bytes": (8 << 20, 32 << 20, 64 << 20)}


def calibrate(base: cost.Calibration, env: dict | None = None,
              measurements: dict[str, Callable[[dict], dict]] | None = None, echo=print) -> cost.Calibration:
    """``base`` with every part this machine measured replaced (its source saying so); a part that could not be
    measured here (one GPU: the copy engine, NCCL; the SM pull and the handshake: their own benchmarks) keeps
    ``base``'s value and source. A measurement that fails is reported and skipped."""
    env = {**default_env(), **(env or {})}
    parts, sources = dict(base.parts), dict(base.sources)
    measured = []
    for name, fn in (measurements or MEASUREMENTS).items():
        try:
            got = fn(env)
        except Exception as exc:  # one part's failure keeps the others' numbers
            echo(f"{name}: not measured ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
            continue
        for k, v in got.items():
            if k not in cost.PARTS:
                raise KeyError(f"measurement {name!r} returned {k!r}, which is not a part of the model")
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                echo(f"{name}: {k} = {v!r} is not a positive number: kept {parts.get(k)}")
                continue
            parts[k] = round(float(v), 6)
            sources[k] = f"measured here by tlxform bench model --calibrate ({name})"
            measured.append(k)
        echo(f"{name}: " + (", ".join(f"{k}={got[k]:.4g}" for k in got) or "nothing here"))
    machine = dict(base.machine)
    machine.update(_this_machine())
    machine["measured"] = sorted(measured)
    machine["date"] = time.strftime("%Y-%m-%d")
    return cost.Calibration(machine, parts, sources)


def _this_machine() -> dict:
    import torch
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    info = {"device": device, "gpus": torch.cuda.device_count(), "torch": torch.__version__,
            "triton": triton.__version__}
    if torch.cuda.is_available():
        info["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    return info


def main(argv: list[str] | None = None) -> None:
    """``python -m tilelink.benchmarks.model``: the same options as ``tlxform bench model``."""
    from tilelink.cli.bench_model import command

    command.main(args=argv if argv is not None else sys.argv[1:], prog_name="python -m tilelink.benchmarks.model")


if __name__ == "__main__":
    main()
