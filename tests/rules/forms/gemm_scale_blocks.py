"""A scaled GEMM in vLLM's form: the rows of A and their scales are gathered together, and the epilogue loads the
tile's scales through a block of pointers given an axis at the load (`tl.load(scale_a_ptrs[:, None])`, with
`scale_a_ptrs = scale_a_ptr + offs`), after the K loop. The scales of B are per column and not gathered."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather(("a_ptr", "scale_a_ptr")))
@triton.jit
def scaled_matmul(a_ptr, b_ptr, scale_a_ptr, scale_b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                  stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    a_ptrs = a_ptr + stride_am * offs_am[:, None] + stride_ak * offs_k[None, :]
    b_ptrs = b_ptr + stride_bk * offs_k[:, None] + stride_bn * offs_bn[None, :]
    scale_a_ptrs = scale_a_ptr + offs_am
    scale_b_ptrs = scale_b_ptr + offs_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, tl.cdiv(K, BLOCK_K)):
        masks_k = offs_k < K
        a = tl.load(a_ptrs, mask=(offs_am[:, None] < M) & masks_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=masks_k[:, None] & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        offs_k += BLOCK_K
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    scale_a = tl.load(scale_a_ptrs[:, None], (offs_am < M)[:, None])
    scale_b = tl.load(scale_b_ptrs[None, :], (offs_bn < N)[None, :])
    acc = scale_a * acc * scale_b
    c_ptrs = c_ptr + stride_cm * offs_am[:, None] + stride_cn * offs_bn[None, :]
    tl.store(c_ptrs, acc, mask=(offs_am[:, None] < M) & (offs_bn[None, :] < N))
