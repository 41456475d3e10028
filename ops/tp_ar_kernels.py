"""The GEMM + AllReduce of TileLink's operators, written as a plain annotated Triton kernel.

A row-parallel linear layer: each rank multiplies its K slice of the activations by its K slice of the weight
and stores the whole (M, N) partial product; ``tilelink.all_reduce`` sums the ranks' partial products onto
every rank (see ``tlxform build ops/tp_ar_kernels.py``). The algorithm is chosen by the message's size
(one-shot for a few decode tokens, two-shot for many); :data:`FORCED` holds the same kernel with either one
forced.
"""

import triton
import triton.language as tl

import tilelink
from tilelink.ops.gemm_kernels import tile_coordinates


@tilelink.overlap(tilelink.all_reduce("c_ptr"))
@triton.jit
def gemm_ar_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C (M, N) = sum over ranks of A_r (M, K_r) @ B_r (K_r, N), the whole of C on every rank."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coordinates(tl.program_id(0), GROUP_M * num_pid_n, num_pid_m, GROUP_M)
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_am[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_mask = (offs_am[:, None] < M) & (offs_bn[None, :] < N)
    tl.store(c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=c_mask)


#: :func:`gemm_ar_kernel` with the all-reduce's algorithm forced (``tilelink.ops.gemm_ar(..., mode=...)``)
FORCED = {mode: tilelink.overlap(tilelink.all_reduce("c_ptr", mode=mode))(gemm_ar_kernel.kernel)
          for mode in ("one_shot", "two_shot")}
