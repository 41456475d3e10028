"""A GEMM of block-quantised operands (the DeepSeek-style FP8 form vLLM and SGLang serve with): A has a scale per row
and group of `group_k` columns, B one per block of `group_n` x `group_k`. A and its scales are gathered together;
the kernel loads the scales of the K step's group in its K loop, at column `k * BLOCK_K // group_k` of the tile's
scale rows, which each call bounds over the loop against the scale rows' length."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather(("A", "As"), dim=0))
@triton.jit
def block_scaled_matmul(A, B, C, As, Bs, M, N, K, group_n, group_k, stride_am, stride_ak, stride_bk, stride_bn,
                        stride_cm, stride_cn, stride_as_m, stride_as_k, stride_bs_k, stride_bs_n,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = B + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    as_ptrs = As + offs_am * stride_as_m
    bs_ptrs = Bs + (offs_bn // group_n) * stride_bs_n

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        k_start = k * BLOCK_K
        offs_ks = k_start // group_k
        a_s = tl.load(as_ptrs + offs_ks * stride_as_k)
        b_s = tl.load(bs_ptrs + offs_ks * stride_bs_k)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = C + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=c_mask)
