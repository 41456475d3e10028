"""Each program copies (all-gather) or scales into partial sums (reduce-scatter) one tile of rows, its tile the
program id itself: the form whose tiles TileLink rotates so that a rank's own rows come first."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def row_tile_copy(x_ptr, y_ptr, M, D, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs[:, None] * stride_xm + cols[None, :], mask=offs[:, None] < M, other=0.0)
    tl.store(y_ptr + offs[:, None] * D + cols[None, :], x, mask=offs[:, None] < M)


@tilelink.overlap(tilelink.reduce_scatter("y_ptr", size="M"))
@triton.jit
def row_tile_scale(x_ptr, y_ptr, M, D, stride_ym, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs[:, None] * D + cols[None, :], mask=offs[:, None] < M, other=0.0)
    tl.store(y_ptr + offs[:, None] * stride_ym + cols[None, :], x * 2.0, mask=offs[:, None] < M)
