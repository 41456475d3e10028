"""Host cost per call of the overlapped operators: what the launching thread spends on one call.

An operator's host work (checks, contexts, the copy engine's enqueues, the kernels' launches) is hidden
behind the GPU's while it is shorter; once it is longer, the host sets the pace and the overlap is lost
(a small token count, a decoder's many layers, a CUDA graph not captured). This benchmark measures it: the
mean host time of ``--calls`` back-to-back calls enqueued without a synchronisation (the GPU drains them
after the clock stops), for ``tilelink.ops.ag_gemm`` and ``gemm_rs`` on the per-rank shape of an MLP of the
paper's Table 4 (:mod:`tilelink.benchmarks.common`), side by side with a warm ``torch.matmul`` alone and with a
``torch.distributed`` collective of the same bytes (``all_gather_into_tensor`` before it,
``reduce_scatter_tensor`` after it, on an NCCL group), and on a GPU the operator's call captured in a CUDA graph and
replayed (what a captured call costs the host: one replay). ``cpu_us`` is the launching thread's CPU time per call
(on a shared machine ``host_us`` also counts the time other work took the core); ``wall_us`` the time per call
including the GPU's (the clock stops after a synchronisation): when ``host_us`` is as long, the host sets the pace.
The table gives each method's host time over ``torch.matmul``'s too: a shared host's speed moves every method alike
between runs (by up to 1.7x on the same kind of machine), which the ratio cancels. A round runs every method once,
the first rotating, so that a drift of the host's speed falls on all of them alike; each operator's result is
checked against an fp32 reference after its first call and after the timed ones (a replay's after them).

Then each operator runs ``--calls`` more calls under ``cProfile`` on every rank; the record keeps rank 0's
top 20 functions by their own time and by their cumulative time, per call.

Ranks are started with :func:`tilelink.spawn`, one world per ``--worlds`` entry: NVSHMEM on a GPU (rank r on
GPU r when there are GPUs enough, else every rank on GPU 0: the ranks then time-slice one GPU, which leaves
their host time meaningful but not the wall time, and NCCL refuses them, so the collective baseline is left
out; keep ``--calls`` at its default there, since eight ranks' calls queued on one GPU can fill its queue, after
which the host waits for the device: 50 calls of ``gemm_rs`` at world 8 took 5 ms of host time a call, 20 took
0.46), emulated CPU ranks without one (a smoke test: kernels run in Triton's interpreter, inside the host time).

``tlxform bench host`` or ``python -m tilelink.benchmarks.host``; writes ``host_<shape>_<dtype>.json``.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import time
import zlib
from pathlib import Path

import click

from tilelink.benchmarks.common import (
    PARTS,
    MLPShape,
    environment,
    per_rank_gemm,
    scaled,
    select_shapes,
    write_json,
)

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: what each operator is set beside: the same GEMM alone, and with the collective its overlap hides
BASELINES = {"ag_gemm": ("torch.matmul", "torch.matmul+all_gather"),
             "gemm_rs": ("torch.matmul", "torch.matmul+reduce_scatter")}
KERNELS = ("auto", "persistent", "pointer")
PROFILE_TOP = 20


def _tensors(part: str, g, world, dtype, device) -> dict:
    """The operator's inputs on this rank, and the full operands of the reference: drawn from one seed on every
    rank, so that each rank's slice is its part of the same problem."""
    import torch

    from tilelink.mapping import shard_range

    R, r = world.world_size, world.rank
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"host/{part}/{g.M}x{g.N}x{g.K}".encode()))
    if part == "ag_gemm":  # each rank: its rows of A, and its own (K, N) weight
        a_full = torch.randn(g.M, g.K, device=device, dtype=dtype, generator=gen)
        b = torch.randn(R, g.K, g.N, device=device, dtype=dtype, generator=gen)[r].contiguous()
        lo, hi = shard_range(g.M, r, R)
        return {"a_full": a_full, "a_shard": a_full[lo:hi].contiguous(), "b": b,
                "ref": a_full.float() @ b.float()}
    # gemm_rs: each rank its K-slice of A and B; the result is this rank's rows of the sum over ranks
    a_all = torch.randn(R, g.M, g.K, device=device, dtype=dtype, generator=gen)
    b_all = torch.randn(R, g.K, g.N, device=device, dtype=dtype, generator=gen)
    lo, hi = shard_range(g.M, r, R)
    ref = sum(a_all[i].float() @ b_all[i].float() for i in range(R))[lo:hi]
    return {"a": a_all[r].contiguous(), "b_shard": b_all[r].contiguous(), "ref": ref}


def _methods(part: str, t: dict, g, world, persistent: bool | None, group) -> dict:
    """name -> a call: the overlapped operator (``path="overlap"``, whatever the cost model would pick) and its
    baselines (the collective one only with ``group``)."""
    import torch
    import torch.distributed as dist

    from tilelink.ops import TPContext, ag_gemm, gemm_rs

    fns = {}
    c = torch.empty(g.M, g.N, device=t["ref"].device, dtype=t["b" if part == "ag_gemm" else "b_shard"].dtype)
    if part == "ag_gemm":
        ctx = TPContext(M=g.M)  # made once: no exchange of the shard sizes per call
        a_full, a_shard, b = t["a_full"], t["a_shard"], t["b"]
        fns["tilelink"] = lambda: ag_gemm(a_shard, b, ctx, persistent=persistent, path="overlap")
        fns["torch.matmul"] = lambda: torch.matmul(a_full, b, out=c)
        if group is not None:
            fns["torch.matmul+all_gather"] = lambda: (dist.all_gather_into_tensor(a_full, a_shard, group=group),
                                                      torch.matmul(a_full, b, out=c))
    else:
        a, b_shard = t["a"], t["b_shard"]
        c_shard = torch.empty(t["ref"].shape, device=c.device, dtype=c.dtype)
        fns["tilelink"] = lambda: gemm_rs(a, b_shard, persistent=persistent, path="overlap")
        fns["torch.matmul"] = lambda: torch.matmul(a, b_shard, out=c)
        if group is not None:
            fns["torch.matmul+reduce_scatter"] = lambda: (torch.matmul(a, b_shard, out=c),
                                                          dist.reduce_scatter_tensor(c_shard, c, group=group))
    if c.device.type == "cuda":
        fns[GRAPHED] = _graphed(fns["tilelink"])
    return fns


#: the method of the operator's call captured in a CUDA graph and replayed
GRAPHED = "tilelink, CUDA graph replay"


def _graphed(fn):
    """``fn`` captured in a CUDA graph at its first call (``fn`` must have run once uncaptured: that call made its
    context and loaded its kernels), then replayed at every call, which returns the captured call's result (written
    by the replay): the host's cost of a captured call."""
    import torch

    captured = []

    def call():
        if not captured:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                result = fn()
            captured.append((graph, result))
        graph, result = captured[0]
        graph.replay()
        return result

    return call


def _check(fn, ref, out: dict, name: str = "tilelink") -> None:
    """Call the operator (the method ``name``) and compare with the reference: ``out["rel_err"]`` is the largest
    relative error of the calls checked, and one past 2e-2 (or NaN: rows never written) is recorded as an error."""
    err = float((fn().float() - ref).norm() / ref.norm().clamp_min(1e-30))
    out["rel_err"] = max(out.get("rel_err", 0.0), err) if err == err else err
    if not err < 2e-2:
        out["errors"][name] = f"relative error {err:.3g} against the fp32 reference"


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_times(fns: dict, calls: int, rounds: int, device, barrier) -> tuple[dict, dict, dict, dict]:
    """For each method of ``fns`` and each round, the mean host time of ``calls`` back-to-back calls (µs; no
    synchronisation between them), the launching thread's CPU time of them (µs a call: on a shared machine the
    host time also counts what other work took from this thread), and the mean time per call once the device has
    finished them too; and the methods that failed (name -> error). A round runs every method, the first one
    rotating from round to round, so that a drift of the host's speed (a shared machine's) falls on every method
    alike. Every rank makes the same calls."""
    host: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    wall: dict[str, list[float]] = {name: [] for name in fns}
    errors: dict[str, str] = {}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name in errors:
                continue
            try:
                _sync(device)
                barrier()
                start, thread = time.perf_counter(), time.thread_time()
                for _ in range(calls):
                    fns[name]()
                enqueued, used = time.perf_counter(), time.thread_time() - thread
                _sync(device)
                done = time.perf_counter()
            except Exception as exc:  # one failing baseline must not lose the others' numbers
                errors[name] = f"{type(exc).__name__}: {exc}"[:500]
                continue
            host[name].append((enqueued - start) * 1e6 / calls)
            cpu[name].append(used * 1e6 / calls)
            wall[name].append((done - start) * 1e6 / calls)
    ok = [n for n in fns if n not in errors]
    return {n: host[n] for n in ok}, {n: cpu[n] for n in ok}, {n: wall[n] for n in ok}, errors


def _where(key: tuple) -> str:
    """A profile entry's function, as ``module/file.py:line(name)`` (the file's last two parts)."""
    file, line, name = key
    if file == "~":  # a builtin
        return name
    return f"{'/'.join(Path(file).parts[-2:])}:{line}({name})"


def profile_calls(fn, calls: int, device, top: int = PROFILE_TOP) -> dict:
    """``calls`` calls of ``fn`` under cProfile: the ``top`` functions by own time and by cumulative time, each
    with its calls per call and µs per call."""
    _sync(device)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    _sync(device)
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, ..)
    rows = [{"function": _where(key), "calls": nc / calls, "own_us": tt * 1e6 / calls, "cum_us": ct * 1e6 / calls}
            for key, (_cc, nc, tt, ct, _callers) in stats.items()]
    total = sum(r["own_us"] for r in rows)
    return {"calls": calls, "total_us": total,
            "by_own": sorted(rows, key=lambda r: -r["own_us"])[:top],
            "by_cumulative": sorted(rows, key=lambda r: -r["cum_us"])[:top]}


def measure_rank(shape: MLPShape, dtype: str, calls: int, rounds: int, kernel: str = "auto",
                 parts: tuple[str, ...] = PARTS, profile: bool = True, warm: int = 3) -> dict:
    """One rank of an initialised world: every part's methods timed, the operators checked against the
    reference and profiled. Returns this rank's row."""
    import torch
    import torch.distributed as dist

    from tilelink.runtime import current_world

    world = current_world()
    device = world.device
    tdtype = getattr(torch, DTYPES[dtype])
    persistent = {"auto": None, "persistent": True, "pointer": False}[kernel]
    R = world.world_size
    shared_gpu = device.type == "cuda" and torch.cuda.device_count() < R
    group = None
    why_no_collective = None
    if device.type != "cuda":
        group = dist.group.WORLD  # the emulated world's gloo group: CPU tensors
    elif shared_gpu:
        why_no_collective = (f"{R} ranks share {torch.cuda.device_count()} GPU(s): NCCL needs a GPU per rank, so the "
                             f"collective baseline is left out")
    else:
        group = dist.new_group(backend="nccl")
    row = {"rank": world.rank, "world": R, "device": str(device), "shared_gpu": shared_gpu, "parts": {}}
    if why_no_collective:
        row["note"] = why_no_collective
    for part in parts:
        g = per_rank_gemm(shape, part, R)
        t = _tensors(part, g, world, tdtype, device)
        fns = _methods(part, t, g, world, persistent, group)
        out = {"M": g.M, "N": g.N, "K": g.K, "host_us": {}, "cpu_us": {}, "wall_us": {}, "errors": {}}
        _check(fns["tilelink"], t["ref"], out)  # the first call: contexts, compilation
        for name, fn in list(fns.items()):
            try:
                for _ in range(warm):  # the first calls of a method load and tune
                    fn()
            except Exception as exc:  # one failing baseline must not lose the others' numbers
                out["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
                del fns[name]
        out["host_us"], out["cpu_us"], out["wall_us"], failed = host_times(fns, calls, rounds, device, world.barrier)
        out["errors"].update(failed)
        _check(fns["tilelink"], t["ref"], out)  # a call like the timed ones, on what the first one set up
        if GRAPHED in fns and GRAPHED not in out["errors"]:  # a replay writes the captured call's result
            try:
                _check(fns[GRAPHED], t["ref"], out, GRAPHED)
            except Exception as exc:  # the uncaptured call's numbers stand without it
                out["errors"][GRAPHED] = f"{type(exc).__name__}: {exc}"[:500]
        if profile:
            out["profile"] = profile_calls(fns["tilelink"], calls, device)
        row["parts"][part] = out
        del t, fns
    if group is not None and group is not dist.group.WORLD:
        dist.destroy_process_group(group)
    return row


def _world_record(shape: MLPShape, world: int, dtype: str, calls: int, rounds: int, kernel: str,
                  parts: tuple[str, ...], profile: bool, warm: int) -> dict:
    """The rows of every rank of a world of ``world`` ranks (started here unless under a launcher)."""
    import torch

    import tilelink
    from tilelink.runtime import current_world

    if "WORLD_SIZE" in os.environ:  # under torchrun / tlxform run: this process is one rank
        tilelink.init()
        try:
            row = measure_rank(shape, dtype, calls, rounds, kernel, parts, profile, warm)
            rows = current_world().control.exchange(row, "tlxform bench host")
        finally:
            tilelink.finalize()
    else:
        backend = "nvshmem" if torch.cuda.is_available() else "emulated"
        rows = tilelink.spawn(measure_rank, world, shape, dtype, calls, rounds, kernel, parts, profile, warm,
                              backend=backend, timeout=900)
    return {"world": len(rows), "ranks": rows}


def run(worlds: tuple[int, ...] = (1, 2), shape: str = "MLP-1", out: Path = Path("bench-results"),
        dtype: str = "bf16", calls: int = 20, rounds: int = 5, kernel: str = "auto",
        parts: tuple[str, ...] = PARTS, profile: bool = True, scale: int = 1, warm: int = 3,
        custom: MLPShape | None = None) -> dict:
    """Measure every world of ``worlds``; write ``<out>/host_<shape>_<dtype>.json`` and print the table.
    ``warm``: calls of each method before its rounds; ``custom``: a shape of one's own in place of ``shape``
    (tests)."""
    chosen = custom or select_shapes(shape)[0]
    record = {"benchmark": "host", "shape": chosen.name, "dtype": dtype, "calls": calls, "rounds": rounds,
              "kernel": kernel, "scale": scale, **environment(), "worlds": []}
    path = Path(out) / f"host_{chosen.name}_{dtype}.json"
    for world in worlds:
        click.echo(f"host cost per call: {chosen.name} at world {world} ({calls} calls x {rounds} rounds)", err=True)
        record["worlds"].append(_world_record(scaled(chosen, scale, world), world, dtype, calls, rounds, kernel,
                                              parts, profile, warm))
        write_json(path, record)  # each world as it is measured: a later world's failure keeps it
    click.echo(summarize(record))
    click.echo(f"wrote {path}", err=True)
    return record


def summarize(record: dict) -> str:
    """The table: per world and part, each method's host, CPU and wall µs per call (the slowest rank's median
    round) and its host time over ``torch.matmul``'s in the same run (on a shared host, whose speed moves every
    method alike from run to run, the steadier number), then rank 0's profile of the operator by own time."""
    lines = [f"{'world':>5} {'part':8} {'method':28} {'host us':>9} {'cpu us':>9} {'wall us':>9} {'/ matmul':>9}"]
    profiles = []
    for w in record["worlds"]:
        ranks = w["ranks"]
        for part in ranks[0]["parts"]:
            per = [r["parts"][part] for r in ranks]
            rows = {name: tuple(max(statistics.median(p[k][name]) for p in per if name in p[k])
                                for k in ("host_us", "cpu_us", "wall_us"))
                    for name in per[0]["host_us"]}
            matmul = rows.get("torch.matmul", (0.0,))[0]
            for name, (host, cpu, wall) in rows.items():
                ratio = f"{host / matmul:8.1f}x" if matmul > 0 else f"{'-':>9}"
                lines.append(f"{w['world']:5d} {part:8} {name:28} {host:9.1f} {cpu:9.1f} {wall:9.1f} {ratio}")
            for p in per:
                for name, e in p["errors"].items():
                    lines.append(f"      error rank {ranks[per.index(p)]['rank']} {name}: {e}")
            prof = per[0].get("profile")
            if prof:
                profiles.append(f"\nworld {w['world']} {part}: rank 0's profile, {prof['total_us']:.1f} us a call "
                                f"under cProfile; by own time (us a call, calls a call):")
                profiles.extend(f"  {r['own_us']:8.1f} {r['calls']:6.1f}  {r['function']}" for r in prof["by_own"])
        if ranks[0].get("note"):
            lines.append(f"      world {w['world']}: {ranks[0]['note']}")
    return "\n".join(lines + profiles)


def main(argv: list[str] | None = None) -> None:
    """``python -m tilelink.benchmarks.host``: the same options as ``tlxform bench host``."""
    from tilelink.cli.bench_cmd import bench  # first: it registers the command of cli/bench_host.py

    bench.commands["host"].main(args=argv if argv is not None else sys.argv[1:],
                                prog_name="python -m tilelink.benchmarks.host")


if __name__ == "__main__":
    main()
