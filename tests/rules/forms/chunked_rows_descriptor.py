"""Column sums of a (B, S, D) tensor gathered along its sequence (dim 1), read one chunk of S at a time through a
tensor descriptor made per chunk: it starts at the chunk's first row and ends at its last, so a block running past
the chunk reads zeros, not the next chunk's rows (which its wait does not cover)."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=1, tile=("s_lo", "s_hi - s_lo"), size="S"), via="copy_engine")
@triton.jit
def chunked_col_sum_desc(x_ptr, y_ptr, S, D, CHUNK, stride_xb, stride_xs, BLOCK_S: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for c in range(0, tl.cdiv(S, CHUNK)):
        s_lo = c * CHUNK
        s_hi = tl.minimum(s_lo + CHUNK, S)
        desc = tl.make_tensor_descriptor(x_ptr + b * stride_xb + s_lo * stride_xs, shape=[s_hi - s_lo, D],
                                         strides=[stride_xs, 1], block_shape=[BLOCK_S, BLOCK_D])
        for start in range(s_lo, s_hi, BLOCK_S):
            x = desc.load([start - s_lo, 0])
            acc += tl.sum(x.to(tl.float32), 0)
    tl.store(y_ptr + b * D + offs_d, acc, mask=offs_d < D)
