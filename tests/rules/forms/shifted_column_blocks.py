"""Copies a block of columns of each row, starting SHIFT blocks before the program's own block along the columns:
the columns are masked by the row's length from above only, so a program whose position is negative reads the end of
the row before."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def shifted_column_blocks(x_ptr, y_ptr, M, D, SHIFT, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    pid_d = tl.program_id(1) - SHIFT
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :], mask=(offs_m[:, None] < M) & (
        offs_d[None, :] < D), other=0.0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    tl.store(y_ptr + offs_m[:, None] * D + cols[None, :], x, mask=(offs_m[:, None] < M) & (cols[None, :] < D))
