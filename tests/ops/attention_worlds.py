"""Rank functions of the attention tests (run in spawned worlds, emulated or NVSHMEM; imported by name)."""

from __future__ import annotations

import torch

import tilelink
import tilelink.runtime


def bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per)


def inputs(B: int, H: int, Hkv: int, S: int, D: int, dtype: torch.dtype, device, seed: int = 11):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, S, D, generator=g).to(dtype).to(device) for h in (H, Hkv, Hkv))
    return q, k, v


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA over the full sequence, in fp64 on the CPU (GQA through repeat_interleave, as enable_gqa)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().cpu().repeat_interleave(group, dim=1) for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.double().cpu(), k, v, is_causal=causal)


def sp_attention_matches_sdpa(B: int, H: int, Hkv: int, S: int, D: int, dtype_name: str,
                              causal: bool, calls: int = 1, use_ctx: bool = False) -> float:
    """Relative error of this rank's rows of ``sp_attention`` against SDPA on the full sequence
    (the worst over ``calls`` calls on one context)."""
    from tilelink.ops import SPContext, sp_attention

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    q, k, v = inputs(B, H, Hkv, S, D, dtype, device)
    lo, hi = bounds(S, r, R)
    ref = reference(q, k, v, causal)[:, :, lo:hi]
    worst = 0.0
    for _ in range(calls):
        o = sp_attention(q[:, :, lo:hi].contiguous(), k[:, :, lo:hi].contiguous(), v[:, :, lo:hi].contiguous(),
                         causal=causal, ctx=SPContext(S) if use_ctx else None)
        assert o.dtype == dtype and o.shape == (B, H, hi - lo, D), (o.dtype, o.shape)
        if hi > lo:
            err = ((o.double().cpu() - ref).norm() / ref.norm()).item()
            if not err <= worst:  # a NaN error is kept: max() would drop it
                worst = err
    return worst


def sp_attention_in_blocks(block_m: int, block_n: int, *args) -> float:
    """:func:`sp_attention_matches_sdpa` with the kernel's tiles ``block_m`` x ``block_n`` (the interpreter's are
    16 x 16): query tiles shorter than a key block make a causal chunk end inside a block."""
    from tilelink.ops import attention

    attention.attention_config = lambda *_, **__: dict(BLOCK_M=block_m, BLOCK_N=block_n)
    return sp_attention_matches_sdpa(*args)


def sp_attention_views(S: int, causal: bool, D: int = 16, dtype_name: str = "float32") -> float:
    """Relative error of this rank's rows of ``sp_attention`` called with a q shard that is a view (of a (batch,
    rows, heads, D) tensor) and k and v shards that are contiguous at a base 4 bytes past a 16-byte boundary, one
    kv head (a rank's rows sequence-major are then the shard's own memory)."""
    from tilelink.ops import sp_attention

    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    q, k, v = inputs(1, 2, 1, S, D, getattr(torch, dtype_name), device)
    lo, hi = bounds(S, r, R)
    q_shard = q[:, :, lo:hi].transpose(1, 2).contiguous().transpose(1, 2)
    shards = []
    for t in (k, v):
        step = 4 // t.element_size()  # 4 bytes
        flat = torch.empty(t[:, :, lo:hi].numel() + step, dtype=t.dtype, device=device)
        shard = flat[step:].view(t[:, :, lo:hi].shape)
        shard.copy_(t[:, :, lo:hi])
        shards.append(shard)
    o = sp_attention(q_shard, *shards, causal=causal)
    ref = reference(q, k, v, causal)[:, :, lo:hi]
    return ((o.double().cpu() - ref).norm() / ref.norm()).item() if hi > lo else 0.0


def bad_inputs() -> list[str]:
    """Each bad call must raise LaunchError before any kernel runs; returns the messages."""
    from tilelink.errors import LaunchError
    from tilelink.ops import SPContext, sp_attention

    q = torch.randn(1, 4, 8, 16)
    k = torch.randn(1, 2, 8, 16)
    calls = [
        lambda: sp_attention(q, k, k.half()),  # dtypes differ
        lambda: sp_attention(q, torch.randn(1, 3, 8, 16), torch.randn(1, 3, 8, 16)),  # 4 heads over 3 kv heads
        lambda: sp_attention(q[0], k, k),  # 3-D
        lambda: sp_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), k),  # not contiguous
        lambda: sp_attention(q, k, k, ctx=SPContext(12)),  # rank 0 of 1 must hold 12 rows
        lambda: sp_attention(torch.randn(1, 4, 8, 24), torch.randn(1, 2, 8, 24), torch.randn(1, 2, 8, 24)),
        lambda: sp_attention(q.to(torch.int32), k.to(torch.int32), k.to(torch.int32)),
        lambda: sp_attention(q, k, torch.randn(1, 2, 7, 16)),  # k and v shapes differ
    ]
    messages = []
    for call in calls:
        try:
            call()
        except LaunchError as exc:
            messages.append(str(exc))
        else:
            messages.append("NO ERROR")
    return messages
