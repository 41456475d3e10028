"""Column sums of a (B, S, D) tensor gathered along its sequence (dim 1), read one chunk of S at a time: the chunk's
wait sits before the loop over its blocks (tile= names the chunk), and each block's rows are masked at the chunk's
end, so a block running past it reads nothing of the next chunk, which may not have arrived yet."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=1, tile=("s_lo", "s_hi - s_lo"), size="S"), via="copy_engine")
@triton.jit
def chunked_col_sum(x_ptr, y_ptr, S, D, CHUNK, stride_xb, stride_xs, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for c in range(0, tl.cdiv(S, CHUNK)):
        s_lo = c * CHUNK
        s_hi = tl.minimum(s_lo + CHUNK, S)
        for start in range(s_lo, s_hi, BLOCK_S):
            offs_s = start + tl.arange(0, BLOCK_S)
            x = tl.load(x_ptr + b * stride_xb + offs_s[:, None] * stride_xs + offs_d[None, :],
                        mask=(offs_s[:, None] < s_hi) & (offs_d[None, :] < D), other=0.0)
            acc += tl.sum(x.to(tl.float32), 0)
    tl.store(y_ptr + b * D + offs_d, acc, mask=offs_d < D)
