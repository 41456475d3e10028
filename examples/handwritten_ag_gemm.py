"""AllGather + GEMM written by hand with the tile-centric primitives (paper Figures 4-6 style).

Every rank holds a row shard of ``A`` (rank ``r`` holds rows ``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))``)
and all of ``B``; each computes ``C = gather(A) @ B``. Two kernels per rank:

- the *producer* pulls the shards from the peers channel by channel, in ring order starting with
  its own shard (``tile_pull_data``), and marks each channel done (``producer_tile_notify``, local);
- the *consumer* GEMM waits, per M tile, for the channels its rows live in
  (``consumer_tile_wait_rows``) and offsets its A pointers by the wait's token, so the loads stay
  behind the wait even when the compiler pipelines the K loop.

Run it on an emulated world of CPU processes::

    tlxform run -n 4 --emulate examples/handwritten_ag_gemm.py
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

import tilelink
import tilelink.language as tll
from tilelink import runtime


@triton.jit
def ag_producer_kernel(shard_ptr, shard_table, gathered_ptr, barrier_ptr, barrier_table,
                       rank, world, M, K, stride_shard_m, stride_gathered_m,
                       rows_per_rank, rows_per_channel, channels_per_rank,
                       BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per (source rank, channel): pull the channel's rows of ``A`` into ``gathered``.

    Args:
        shard_ptr: this rank's shard of A, symmetric ``[rows_per_rank, K]``.
        shard_table: peer table of the shard buffer.
        gathered_ptr: ``[M, K]``, the gathered A on this rank.
        barrier_ptr: this rank's barrier array, ``world * channels_per_rank`` int64 words.
    """
    pid = tl.program_id(0)
    step = pid // channels_per_rank
    channel_in_rank = pid % channels_per_rank
    src = (rank + step) % world  # ring order: own shard first, then the next ranks
    rank_end = tl.minimum((src + 1) * rows_per_rank, M)
    row_begin = src * rows_per_rank + channel_in_rank * rows_per_channel
    row_end = tl.minimum(row_begin + rows_per_channel, rank_end)
    for m in range(row_begin, row_end, BLOCK_M):
        offs_m = m + tl.arange(0, BLOCK_M)
        mask_m = offs_m < row_end
        local_m = offs_m - src * rows_per_rank
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            offs_k = k * BLOCK_K + tl.arange(0, BLOCK_K)
            mask = mask_m[:, None] & (offs_k[None, :] < K)
            offsets = local_m[:, None] * stride_shard_m + offs_k[None, :]
            tile = tll.tile_pull_data(shard_table, shard_ptr, src, offsets, mask)
            tl.store(gathered_ptr + offs_m[:, None] * stride_gathered_m + offs_k[None, :], tile,
                     mask=mask)
    # MODE 0: the consumer is the GEMM on this rank
    tll.producer_tile_notify(barrier_ptr, src * channels_per_rank + channel_in_rank, 1,
                             barrier_table, rank, world, 0)


@triton.jit
def gemm_consumer_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                         stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                         barrier_ptr, rows_per_rank, rows_per_channel, channels_per_rank,
                         first_tile, epoch, diag_ptr, budget,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``C = A @ B`` over the gathered ``A``; each M tile waits for its channels first.

    The M tiles are visited starting at ``first_tile`` (this rank's own rows), whose data is
    ready first.
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m = (tl.program_id(0) + first_tile) % num_pid_m
    pid_n = tl.program_id(1)
    row_start = pid_m * BLOCK_M
    token = tll.consumer_tile_wait_rows(barrier_ptr, row_start, tl.minimum(row_start + BLOCK_M, M),
                                        rows_per_rank, rows_per_channel, channels_per_rank, epoch,
                                        diag_ptr, budget)
    offs_m = row_start + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + token + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


class AgGemmContext:
    """Symmetric buffers and channels of one AG+GEMM shape, allocated once and reused per call."""

    def __init__(self, M: int, K: int, dtype: torch.dtype, channels_per_rank: int = 2,
                 block_m: int = 16, block_n: int = 16, block_k: int = 16) -> None:
        world = runtime.current_world()
        self.world, self.M, self.K = world, M, K
        self.rows_per_rank = triton.cdiv(M, world.world_size)
        self.channels_per_rank = channels_per_rank
        self.rows_per_channel = max(1, triton.cdiv(self.rows_per_rank, channels_per_rank))
        self.block_m, self.block_n, self.block_k = block_m, block_n, block_k
        self.shard = runtime.symmetric_zeros((self.rows_per_rank, K), dtype)
        self.shard_table = runtime.peer_table(self.shard)
        self.gathered = torch.empty((M, K), dtype=dtype, device=world.device)
        self.channel = runtime.Channel(world.world_size * channels_per_rank)
        self.diagnostics = runtime.Diagnostics()

    def __call__(self, a_shard: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        world, M, K = self.world, self.M, self.K
        N = b.shape[1]
        rows = min(M, (world.rank + 1) * self.rows_per_rank) - world.rank * self.rows_per_rank
        if a_shard.shape != (max(rows, 0), K) or b.shape[0] != K:
            raise tilelink.LaunchError(f"ag_gemm: rank {world.rank} expects an A shard of "
                                       f"{[max(rows, 0), K]} and B of [{K}, N], got "
                                       f"{list(a_shard.shape)} and {list(b.shape)}")
        # the shard buffer is read by peers: nobody may still read the previous call's shard
        world.barrier()
        self.shard[: a_shard.shape[0]].copy_(a_shard)
        world.barrier()
        epoch = self.channel.advance()
        c = torch.empty((M, N), dtype=a_shard.dtype, device=world.device)
        ch = self.channel
        producer_grid = (world.world_size * self.channels_per_rank,)
        ag_producer_kernel[producer_grid](
            self.shard, self.shard_table, self.gathered, ch.barriers, ch.peer_table,
            world.rank, world.world_size, M, K, self.shard.stride(0), self.gathered.stride(0),
            self.rows_per_rank, self.rows_per_channel, self.channels_per_rank,
            BLOCK_M=self.block_m, BLOCK_K=self.block_k)
        gemm_grid = (triton.cdiv(M, self.block_m), triton.cdiv(N, self.block_n))
        gemm_consumer_kernel[gemm_grid](
            self.gathered, b, c, M, N, K, self.gathered.stride(0), self.gathered.stride(1),
            b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            ch.barriers, self.rows_per_rank, self.rows_per_channel, self.channels_per_rank,
            (world.rank * self.rows_per_rank) // self.block_m, epoch,
            self.diagnostics.buffer, self.diagnostics.budget_ns,
            BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k)
        self.diagnostics.check("gemm_consumer_kernel")
        return c


def run_check(M: int = 50, N: int = 24, K: int = 40, calls: int = 3) -> float:
    """On every rank: AG+GEMM ``calls`` times on one context (epochs, no reset) against torch.
    Returns the largest absolute error seen."""
    world = runtime.current_world()
    context = AgGemmContext(M, K, torch.float32)
    worst = 0.0
    for call in range(calls):
        generator = torch.Generator().manual_seed(1234 + call)  # the same A and B on every rank
        a = torch.randn(M, K, generator=generator)
        b = torch.randn(K, N, generator=generator)
        rows_per_rank = context.rows_per_rank
        shard = a[world.rank * rows_per_rank: min(M, (world.rank + 1) * rows_per_rank)]
        c = context(shard.to(world.device), b.to(world.device))
        expected = a.double() @ b.double()
        error = (c.double().cpu() - expected).abs().max().item()
        if error > 1e-3:
            raise AssertionError(f"rank {world.rank} call {call}: AG+GEMM differs from torch by {error}")
        worst = max(worst, error)
    return worst


def main() -> int:
    tilelink.init()
    error = run_check()
    print(f"rank {tilelink.rank()}/{tilelink.world_size()}: AG+GEMM M=50 N=24 K=40 matches torch "
          f"over 3 calls (max abs error {error:.2e})")
    tilelink.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
