"""A linear one output row a program whose columns are swept in blocks, as Triton's layer-norm tutorial sweeps a row:
both pointers moved to the program's row in place (`Y += row * stride_y`), then `for off in range(0, N, BLOCK_N)`,
`cols = off + tl.arange(0, BLOCK_N)`, `mask = cols < N`, `tl.store(Y + cols, acc, mask=mask)`. Under all_reduce (K
split over the ranks) the tile is the program's row: the loop's stores are counted and the row notified after it."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_reduce("Y"))
@triton.jit
def row_sweep(X, W, Y, stride_x, stride_w, stride_y, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    X += row * stride_x
    Y += row * stride_y
    for off in range(0, N, BLOCK_N):
        cols = off + tl.arange(0, BLOCK_N)
        mask = cols < N
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            offs_k = k + tl.arange(0, BLOCK_K)
            x = tl.load(X + offs_k, mask=offs_k < K, other=0.0)
            w = tl.load(W + cols[:, None] * stride_w + offs_k[None, :],
                        mask=mask[:, None] & (offs_k[None, :] < K), other=0.0)
            acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(Y + cols, acc, mask=mask)
