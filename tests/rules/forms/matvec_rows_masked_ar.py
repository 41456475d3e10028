"""A matrix-vector product one output element a program on a grid rounded up past the rows: the store is masked by
`pid < M`, through the output pointer moved to the program's element in place (`y_ptr += pid`, as Liger's and
unsloth's row kernels move theirs), A read through rows clamped to the last one. Under all_reduce (K split over the
ranks) the row count is the mask's bound, and every rank ends with the whole vector."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_reduce("y_ptr"))
@triton.jit
def matvec_rows_masked(a_ptr, x_ptr, y_ptr, M, K, stride_am, BLOCK_K: tl.constexpr):
    pid = tl.program_id(axis=0)
    clamped = tl.minimum(pid, M - 1)
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + clamped * stride_am + offs_k, mask=offs_k < K, other=0.0)
        x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
        acc += a.to(tl.float32) * x.to(tl.float32)
    y_ptr += pid
    tl.store(y_ptr, tl.sum(acc, axis=0), mask=pid < M)
