"""A GEMM whose epilogue is chosen at compile time: with SPLIT_EPILOGUE it stores C as two half-width tiles,
else as one tile; C's partial sums are reduce-scattered along M."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def matmul_branch(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_EPILOGUE: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    if SPLIT_EPILOGUE:
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + cols[None, :] * stride_cn, left,
                 mask=(offs_m[:, None] < M) & (cols[None, :] < N))
        cols2 = cols + BLOCK_N // 2
        tl.store(c_ptr + offs_m[:, None] * stride_cm + cols2[None, :] * stride_cn, right,
                 mask=(offs_m[:, None] < M) & (cols2[None, :] < N))
    else:
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
