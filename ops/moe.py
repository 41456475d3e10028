"""Tensor-parallel MoE with the communication overlapped: AG + gather + GroupGEMM and GroupGEMM + scatter
+ top-k reduce + RS (paper §7.2, Figure 9), on the dynamic mappings of :mod:`tilelink.ops.moe_kernels`.

Experts are sharded TP-style along their intermediate dimension: every rank holds every expert's
slice ``[r*ceil(I/R), min(I, (r+1)*ceil(I/R)))``. The tokens are sharded by rows like the dense
operators (rank ``r`` holds rows ``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))`` of the (M, H) input).

**Routing is replicated**: both calls take ``topk_ids`` (M, top_k) of *all* M tokens, the same on
every rank (the router is cheap and per token: :class:`tilelink.nn.TPMoE` computes it on each rank's
rows and all-gathers the ids and weights). The slot of token ``t``'s ``k``-th expert is ``t*top_k+k``.

- ``ag_moe(x_shard, w, topk_ids)``: ``w`` (E, H, N_r) this rank's expert columns; returns the
  (M*top_k, N_r) per-slot product ``x[t] @ w[topk_ids[t, k]]`` (row ``t*top_k+k``).
- ``moe_rs(h, w, topk_ids, topk_weights)``: ``h`` (M*top_k, I_r) this rank's per-slot activations,
  ``w`` (E, I_r, H); returns this rank's rows of ``sum_k topk_weights[t, k] * h[t*top_k+k] @ w[e]``
  summed over ranks.

Every argument is checked before a kernel runs; the symmetric buffers and channels of a shape are
created on its first call and reused (the kernels' launchers cache them per shape). No token (M = 0,
``topk_ids`` of shape (0, top_k) on every rank) returns an empty result at once, as every operator does.

Both can be captured in a CUDA graph: a captured call routes on the device, sized for the worst case of its shapes
(:func:`tilelink.ops.moe_routing.route_fixed`), so that each replay takes the routing written into ``topk_ids``.
"""

from __future__ import annotations

import torch
import triton

from tilelink.errors import LaunchError
from tilelink.mapping import shard_range
from tilelink.ops import plain
from tilelink.ops.contract import (
    aligned,
    check_rows,
    check_tensor,
    interpreter_inputs,
    interpreting,
    persistent_grid,
    persistent_wanted,
    tail_split,
)
from tilelink.ops.moe_routing import Routing, align_tokens, as_routing, route_fixed
from tilelink.ops.path import check as check_path
from tilelink.ops.path import select as select_path


def moe_config(num_slots: int, num_experts: int, N: int, dtype: torch.dtype, K: int = 4096) -> dict:
    """Tile config of the grouped GEMMs (Hopper), from the candidates timed on an H200 at the MoE-4..6
    per-rank shapes of world 8: 128x256x64, 8 warps, 3 stages (one program per SM)
    for the AG part; for a short inner dimension (``K <= 512``, the RS part: 256 at world 8)
    128x128x64 with 4 warps, two programs per SM, so that one program's epilogue (the scattered stores and
    the notify) overlaps the other's loads and MMAs (0.51 of dense cuBLAS rewritten against 0.44). 64-row
    tiles when experts average fewer than 128 slots, 128 columns for narrow outputs and for outputs whose last
    256-wide column tile would be at most half used."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    if dtype == torch.float32:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3)
    short_k = K <= 512  # two programs per SM
    block_m = 128 if num_slots >= 128 * num_experts else 64
    # 256 columns unless their last tile would be at most half used (N = 384 at MoE-1..3, world 8: two 256-wide
    # tiles compute 512 columns, three 128-wide ones 384)
    block_n = 128 if short_k or N < 256 or triton.cdiv(N, 256) * 256 > triton.cdiv(N, 128) * 128 else 256
    warps = 4 if short_k or block_m * block_n < 128 * 128 else 8
    stages = 3 if short_k or block_n >= 256 else 4
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=64, GROUP_M=8, num_warps=warps, num_stages=stages)


#: the persistent AG grouped GEMM's tiles of equal area, bf16/fp16 on Hopper: (BLOCK_M, BLOCK_N, time of one
#: tile relative to the first). One program per SM either way; 64x512 was 3% slower per tile on an H200
#: (MoE-4, whole waves of both), and with one N tile it takes a 512-wide gate|up slice in one pass.
PERSISTENT_AG_TILES = ((128, 256, 1.0), (64, 512, 1.03))


#: the deepest pipeline of the persistent AG kernel's last-wave pieces (``TAIL_STAGES``, see :func:`tail_stages`):
#: on an H200 (MoE-5 at world 8, random routing, 24 last tiles in four 128x64 pieces, K = 4096) 6 stages took
#: the kernel from 0.722 to 0.752 of dense cuBLAS, 8 to 0.747
TAIL_STAGES = 6


def tail_stages(meta: dict) -> int | None:
    """``TAIL_STAGES`` for the persistent AG kernel launched with ``meta`` (``TAIL_SPLIT`` set): when the last
    wave is cut in column pieces, the deepest pipeline up to :data:`TAIL_STAGES` whose stages take no more
    shared memory than the whole tiles' ``num_stages`` (the two loops share it); None (the kernel's
    ``num_stages``) when that is no deeper, or when the last wave runs whole tiles: there an explicit
    depth made Triton 3.6 keep both loops' buffers apart (384 KiB for 128x256, more than an H200 has)."""
    split = meta["TAIL_SPLIT"]
    if split == 1:
        return None
    stages = meta.get("num_stages", 3)  # Triton's default
    bm, bn = meta["BLOCK_M"], meta["BLOCK_N"]
    deepest = min(TAIL_STAGES, stages * (bm + bn) // (bm + bn // split))  # a stage: BLOCK_K x (rows + columns)
    return deepest if deepest > stages else None


def persistent_ag_config(meta: dict, topk_ids: torch.Tensor | Routing, num_experts: int, N: int, device) -> dict:
    """The tile of the persistent AG grouped GEMM for this routing: of :data:`PERSISTENT_AG_TILES`, the
    one whose tiles (each expert padded to the tile height) leave the least of a wave idle, the last wave
    split in column pieces (:func:`tilelink.ops.contract.tail_split`). On an H200 at MoE-6 (world 8)
    128x256 gives 678 tiles, 5.14 waves on 132 SMs, and 64x512 gives 658, 4.98 waves: 0.85 -> 0.88 of
    dense cuBLAS. ``meta`` (from :func:`moe_config`) is kept unless it is the
    128x256 bf16/fp16 tile."""
    from tilelink.ops import moe_kernels
    from tilelink.ops.tp import _compute_sms

    if interpreting() or (meta["BLOCK_M"], meta["BLOCK_N"]) != PERSISTENT_AG_TILES[0][:2]:
        return meta
    programs = _compute_sms(torch.device(device), moe_kernels.ag_group_gemm_persistent_kernel)
    routing = as_routing(topk_ids, num_experts)

    def cost(tile) -> float:
        bm, bn, rel = tile
        tiles = routing.blocks(bm) * triton.cdiv(N, bn)
        waves = tiles // programs + (1 / tail_split(tiles, programs, bn) if tiles % programs else 0)
        return waves * rel

    bm, bn, _ = min(PERSISTENT_AG_TILES, key=cost)
    return {**meta, "BLOCK_M": bm, "BLOCK_N": bn}


def sweep_config(K: int) -> dict:
    """Tile config of :func:`tilelink.ops.moe_kernels.group_gemm_rs_sweep_kernel` for this rank's inner
    dimension ``K`` (bf16/fp16 on Hopper): ``K <= 256`` gathers the rows once (``ONE_K``), 128x64 tiles,
    4 warps, 4 stages (one program per SM): the best of the candidates timed on an H200 at the MoE-4..6
    per-rank shapes of world 8 (K = 256). A longer K loops over it in 64-deep steps
    for every column tile, with 128x256 tiles, 8 warps, 3 stages: at world 2 (K = 1024) 0.85 / 0.71 / 0.76
    of dense cuBLAS on MoE-4/5/6, against 0.64 / 0.55 / 0.57 for 128x128 (wider tiles gather a tile's rows
    for half as many column tiles; H200). ``N_CHUNKS=None``: :func:`grouped_gemm`
    picks it from the tiles (:func:`sweep_plan`)."""
    small = 32 if interpreting() else 256  # the emulated world's small shapes take both forms
    one_k = K <= small
    block_k = max(16, triton.next_power_of_2(K)) if one_k else (16 if interpreting() else 64)
    if interpreting():  # two runs of column tiles: the tests' 40 columns leave the second one short
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=block_k, N_CHUNKS=2, ONE_K=one_k)
    if one_k:
        return dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=block_k, N_CHUNKS=None, ONE_K=True, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=block_k, N_CHUNKS=None, ONE_K=False, num_warps=8, num_stages=3)


#: a sweep program's cost besides its column tiles (gathering its rows, filling the pipeline), as a fraction
#: of sweeping all the columns: 1/8 fits the H200 timings of 1, 2 and 4 runs at MoE-4..6 (timed with a
#: notify after each sweep, which the copy-engine path does not insert)
SWEEP_OVERHEAD = 1 / 8


def sweep_plan(m_tiles: int, programs: int, n_tiles: int, most: int = 8) -> tuple[int, int, int, int]:
    """How the column sweep shares out its M tiles' column tiles, one run of them per program:
    ``(body_tiles, body_runs, tail_width, tail_span)`` (:func:`tilelink.ops.moe_kernels.group_gemm_rs_sweep_kernel`):
    the first ``body_tiles`` M tiles in ``body_runs`` runs each; the rest's column tiles, each M tile's
    counted as ``tail_width``, in spans of ``tail_span``. Waves of programs run one after another; a wave
    of runs of ``1/c`` of the columns takes ``SWEEP_OVERHEAD + 1/c`` of a whole sweep, a span that goes on
    into a second M tile one more ``SWEEP_OVERHEAD`` (it gathers a second set of rows). Of these, the least
    time (then the fewest programs):

    - every M tile in ``c`` runs (``c`` in 1, 2, 4, 8): ``ceil(m_tiles * c / programs)`` waves;
    - whole sweeps for the full waves of M tiles, and the last, partial wave's ``t`` tiles each in
      ``programs // t`` runs (at most ``n_tiles``), so that it fills the SMs;
    - whole sweeps for the full waves, and the last wave's ``t * n_tiles`` column tiles in equal spans
      over all the programs, a span crossing from one M tile into the next where it must.

    On an H200 at world 8 (132 SMs, 64 column tiles): MoE-4's 132 M tiles take one wave of whole sweeps;
    MoE-5's 144 take 132 whole sweeps and 12 tiles in 11 runs (1.34 sweeps of time, against 1.88 for two
    runs each); MoE-6's 339 (random routing) take 264 whole sweeps and 75 tiles' 4800 column tiles in
    spans of 37 (3.08 sweeps, against 3.38 for whole sweeps: a tail of 75 tiles has no room for a second
    run of each)."""
    def waves(c: int) -> float:
        return triton.cdiv(m_tiles * c, programs) * (SWEEP_OVERHEAD + 1 / c)

    plans = [(waves(c), m_tiles * c, (m_tiles, c, 1, 1)) for c in (1, 2, 4, 8) if c <= max(1, min(most, n_tiles))]
    full, tail = (m_tiles // programs) * programs, m_tiles % programs
    if full and tail:
        body = (full // programs) * (SWEEP_OVERHEAD + 1)
        runs = max(1, min(programs // tail, n_tiles))
        per = triton.cdiv(n_tiles, runs)
        plans.append((body + SWEEP_OVERHEAD + 1 / runs, full + tail * runs, (full, 1, runs * per, per)))
        span = triton.cdiv(tail * n_tiles, programs)
        crossing = 2 if n_tiles % span else 1
        plans.append((body + crossing * SWEEP_OVERHEAD + span / n_tiles, full + triton.cdiv(tail * n_tiles, span),
                      (full, 1, n_tiles, span)))
    return min(plans, key=lambda p: p[:2])[2]


def sweep_programs(m_tiles: int, plan: tuple[int, int, int, int]) -> int:
    """The programs a :func:`sweep_plan` launches."""
    body_tiles, body_runs, tail_width, tail_span = plan
    return body_tiles * body_runs + triton.cdiv((m_tiles - body_tiles) * tail_width, tail_span)


def descriptor_kernel_wanted(part: str, device: torch.device, dtype: torch.dtype,
                             persistent: bool | None = None) -> bool:
    """Whether ``part`` ("ag_moe" or "moe_rs") runs its tensor-descriptor kernel (the persistent AG kernel,
    the RS column sweep), decided from what every rank shares (the caller's ``persistent``, else the device
    type; the dtype): the RS sweep holds fp32 rows too large for shared memory."""
    return persistent_wanted(device, persistent) and (part == "ag_moe" or interpreting() or dtype != torch.float32)


def launch_config(part: str, persistent: bool, topk_ids: torch.Tensor | Routing, num_experts: int, N: int,
                  dtype: torch.dtype, K: int, device) -> dict:
    """The tile config the operator launches ``part`` with: :func:`sweep_config` for the RS sweep,
    :func:`moe_config` otherwise, with the persistent AG kernel's tile chosen from the routing."""
    if persistent and part == "moe_rs":
        return sweep_config(K)
    slots = (topk_ids.topk_ids if isinstance(topk_ids, Routing) else topk_ids).numel()
    meta = moe_config(slots, num_experts, N, dtype, K)
    return persistent_ag_config(meta, topk_ids, num_experts, N, device) if persistent else meta


def grouped_gemm(part: str, x, w, out, weights, sorted_ids, expert_ids, num_slots: int, top_k: int, meta: dict,
                 persistent: bool):
    """``(overlapped kernel, grid, args, meta)`` of one grouped GEMM of ``part`` ("ag_moe" or "moe_rs"):
    what the operators launch, and what ``benchmarks.moe`` times in its plain and rewritten forms.
    ``persistent`` selects the tensor-descriptor kernel: the persistent AG kernel, or the RS part's
    column sweep (``meta`` from :func:`sweep_config`)."""
    from tilelink.ops import moe_kernels
    from tilelink.ops.gemm import _install_allocator
    from tilelink.ops.tp import _compute_sms

    E, K, N = w.shape
    EM = sorted_ids.numel()
    tiles = triton.cdiv(EM, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])
    head = (x, w, out) if part == "ag_moe" else (x, w, out, weights)
    routing = (sorted_ids, expert_ids, N, K, EM, num_slots, top_k)
    if persistent and x.device.type == "cuda":
        _install_allocator()  # tensor descriptors made on the device need scratch memory
    if persistent and part == "moe_rs":
        kernel = moe_kernels.group_gemm_rs_sweep_kernel
        m_tiles = triton.cdiv(EM, meta["BLOCK_M"])
        runs = meta.get("N_CHUNKS")  # a fixed number of runs for every M tile, or None: planned here
        if runs is not None and (not isinstance(runs, int) or isinstance(runs, bool) or runs < 1):
            raise LaunchError(f"moe_rs: N_CHUNKS must be a positive int (runs of column tiles per M tile) or "
                              f"None (planned from the waves), got {runs!r}")
        meta = {k: v for k, v in meta.items() if k != "N_CHUNKS"}
        plan = ((m_tiles, runs, 1, 1) if runs is not None
                else sweep_plan(m_tiles, _compute_sms(x.device, kernel), triton.cdiv(N, meta["BLOCK_N"])))
        args = (*head, sorted_ids, expert_ids, N, K, num_slots, top_k, E, x.stride(0), x.stride(1), w.stride(0),
                w.stride(1), w.stride(2), out.stride(0), out.stride(1), m_tiles, *plan)
        return kernel, (sweep_programs(m_tiles, plan),), args, meta
    if persistent:
        kernel = moe_kernels.ag_group_gemm_persistent_kernel
        grid, launch_meta = persistent_grid(tiles, _compute_sms(x.device, kernel), meta)
        stages = tail_stages(launch_meta)
        if stages is not None:
            launch_meta["TAIL_STAGES"] = stages
        args = (*head, *routing, E, x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
                out.stride(1))
        return kernel, grid, args, launch_meta
    kernel = moe_kernels.ag_group_gemm_kernel if part == "ag_moe" else moe_kernels.group_gemm_rs_kernel
    args = (*head, *routing, x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
            out.stride(1))
    return kernel, (tiles,), args, meta


#: the calls (per shape) whose form of fixed sizes is loaded on this GPU rank: a captured call launches variants of
#: its own (the tile config and grid of the shape's worst case, the fixed routing's kernel), which cannot be
#: compiled and loaded while a stream captures
_fixed_loaded: set = set()


def _launch(part: str, x, w, out, weights, routing: Routing, world, persistent: bool | None = None,
            written: bool = False) -> None:
    """Align the routing to the tile config and launch ``part``'s grouped GEMM. A rank that holds no
    column of the inner dimension (K == 0) still takes part, with a zero slice. ``written``: the kernel as
    written, no communication (the plain path: ``x`` all the tokens, ``out`` one row per slot). A routing of
    fixed sizes (a captured call) launches the grid of the shape's worst case; on a GPU the first uncaptured
    call of a shape then compiles and loads that form's kernels, running none of them (every rank alike: the key
    is the call's shapes), so that a capture finds them loaded."""
    N = w.shape[2]
    kernel, grid, args, meta, run_out = _grouped_gemm(part, x, w, out, weights, routing, world, persistent)
    if written:  # the kernel as written, no launcher: a step of a capture here (the launchers make their own)
        from tilelink.runtime import graphs

        graphs.enqueue(lambda: kernel.kernel[grid](*args, **meta))
    else:
        kernel[grid](*args, **meta)
    if run_out is not out:
        out.copy_(run_out[:, :N])
    if not routing.fixed and world.device.type == "cuda":
        key = (part, tuple(routing.topk_ids.shape), tuple(x.shape), tuple(w.shape), x.dtype, persistent, written)
        if key not in _fixed_loaded:
            _fixed_loaded.add(key)
            fixed = route_fixed(routing.topk_ids, routing.num_experts, load=True)
            kernel, grid, args, meta, _ = _grouped_gemm(part, x, w, out, weights, fixed, world, persistent, load=True)
            if written:
                from tilelink.runtime.preload import preload

                preload(kernel.kernel, grid, *args, **meta)
            else:  # after this shape's first call, which loaded the partner kernels (Launcher.load)
                kernel.load(grid, *args, **meta)


def _grouped_gemm(part: str, x, w, out, weights, routing: Routing, world, persistent: bool | None,
                  load: bool = False) -> tuple:
    """``(overlapped kernel, grid, args, meta, the output it writes)`` of :func:`_launch`'s grouped GEMM, the
    routing aligned to its tile config (``load``: the alignment's kernel only loaded, :func:`tilelink.ops.
    moe_routing.align_tokens`). The output is ``out``, or a wider one whose first columns are copied to it."""
    E, K, N = w.shape
    num_slots, top_k = routing.topk_ids.numel(), routing.topk_ids.shape[1]
    if K == 0:
        x = torch.zeros((x.shape[0], 1), dtype=x.dtype, device=world.device)
        w = torch.zeros((E, 1, N), dtype=x.dtype, device=world.device)
    persistent = descriptor_kernel_wanted(part, world.device, x.dtype, persistent)
    run_out = out
    if persistent:  # the weights' rows as a descriptor needs them: pad the columns if it must
        w = aligned(w, -1)
        if w.shape[2] != N:
            run_out = out.new_empty((out.shape[0], w.shape[2]))
    meta = launch_config(part, persistent, routing, E, w.shape[2], x.dtype, w.shape[1], x.device)
    sorted_ids, expert_ids = align_tokens(routing, E, meta["BLOCK_M"], load=load)
    kernel, grid, args, meta = grouped_gemm(part, x, w, run_out, weights, sorted_ids, expert_ids, num_slots, top_k,
                                            meta, persistent)
    return kernel, grid, args, meta, run_out


def _check_routing(op: str, topk_ids, num_experts: int, world) -> Routing:
    """The checked routing of a call (its one copy to the host: :func:`tilelink.ops.moe_routing.route`; in a
    captured call the routing of fixed sizes, no copy), or the :class:`Routing` the caller made once for both
    parts of a layer."""
    given = topk_ids
    if isinstance(topk_ids, Routing):
        topk_ids = topk_ids.topk_ids
    elif not isinstance(topk_ids, torch.Tensor):
        raise LaunchError(f"{op}: topk_ids must be a (tokens, top_k) integer tensor, got {type(topk_ids).__name__}")
    if topk_ids.device.type != world.device.type:
        raise LaunchError(f"{op}: topk_ids is on {topk_ids.device}, this rank computes on {world.device}")
    try:
        routing = as_routing(given, num_experts)
    except LaunchError as exc:
        raise LaunchError(f"{op}: {exc}") from None
    if topk_ids.shape[1] < 1:  # no token (M = 0) is an empty call: the operators return an empty result
        raise LaunchError(f"{op}: topk_ids must route every token to at least one expert, got shape "
                          f"{tuple(topk_ids.shape)}")
    return routing


def ag_moe(x_shard: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor | Routing, *,
           persistent: bool | None = None, path: str = "auto") -> torch.Tensor:
    """AllGather(x) -> gather by routing -> GroupGEMM, overlapped: the (M*top_k, N) per-slot product.

    Args:
        x_shard: this rank's rows of the (M, H) tokens.
        w: (E, H, N) this rank's columns of every expert (e.g. gate | up of its intermediate slice).
        topk_ids: (M, top_k) expert ids of every token, identical on every rank; or its
            :func:`tilelink.ops.moe_routing.route`, made once for both parts of a layer (one copy to the host).
        persistent: ``True`` forces the persistent tensor-descriptor kernel (also in the interpreter),
            ``False`` the pointer kernel, ``None`` (default) the persistent one on a GPU; the same on every rank.
        path: ``"overlap"`` the overlapped kernel, ``"plain"`` a ``torch.distributed`` all-gather of the tokens,
            then the grouped GEMM as written; ``"auto"`` (default) the one the cost model predicts faster, alike
            on every rank (:mod:`tilelink.ops.path`).

    Raises:
        tilelink.LaunchError: shapes, dtypes, devices or routing that no kernel could serve.
    """
    from tilelink.runtime import current_world

    world = current_world()
    check_tensor("ag_moe", "x_shard", x_shard, 2, world.device)
    check_tensor("ag_moe", "w (experts, hidden, columns)", w, 3, world.device)
    if w.dtype != x_shard.dtype:
        raise LaunchError(f"ag_moe: x_shard and w have different dtypes ({x_shard.dtype}, {w.dtype})")
    E, K, N = w.shape
    if x_shard.shape[1] != K:
        raise LaunchError(f"ag_moe: x_shard has {x_shard.shape[1]} columns but w expects hidden size {K} "
                          f"(w is {tuple(w.shape)})")
    routing = _check_routing("ag_moe", topk_ids, E, world)
    M, top_k = routing.topk_ids.shape
    check_rows("ag_moe", f"the {M} routed tokens", x_shard.shape[0], M, world)
    check_path("ag_moe", path)
    out_dtype = x_shard.dtype
    if M == 0:  # no token on any rank (the routing is every rank's): nothing to gather or compute
        return torch.empty((0, N), dtype=out_dtype, device=world.device)
    x_in, w_in = interpreter_inputs(x_shard, w)
    num_slots = M * top_k
    if select_path("ag_moe", path, world, dict(S=M, H=K, E=E, topk=top_k), dict(N=N), x_shard.dtype) == "plain":
        x_full = plain.all_gather_rows(x_in, M, world)  # every rank gathers, also one without columns
        out = torch.empty((num_slots, N), dtype=x_in.dtype, device=world.device)
        if N:
            _launch("ag_moe", x_full, w_in, out, None, routing, world, persistent, written=True)
        return out if out.dtype == out_dtype else out.to(out_dtype)
    if N == 0:  # no column here, but the other ranks need this rank's tokens: gather into one dummy column
        _launch("ag_moe", x_in, w_in.new_zeros((E, K, 1)), x_in.new_empty((num_slots, 1)), None, routing, world,
                persistent)
        return torch.empty((num_slots, 0), dtype=out_dtype, device=world.device)
    out = torch.empty((num_slots, N), dtype=x_in.dtype, device=world.device)
    _launch("ag_moe", x_in, w_in, out, None, routing, world, persistent)
    return out if out.dtype == out_dtype else out.to(out_dtype)


def moe_rs(h: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor | Routing,
           topk_weights: torch.Tensor, *, persistent: bool | None = None, path: str = "auto") -> torch.Tensor:
    """GroupGEMM -> scatter -> top-k reduce -> ReduceScatter, overlapped: this rank's (rows, N) output.

    Args:
        h: (M*top_k, I_r) this rank's slice of the per-slot activations (row ``t*top_k+k``).
        w: (E, I_r, N) this rank's rows of every expert's down projection.
        topk_ids: (M, top_k) expert ids of every token, identical on every rank (or its ``route``).
        topk_weights: (M, top_k) router weights of every token (applied inside the kernel).
        persistent: ``True`` forces the tensor-descriptor column sweep (where the dtype allows it, and in the
            interpreter), ``False`` the pointer kernel, ``None`` (default) the sweep on a GPU; the same on
            every rank.
        path: as for :func:`ag_moe` (``"plain"``: the grouped GEMM as written, the top-k sum, then a
            ``torch.distributed`` reduce-scatter).

    Raises:
        tilelink.LaunchError: shapes, dtypes, devices or routing that no kernel could serve.
    """
    from tilelink.runtime import current_world

    world = current_world()
    check_tensor("moe_rs", "h (slots, intermediate)", h, 2, world.device)
    check_tensor("moe_rs", "w (experts, intermediate, hidden)", w, 3, world.device)
    if w.dtype != h.dtype:
        raise LaunchError(f"moe_rs: h and w have different dtypes ({h.dtype}, {w.dtype})")
    E, K, N = w.shape
    if h.shape[1] != K:
        raise LaunchError(f"moe_rs: h has {h.shape[1]} columns but w expects {K} intermediate rows "
                          f"(w is {tuple(w.shape)})")
    routing = _check_routing("moe_rs", topk_ids, E, world)
    M, top_k = routing.topk_ids.shape
    if h.shape[0] != M * top_k:
        raise LaunchError(f"moe_rs: h must have one row per slot, {M} tokens x top_k {top_k} = {M * top_k}, "
                          f"got {h.shape[0]}")
    check_tensor("moe_rs", "topk_weights", topk_weights, 2, world.device)
    if tuple(topk_weights.shape) != (M, top_k):
        raise LaunchError(f"moe_rs: topk_weights must have the shape of topk_ids {(M, top_k)}, got "
                          f"{tuple(topk_weights.shape)}")
    check_path("moe_rs", path)
    lo, hi = shard_range(M, world.rank, world.world_size)
    out_dtype = h.dtype
    h_in, w_in = interpreter_inputs(h, w)
    out = torch.empty((hi - lo, N), dtype=h_in.dtype, device=world.device)
    if N == 0 or M == 0:  # N and M are every rank's: no rank communicates
        return out.to(out_dtype)
    weights = topk_weights.to(torch.float32).contiguous().view(-1)
    if select_path("moe_rs", path, world, dict(S=M, H=N, E=E, topk=top_k), dict(K=K), h.dtype) == "plain":
        slots = torch.empty((M * top_k, N), dtype=h_in.dtype, device=world.device)
        _launch("moe_rs", h_in, w_in, slots, weights, routing, world, persistent, written=True)
        return plain.reduce_scatter_rows(slots.view(M, top_k, N).sum(1), world).to(out_dtype)
    _launch("moe_rs", h_in, w_in, out, weights, routing, world, persistent)
    return out if out.dtype == out_dtype else out.to(out_dtype)
