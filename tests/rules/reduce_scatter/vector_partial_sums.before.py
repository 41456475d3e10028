"""A 1-D kernel whose stores are partial sums: y = x * w summed over ranks, then scattered. Its mask
is not (rows < M) & (columns < N), so the generic per-element count is used."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("y_ptr", dim=0))
@triton.jit
def partial_scale_kernel(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < N
    x = tl.load(x_ptr + offs, mask=keep, other=0.0)
    w = tl.load(w_ptr + offs, mask=keep, other=0.0)
    tl.store(y_ptr + offs, x * w, mask=keep)
