"""The second half of a TP MoE: a fused-MoE grouped GEMM whose outputs are scattered to each token's
expert slot, weighted by the router, reduced over the top-k slots and reduce-scattered across ranks
(paper §7.2: GroupGEMM -> scatter -> top-k reduce -> RS, three kernels chained by tile primitives)."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0, index="sorted_token_ids_ptr", topk="top_k",
                                          size="num_valid_tokens // top_k"))
@triton.jit
def fused_moe_down_kernel(a_ptr, b_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr, N, K, EM,
                          num_valid_tokens, top_k, stride_am, stride_ak, stride_be, stride_bk, stride_bn, stride_cm,
                          stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_token_id = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_token = tl.load(sorted_token_ids_ptr + offs_token_id, mask=offs_token_id < EM, other=num_valid_tokens)
    token_mask = offs_token < num_valid_tokens
    expert = tl.load(expert_ids_ptr + pid_m)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_token[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    weight = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0.0)
    acc = acc * weight[:, None]
    c_ptrs = c_ptr + offs_token[:, None] * stride_cm + offs_bn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=token_mask[:, None] & (offs_bn[None, :] < N))
