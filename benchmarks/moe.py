"""Tensor-parallel MoE (paper §7.2, Table 4 MoE-1..6, Figure 9): AG + gather + GroupGEMM and GroupGEMM +
scatter + top-k reduce + RS.

Per-rank shapes at world size W (S tokens, hidden H, intermediate I, E experts, top-k): after the
gather every rank computes all ``S * topk`` slots against its slice of every expert —
part 1 (``ag_moe``, gate | up fused): **slots x H @ H x 2I/W**; part 2 (``moe_rs``): **slots x I/W
@ I/W x H** — grouped by expert, each expert's slots padded to the tile height.

Modes:
- ``compute`` (one GPU): the grouped GEMM TileLink's operators are annotated from (``plain``: the
  kernel as written, no communication; ``rewritten``: the generated kernel with every channel already
  satisfied; ``persistent`` / ``persistent_rewritten``: the tensor-descriptor kernel the operator runs on
  a GPU, persistent for ``ag_moe``, the column sweep for ``moe_rs``) against dense cuBLAS on **equal
  useful FLOPs** (``torch.matmul`` of (slots, K) @ (K, N)) and against a torch loop over experts (gather,
  matmul per expert, scatter-add); ``--configs`` also times candidate tile configs. Ratio = baseline ms /
  ours (> 1: ours faster).
- ``dist`` (``--world W`` ranks started here, one per GPU; or each process one rank under ``torchrun`` /
  ``tlxform run``): ``ag_moe`` / ``moe_rs`` (overlapped) against
  the torch reference (torch.distributed all-gather, loop over experts, reduce-scatter) and against our
  own non-overlapped path (the same grouped GEMM, then torch.distributed all-gather / reduce-scatter).

Routing: each token picks ``topk`` distinct experts uniformly at random (seeded). ``--expert-routing``
(compute mode) also takes two routings that give every expert the same number of slots (no padding beyond
the last tile of the whole problem): ``balanced`` (token ``t``'s ``k``-th expert is ``(t*topk + k) mod E``,
so a token's experts are neighbours) and ``equal`` (the balanced rows given to the tokens in a random order:
every expert the same count, a token's experts and each expert's tokens random). Against ``random`` they
separate what the padding of uneven experts costs from what a random gather costs. Compute mode also times
``triton_dense``: our own autotuned dense Triton GEMM
(:func:`tilelink.ops.gemm.matmul`) on the same dense problem as cuBLAS, the rate a Triton kernel reaches
without a gather, padding or scatter.

Run: ``python -m tilelink.benchmarks.moe --mode compute --world 8 --shapes 4,5,6 --rounds 2 --out results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
from pathlib import Path

import torch

from tilelink.benchmarks.common import environment, select_named, side_by_side, spawn_backend, write_json


@dataclasses.dataclass(frozen=True)
class MoEShape:
    """One MoE row of the paper's Table 4."""

    name: str
    S: int
    H: int
    I: int  # noqa: E741 - the paper's name for the intermediate size
    E: int
    topk: int


MOE_SHAPES = {s.name: s for s in (
    MoEShape("MoE-1", 8192, 2048, 1536, 8, 2), MoEShape("MoE-2", 8192, 2048, 1536, 32, 2),
    MoEShape("MoE-3", 8192, 2048, 1536, 32, 5), MoEShape("MoE-4", 8192, 4096, 2048, 8, 2),
    MoEShape("MoE-5", 8192, 4096, 2048, 32, 2), MoEShape("MoE-6", 8192, 4096, 2048, 32, 5))}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PARTS = ("ag_moe", "moe_rs")
#: candidate (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the grouped GEMMs, bf16 on Hopper
CANDIDATES = ((64, 128, 64, 4, 4), (64, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
              (128, 256, 128, 8, 2), (64, 512, 64, 8, 3))


def random_routing(S: int, E: int, topk: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk`` distinct experts per token, uniformly at random, and weights summing to 1."""
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.rand(S, E, generator=g, device=device).topk(topk, dim=-1).indices
    w = torch.rand(S, topk, generator=g, device=device)
    return ids, w / w.sum(-1, keepdim=True)


#: the routings of ``--expert-routing`` (see the module docstring)
EXPERT_ROUTINGS = ("random", "balanced", "equal")


def expert_routing(kind: str, S: int, E: int, topk: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids (S, topk), weights (S, topk)) of routing ``kind`` of :data:`EXPERT_ROUTINGS`: ``topk``
    distinct experts per token (``topk <= E``), weights summing to 1 (those of :func:`random_routing` for
    every kind). With ``balanced`` and ``equal`` every expert gets the same number of slots when ``E``
    divides ``S * topk``."""
    if kind not in EXPERT_ROUTINGS:
        raise ValueError(f"expert routing must be one of {', '.join(EXPERT_ROUTINGS)}, got {kind!r}")
    ids, weights = random_routing(S, E, topk, device, seed)
    if kind == "random":
        return ids, weights
    slot = torch.arange(S * topk, device=device).view(S, topk)
    ids = slot % E  # balanced: consecutive slots on consecutive experts, so a token's experts are distinct
    if kind == "equal":
        g = torch.Generator(device=device).manual_seed(seed + 1)
        ids = ids[torch.randperm(S, generator=g, device=device)]
    return ids, weights


def per_rank_problem(shape: MoEShape, part: str, world: int) -> tuple[int, int, int]:
    """(slots, N, K) of the grouped GEMM one rank computes for ``part``."""
    slots, inter = shape.S * shape.topk, shape.I // world
    return (slots, 2 * inter, shape.H) if part == "ag_moe" else (slots, shape.H, inter)


def torch_loop(x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, weights: torch.Tensor | None,
               gather_rows: bool) -> torch.Tensor:
    """The torch reference: for each expert, gather its slots, one matmul, scatter (or scatter-add, weighted,
    into token rows when ``weights`` is given)."""
    flat = topk_ids.flatten()
    slots, topk = flat.numel(), topk_ids.shape[1]
    out = (torch.empty((slots, w.shape[2]), dtype=x.dtype, device=x.device) if weights is None
           else torch.zeros((topk_ids.shape[0], w.shape[2]), dtype=torch.float32, device=x.device))
    for e in range(w.shape[0]):
        idx = (flat == e).nonzero().squeeze(1)
        rows = x[idx // topk] if gather_rows else x[idx]
        y = rows @ w[e]
        if weights is None:
            out[idx] = y
        else:
            out.index_add_(0, idx // topk, y.float() * weights.flatten()[idx, None])
    return out if weights is None else out.to(x.dtype)


def _grouped(part: str, x, w, out, weights, topk_ids, meta: dict, *, persistent: bool = False,
             rewritten: bool = False, rows: int = 0, world: int = 1):
    """A launch of the operator's grouped GEMM (``persistent`` or pointer form; as written, or
    ``rewritten`` with every channel of ``world`` ranks sharing ``rows`` tokens already satisfied), with
    the routing aligned to ``meta``."""
    from tilelink.ops.contract import aligned
    from tilelink.ops.moe import grouped_gemm
    from tilelink.ops.moe_routing import align_tokens, as_routing

    routing = as_routing(topk_ids, w.shape[0])  # ids: routed here, one copy to the host; a Routing: as it is
    topk_ids = routing.topk_ids
    if persistent and aligned(w, -1) is not w:
        raise ValueError(f"the persistent kernel needs 16-byte rows of w, got {tuple(w.shape)} {w.dtype}: "
                         f"pad N (tilelink.ops.contract.aligned) as ag_moe does")
    sorted_ids, expert_ids = align_tokens(routing, w.shape[0], meta["BLOCK_M"])
    okernel, grid, args, launch_meta = grouped_gemm(part, x, w, out, weights, sorted_ids, expert_ids,
                                                    topk_ids.numel(), topk_ids.shape[1], meta, persistent)
    kernel = getattr(okernel.module, okernel.name) if rewritten else okernel.kernel
    extra = okernel.launcher.satisfied_args(rows, world, x.device) if rewritten else {}

    def run():
        kernel[grid](*args, **launch_meta, **extra)
        return out
    return run


#: the weight layouts ``torch._grouped_mm`` is timed with: (E, K, N) row-major, and each expert's (N, K) transposed
GROUPED_MM_LAYOUTS = ("kn", "nk")


def grouped_mm_inputs(x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, gather_rows: bool):
    """What a user of ``torch._grouped_mm`` passes: the slots' rows sorted by expert (gathered from the tokens
    when ``gather_rows``), each layout of ``GROUPED_MM_LAYOUTS`` of the weights, and the groups' end offsets;
    also the slot order, to compare with a per-slot reference."""
    flat = topk_ids.flatten()
    order = torch.argsort(flat, stable=True)
    rows = x[order // topk_ids.shape[1]] if gather_rows else x[order]
    offs = torch.cumsum(torch.bincount(flat, minlength=w.shape[0]), 0).to(torch.int32)
    layouts = {"kn": w.contiguous(), "nk": w.transpose(1, 2).contiguous().transpose(1, 2)}
    return rows.contiguous(), layouts, offs, order


def grouped_mm(rows: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """torch's grouped GEMM: each expert's run of ``rows`` (ending at ``offs``) times its weights."""
    return torch._grouped_mm(rows, w, offs=offs)


#: what compute mode times besides our grouped GEMMs: torch's grouped GEMM per weight layout (the rows already
#: sorted by expert: the GEMM alone), the dense GEMMs at equal FLOPs and the torch loop
REFERENCES = (*(f"grouped_mm_{layout}" for layout in GROUPED_MM_LAYOUTS), "cublas_dense", "triton_dense",
              "torch_loop")


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def measure_compute(shape: MoEShape, part: str, world: int, dtype: torch.dtype, rounds: int, sweep: bool,
                    rewritten: bool, device: str = "cuda", routing: str = "random") -> dict:
    from tilelink.ops.gemm import matmul
    from tilelink.ops.moe import moe_config, persistent_ag_config, sweep_config
    from tilelink.ops.moe_routing import route

    device = torch.device(device)
    slots, N, K = per_rank_problem(shape, part, world)
    g = torch.Generator(device=device).manual_seed(1)
    topk_ids, weights = expert_routing(routing, shape.S, shape.E, shape.topk, device)
    routed = route(topk_ids, shape.E)  # checked and counted once, for every kernel below
    rows = shape.S if part == "ag_moe" else slots
    x = torch.randn(rows, K, dtype=dtype, device=device, generator=g)
    w = torch.randn(shape.E, K, N, dtype=dtype, device=device, generator=g) / K**0.5
    wflat = weights.flatten().float().contiguous()
    out_rows = slots  # the plain kernel stores each slot's row (part 2: weighted, before the top-k reduce)
    meta = moe_config(slots, shape.E, N, dtype, K)
    a = torch.randn(slots, K, dtype=dtype, device=device, generator=g)
    b = torch.randn(K, N, dtype=dtype, device=device, generator=g)

    def grouped(cfg: dict, persistent: bool, rewritten: bool = False):
        out = torch.empty(out_rows, N, dtype=dtype, device=device)
        return _grouped(part, x, w, out, wflat, routed, cfg, persistent=persistent, rewritten=rewritten,
                        rows=shape.S, world=world)

    fns = {"cublas_dense": functools.partial(torch.matmul, a, b), "triton_dense": functools.partial(matmul, a, b),
           "torch_loop": functools.partial(torch_loop, x, w, topk_ids, weights if part == "moe_rs" else None,
                                           part == "ag_moe"),
           "plain": grouped(meta, False)}
    mm_rows, mm_weights, mm_offs, mm_order = grouped_mm_inputs(x, w, topk_ids, part == "ag_moe")
    for layout, wl in mm_weights.items():
        fns[f"grouped_mm_{layout}"] = functools.partial(grouped_mm, mm_rows, wl, mm_offs)
    forms = (False, True) if part == "ag_moe" else (False,)  # the candidates are the AG kernels' tiles
    # the descriptor kernel the operator takes on a GPU: the persistent AG kernel with its tile for this routing
    # (its last wave split in pieces), the RS part's column sweep
    pmeta = (persistent_ag_config(meta, routed, shape.E, N, device) if part == "ag_moe" else sweep_config(K))
    fns["persistent"] = grouped(pmeta, True)
    if rewritten:
        fns["rewritten"] = grouped(meta, False, True)
        fns["persistent_rewritten"] = grouped(pmeta, True, True)
    names = {}
    if sweep:
        for bm, bn, bk, warps, stages in CANDIDATES:
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
            if all(cfg.get(k) == v for k, v in meta.items()):
                continue
            for persistent in forms:
                name = f"{'persistent ' if persistent else ''}{bm}x{bn}x{bk}_w{warps}_s{stages}"
                names[name] = cfg
                fns[name] = grouped(cfg, persistent)
    ref = torch_loop(x.float(), w.float(), topk_ids, None, part == "ag_moe")
    errors, failed = {}, []
    for name in [n for n in fns if n.startswith("grouped_mm_")]:
        try:
            errors[name] = _rel_err(fns[name](), ref[mm_order])  # its rows in expert order, unweighted
        except RuntimeError as exc:  # a layout, dtype or GPU torch's grouped GEMM does not take: reported
            failed.append({"config": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            del fns[name]
    if part == "moe_rs":
        ref = ref * wflat[:, None]
    for name in [n for n in fns if n not in REFERENCES]:  # ours
        try:
            errors[name] = _rel_err(fns[name](), ref)
        except Exception as exc:  # noqa: BLE001 - a config that cannot compile is reported, not fatal
            failed.append({"config": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            del fns[name]
    times = side_by_side(fns, rounds, device.type)
    med = {n: statistics.median(t) for n, t in times.items()}
    flops = 2 * slots * N * K
    row = {"shape": shape.name, "part": part, "routing": routing, "slots": slots, "N": N, "K": K, "E": shape.E,
           "topk": shape.topk, "config": meta, "persistent_config": pmeta, "ms": med, "times_ms": times,
           # the rows each kernel computes beyond the slots: every expert padded to its tile height
           "padded_rows": {n: routed.blocks(c["BLOCK_M"]) * c["BLOCK_M"] - slots
                           for n, c in (("plain", meta), ("persistent", pmeta))},
           "tflops": {n: flops / (t * 1e-3) / 1e12 for n, t in med.items()},
           "rate_vs_cublas_dense": {n: med["cublas_dense"] / t for n, t in med.items() if n != "cublas_dense"},
           "speedup_vs_torch_loop": {n: med["torch_loop"] / t for n, t in med.items() if n != "torch_loop"},
           "rel_err_vs_fp32_loop": errors, "failed_configs": failed, "sweep_configs": names}
    best = min((n for n in med if n not in REFERENCES and "rewritten" not in n), key=med.get)
    row["best_plain"] = best
    mm = [n for n in med if n.startswith("grouped_mm_")]
    if mm:  # the baseline a user can call: torch's grouped GEMM on its fastest weight layout
        fastest = min(mm, key=med.get)
        row["grouped_mm_baseline"] = fastest
        row["speedup_vs_grouped_mm"] = {n: med[fastest] / t for n, t in med.items() if n not in REFERENCES}
    # the gap to dense cuBLAS, split: the padded rows' share of the work, and the rate per computed row
    for name in ("persistent", "plain"):
        if name in med:
            computed = slots + row["padded_rows"][name]
            row.setdefault("gap_to_cublas", {})[name] = {
                "padding_share": row["padded_rows"][name] / computed,
                "rate_per_computed_row": row["rate_vs_cublas_dense"][name] * computed / slots}
    rates = row["rate_vs_cublas_dense"]
    print(f"{shape.name} {part} ({routing} routing) slots={slots} N={N} K={K}: cublas {med['cublas_dense']:.3f} ms; "
          "rate vs cuBLAS: "
          + ", ".join(f"{n} {rates[n]:.3f}" for n in ("triton_dense", "plain", "rewritten", "persistent",
                                                      "persistent_rewritten")
                      if n in rates) + f"; best {best} "
          f"{med[best]:.3f} ms (rate {row['rate_vs_cublas_dense'][best]:.3f}), torch loop {med['torch_loop']:.3f} ms; "
          + (f"vs {row['grouped_mm_baseline']} " + ", ".join(f"{n} {r:.3f}" for n, r in
                                                             row["speedup_vs_grouped_mm"].items()) + "; "
             if mm else "")
          +
          f"err {errors}; failed {failed}", flush=True)
    return row


def run_compute(shapes: list[MoEShape], world: int, dtype: torch.dtype, rounds: int, configs: bool,
                rewritten: bool, routing: str = "random") -> dict:
    rows = []
    for shape in shapes:
        for part in PARTS:
            rows.append(measure_compute(shape, part, world, dtype, rounds, configs, rewritten, routing=routing))
            torch.cuda.empty_cache()
    return {"mode": "compute", "world": world, "dtype": str(dtype), "rounds": rounds, "expert_routing": routing,
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count, "rows": rows,
            "note": "rate = cuBLAS dense (slots, K) @ (K, N) median ms / ours (equal useful FLOPs; ours also pays "
                    "the per-expert padding and the gather); medians of triton.testing.do_bench medians (warmup "
                    "25 ms, rep 100 ms) over rounds that alternate which method runs first"}


# --------------------------------------------------------------------------- several ranks
def _ag_rows(x_shard: torch.Tensor, M: int, group) -> torch.Tensor:
    import torch.distributed as dist

    world = dist.get_world_size(group)
    per = -(-M // world)
    padded = torch.zeros((per, x_shard.shape[1]), dtype=x_shard.dtype, device=x_shard.device)
    padded[:x_shard.shape[0]] = x_shard
    full = torch.empty((world * per, x_shard.shape[1]), dtype=x_shard.dtype, device=x_shard.device)
    dist.all_gather_into_tensor(full, padded, group=group)
    return full[:M]


def _rs_rows(partial: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    M = partial.shape[0]
    per = -(-M // world)
    padded = torch.zeros((world * per, partial.shape[1]), dtype=partial.dtype, device=partial.device)
    padded[:M] = partial
    out = torch.empty((per, partial.shape[1]), dtype=partial.dtype, device=partial.device)
    dist.reduce_scatter_tensor(out, padded, group=group)
    return out[:max(0, min(M, (rank + 1) * per) - rank * per)]


#: the methods whose calls ``--profile`` records (the overlapped operators and the fused baseline)
PROFILED = ("tilelink_ag", "fused_ag", "tilelink_rs", "fused_rs")


def profile_calls(fns: dict, names, shape_name: str, rank: int, out: Path, group, calls: int = 5) -> dict:
    """``calls`` calls of each method of ``names`` under ``torch.profiler`` (CPU, and CUDA on a GPU), after a
    barrier: a Chrome trace per method and rank in ``out``, and the last call's device timeline (kernels,
    copies, and their start relative to the call's first) in the returned dict. What the host and the
    device spend per call, kernel by kernel."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out.mkdir(parents=True, exist_ok=True)
    timelines = {}
    for name in names:
        dist.barrier(group=group)
        with profile(activities=activities) as prof:
            for _ in range(calls):
                fns[name]()
            if cuda:
                torch.cuda.synchronize()
        prof.export_chrome_trace(str(out / f"{shape_name}_{name}_r{rank}.json"))
        device = [e for e in prof.events() if e.device_type.name == "CUDA"]
        if device:
            device.sort(key=lambda e: e.time_range.start)
            last = device[-max(1, len(device) // calls):]  # about one call's worth
            t0 = last[0].time_range.start
            timelines[name] = [(round(e.time_range.start - t0, 1), round(e.time_range.elapsed_us(), 1), e.name[:80])
                               for e in last]
        else:
            timelines[name] = []
    return timelines


def measure_dist(shape: MoEShape, world, dtype: torch.dtype, rounds: int, group,
                 profile_dir: Path | None = None, routing: str = "per-call") -> dict:
    """One shape of the dist mode on this rank. ``routing``: "per-call", every call routes ``topk_ids``
    itself (one copy to the host, which waits for the GPU's queued work: the host cannot run ahead); "once",
    the ``Routing`` is made once before the timed calls and passed in (as ``TPMoE`` routes once for both
    parts of a layer, or a caller that reuses a routing): no call waits for the GPU."""
    import torch.distributed as dist

    from tilelink.ops import ag_moe, moe_rs
    from tilelink.ops.moe import descriptor_kernel_wanted, launch_config
    from tilelink.ops.moe_routing import as_routing, route

    if routing not in ("per-call", "once"):
        raise ValueError(f"routing must be 'per-call' or 'once', got {routing!r}")
    R, r, device = world.world_size, world.rank, world.device
    M, inter = shape.S, shape.I // R
    per = -(-M // R)
    lo, hi = min(M, r * per), min(M, (r + 1) * per)
    g = torch.Generator(device=device).manual_seed(r)
    topk_ids, weights = random_routing(M, shape.E, shape.topk, device)  # same seed: replicated
    x_shard = torch.randn(hi - lo, shape.H, dtype=dtype, device=device, generator=g)
    w_up = torch.randn(shape.E, shape.H, 2 * inter, dtype=dtype, device=device, generator=g) / shape.H**0.5
    w_down = torch.randn(shape.E, inter, shape.H, dtype=dtype, device=device, generator=g) / inter**0.5
    h = torch.randn(M * shape.topk, inter, dtype=dtype, device=device, generator=g)
    wflat = weights.flatten().float().contiguous()
    slots = M * shape.topk
    # what every call of our paths takes: the ids (each call routes them itself), or their Routing
    ids = route(topk_ids, shape.E) if routing == "once" else topk_ids

    def fused_ag():  # ours, not overlapped: NCCL all-gather, then the plain grouped GEMM
        x = _ag_rows(x_shard, M, group)
        out = torch.empty(slots, 2 * inter, dtype=dtype, device=device)
        persistent = descriptor_kernel_wanted("ag_moe", device, dtype)  # the kernel and tile ag_moe takes
        routed = as_routing(ids, shape.E)  # checked and counted once, as ag_moe does
        meta = launch_config("ag_moe", persistent, routed, shape.E, 2 * inter, dtype, shape.H, device)
        return _grouped("ag_moe", x, w_up, out, None, routed, meta, persistent=persistent)()

    def fused_rs():  # ours, not overlapped: the plain grouped GEMM, top-k sum, then NCCL reduce-scatter
        out = torch.empty(slots, shape.H, dtype=dtype, device=device)
        sweep = descriptor_kernel_wanted("moe_rs", device, dtype)  # the kernel and tile moe_rs takes
        routed = as_routing(ids, shape.E)
        meta = launch_config("moe_rs", sweep, routed, shape.E, shape.H, dtype, inter, device)
        y = _grouped("moe_rs", h, w_down, out, wflat, routed, meta, persistent=sweep)()
        return _rs_rows(y.view(M, shape.topk, shape.H).sum(1), group)

    fns = {"torch_ag": lambda: torch_loop(_ag_rows(x_shard, M, group), w_up, topk_ids, None, True),
           "fused_ag": fused_ag, "tilelink_ag": lambda: ag_moe(x_shard, w_up, ids, path="overlap"),
           "torch_rs": lambda: _rs_rows(torch_loop(h, w_down, topk_ids, weights, False), group),
           "fused_rs": fused_rs, "tilelink_rs": lambda: moe_rs(h, w_down, ids, weights, path="overlap")}
    errors = {"tilelink_ag": _rel_err(fns["tilelink_ag"](), fns["torch_ag"]()),
              "fused_ag": _rel_err(fns["fused_ag"](), fns["torch_ag"]())}
    ref_rs = fns["torch_rs"]()
    # every rank calls each function (a rank without rows takes part in the collectives too)
    got_rs = {name: fns[name]() for name in ("tilelink_rs", "fused_rs")}
    if ref_rs.numel():
        errors |= {name: _rel_err(out, ref_rs) for name, out in got_rs.items()}
    host: dict[str, list[float]] = {}
    times = side_by_side(fns, rounds, device.type, group=group or dist.group.WORLD, host=host)
    med = {n: statistics.median(t) for n, t in times.items()}
    host_ms = {n: statistics.median(t) for n, t in host.items()}  # as long as ms: the host sets the pace
    if r == 0:
        print(f"{shape.name}: {med} host {host_ms} err {errors}", flush=True)
    speedup = {f"{n}_vs_{b}": med[f"{b}_{p}"] / med[n] for p in ("ag", "rs") for n in (f"tilelink_{p}",)
               for b in ("torch", "fused")}
    row = {"shape": shape.name, "routing": routing, "ms": med, "host_ms": host_ms, "times_ms": times,
           "rel_err": errors, "speedup": speedup}
    if profile_dir is not None:
        row["timeline_us"] = profile_calls(fns, PROFILED, shape.name, r, Path(profile_dir),
                                           group or dist.group.WORLD)
    return row


def _dist_rows(shapes: list[MoEShape], dtype: torch.dtype, rounds: int,
               profile_dir: Path | None = None, routing: str = "per-call") -> list[dict] | None:
    """One rank of the dist mode, in an initialised world; rank 0 returns the rows."""
    import torch.distributed as dist

    from tilelink.runtime import current_world

    world = current_world()
    group = dist.new_group(backend="nccl") if world.device.type == "cuda" else None
    rows = [measure_dist(shape, world, dtype, rounds, group, profile_dir, routing) for shape in shapes]
    return rows if world.rank == 0 else None


def run_dist(shapes: list[MoEShape], dtype: torch.dtype, rounds: int, world: int,
             profile_dir: Path | None = None, routing: str = "per-call") -> dict | None:
    """Under ``torchrun`` / ``tlxform run`` (``WORLD_SIZE`` set): this process is one rank. Otherwise
    ``world`` ranks are started here: one per GPU (NVSHMEM), or emulated on CPU processes without GPUs
    enough."""
    import os

    import tilelink

    if "WORLD_SIZE" in os.environ:
        tilelink.init()
        rows = _dist_rows(shapes, dtype, rounds, profile_dir, routing)
        size = tilelink.world_size()
        tilelink.finalize()
    else:
        rows = tilelink.spawn(_dist_rows, world, shapes, dtype, rounds, profile_dir, routing,
                              backend=spawn_backend(world), timeout=3600)[0]
        size = world
    return {"mode": "dist", "world": size, "dtype": str(dtype), "rounds": rounds, "routing": routing,
            "rows": rows} if rows is not None else None


def run(world: int, shapes: str, out: Path, dtype: str, mode: str, rounds: int, configs: bool,
        rewritten: bool, profile: bool = False, routing: str = "per-call",
        expert_routing_kind: str = "random") -> Path | None:
    chosen = select_named(MOE_SHAPES, "MoE", shapes)
    if expert_routing_kind not in EXPERT_ROUTINGS:
        raise SystemExit(f"--expert-routing must be one of {', '.join(EXPERT_ROUTINGS)}")
    if mode == "auto":
        mode = "dist" if torch.cuda.device_count() >= world > 1 else "compute"
    if mode == "compute":
        if not torch.cuda.is_available():
            raise SystemExit("tilelink.benchmarks.moe --mode compute needs a CUDA GPU")
        record = run_compute(chosen, world, DTYPES[dtype], rounds, configs, rewritten, expert_routing_kind)
    else:
        if expert_routing_kind != "random":
            raise SystemExit("--expert-routing is for --mode compute; the dist mode routes at random")
        record = run_dist(chosen, DTYPES[dtype], rounds, world, Path(out) / "profile" if profile else None, routing)
        if record is None:
            return None
    record = {"benchmark": "moe", **environment(), **record}
    suffix = ("_routed_once" if mode == "dist" and routing == "once" else
              f"_{expert_routing_kind}_routing" if expert_routing_kind != "random" else "")
    path = write_json(Path(out) / f"moe_{mode}_w{world}_{dtype}{suffix}.json", record)
    print(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--shapes", default="all")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--mode", choices=["auto", "compute", "dist"], default="auto")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", action="store_true", help="compute mode: also time candidate tile configs")
    p.add_argument("--no-rewritten", dest="rewritten", action="store_false")
    p.add_argument("--profile", action="store_true",
                   help="dist mode: also profile 5 calls of each overlapped operator and fused baseline (Chrome "
                        "traces in OUT/profile, the last call's device timeline in the JSON)")
    p.add_argument("--routing", choices=["per-call", "once"], default="per-call",
                   help="dist mode: every call routes topk_ids itself (one copy to the host per call), or the "
                        "routing is made once before the timed calls and passed in")
    p.add_argument("--expert-routing", choices=EXPERT_ROUTINGS, default="random",
                   help="compute mode: which experts the tokens pick: at random, or every expert the same count "
                        "(balanced: a token's experts neighbours; equal: in a random order)")
    a = p.parse_args(argv)
    run(a.world, a.shapes, a.out, a.dtype, a.mode, a.rounds, a.configs, a.rewritten, a.profile, a.routing,
        a.expert_routing)


if __name__ == "__main__":
    main()
