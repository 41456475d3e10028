"""A row-parallel linear layer's GEMM for decode: y = x_r @ w_r, each rank holding a slice of K; the partial
products are all-reduced (one-shot: a few rows of activations)."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_reduce("y_ptr", mode="one_shot"))
@triton.jit
def row_parallel_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn, stride_ym,
                        stride_yn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :] * stride_xk,
                    mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K), other=0.0)
        w = tl.load(w_ptr + (k0 + ks)[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(x, w)
    y_mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=y_mask)
