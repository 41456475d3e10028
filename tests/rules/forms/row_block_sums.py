"""Sums of the first BLOCK_D elements of each row of a (B, S, D) tensor gathered along its sequence (dim 1): the
columns are a whole block, read without a mask, so the rows must hold at least BLOCK_D elements."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=1, tile=("s0", "BLOCK_S"), size="S"), via="copy_engine")
@triton.jit
def row_block_sum(x_ptr, y_ptr, S, stride_xb, stride_xs, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(1)
    s0 = tl.program_id(0) * BLOCK_S
    offs_s = s0 + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + b * stride_xb + offs_s[:, None] * stride_xs + offs_d[None, :], mask=offs_s[:, None] < S,
                other=0.0)
    tl.store(y_ptr + b * S + offs_s, tl.sum(x, 1), mask=offs_s < S)
