"""Rank functions of the handshake kernel's tests (``test_handshake_kernel.py``): the kernel an uncaptured call on a
GPU starts with, run here by Triton's interpreter between emulated ranks."""

from __future__ import annotations

import time

import tilelink


def handshake_calls(calls: int, late_rank: int, late_call: int, late_s: float, skip: bool) -> list[str]:
    """``calls`` handshakes of every rank on one ``ready`` array, as a context's calls make them; rank ``late_rank``
    comes ``late_s`` late to call ``late_call``, or with ``skip`` never makes it (nor any later). Returns per call
    what this rank saw after the handshake: ``ok`` (every peer's word had reached the call), or the timeout's type, its
    fields and its message."""
    from tilelink.runtime import Channel, Diagnostics, current_world
    from tilelink.runtime.diagnostics import skew_timeout_s
    from tilelink.runtime.handshake import handshake_kernel

    world = current_world()
    ready, flags, diag = Channel(world.world_size), Channel(2), Diagnostics()
    budget = int(skew_timeout_s(True) * 1e9)
    seen = []
    for call in range(1, calls + 1):
        if world.rank == late_rank and call == late_call:
            if skip:
                break
            time.sleep(late_s)
        handshake_kernel[(1,)](ready.peer_table, ready.barriers, world.rank, world.world_size, call, diag.buffer,
                               budget, flags.barriers, 1, 1, 10 * call)  # flag 1 := 10 * call, flag 0 left
        try:
            diag.check(kernel="ag_gemm_kernel")
            words = [int(ready.barriers[r]) for r in range(world.world_size) if r != world.rank]
            if min(words) < call:
                seen.append(f"returned before the peers came: {words}")
            else:
                seen.append("ok" if flags.barriers.tolist() == [0, 10 * call] else f"flags {flags.barriers.tolist()}")
        except tilelink.WaitTimeout as exc:
            seen.append(f"{type(exc).__name__} peer={getattr(exc, 'peer', None)} call={getattr(exc, 'call', None)} "
                        f"seen={exc.seen}: {exc}")
    return seen


def shard_handshake_calls(calls: int, n: int, block: int, programs: int) -> list[str]:
    """``calls`` calls of the all-gather's copying handshake on every rank (``shard_handshake_kernel``): each copies
    this rank's ``n``-element shard of the call into its place on ``programs`` programs of ``block`` elements, then
    hand shakes. Returns per call what this rank saw after it: ``ok`` (the place holds the shard, the count is back to
    zero for the next call, the own flag holds its value and every peer's word reached the call), or what differed."""
    import torch

    from tilelink.runtime import Channel, Diagnostics, current_world
    from tilelink.runtime.diagnostics import skew_timeout_s
    from tilelink.runtime.handshake import shard_handshake_kernel

    world = current_world()
    ready, flags, diag = Channel(world.world_size), Channel(2), Diagnostics()
    budget = int(skew_timeout_s(True) * 1e9)
    count = torch.zeros(1, dtype=torch.int64)
    place = torch.zeros(n + 5, dtype=torch.float32)  # a canary past the place
    seen = []
    for call in range(1, calls + 1):
        shard = torch.arange(n, dtype=torch.float32) + 1000 * call + 100 * world.rank
        shard_handshake_kernel[(programs,)](shard, place, n, count, ready.peer_table, ready.barriers, world.rank,
                                            world.world_size, call, diag.buffer, budget, flags.barriers, 1, 1,
                                            10 * call, BLOCK=block)
        diag.check(kernel="ag_gemm_kernel")
        words = [int(ready.barriers[r]) for r in range(world.world_size) if r != world.rank]
        wrong = []
        if not torch.equal(place[:n], shard):
            wrong.append(f"{int((place[:n] != shard).sum())} of {n} elements not copied")
        if place[n:].any():
            wrong.append("written past the place")
        if int(count) != 0:
            wrong.append(f"count left at {int(count)}")
        if flags.barriers.tolist() != [0, 10 * call]:
            wrong.append(f"flags {flags.barriers.tolist()}")
        if min(words) < call:
            wrong.append(f"returned before the peers came: {words}")
        seen.append("; ".join(wrong) or "ok")
    return seen
