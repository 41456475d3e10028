"""GEMM + ReduceScatter from a plain Triton GEMM with one annotation.

Each rank holds a slice of the reduction dimension K (A[:, k-slice] and B[k-slice, :]); the sum of the
ranks' products is A @ B. The kernel is launched like the single-GPU GEMM with this rank's output
rows [r*ceil(M/R), min(M, (r+1)*ceil(M/R))) in place of C; TileLink notifies each finished tile and a
partner kernel reduces this rank's rows from every rank as they complete.

    tlxform run -n 4 --emulate examples/gemm_rs.py
"""

import torch
import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
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
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def main(M: int = 50, N: int = 24, K: int = 40) -> None:
    world = tilelink.init()
    rank, size = world.rank, world.world_size
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=gen).to(world.device)
    b = torch.randn(K, N, generator=gen).to(world.device)
    kper = -(-K // size)
    klo, khi = min(K, rank * kper), min(K, (rank + 1) * kper)
    a_r, b_r = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    rows = -(-M // size)
    lo, hi = min(M, rank * rows), min(M, (rank + 1) * rows)
    c_shard = torch.empty(hi - lo, N, device=world.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    for _ in range(3):
        matmul_kernel[grid](a_r, b_r, c_shard, M, N, khi - klo, a_r.stride(0), a_r.stride(1), b_r.stride(0),
                            b_r.stride(1), N, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    err = (c_shard - (a @ b)[lo:hi]).abs().max().item() if hi > lo else 0.0
    assert err < 1e-3, f"rank {rank}: max error {err}"
    print(f"rank {rank}/{size}: GEMM+RS {M}x{N}x{K} (output rows {lo}..{hi}) equals torch, max error {err:.2e}")
    tilelink.finalize()


if __name__ == "__main__":
    main()
