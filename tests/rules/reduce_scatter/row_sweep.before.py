"""A GEMM whose programs each own BLOCK_M rows of C and sweep its column tiles in an inner loop (pointer
stores), C reduce-scattered along M. The rows do not change inside the loop: the rewrite counts the columns
each iteration stored and notifies the rows' channels once, after the loop."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    for pid_n in range(0, tl.cdiv(N, BLOCK_N)):
        offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptr + offs_am[:, None] * stride_am + (k * BLOCK_K + offs_k[None, :]) * stride_ak,
                        mask=(offs_am[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
            b = tl.load(b_ptr + (k * BLOCK_K + offs_k[:, None]) * stride_bk + offs_bn[None, :] * stride_bn,
                        mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
        tl.store(c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn, acc,
                 mask=(offs_am[:, None] < M) & (offs_bn[None, :] < N))
