"""Compiled ``tilelink.language`` on one CUDA GPU, without NVSHMEM (run on the GPU machine):

1. a spinning consumer and its producer on two streams (both preloaded first): the consumer's
   token-guarded load sees the producer's data, no timeout;
2. a wait nobody satisfies returns after its budget with the diagnostics record filled;
3. the hand-written AG+GEMM kernels in a world of one (the peer table holds the local address),
   three calls on one channel (epochs), against torch.

Usage: ``python -m tests.runtime.gpu_language_check`` from the checkout, with TRITON_INTERPRET unset. Exit 0 = pass.
"""

from __future__ import annotations

import sys
import time

import torch
import triton

import tilelink.language as tll
from examples import handwritten_ag_gemm as example
from tests.runtime import runtime_worlds as worlds
from tilelink.runtime.preload import preload

N = worlds.N


def check_two_streams(device) -> None:
    barriers = torch.zeros(2, dtype=torch.int64, device=device)
    table = torch.tensor([barriers.data_ptr()], dtype=torch.int64, device=device)
    data = torch.zeros(2 * N, dtype=torch.int64, device=device)
    data_table = torch.tensor([data.data_ptr()], dtype=torch.int64, device=device)
    out = torch.zeros(2 * N, dtype=torch.int64, device=device)
    diag = torch.zeros(8, dtype=torch.int64, device=device)
    budget = int(5e9)
    consumer_args = (data, out, barriers, 0, 1, 1, diag, budget)
    producer_args = (data, data_table, barriers, table, 0, 1, 0, 4200)
    preload(worlds.consume_kernel, (1,), *consumer_args, BLOCK=N)
    preload(worlds.produce_kernel, (1,), *producer_args, MODE=0, PUSH=0, BLOCK=N)
    consumer_stream, producer_stream = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    start = time.monotonic()
    with torch.cuda.stream(consumer_stream):
        worlds.consume_kernel[(1,)](*consumer_args, BLOCK=N)
    time.sleep(0.2)  # the consumer is spinning by now
    with torch.cuda.stream(producer_stream):
        worlds.produce_kernel[(1,)](*producer_args, MODE=0, PUSH=0, BLOCK=N)
    torch.cuda.synchronize()
    elapsed = time.monotonic() - start
    assert diag.tolist() == [0] * 8, diag.tolist()
    assert out[:N].tolist() == [4200 + i for i in range(N)], out.tolist()
    print(f"two streams: consumer saw the producer's tile after {elapsed:.3f} s, no timeout")


def check_timeout(device) -> None:
    barriers = torch.zeros(4, dtype=torch.int64, device=device)
    barriers[2] = 3
    diag = torch.zeros(8, dtype=torch.int64, device=device)
    scratch = torch.zeros(4 * N, dtype=torch.int64, device=device)
    torch.cuda.synchronize()
    start = time.monotonic()
    worlds.consume_kernel[(1,)](scratch, scratch, barriers, 2, 1, 7, diag, int(0.3e9), BLOCK=N)
    worlds.peer_wait_kernel[(1,)](barriers, 3, 9, diag, int(0.1e9))  # second timeout: not recorded
    torch.cuda.synchronize()
    elapsed = time.monotonic() - start
    assert diag.tolist()[:5] == [1, 1, 2, 7, 3], diag.tolist()
    assert elapsed < 5, elapsed
    print(f"timeout: record {diag.tolist()[:5]} after {elapsed:.3f} s (budgets 0.3 s + 0.1 s)")


def check_ag_gemm(device) -> None:
    M, N_, K = 50, 24, 40
    rows_per_rank, channels_per_rank = M, 2
    rows_per_channel = triton.cdiv(rows_per_rank, channels_per_rank)
    shard = torch.zeros(M, K, device=device)
    shard_table = torch.tensor([shard.data_ptr()], dtype=torch.int64, device=device)
    gathered = torch.empty(M, K, device=device)
    barriers = torch.zeros(channels_per_rank, dtype=torch.int64, device=device)
    barrier_table = torch.tensor([barriers.data_ptr()], dtype=torch.int64, device=device)
    diag = torch.zeros(8, dtype=torch.int64, device=device)
    for epoch in (1, 2, 3):
        generator = torch.Generator().manual_seed(epoch)
        a = torch.randn(M, K, generator=generator).to(device)
        b = torch.randn(K, N_, generator=generator).to(device)
        shard.copy_(a)
        c = torch.empty(M, N_, device=device)
        example.ag_producer_kernel[(channels_per_rank,)](
            shard, shard_table, gathered, barriers, barrier_table, 0, 1, M, K, shard.stride(0),
            gathered.stride(0), rows_per_rank, rows_per_channel, channels_per_rank, BLOCK_M=16, BLOCK_K=16)
        example.gemm_consumer_kernel[(triton.cdiv(M, 16), triton.cdiv(N_, 16))](
            gathered, b, c, M, N_, K, gathered.stride(0), gathered.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), barriers, rows_per_rank, rows_per_channel, channels_per_rank, 0,
            epoch, diag, int(5e9), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        torch.cuda.synchronize()
        assert diag[0].item() == 0, diag.tolist()
        error = (c.double() - a.double() @ b.double()).abs().max().item()
        assert error < 5e-2, error  # tf32 dot
        print(f"AG+GEMM world of one, call {epoch}: max abs error {error:.2e}, barriers {barriers.tolist()}")


def main() -> int:
    assert not tll.INTERPRETED, "run with TRITON_INTERPRET unset"
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    device = torch.device("cuda", 0)
    check_two_streams(device)
    check_timeout(device)
    check_ag_gemm(device)
    print("gpu language check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
