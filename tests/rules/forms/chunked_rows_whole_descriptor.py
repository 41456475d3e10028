"""Column sums of the first END rows of a (B, S, D) tensor gathered along its sequence (dim 1), read one chunk of
CHUNK rows at a time. Where every chunk is a whole number of blocks (EVEN), through one tensor descriptor over all the
rows, made once: a block starts a whole number of blocks past its chunk's first row, so it ends inside the chunk, whose
rows its wait covers (past END too, weighted 0). Otherwise through a descriptor per chunk that ends at the chunk's last
row (a block past it reads zeros)."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=1, tile=("s_lo", "CHUNK"), size="S"), via="copy_engine")
@triton.jit
def chunked_col_sum_whole(x_ptr, y_ptr, S, END, D, CHUNK, stride_xb, stride_xs, BLOCK_S: tl.constexpr,
                          BLOCK_D: tl.constexpr, EVEN: tl.constexpr):
    b = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    if EVEN:
        whole = tl.make_tensor_descriptor(x_ptr + b * stride_xb, shape=[S, D], strides=[stride_xs, 1],
                                          block_shape=[BLOCK_S, BLOCK_D])
    for c in range(0, tl.cdiv(END, CHUNK)):
        s_lo = c * CHUNK
        s_hi = tl.minimum(s_lo + CHUNK, END)
        if not EVEN:
            part = tl.make_tensor_descriptor(x_ptr + b * stride_xb + s_lo * stride_xs, shape=[s_hi - s_lo, D],
                                             strides=[stride_xs, 1], block_shape=[BLOCK_S, BLOCK_D])
        for start in range(s_lo, s_hi, BLOCK_S):
            rows = start + tl.arange(0, BLOCK_S)
            if EVEN:
                x = whole.load([start, 0])
            else:
                x = part.load([start - s_lo, 0])
            # a weight, not a select: a row read before its wait has passed makes the sum NaN
            keep = (rows < s_hi).to(tl.float32)
            acc += tl.sum(x.to(tl.float32) * keep[:, None], 0)
    tl.store(y_ptr + b * D + offs_d, acc, mask=offs_d < D)
