"""The tensor-parallel MoE grouped GEMMs, written as plain annotated Triton kernels (paper §7.2, Fig. 5).

Both are the fused-MoE grouped GEMM of vLLM's design: the routed *slots* (slot ``s = t * top_k + k``
is token ``t``'s ``k``-th expert) are sorted by expert and padded per expert to a multiple of
``BLOCK_M`` (:func:`tilelink.ops.moe_routing.align_tokens`), so each M tile belongs to one expert
and gathers its rows by index. The mapping from a tile to the ranks and channels it depends on is
therefore only known at run time (dynamic mapping, paper §4.1): the ``index=`` of the annotation
tells the rewriter where the rows come from (``tlxform show ops/moe_kernels.py::ag_group_gemm_kernel``).

- :func:`ag_group_gemm_kernel` (AG + gather + GroupGEMM): ``out[s] = x[s // top_k] @ w[expert(s)]``;
  ``x`` is all-gathered across ranks, each tile waits only for the channels of the tokens it gathers.
- :func:`group_gemm_rs_kernel` (GroupGEMM + scatter + top-k reduce + RS): ``out[s] = weight[s] *
  h[s] @ w[expert(s)]`` scattered to slot rows, reduced over each token's ``top_k`` slots and over
  the ranks (the rule's partner kernels; on the copy engine's path ``rs_topk_reduce`` first); each rank
  keeps its rows of the tokens.

Tiles are visited in grouped order (``GROUP_M`` M tiles share the N sweep) for L2 reuse of the
expert's weight columns, with pointer arithmetic (any layout). The AG part also has a persistent form,
:func:`ag_group_gemm_persistent_kernel`, with the expert weights read by a tensor descriptor (TMA on
Hopper; the gathered rows stay pointer loads: a gathered tile has no tensor-descriptor form on Hopper) and
the gather on the copy engine, which ``ag_moe`` takes on every GPU rank (padding a rank's columns of ``w``
to 16-byte rows when they are not).
The RS part's short inner dimension (``I / R``: 256 at world 8) makes its tiles short: a tile loads as
much as it computes, and a notify per tile (count, barrier, fence) comes every few microseconds. On a
GPU ``moe_rs`` takes :func:`group_gemm_rs_sweep_kernel`: each program gathers its rows of ``h`` once and
sweeps a run of column tiles, ``w`` by tensor descriptor (MoE-4 at world 8 on an H200: 0.51 -> 0.76 of
dense cuBLAS rewritten). Its reduction is the hybrid (``via="copy_engine"``) in three
stages: behind the sweep, one kernel on every SM sums each token's top-k slot rows, rank by rank; the copy
engine carries each rank's summed rows to it; one kernel sums the ranks. The sweep keeps every SM and its
rewrite adds no notify: a rank's tokens are spread over all experts, so its rows are complete only after
the last tiles (an SM pull consumer on 16 SMs beside the sweep took 1.13 ms after its 0.46 ms on two
H200s, MoE-4, pulling at 113 GB/s).
"""

import triton
import triton.language as tl

import tilelink
from tilelink.ops.gemm_kernels import tile_coordinates


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0, index="sorted_slot_ids_ptr", size="num_slots // top_k"),
                  channels_per_rank=1)
@triton.jit
def ag_group_gemm_kernel(x_ptr, w_ptr, out_ptr, sorted_slot_ids_ptr, expert_ids_ptr, N, K, EM, num_slots, top_k,
                         stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_om, stride_on,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    """out (num_slots, N)[s] = x (num_slots // top_k, K)[s // top_k] @ w (E, K, N)[expert of s].

    ``sorted_slot_ids_ptr`` (EM,) int32: slots sorted by expert, padded with ``num_slots``;
    ``expert_ids_ptr`` (EM // BLOCK_M,) int32: the expert of each block of BLOCK_M sorted slots, or -1 for a block
    past the routing's own (a captured call's worst-case grid: all padding, it skips its K loop).
    """
    num_pid_m = tl.cdiv(EM, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coordinates(tl.program_id(0), GROUP_M * num_pid_n, num_pid_m, GROUP_M)
    offs_slot_id = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_slot = tl.load(sorted_slot_ids_ptr + offs_slot_id, mask=offs_slot_id < EM, other=num_slots)
    slot_mask = offs_slot < num_slots
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    k_tiles = tl.where(expert >= 0, tl.cdiv(K, BLOCK_K), 0)  # a block past the routing's own (-1): no K step
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (offs_slot[:, None] // top_k * stride_xm + offs_k[None, :] * stride_xk)
    w_ptrs = w_ptr + expert * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_tiles):
        x = tl.load(x_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        w = tl.load(w_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    out_ptrs = out_ptr + offs_slot[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=slot_mask[:, None] & (offs_n[None, :] < N))


@tilelink.overlap(tilelink.reduce_scatter("out_ptr", dim=0, index="sorted_slot_ids_ptr", topk="top_k",
                                          size="num_slots // top_k"), channels_per_rank=1)
@triton.jit
def group_gemm_rs_kernel(h_ptr, w_ptr, out_ptr, topk_weights_ptr, sorted_slot_ids_ptr, expert_ids_ptr, N, K, EM,
                         num_slots, top_k, stride_hm, stride_hk, stride_we, stride_wk, stride_wn, stride_om,
                         stride_on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    """out (num_slots // top_k, N)[t] = sum over ranks and k of weight[t*top_k+k] * h[t*top_k+k] @ w[expert].

    ``h_ptr`` (num_slots, K): this rank's slice of the intermediate activations, one row per slot;
    ``w_ptr`` (E, K, N); ``topk_weights_ptr`` (num_slots,) float32 router weights. The kernel stores
    each slot's weighted row at row ``s`` of ``out_ptr``; the rewrite redirects that to the partial
    buffer whose top-k + cross-rank reduction leaves this rank's token rows in the caller's tensor.
    """
    num_pid_m = tl.cdiv(EM, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coordinates(tl.program_id(0), GROUP_M * num_pid_n, num_pid_m, GROUP_M)
    offs_slot_id = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_slot = tl.load(sorted_slot_ids_ptr + offs_slot_id, mask=offs_slot_id < EM, other=num_slots)
    slot_mask = offs_slot < num_slots
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    k_tiles = tl.where(expert >= 0, tl.cdiv(K, BLOCK_K), 0)  # a block past the routing's own (-1): no K step
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + offs_slot[:, None] * stride_hm + offs_k[None, :] * stride_hk
    w_ptrs = w_ptr + expert * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_tiles):
        h = tl.load(h_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        w = tl.load(w_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(h, w, acc)
        h_ptrs += BLOCK_K * stride_hk
        w_ptrs += BLOCK_K * stride_wk
    weight = tl.load(topk_weights_ptr + offs_slot, mask=slot_mask, other=0.0)
    acc = acc * weight[:, None]
    out_ptrs = out_ptr + offs_slot[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=slot_mask[:, None] & (offs_n[None, :] < N))


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0, index="sorted_slot_ids_ptr", size="num_slots // top_k"),
                  via="copy_engine", channels_per_rank=1)
@triton.jit
def ag_group_gemm_persistent_kernel(x_ptr, w_ptr, out_ptr, sorted_slot_ids_ptr, expert_ids_ptr, N, K, EM, num_slots,
                                    top_k, num_experts, stride_xm, stride_xk, stride_we, stride_wk, stride_wn,
                                    stride_om, stride_on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                                    TAIL_SPLIT: tl.constexpr = 1, TAIL_STAGES: tl.constexpr = None):
    """:func:`ag_group_gemm_kernel`, persistent (``NUM_SMS`` programs stride over the tiles) with the
    expert weights read by a 3-D tensor descriptor over ``w`` (E, K, N): TMA loads of ``w`` on Hopper,
    the gathered rows of ``x`` by pointers. Launch ``min(NUM_SMS, tiles * TAIL_SPLIT)`` programs.
    The gather runs on the copy engine, so the persistent GEMM keeps every SM. With ``TAIL_SPLIT`` > 1
    the tiles of the last, partial wave run as ``TAIL_SPLIT`` column pieces each, all at once, their
    K loop pipelined ``TAIL_STAGES`` deep (None: the kernel's ``num_stages``): a narrow piece waits on
    its loads more than it computes, and its stages are smaller."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(EM, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    tail = num_tiles % NUM_SMS if TAIL_SPLIT > 1 else 0  # one binding: each call's rotation check writes it out
    # one expert's (K, N) at a time: the K tail of a tile reads zeros, not the next expert's rows
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[num_experts, K, N], strides=[stride_we, stride_wk, stride_wn],
                                       block_shape=[1, BLOCK_K, BLOCK_N])
    for tile_id in tl.range(start_pid, num_tiles - tail, NUM_SMS):
        pid_m, pid_n = tile_coordinates(tile_id, GROUP_M * num_pid_n, num_pid_m, GROUP_M)
        offs_slot = tl.load(sorted_slot_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        slot_mask = offs_slot < num_slots
        expert = tl.load(expert_ids_ptr + pid_m)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + (offs_slot[:, None] // top_k * stride_xm + offs_k[None, :] * stride_xk)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(0, tl.where(expert >= 0, tl.cdiv(K, BLOCK_K), 0)):  # -1: past the routing's blocks
            x = tl.load(x_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < K - ki * BLOCK_K), other=0.0)
            w = w_desc.load([expert, ki * BLOCK_K, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
            acc = tl.dot(x, w, acc)
            x_ptrs += BLOCK_K * stride_xk
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        out_ptrs = out_ptr + offs_slot[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=slot_mask[:, None] & (offs_n[None, :] < N))
    # the last wave's tiles, in TAIL_SPLIT column pieces
    PIECE: tl.constexpr = BLOCK_N // TAIL_SPLIT
    w_piece = tl.make_tensor_descriptor(w_ptr, shape=[num_experts, K, N], strides=[stride_we, stride_wk, stride_wn],
                                        block_shape=[1, BLOCK_K, PIECE])
    for piece in tl.range(start_pid, tail * TAIL_SPLIT, NUM_SMS):
        pid_m, pid_n = tile_coordinates(num_tiles - tail + piece // TAIL_SPLIT, GROUP_M * num_pid_n, num_pid_m,
                                        GROUP_M)
        col = pid_n * BLOCK_N + (piece % TAIL_SPLIT) * PIECE
        tail_slot = tl.load(sorted_slot_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        tail_mask = tail_slot < num_slots
        expert = tl.load(expert_ids_ptr + pid_m)
        offs_k = tl.arange(0, BLOCK_K)
        tail_ptrs = x_ptr + (tail_slot[:, None] // top_k * stride_xm + offs_k[None, :] * stride_xk)
        acc = tl.zeros((BLOCK_M, PIECE), dtype=tl.float32)
        for ki in tl.range(0, tl.where(expert >= 0, tl.cdiv(K, BLOCK_K), 0), num_stages=TAIL_STAGES):
            x = tl.load(tail_ptrs, mask=tail_mask[:, None] & (offs_k[None, :] < K - ki * BLOCK_K), other=0.0)
            w = w_piece.load([expert, ki * BLOCK_K, col]).reshape(BLOCK_K, PIECE)
            acc = tl.dot(x, w, acc)
            tail_ptrs += BLOCK_K * stride_xk
        offs_n = col + tl.arange(0, PIECE)
        out_ptrs = out_ptr + tail_slot[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tail_mask[:, None] & (offs_n[None, :] < N))


@tilelink.overlap(tilelink.reduce_scatter("out_ptr", dim=0, index="sorted_slot_ids_ptr", topk="top_k",
                                          size="num_slots // top_k"), via="copy_engine", channels_per_rank=1)
@triton.jit(do_not_specialize=["m_tiles", "body_tiles", "body_runs", "tail_width", "tail_span"])  # every plan
def group_gemm_rs_sweep_kernel(h_ptr, w_ptr, out_ptr, topk_weights_ptr, sorted_slot_ids_ptr, expert_ids_ptr, N, K,
                               num_slots, top_k, num_experts, stride_hm, stride_hk, stride_we, stride_wk, stride_wn,
                               stride_om, stride_on, m_tiles, body_tiles, body_runs, tail_width, tail_span,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               ONE_K: tl.constexpr):
    """:func:`group_gemm_rs_kernel` for a short inner dimension. A program sweeps a run of column tiles of
    an M tile (BLOCK_M sorted slots of one expert): the first ``body_tiles`` of the ``m_tiles`` M tiles
    in ``body_runs`` runs each; the column tiles of the others, each M tile's counted as ``tail_width``
    (at least the column tiles; the rest are empty), in spans of ``tail_span``, one per program. A span
    that ends in one M tile goes on in the next: the last, partial wave of M tiles is shared out evenly
    over the SMs (with ``tail_width`` a multiple of ``tail_span`` no span crosses a tile: runs). With
    ``ONE_K`` (``K <= BLOCK_K``) a program gathers its rows of ``h`` once per M tile and reuses them for
    every column tile; otherwise it loops over K for each. ``w`` (E, K, N) is read by a 3-D tensor
    descriptor (TMA on Hopper; rows of 16-byte multiples). Launch :func:`tilelink.ops.moe.sweep_programs`
    programs (:func:`tilelink.ops.moe.sweep_plan`)."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_run = tl.cdiv(num_pid_n, body_runs)
    body = body_tiles * body_runs
    in_tail = pid >= body
    # this program's span [start, end) of its region's column tiles, M tile by M tile of `width` each
    width = tl.where(in_tail, tail_width, body_runs * per_run)
    start = tl.where(in_tail, (pid - body) * tail_span, pid * per_run)
    end = tl.minimum(start + tl.where(in_tail, tail_span, per_run),
                     tl.where(in_tail, m_tiles - body_tiles, body_tiles) * width)
    offs_k = tl.arange(0, BLOCK_K)
    # one expert's (K, N) at a time: the K tail reads zeros, not the next expert's rows
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[num_experts, K, N], strides=[stride_we, stride_wk, stride_wn],
                                       block_shape=[1, BLOCK_K, BLOCK_N])
    for m in range(start // width, tl.cdiv(end, width)):
        pid_m = tl.where(in_tail, body_tiles, 0) + m
        first = tl.maximum(start - m * width, 0)
        offs_slot = tl.load(sorted_slot_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        slot_mask = offs_slot < num_slots
        expert = tl.load(expert_ids_ptr + pid_m)
        weight = tl.load(topk_weights_ptr + offs_slot, mask=slot_mask, other=0.0)
        h_ptrs = h_ptr + offs_slot[:, None] * stride_hm + offs_k[None, :] * stride_hk
        if ONE_K:
            h = tl.load(h_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        last = tl.where(expert >= 0, tl.minimum(end - m * width, num_pid_n), first)  # -1: past the routing's blocks
        for pid_n in range(first, last):
            if ONE_K:
                acc = tl.dot(h, w_desc.load([expert, 0, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N))
            else:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for ki in range(0, tl.cdiv(K, BLOCK_K)):
                    h_k = tl.load(h_ptrs + ki * BLOCK_K * stride_hk,
                                  mask=slot_mask[:, None] & (offs_k[None, :] < K - ki * BLOCK_K), other=0.0)
                    w = w_desc.load([expert, ki * BLOCK_K, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
                    acc = tl.dot(h_k, w, acc)
            acc = acc * weight[:, None]
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            out_ptrs = out_ptr + offs_slot[:, None] * stride_om + offs_n[None, :] * stride_on
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=slot_mask[:, None] & (offs_n[None, :] < N))
