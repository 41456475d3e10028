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
  the ranks (the rule's ``rs_pull_consumer`` with ``TOPK``); each rank keeps its rows of the tokens.

Tiles are visited in grouped order (``GROUP_M`` M tiles share the N sweep) for L2 reuse of the
expert's weight columns; pointer arithmetic only (a gathered tile has no tensor-descriptor form).
"""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0, index="sorted_slot_ids_ptr", size="num_slots // top_k"),
                  channels_per_rank=1)
@triton.jit
def ag_group_gemm_kernel(x_ptr, w_ptr, out_ptr, sorted_slot_ids_ptr, expert_ids_ptr, N, K, EM, num_slots, top_k,
                         stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_om, stride_on,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    """out (num_slots, N)[s] = x (num_slots // top_k, K)[s // top_k] @ w (E, K, N)[expert of s].

    ``sorted_slot_ids_ptr`` (EM,) int32: slots sorted by expert, padded with ``num_slots``;
    ``expert_ids_ptr`` (EM // BLOCK_M,) int32: the expert of each block of BLOCK_M sorted slots.
    """
    num_pid_m = tl.cdiv(EM, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_slot_id = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_slot = tl.load(sorted_slot_ids_ptr + offs_slot_id, mask=offs_slot_id < EM, other=num_slots)
    slot_mask = offs_slot < num_slots
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (offs_slot[:, None] // top_k * stride_xm + offs_k[None, :] * stride_xk)
    w_ptrs = w_ptr + expert * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
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
    pid = tl.program_id(0)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_slot_id = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_slot = tl.load(sorted_slot_ids_ptr + offs_slot_id, mask=offs_slot_id < EM, other=num_slots)
    slot_mask = offs_slot < num_slots
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + offs_slot[:, None] * stride_hm + offs_k[None, :] * stride_hk
    w_ptrs = w_ptr + expert * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        h = tl.load(h_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        w = tl.load(w_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(h, w, acc)
        h_ptrs += BLOCK_K * stride_hk
        w_ptrs += BLOCK_K * stride_wk
    weight = tl.load(topk_weights_ptr + offs_slot, mask=slot_mask, other=0.0)
    acc = acc * weight[:, None]
    out_ptrs = out_ptr + offs_slot[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=slot_mask[:, None] & (offs_n[None, :] < N))
