"""Sequence-parallel self-attention (paper §7.2, Table 4 Attn-1/2, Figure 10): TileLink against
torch all-gather + SDPA and against a ring attention, and our flash-attention kernel against SDPA.

Per-rank shape at world size W and sequence S: this rank's S/W query rows against all S keys
(batch 1, H heads, head dim 128, non-causal: SDPA's causal mask is aligned to the top-left corner,
which is not a rank's global position, and its flash backend takes no explicit mask).

Modes:
- ``compute`` (one GPU): the flash-attention kernel TileLink's operator is annotated from
  (``flash_attention``, no communication) and the same kernel as rewritten (every channel already
  satisfied: the inserted waits pass at once), and at ``--world`` above 1 the plain kernel in the rewritten one's
  chunks of keys (``chunked``: the cost of the chunks alone), against ``scaled_dot_product_attention`` on each of its
  GPU backends (cuDNN, flash, memory-efficient), side by side; the fastest backend on the shape is the
  baseline, ratio = its time / ours (> 1 faster), and every backend's time is recorded. ``--configs``
  also times candidate tile configs of the plain kernel on the first shape.
- ``dist`` (W GPUs, under ``torchrun --nproc-per-node W``): ``sp_attention`` against torch
  all-gather of K/V + SDPA on its fastest backend for the shape (no overlap) and against a ring
  attention (K/V passed around the ring with ``torch.distributed`` P2P while the current chunk is
  computed, partial results merged by their log-sum-exp). Also the communication alone (``comm_only``: the
  bare K/V all-gather) and the computation alone (``comp_only``: our flash kernel on the gathered K/V), for
  the paper's overlap ratio ``(comp_only + comm_only - overlapped) / comm_only`` of TileLink; JSON and a PNG chart.

Run: ``python -m tilelink.benchmarks.attention --mode compute --world 8 --rounds 3 --out results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import sys
from pathlib import Path

import torch

from tilelink.benchmarks.common import environment, select_named, side_by_side, write_json


@dataclasses.dataclass(frozen=True)
class AttnShape:
    """One self-attention row of the paper's Table 4."""

    name: str
    heads: int
    head_dim: int


ATTN_SHAPES = {s.name: s for s in (AttnShape("Attn-1", 32, 128), AttnShape("Attn-2", 64, 128))}
SEQS = (16384, 32768, 65536, 131072)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) configs of the plain kernel, head dim 128
CANDIDATES = ((128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3))


def flops(heads: int, q_rows: int, kv_rows: int, head_dim: int) -> int:
    """Two GEMMs (QK^T and PV) of a non-causal forward pass."""
    return 4 * heads * q_rows * kv_rows * head_dim


#: SDPA's GPU backends, fastest first on an H200 at these shapes (the math backend is not a contender)
SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")


def sdpa_on(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``scaled_dot_product_attention`` pinned to one backend (``SDPA_BACKENDS``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, backend)):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def sdpa_candidates(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[dict, dict]:
    """Each SDPA backend that runs this shape, as ``sdpa_<backend>`` -> callable, and the reason of each
    that does not (a backend refuses some shapes, dtypes and GPUs)."""
    fns: dict = {}
    refused: dict = {}
    for backend in SDPA_BACKENDS:
        name = "sdpa_" + backend.split("_")[0].lower()
        try:
            sdpa_on(backend, q, k, v)
        except RuntimeError as exc:
            refused[name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        fns[name] = functools.partial(sdpa_on, backend, q, k, v)
    return fns, refused


def fastest_sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The backend of ``SDPA_BACKENDS`` that runs this shape fastest (a short timing of each)."""
    import triton.testing

    fns, refused = sdpa_candidates(q, k, v)
    if not fns:
        raise RuntimeError(f"no SDPA backend runs this shape: {refused}")
    ms = {n: triton.testing.do_bench(fn, warmup=10, rep=30) for n, fn in fns.items()}
    return SDPA_BACKENDS[[("sdpa_" + b.split("_")[0].lower()) for b in SDPA_BACKENDS].index(best_sdpa(ms))]


def best_sdpa(ms: dict) -> str:
    """The fastest SDPA backend among the timed ones (``sdpa_*`` keys of ``ms``)."""
    return min((n for n in ms if n.startswith("sdpa_")), key=ms.__getitem__)


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def _rewritten(q, k, v, world: int, meta: dict):
    """The generated kernel on full K/V with satisfied channels (rank 0's query rows)."""
    from tilelink.ops import attention_kernels

    ok = attention_kernels.sp_attention_fwd_kernel
    gen = getattr(ok.module, ok.name)
    B, H, rows, D = q.shape
    S = k.shape[2]
    o = torch.empty_like(q)
    chans = ok.launcher.satisfied_args(S, world, q.device)
    grid = (-(-rows // meta["BLOCK_M"]), B * H)

    if q.device.type == "cuda":
        from tilelink.ops.gemm import _install_allocator

        _install_allocator()  # the kernel's K/V tensor descriptors need scratch memory

    def run():
        chunk = -(-S // world)  # one rank's shard: the rewritten kernel waits once per chunk
        gen[grid](q, k, v, o, 1.0 / math.sqrt(D), rows, S, 0, 0, chunk, H, H // k.shape[1], q.stride(0),
                  q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
                  v.stride(2), o.stride(0), o.stride(1), o.stride(2), HEAD_DIM=D, CAUSAL=False,
                  EVEN_N=S % meta["BLOCK_N"] == 0 and chunk % meta["BLOCK_N"] == 0, **meta, **chans)
        return o
    return run


def _chunked(q, k, v, world: int, meta: dict):
    """The plain kernel visiting the keys in the rewritten kernel's chunks (one rank's shard each), with no wait:
    against the plain kernel in one chunk, what the chunks alone cost (each restarts the inner loop's pipeline);
    against the rewritten kernel, what its waits cost."""
    from tilelink.ops.attention import _launch
    from tilelink.ops.attention_kernels import attention_fwd_kernel

    S = k.shape[2]
    o = torch.empty_like(q)

    def run():
        _launch(attention_fwd_kernel, q, k, v, o, S, k.shape[1], 0, 0, -(-S // world), False,
                (k.stride(0), k.stride(1), k.stride(2)), meta)
        return o
    return run


def _measure_compute(shape: AttnShape, S: int, world: int, dtype: torch.dtype, rounds: int, sweep: bool,
                     rewritten: bool, device: str = "cuda") -> tuple[dict, list[dict]]:
    """One per-rank shape: every SDPA backend and our kernel side by side (the fastest backend is the baseline);
    with ``sweep``, candidate configs."""
    from tilelink.ops.attention import attention_config, flash_attention

    q_rows = S // world
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, shape.heads, n, shape.head_dim, device=device, dtype=dtype, generator=g)
               for n in (q_rows, S, S))
    meta = attention_config(shape.head_dim, dtype, device)
    baselines, refused = sdpa_candidates(q, k, v)
    if not baselines:
        raise RuntimeError(f"no SDPA backend runs {shape.name} S={S}: {refused}")
    ref = next(iter(baselines.values()))()
    fns = {**baselines, "tilelink": functools.partial(flash_attention, q, k, v)}
    errors = {"tilelink": _rel_err(fns["tilelink"](), ref)}
    if rewritten:
        fns["rewritten"] = _rewritten(q, k, v, world, meta)
        errors["rewritten"] = _rel_err(fns["rewritten"](), ref)
        if world > 1:
            fns["chunked"] = _chunked(q, k, v, world, meta)
            errors["chunked"] = _rel_err(fns["chunked"](), ref)
    failed: list[dict] = []
    if sweep:
        for bm, bn, w, st in CANDIDATES:
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
            name = f"{bm}x{bn}_w{w}_s{st}"
            try:
                errors[name] = _rel_err(flash_attention(q, k, v, config=cfg), ref)
            except Exception as exc:  # noqa: BLE001 - a config that cannot compile is reported, not fatal
                failed.append({"config": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            fns[name] = functools.partial(flash_attention, q, k, v, config=cfg)
    times = side_by_side(fns, rounds, device)
    med = {n: statistics.median(t) for n, t in times.items()}
    best = best_sdpa(med)
    f = flops(shape.heads, q_rows, S, shape.head_dim)
    main = [*baselines, *(n for n in ("tilelink", "chunked", "rewritten") if n in med)]
    ours = [n for n in ("tilelink", "chunked", "rewritten") if n in med]
    row = {"shape": shape.name, "S": S, "q_rows": q_rows, "heads": shape.heads, "head_dim": shape.head_dim,
           "config": meta, "baseline": best, "sdpa_refused": refused,
           "ms": {n: med[n] for n in main}, "times_ms": {n: times[n] for n in main},
           "tflops": {n: f / (med[n] * 1e-3) / 1e12 for n in main},
           "ratio_vs_best_sdpa": {n: med[best] / med[n] for n in ours},
           "ratio_per_round": {n: [a / b for a, b in zip(times[best], times[n], strict=True)] for n in ours},
           "rel_err_vs_sdpa": errors}
    entries = failed + [{"shape": shape.name, "S": S, "config": n, "ms": med[n],
                         "ratio_vs_best_sdpa": med[best] / med[n], "tflops": f / (med[n] * 1e-3) / 1e12}
                        for n in med if n not in (*baselines, "chunked", "rewritten")]
    return row, entries if sweep else []


def run_compute(shapes: list[AttnShape], seqs: list[int], world: int, dtype: torch.dtype, rounds: int,
                configs: bool, rewritten: bool, checkpoint=None) -> dict:
    """Every per-rank shape in turn; ``checkpoint(record)`` gets the record so far after each shape."""
    props = torch.cuda.get_device_properties(0)
    rows: list[dict] = []
    sweep: list[dict] = []
    for shape in shapes:
        for S in seqs:
            row, entries = _measure_compute(shape, S, world, dtype, rounds, configs and not rows, rewritten)
            rows.append(row)
            sweep += entries
            med, tf = row["ms"], row["tflops"]
            ratios = " ".join(f"{n}={r:.3f}" for n, r in row["ratio_vs_best_sdpa"].items())
            sdpa = ", ".join(f"{n[5:]} {med[n]:.3f} ms ({tf[n]:.0f} TFLOP/s)" for n in med if n.startswith("sdpa_"))
            print(f"{shape.name} S={S} rows={row['q_rows']}: SDPA {sdpa}, "
                  f"ours {med['tilelink']:.3f} ms ({tf['tilelink']:.0f} TFLOP/s); vs {row['baseline']} {ratios}; "
                  f"err {row['rel_err_vs_sdpa']}", flush=True)
            for e in entries:
                print(f"  config {e}", flush=True)
            torch.cuda.empty_cache()
            record = {"mode": "compute", "world": world, "dtype": str(dtype), "rounds": rounds,
                      "sm_count": props.multi_processor_count, "rows": rows, "config_sweep": sweep,
                      "note": "ratio = the fastest SDPA backend's median ms / ours; each time the median of do_bench "
                              "medians (warmup 25 ms, rep 100 ms) over rounds that alternate which method runs first"}
            if checkpoint is not None:
                checkpoint(record)
    return record


# --------------------------------------------------------------------------- several GPUs (torchrun)
def _attn_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its per-row log-sum-exp (natural log), (B, H, rows) in fp32."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)
        return out[0], out[1]
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)
    return (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype), lse


_GROUP = None  # the NCCL group of the baselines (tilelink.init's default group is gloo, for control)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Non-causal ring attention: K/V shards travel around the ring (P2P) while the chunk in hand is
    computed; partial outputs are merged by log-sum-exp. Shards must all have the same length."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    kv = torch.stack((k, v))
    out, lse = None, None
    for step in range(world):
        if step < world - 1:
            nxt = torch.empty_like(kv)
            ops = [dist.P2POp(dist.isend, kv, (rank + 1) % world, _GROUP),
                   dist.P2POp(dist.irecv, nxt, (rank - 1) % world, _GROUP)]
            reqs = dist.batch_isend_irecv(ops)
        o_i, lse_i = _attn_lse(q, kv[0], kv[1])
        if out is None:
            out, lse = o_i.float(), lse_i
        else:
            new = torch.logaddexp(lse, lse_i)
            out = out * torch.exp(lse - new)[..., None] + o_i.float() * torch.exp(lse_i - new)[..., None]
            lse = new
        if step < world - 1:
            for r in reqs:
                r.wait()
            kv = nxt
    return out.to(q.dtype)


def _gather_buffers(k: torch.Tensor, v: torch.Tensor, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's K and V stacked, and the buffer the all-gather fills with every rank's (K, V) in turn
    (one flat leading dimension: what both gloo and NCCL accept)."""
    kv = torch.stack((k, v)).contiguous()
    return kv, torch.empty((world * 2, *kv.shape[1:]), dtype=kv.dtype, device=kv.device)


def gather_kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The communication alone: all-gather K and V along the sequence (NCCL, or the default group's
    backend), returned as the full (batch, kv heads, world * shard, head_dim) K and V."""
    import torch.distributed as dist

    world = dist.get_world_size(_GROUP)
    kv, full = _gather_buffers(k, v, world)
    dist.all_gather_into_tensor(full, kv, group=_GROUP)
    full = full.view(world, *kv.shape)
    shape = (k.shape[0], k.shape[1], -1, k.shape[3])
    return (full[:, 0].permute(1, 2, 0, 3, 4).reshape(shape), full[:, 1].permute(1, 2, 0, 3, 4).reshape(shape))


def allgather_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """torch baseline: all-gather K and V along the sequence, then SDPA (no overlap) on ``backend`` (one of
    ``SDPA_BACKENDS``; None: torch's own choice)."""
    kf, vf = gather_kv(k, v)
    if backend is None:
        return torch.nn.functional.scaled_dot_product_attention(q, kf, vf)
    return sdpa_on(backend, q, kf, vf)


def overlap_ratio(comp_ms: float, comm_ms: float, overlapped_ms: float) -> float:
    """The paper's overlap ratio (§7.2, Figure 10): the share of the communication time hidden,
    ``(comp_only + comm_only - overlapped) / comm_only``."""
    return (comp_ms + comm_ms - overlapped_ms) / comm_ms


def _measure_dist(shape: AttnShape, S: int, world, dtype: torch.dtype, rounds: int) -> dict:
    from tilelink.ops import SPContext, flash_attention, sp_attention

    n = S // world.world_size
    g = torch.Generator(device=world.device).manual_seed(world.rank)
    q, k, v = (torch.randn(1, shape.heads, n, shape.head_dim, device=world.device, dtype=dtype, generator=g)
               for _ in range(3))
    import torch.distributed as dist

    kf, vf = gather_kv(k, v)  # the comp-only input: this rank's queries against the gathered sequence
    kv, gathered = _gather_buffers(k, v, world.world_size)
    backend = fastest_sdpa_backend(q, kf, vf)  # the same on every rank: equal shapes, one GPU model
    fns = {"torch_ag_sdpa": functools.partial(allgather_sdpa, q, k, v, backend),
           "ring": functools.partial(ring_attention, q, k, v),
           "tilelink": functools.partial(sp_attention, q, k, v, ctx=SPContext(S)),
           # the communication alone: the bare all-gather of K and V, no layout copies
           "comm_only": functools.partial(dist.all_gather_into_tensor, gathered, kv, group=_GROUP),
           "comp_only": functools.partial(flash_attention, q, kf, vf)}
    with torch.cuda.device(world.device):
        ref = fns["torch_ag_sdpa"]()
        errors = {name: _rel_err(fns[name](), ref) for name in ("ring", "tilelink", "comp_only")}
        times = side_by_side(fns, rounds, "cuda", group=_GROUP or dist.group.WORLD)
    med = {name: statistics.median(t) for name, t in times.items()}
    if world.rank == 0:
        print(f"{shape.name} S={S}: {med}", flush=True)
    return {"shape": shape.name, "S": S, "sdpa_backend": backend, "ms": med, "times_ms": times, "rel_err": errors,
            "speedup_vs_torch": {name: med["torch_ag_sdpa"] / med[name] for name in ("ring", "tilelink")},
            # TileLink's only: comp_only is its own kernel (the ring computes with SDPA chunks and merges)
            "overlap_ratio": {"tilelink": overlap_ratio(med["comp_only"], med["comm_only"], med["tilelink"])}}


def chart(record: dict, path: Path) -> Path | None:
    """Speedup over torch (all-gather + SDPA) per shape, TileLink and RingAttention, like Figure 10."""
    from tilelink.benchmarks.common import bar_chart

    rows = record["rows"]
    groups = [f"{r['shape']} {r['S'] // 1024}k" for r in rows]
    series = {"TileLink": [r["speedup_vs_torch"]["tilelink"] for r in rows],
              "RingAttn": [r["speedup_vs_torch"]["ring"] for r in rows]}
    ratios = ", ".join(f"{g}: {r['overlap_ratio']['tilelink']:.0%}" for g, r in zip(groups, rows, strict=True))
    return bar_chart(path, f"SP attention on {record['world']} GPUs, {record['dtype']} (TileLink overlap {ratios})",
                     groups, series, "speedup over torch all-gather + SDPA")


def run_dist(shapes: list[AttnShape], seqs: list[int], dtype: torch.dtype, rounds: int) -> dict | None:
    import torch.distributed as dist

    import tilelink

    global _GROUP
    world = tilelink.init()
    rank, W = world.rank, world.world_size
    _GROUP = dist.new_group(backend="nccl")
    rows = [_measure_dist(shape, S, world, dtype, rounds) for shape in shapes for S in seqs]
    tilelink.finalize()
    return {"mode": "dist", "world": W, "dtype": str(dtype), "rounds": rounds, "rows": rows} if rank == 0 else None


def run(world: int, shapes: str, seqs: str, out: Path, dtype: str, mode: str, rounds: int, configs: bool,
        rewritten: bool) -> Path | None:
    chosen = select_named(ATTN_SHAPES, "Attn", shapes)
    seq_list = [int(s.lower().replace("k", "")) * 1024 if s.lower().endswith("k") else int(s)
                for s in seqs.split(",")] if seqs != "all" else list(SEQS)
    if mode == "auto":
        mode = "dist" if torch.cuda.device_count() >= world > 1 else "compute"
    if not torch.cuda.is_available():
        raise SystemExit("tilelink.benchmarks.attention needs a CUDA GPU")
    path = Path(out) / f"attention_{mode}_w{world}_{dtype}.json"
    if mode == "compute":
        env = {"benchmark": "attention", **environment()}
        record = run_compute(chosen, seq_list, world, DTYPES[dtype], rounds, configs, rewritten,
                             checkpoint=lambda r: write_json(path, {**env, **r}))
    else:
        record = run_dist(chosen, seq_list, DTYPES[dtype], rounds)
        if record is None:
            return None
    record = {"benchmark": "attention", **environment(), **record}
    write_json(path, record)
    print(f"wrote {path}")
    if mode == "dist":
        png = chart(record, path.with_suffix(".png"))
        if png is not None:
            print(f"wrote {png}")
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--shapes", default="all")
    p.add_argument("--seqs", default="all", help="comma list such as 16k,32k or 'all' (16k..128k)")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--mode", choices=["auto", "compute", "dist"], default="auto")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", action="store_true", help="also time candidate configs on the first shape")
    p.add_argument("--no-rewritten", dest="rewritten", action="store_false")
    a = p.parse_args(argv)
    run(a.world, a.shapes, a.seqs, a.out, a.dtype, a.mode, a.rounds, a.configs, a.rewritten)


if __name__ == "__main__":
    main(sys.argv[1:])
