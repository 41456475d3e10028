"""NvshmemBackend on the GPU: bootstrap, symmetric heap, flags, copies, bounded waits.

Each world runs the whole suite once (NVSHMEM start-up dominates the time), 1, 2, 4 and 8 ranks
sharing the GPU(s).
"""

from __future__ import annotations

import time

import pytest
import torch

import tilelink
from tests.gpu.ranks import run_world
from tilelink.errors import SymmetricHeapError


def backend_suite(backend):
    torch.cuda.set_device(backend.device)
    r, n = backend.rank, backend.world_size
    out = {"rank": r, "world": n, "device": str(backend.device)}
    import nvshmem.core as core

    out["pe"], out["npes"] = core.my_pe(), core.n_pes()

    # symmetric allocation and peer views: every rank sees every rank's bytes
    local, peers = backend.allocate(4096 + 3)
    out["n_views"] = len(peers)
    out["self_view_is_local"] = peers[r].data_ptr() == local.data_ptr()
    local.fill_(r + 1)
    backend.barrier()
    out["peer_values"] = [int(p[:7].to(torch.int64).sum().item()) // 7 for p in peers]
    out["peer_tail"] = [int(p[-1].item()) for p in peers]

    # host flags: write into the next rank's word, wait for the previous rank's
    words, word_views = backend.allocate(8 * n)
    words.view(torch.int64).zero_()
    backend.barrier()
    side = torch.cuda.Stream(backend.device)
    nxt, prv = (r + 1) % n, (r - 1) % n
    for epoch in (1, 2, 3):
        backend.write_value(word_views[nxt].view(torch.int64)[r:r + 1], epoch, side)
        backend.wait_value(words.view(torch.int64)[prv:prv + 1], epoch, side, timeout_s=30.0)
    side.synchronize()
    out["flag_from_prev"] = int(words.view(torch.int64)[prv].item())

    # copy engine: push my bytes into slot r of the next rank, then pull from the previous rank the
    # slot its own previous rank pushed there
    data, data_views = backend.allocate(2 * 1024 * n)
    data.zero_()
    mine = torch.full((1024,), r + 7, dtype=torch.uint8, device=backend.device)
    backend.barrier()
    backend.copy(mine, data_views[nxt][1024 * r:1024 * (r + 1)], side)
    backend.stream_barrier(side)
    pulled = torch.empty(1024, dtype=torch.uint8, device=backend.device)
    pp = (prv - 1) % n
    backend.copy(data_views[prv][1024 * pp:1024 * (pp + 1)], pulled, side)
    side.synchronize()
    out["pushed_to_me"] = int(data[1024 * prv:1024 * (prv + 1)].to(torch.int64).sum().item())
    out["pulled"] = int(pulled.to(torch.int64).sum().item())

    # a wait nobody satisfies: WaitTimeout within the budget, and the stream is released
    start = time.monotonic()
    try:
        backend.wait_value(words.view(torch.int64)[prv:prv + 1], 1000, side, timeout_s=1.0)
        out["timeout"] = "no error"
    except tilelink.WaitTimeout as exc:
        out["timeout"] = (exc.expected, exc.seen, exc.primitive)
    side.synchronize()
    out["timeout_s"] = round(time.monotonic() - start, 2)
    # the same wait, not blocking the host: it returns at once, the watcher releases the stream after the
    # budget, and the next check raises the timeout
    start = time.monotonic()
    backend.wait_value(words.view(torch.int64)[prv:prv + 1], 2000, side, timeout_s=1.0, block=False, index=prv)
    out["watched_return_s"] = round(time.monotonic() - start, 2)
    side.synchronize()
    out["watched_release_s"] = round(time.monotonic() - start, 2)
    time.sleep(0.05)
    try:
        backend.check_waits()
        out["watched_timeout"] = "no error"
    except tilelink.WaitTimeout as exc:
        out["watched_timeout"] = (exc.expected, exc.seen, exc.index)
    backend.check_waits()  # raised once
    # a watched wait that is satisfied raises nothing
    backend.barrier()  # every rank's timed-out wait is over before anyone writes again
    backend.write_value(word_views[nxt].view(torch.int64)[r:r + 1], 3000, side)
    backend.wait_value(words.view(torch.int64)[prv:prv + 1], 3000, side, timeout_s=30.0, block=False)
    side.synchronize()
    time.sleep(0.05)
    backend.check_waits()
    backend.barrier()

    # release is collective and refuses a second release of the same buffer
    backend.release(data)
    try:
        backend.release(data)
        out["double_release"] = "no error"
    except SymmetricHeapError:
        out["double_release"] = "SymmetricHeapError"
    try:
        backend.release(torch.zeros(4, dtype=torch.uint8, device=backend.device))
        out["foreign_release"] = "no error"
    except SymmetricHeapError:
        out["foreign_release"] = "SymmetricHeapError"
    backend.release(words)
    backend.release(local)
    empty, empty_views = backend.allocate(0)
    out["empty"] = (empty.numel(), [v.numel() for v in empty_views])
    backend.release(empty)
    return out


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_backend_world(world_size, heap_for_ranks):
    heap_for_ranks(world_size)
    results = run_world(backend_suite, world_size, timeout=240)
    for r, out in enumerate(results):
        n = world_size
        prv = (r - 1) % n
        assert (out["rank"], out["world"], out["pe"], out["npes"]) == (r, n, r, n)
        assert out["n_views"] == n and out["self_view_is_local"]
        assert out["peer_values"] == [k + 1 for k in range(n)]
        assert out["peer_tail"] == [k + 1 for k in range(n)]
        assert out["flag_from_prev"] == 3
        assert out["pushed_to_me"] == 1024 * (prv + 7)
        assert out["pulled"] == 1024 * ((prv - 1) % n + 7)
        assert out["timeout"][0] == 1000 and out["timeout"][1] == 3 and out["timeout"][2] == "rank_wait"
        assert out["timeout_s"] < 10
        assert out["watched_return_s"] < 0.5 and 0.9 < out["watched_release_s"] < 10, out
        assert out["watched_timeout"] == (2000, 1000, prv), out
        assert out["double_release"] == "SymmetricHeapError"
        assert out["foreign_release"] == "SymmetricHeapError"
        assert out["empty"] == (0, [0] * n)
    print("backend world", world_size, results[0])
