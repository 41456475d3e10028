"""A GEMM of A (M, K) and B given as its transpose (N, K), both contiguous, so that K is the row stride of both:
pointers advanced along K on each step, and a fixed inner loop summing each step's product in two halves of the
rows' weight. Each rank holds a slice of K of A and of B's transpose, whose row stride is that slice's own K; C's
partial sums are reduce-scattered along M."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def matmul_nt(a_ptr, bt_ptr, c_ptr, M, N, K,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    offs_m = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = bt_ptr + offs_n[None, :] * K + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_n[None, :] < N), other=0.0)
        for _half in tl.static_range(0, 2):
            acc = tl.dot(a * 0.5, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], c, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
