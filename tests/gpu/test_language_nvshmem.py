"""tilelink.language compiled on the GPU, across NVSHMEM ranks sharing it: push/notify rings,
broadcast notify + pull, a producer/consumer pair, the host copy engine, and a bounded wait that
must end in WaitTimeout. The emulated counterparts live in tests/runtime.

Every kernel is compiled and loaded on every rank before any kernel that spins is launched (loading
a module waits for the running kernels).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import tilelink
import tilelink.language as tll
from tests.gpu.ranks import run_world

N = 256


@triton.jit
def push_notify_kernel(data_table, data_ptr, bar_table, bar_ptr, src_ptr, dst_rank, my_rank,
                       N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(src_ptr + offs)
    tll.tile_push_data(data_table, data_ptr, dst_rank, my_rank * N + offs, x, offs < N)
    tll.peer_tile_notify(bar_table, bar_ptr, my_rank, dst_rank, 1)


@triton.jit
def wait_read_kernel(bar_ptr, index, target, diag_ptr, budget, data_ptr, out_ptr, N: tl.constexpr):
    token = tll.peer_tile_wait(bar_ptr, index, target, diag_ptr, budget)
    offs = tl.arange(0, N)
    x = tl.load(data_ptr + index * N + offs + token)
    tl.store(out_ptr + offs, x)


@triton.jit
def produce_broadcast_kernel(data_ptr, bar_ptr, bar_table, src_ptr, my_rank, world, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(data_ptr + my_rank * N + offs, tl.load(src_ptr + offs))
    tll.producer_tile_notify(bar_ptr, my_rank, 1, bar_table, my_rank, world, tll.MODE_BROADCAST)


@triton.jit
def consume_pull_kernel(bar_ptr, target, diag_ptr, budget, data_table, data_ptr, out_ptr, world,
                        N: tl.constexpr):
    offs = tl.arange(0, N)
    for source in range(0, world):
        token = tll.consumer_tile_wait(bar_ptr, source, 1, target, diag_ptr, budget)
        x = tll.tile_pull_data(data_table, data_ptr, source, source * N + offs + token, offs < N)
        tl.store(out_ptr + source * N + offs, x)


def language_suite(world):
    from tilelink.runtime import heap, host
    from tilelink.runtime.diagnostics import Diagnostics
    from tilelink.runtime.preload import preload

    r, n = world.rank, world.world_size
    dev = world.device
    nxt, prv = (r + 1) % n, (r - 1) % n
    data = heap.symmetric_zeros((n * N,), torch.float32)
    bars = heap.symmetric_zeros((n,), torch.int64)
    data_table, bar_table = heap.peer_table(data), heap.peer_table(bars)
    src = torch.arange(N, device=dev, dtype=torch.float32) + 1000 * r
    out = torch.zeros(n * N, device=dev, dtype=torch.float32)
    diag = Diagnostics()
    budget = int(20e9)
    short = int(0.3e9)

    kernels = [
        (push_notify_kernel, (data_table, data, bar_table, bars, src, nxt, r), {"N": N}),
        (wait_read_kernel, (bars, prv, 1, diag.buffer, budget, data, out), {"N": N}),
        (produce_broadcast_kernel, (data, bars, bar_table, src, r, n), {"N": N}),
        (consume_pull_kernel, (bars, 1, diag.buffer, budget, data_table, data, out, n), {"N": N}),
    ]
    for kernel, args, kwargs in kernels:
        preload(kernel, (1,), *args, **kwargs)
    world.barrier()
    result = {"rank": r}

    # ring: push my row into the next rank, notify it; wait for the previous rank's row
    push_notify_kernel[(1,)](data_table, data, bar_table, bars, src, nxt, r, N=N)
    wait_read_kernel[(1,)](bars, prv, 1, diag.buffer, budget, data, out, N=N)
    torch.cuda.synchronize()
    diag.check("wait_read_kernel")
    expected_prev = torch.arange(N, device=dev, dtype=torch.float32) + 1000 * prv
    result["ring"] = bool(torch.equal(out[:N], expected_prev))
    world.barrier()

    # broadcast notify + pull: every rank writes its own row, tells everyone, pulls everyone's
    data.zero_()
    bars.zero_()
    out.zero_()
    world.barrier()
    produce_broadcast_kernel[(1,)](data, bars, bar_table, src, r, n, N=N)
    consume_pull_kernel[(1,)](bars, 1, diag.buffer, budget, data_table, data, out, n, N=N)
    torch.cuda.synchronize()
    diag.check("consume_pull_kernel")
    expected = torch.cat([torch.arange(N, device=dev, dtype=torch.float32) + 1000 * s for s in range(n)])
    result["pull"] = bool(torch.equal(out, expected))
    world.barrier()

    # copy engine: rank_copy_data into the next rank + rank_notify; rank_wait for mine
    side = torch.cuda.Stream(dev)
    host.rank_copy_data(src, heap.peer_tensor(data, nxt)[r * N:(r + 1) * N], stream=side)
    host.rank_notify(bars, r, 5, nxt, stream=side)
    host.rank_wait(bars, prv, 5, stream=side, timeout_s=30.0)
    side.synchronize()
    result["copy_engine"] = bool(torch.equal(data[prv * N:(prv + 1) * N], expected_prev))
    world.barrier()

    # a device wait nobody satisfies ends in WaitTimeout (after its budget), not in a hang
    wait_read_kernel[(1,)](bars, prv, 1_000_000, diag.buffer, short, data, out, N=N)
    torch.cuda.synchronize()
    try:
        diag.check("wait_read_kernel")
        result["timeout"] = "no error"
    except tilelink.WaitTimeout as exc:
        result["timeout"] = (exc.primitive, exc.index, exc.expected, exc.seen)
    world.barrier()
    return result


@pytest.mark.parametrize("world_size", [2, 4])
def test_language_world(world_size):
    results = run_world(language_suite, world_size, mode="tilelink", timeout=300)
    for r, out in enumerate(results):
        prv = (r - 1) % world_size
        assert out["ring"], out
        assert out["pull"], out
        assert out["copy_engine"], out
        assert out["timeout"] == ("peer_tile_wait", prv, 1_000_000, 5), out
    print("language world", world_size, results)
