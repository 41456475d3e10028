"""AllGather + GEMM from a plain Triton GEMM with one annotation.

Each rank holds rows [r*ceil(M/R), min(M, (r+1)*ceil(M/R))) of A and the whole B; the kernel is
launched exactly like the single-GPU GEMM, with this rank's shard in place of A. TileLink gathers A
(SM pull, ring order) while the GEMM computes, each tile waiting only for the rows it reads.

    tlxform build examples/ag_gemm.py          # see the generated source and the report
    tlxform run -n 4 --emulate examples/ag_gemm.py   # 4 ranks on the CPU (Triton interpreter)
    tlxform run -n 2 examples/ag_gemm.py       # 2 ranks on GPUs (NVSHMEM)
"""

import torch
import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
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
    gen = torch.Generator().manual_seed(0)  # every rank builds the same full problem
    a = torch.randn(M, K, generator=gen).to(world.device)
    b = torch.randn(K, N, generator=gen).to(world.device)
    rows = -(-M // size)
    lo, hi = min(M, rank * rows), min(M, (rank + 1) * rows)
    a_shard = a[lo:hi].contiguous()  # this rank's rows of A
    c = torch.empty(M, N, device=world.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    for _ in range(3):  # the context (buffers, channels) is created once and reused
        matmul_kernel[grid](a_shard, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            c.stride(0), c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    err = (c - a @ b).abs().max().item()
    assert err < 1e-3, f"rank {rank}: max error {err}"
    print(f"rank {rank}/{size}: AG+GEMM {M}x{N}x{K} (rows {lo}..{hi} local) equals torch, max error {err:.2e}")
    tilelink.finalize()


if __name__ == "__main__":
    main()
