"""Rank functions of the fail-fast tests (``tests/runtime/test_fail_fast.py``): worlds where one rank fails,
dies, skips a call or comes late, and operator calls with empty or wrong shards. Tiny shapes: the point is
who waits for whom, not the GEMM."""

from __future__ import annotations

import os
import signal
import time

import torch

import tilelink

M, K, N = 8, 16, 8


def _operands(rows: int = M):
    """This rank's rows of A (rows x K) and B, the same full problem on every rank."""
    world = tilelink.runtime.current_world()
    per = -(-rows // world.world_size)
    lo, hi = min(rows, world.rank * per), min(rows, (world.rank + 1) * per)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(rows, K, generator=gen)
    b = torch.randn(K, N, generator=gen)
    return a, a[lo:hi].contiguous(), b


def _context(ctx: bool):
    from tilelink.ops import TPContext

    return TPContext(M=M) if ctx else None


def raise_in_op(ctx: bool) -> float:
    """Rank 1 raises after the first call, while rank 0 goes into the second (its shard-size exchange, or with a
    TPContext its handshake). Returns how long rank 0's call took (it should not return)."""
    from tilelink.ops import ag_gemm

    _, shard, b = _operands()
    ag_gemm(shard, b, _context(ctx))
    if tilelink.rank() == 1:
        time.sleep(0.5)
        raise ValueError("deliberate failure of rank 1 between two calls")
    start = time.monotonic()
    ag_gemm(shard, b, _context(ctx))
    return time.monotonic() - start


def killed_in_op(ctx: bool) -> int:
    """Rank 1 is SIGKILLed (no exception, no report) while rank 0 is in the second call."""
    from tilelink.ops import ag_gemm

    _, shard, b = _operands()
    ag_gemm(shard, b, _context(ctx))
    if tilelink.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    ag_gemm(shard, b, _context(ctx))
    return 0


def skip_a_call(ctx: bool) -> int:
    """Rank 1 makes one call of ag_gemm fewer than rank 0, and finishes."""
    from tilelink.ops import ag_gemm

    _, shard, b = _operands()
    for _ in range(2 if tilelink.rank() == 0 else 1):
        ag_gemm(shard, b, _context(ctx))
    return 0


def late_first_call(delay_s: float, ctx: bool) -> float:
    """Rank 1 reaches the first call ``delay_s`` late; returns how long each rank's first call took."""
    from tilelink.ops import ag_gemm

    a, shard, b = _operands()
    if tilelink.rank() == 1:
        time.sleep(delay_s)
    start = time.monotonic()
    c = ag_gemm(shard, b, _context(ctx))
    elapsed = time.monotonic() - start
    assert torch.allclose(c, a @ b, atol=1e-4), (c - a @ b).abs().max()
    return elapsed


def late_second_call(delay_s: float) -> float:
    """Rank 1 reaches the second call (with a TPContext: the call's handshake) ``delay_s`` late."""
    from tilelink.ops import ag_gemm

    _, shard, b = _operands()
    ag_gemm(shard, b, _context(True))
    if tilelink.rank() == 1:
        time.sleep(delay_s)
    start = time.monotonic()
    ag_gemm(shard, b, _context(True))
    return time.monotonic() - start


def finalize_in_except(hold_s: float) -> float:
    """Rank 1 calls ``tilelink.finalize()`` while handling an exception, with a symmetric buffer live (its
    release is collective) and rank 0 busy for ``hold_s``: returns how long each rank's finalize took."""
    from tilelink import runtime

    runtime.symmetric_zeros((4,), torch.float32)
    if tilelink.rank() == 1:
        try:
            raise KeyError("handled on rank 1")
        except KeyError:
            start = time.monotonic()
            tilelink.finalize()
            return time.monotonic() - start
    time.sleep(hold_s)
    start = time.monotonic()
    tilelink.finalize()
    return time.monotonic() - start


def empty_and_wrong_shards() -> dict:
    """What each operator does with an empty communicated dimension, and the message of a rank passing the whole
    A to ag_gemm with a TPContext."""
    from tilelink.ops import SPContext, TPContext, ag_gemm, ag_moe, gemm_rs, moe_rs, sp_attention

    world = tilelink.runtime.current_world()
    out: dict = {}
    b = torch.randn(K, N)
    out["ag_gemm"] = tuple(ag_gemm(torch.randn(0, K), b).shape)
    out["ag_gemm_ctx"] = tuple(ag_gemm(torch.randn(0, K), b, TPContext(M=0)).shape)
    out["gemm_rs"] = tuple(gemm_rs(torch.randn(0, K), b).shape)
    E, top_k, inter = 3, 2, 4
    ids = torch.zeros(0, top_k, dtype=torch.int64)
    out["ag_moe"] = tuple(ag_moe(torch.randn(0, K), torch.randn(E, K, inter), ids).shape)
    out["moe_rs"] = tuple(moe_rs(torch.randn(0, inter), torch.randn(E, inter, K), ids, torch.rand(0, top_k)).shape)
    q = torch.randn(1, 2, 0, 16)
    out["sp_attention"] = tuple(sp_attention(q, q, q).shape)
    out["sp_attention_ctx"] = tuple(sp_attention(q, q, q, ctx=SPContext(S=0)).shape)
    full = torch.randn(M, K)
    try:
        ag_gemm(full, b, TPContext(M=M))
        out["full_a"] = "NO ERROR"
    except tilelink.LaunchError as exc:
        out["full_a"] = str(exc)
    out["rank"] = world.rank
    return out
