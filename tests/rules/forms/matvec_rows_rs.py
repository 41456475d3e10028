"""A matrix-vector product one output element a program, in the form of the GEMV kernels of serving stacks: program
`row` sums its row of A times x over K in blocks and stores `tl.store(y_ptr + row, acc)`, no mask, a grid of one
program a row. Under reduce_scatter (K split over the ranks) the row count is the grid's."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("y_ptr"))
@triton.jit
def matvec_rows(a_ptr, x_ptr, y_ptr, K, stride_am, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + row * stride_am + offs_k, mask=offs_k < K, other=0.0)
        x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
        acc += a.to(tl.float32) * x.to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc, axis=0))
