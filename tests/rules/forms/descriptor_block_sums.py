"""Sums of SPAN rows read through a tensor descriptor in blocks, the loop's target the block's first row: each
program sums rows [pid * BLOCK_M, pid * BLOCK_M + SPAN) block by block (rows past M read as zeros)."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
@triton.jit
def block_sums(x_ptr, y_ptr, M, D, stride_xm, SPAN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    desc = tl.make_tensor_descriptor(x_ptr, shape=[M, D], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_D])
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start in range(pid * BLOCK_M, pid * BLOCK_M + SPAN, BLOCK_M):
        acc += desc.load([start, 0])
    offs = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    tl.store(y_ptr + offs[:, None] * BLOCK_D + cols[None, :], acc, mask=offs[:, None] < M)
