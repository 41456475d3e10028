"""Partial sums stored by `@triton.jit` helpers: each helper call writes one half of the tile's columns, so every
element is stored, and counted in its channel's notifies, once. A kernel that stored the tile through the helper twice
(zeros first, then the sums) would count its rows twice and complete their channel early."""

import triton
import triton.language as tl

import tilelink


@triton.jit
def store_columns(y_ptr, rows, first, M, D, stride_ym, value, WIDTH: tl.constexpr):
    cols = first + tl.arange(0, WIDTH)
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], value, mask=(rows[:, None] < M) & (cols[None, :] < D))


@tilelink.overlap(tilelink.reduce_scatter("y_ptr", size="M"))
@triton.jit
def scaled_halves(x_ptr, y_ptr, M, D, scale, stride_xm, stride_ym, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    # y = scale * x, each half of a row's BLOCK_D columns written by its own helper call
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    HALF: tl.constexpr = BLOCK_D // 2
    half = tl.arange(0, HALF)
    left = tl.load(x_ptr + rows[:, None] * stride_xm + half[None, :])
    right = tl.load(x_ptr + rows[:, None] * stride_xm + HALF + half[None, :])
    store_columns(y_ptr, rows, 0, M, D, stride_ym, left * scale, HALF)
    store_columns(y_ptr, rows, HALF, M, D, stride_ym, right * scale, HALF)
