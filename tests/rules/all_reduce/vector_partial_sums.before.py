"""A 1-D kernel whose stores are partial sums, all-reduced two-shot: y = sum over ranks of x_r * w. Its mask is
not (rows < M) & (columns < N): the elements stored are counted one by one."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_reduce("y_ptr", mode="two_shot"))
@triton.jit
def partial_product_kernel(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < N
    x = tl.load(x_ptr + offs, mask=inside, other=0.0)
    w = tl.load(w_ptr + offs, mask=inside, other=0.0)
    tl.store(y_ptr + offs, x * w, mask=inside)
