"""A persistent GEMM: each program loops over output tiles; A is all-gathered along M."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
@triton.jit
def persistent_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stride_cm, stride_cn, NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    for tile_id in range(pid, num_pid_m * num_pid_n, NUM_PROGRAMS):
        pid_m = tile_id // num_pid_n
        pid_n = tile_id % num_pid_n
        offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            offs_kk = k * BLOCK_K + offs_k
            a = tl.load(a_ptr + offs_am[:, None] * stride_am + offs_kk[None, :] * stride_ak,
                        mask=(offs_am[:, None] < M) & (offs_kk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + offs_kk[:, None] * stride_bk + offs_bn[None, :] * stride_bn,
                        mask=(offs_kk[:, None] < K) & (offs_bn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
        c_ptrs = c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_am[:, None] < M) & (offs_bn[None, :] < N))
