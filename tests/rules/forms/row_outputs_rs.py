"""A row-parallel linear one output row a program (a decode step's few token rows: a program per row, the row's
columns in one block), `tl.store(y_ptr + row * stride_ym + cols, acc, mask=cols < N)`. Under reduce_scatter (K split
over the ranks) the tile is the program's row, and its notify counts the columns the mask lets through."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("y_ptr"))
@triton.jit
def row_linear(x_ptr, w_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_ym, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_xm + offs_k, mask=offs_k < K, other=0.0)
        w = tl.load(w_ptr + cols[:, None] * stride_wn + offs_k[None, :],
                    mask=(cols[:, None] < N) & (offs_k[None, :] < K), other=0.0)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(y_ptr + row * stride_ym + cols, acc, mask=cols < N)
