"""Sums of each row's column blocks from column OFF on, walked in a K loop the way a matmul walks A: the pointer
advanced by a block of columns after each load, the columns masked by what is left of the row."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def window_strip_sum(x_ptr, y_ptr, M, D, OFF, NSTEP, stride_xm, stride_xd, BLOCK_M: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    # y[m, c] = the sum of x[m, OFF + c + j * BLOCK_D] over the steps j that stay in the row
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = OFF + tl.arange(0, BLOCK_D)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :] * stride_xd
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for j in range(0, NSTEP):
        acc += tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_d[None, :] < D - j * BLOCK_D), other=0.0)
        x_ptrs += BLOCK_D * stride_xd
    cols = tl.arange(0, BLOCK_D)
    tl.store(y_ptr + offs_m[:, None] * BLOCK_D + cols[None, :], acc, mask=offs_m[:, None] < M)
