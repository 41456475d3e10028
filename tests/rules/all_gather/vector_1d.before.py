"""A 1-D kernel: y = x * w where x is all-gathered (a 1-D tile of BLOCK elements)."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def scale_kernel(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    w = tl.load(w_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, x * w, mask=offs < N)
