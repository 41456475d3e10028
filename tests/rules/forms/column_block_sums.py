"""Sums of blocks of columns of each row of an (M, D) tensor gathered along its rows: program (i, j) sums columns
[j * STEP, j * STEP + BLOCK_D) of its block of rows, the columns masked by the row's length."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def column_block_sum(x_ptr, y_ptr, M, D, STEP, stride_xm, stride_xd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    pid_d = tl.program_id(1)
    cols = pid_d * STEP + tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] * stride_xd,
                mask=(offs_m[:, None] < M) & (cols[None, :] < D), other=0.0)
    tl.store(y_ptr + offs_m * tl.num_programs(1) + pid_d, tl.sum(x, 1), mask=offs_m < M)
