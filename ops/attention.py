"""Sequence-parallel attention: AllGather of K and V on the copy engine, overlapped with flash attention.

``sp_attention(q_shard, k_shard, v_shard, causal)``: every tensor is in SDPA layout
(batch, heads, rows, head_dim), and every one is this rank's shard of the sequence: rank ``r`` holds
rows ``[r*ceil(S/R), min(S, (r+1)*ceil(S/R)))`` of Q, K and V. Returns this rank's rows of
``softmax(Q K^T / sqrt(D)) V`` over the whole sequence (causal: by global position). K and V may
have fewer heads than Q (grouped-query attention, ``heads % kv_heads == 0``).

It launches the annotated kernel of :mod:`tilelink.ops.attention_kernels`; the gathered K/V buffers
and the channels of a shape are created on the first call and reused (the kernel's launcher caches
them). The kernel reads K and V through tensor descriptors: a K or V whose base or strides other than
the last are not 16-byte multiples is copied first. Every argument is checked before anything runs.
``flash_attention(q, k, v)`` is the same kernel without communication, for one GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from tilelink.errors import LaunchError
from tilelink.ops import plain
from tilelink.ops.contract import (
    check_rows,
    check_tensor,
    descriptor_ready,
    full_size,
    interpreter_inputs,
    interpreting,
)
from tilelink.ops.path import check as check_path
from tilelink.ops.path import select as select_path

_HEAD_DIMS = (16, 32, 64, 128)


@dataclass(frozen=True)
class SPContext:
    """What a rank cannot know from its own shard: the full sequence length S.

    Create it once (``tilelink.ops.SPContext(S=32768)``) and pass it to every call; without it,
    ``sp_attention`` learns S with one host all-gather of the shard lengths per call.
    """

    S: int


def attention_config(head_dim: int, dtype: torch.dtype, device_type: str = "cuda") -> dict:
    """Tile sizes and launch options of the flash-attention kernel (the ones benchmarked on an H200)."""
    if interpreting() or device_type != "cuda":
        return dict(BLOCK_M=16, BLOCK_N=16)
    if dtype == torch.float32:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    if head_dim <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    # 128-key blocks: on an H200 the kernel's K/V descriptor (TMA) loads ran 1-3% faster with them than with
    # 64-key blocks; 256-row tiles or 2 stages were slower
    return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)


def _check(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, device: torch.device) -> None:
    for what, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, what, t, 4, device, layout=" (batch, heads, rows, head_dim)", contiguous=False)
    if not (q.dtype == k.dtype == v.dtype):
        raise LaunchError(f"{name}: q, k and v have different dtypes ({q.dtype}, {k.dtype}, {v.dtype})")
    if k.shape != v.shape:
        raise LaunchError(f"{name}: k and v have different shapes ({tuple(k.shape)}, {tuple(v.shape)})")
    if q.shape[0] != k.shape[0]:
        raise LaunchError(f"{name}: batch sizes differ (q {q.shape[0]}, k {k.shape[0]})")
    if q.shape[3] != k.shape[3]:
        raise LaunchError(f"{name}: head dims differ (q {q.shape[3]}, k {k.shape[3]})")
    if q.shape[3] not in _HEAD_DIMS:
        raise LaunchError(f"{name}: head dim {q.shape[3]} is not supported ({', '.join(map(str, _HEAD_DIMS))})")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise LaunchError(f"{name}: {q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads "
                          f"(grouped-query attention needs heads % kv_heads == 0)")


def _kernel_inputs(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # the kernel needs a contiguous last dim; every other stride is a parameter
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in interpreter_inputs(*ts))


def _descriptor_ready(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` and ``v`` as the kernel's tensor descriptors read them: a 16-byte aligned base and every stride
    other than the last (the per-head bases, the row step) a multiple of 16 bytes, alike for both (the kernel
    takes one set of strides); otherwise contiguous copies of both. A view of a larger tensor usually already is
    (its strides are those of the whole); a copy costs one pass over K and V."""
    if descriptor_ready(k) and descriptor_ready(v) and k.stride() == v.stride():
        return k, v
    return (k.clone(memory_format=torch.contiguous_format), v.clone(memory_format=torch.contiguous_format))


def _launch(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, S: int, kv_heads: int,
            q_offset: int, kv_first: int, kv_chunk: int, causal: bool, kv_strides: tuple[int, int, int],
            meta: dict) -> None:
    B, H, rows, D = q.shape
    grid = (triton.cdiv(rows, meta["BLOCK_M"]), B * H)
    if q.device.type == "cuda":
        from tilelink.ops.gemm import _install_allocator

        _install_allocator()  # the K/V tensor descriptors made on the device need scratch memory
    even = S % meta["BLOCK_N"] == 0 and kv_chunk % meta["BLOCK_N"] == 0
    kernel[grid](q, k, v, o, 1.0 / math.sqrt(D), rows, S, q_offset, kv_first, kv_chunk, H, H // kv_heads,
                 q.stride(0), q.stride(1), q.stride(2), *kv_strides, *kv_strides, o.stride(0), o.stride(1),
                 o.stride(2), HEAD_DIM=D, CAUSAL=causal, EVEN_N=even, **meta)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, q_offset: int = 0,
                    config: dict | None = None) -> torch.Tensor:
    """Attention of ``q`` over the full ``k``/``v`` on one device (no communication): the plain kernel.

    ``q_offset`` is the global position of ``q``'s first row (causal masking); ``config`` overrides
    :func:`attention_config` (benchmarks).
    """
    from tilelink.ops.attention_kernels import attention_fwd_kernel

    _check("flash_attention", q, k, v, q.device)
    out_dtype = q.dtype
    q_in, k_in, v_in = _kernel_inputs(q, k, v)
    k_in, v_in = _descriptor_ready(k_in, v_in)
    o = torch.empty(q_in.shape, dtype=q_in.dtype, device=q.device)
    if o.numel() == 0:
        return o.to(out_dtype)
    if k.shape[2] == 0:
        raise LaunchError("flash_attention: k and v have no rows")
    meta = config or attention_config(q.shape[3], q_in.dtype, q.device.type)
    _launch(attention_fwd_kernel, q_in, k_in, v_in, o, k.shape[2], k.shape[1], q_offset, 0, max(k.shape[2], 1), causal,
            (k_in.stride(0), k_in.stride(1), k_in.stride(2)), meta)
    return o if o.dtype == out_dtype else o.to(out_dtype)


def sp_attention(q_shard: torch.Tensor, k_shard: torch.Tensor, v_shard: torch.Tensor, causal: bool = False,
                 ctx: SPContext | None = None, *, path: str = "auto") -> torch.Tensor:
    """This rank's rows of attention over the whole sequence, with the K/V all-gather overlapped.

    Collective: every rank calls it with its shards (a rank may hold no rows). Returns a tensor shaped
    like ``q_shard``; an empty sequence (S = 0) returns an empty one at once, as every operator does.
    ``path``: ``"overlap"`` the overlapped kernel, ``"plain"`` a ``torch.distributed`` all-gather of K and V, then
    SDPA; ``"auto"`` (default) the one the cost model predicts faster, alike on every rank
    (:mod:`tilelink.ops.path`).
    """
    from tilelink.ops import attention_kernels
    from tilelink.runtime import current_world

    world = current_world()
    _check("sp_attention", q_shard, k_shard, v_shard, world.device)
    check_path("sp_attention", path)
    for what, t in (("k_shard", k_shard), ("v_shard", v_shard)):
        if not t.is_contiguous():
            raise LaunchError(f"sp_attention: {what} must be contiguous (call .contiguous())")
    if ctx is not None and (not isinstance(ctx.S, int) or isinstance(ctx.S, bool) or ctx.S < 0):
        raise LaunchError(f"sp_attention: SPContext.S={ctx.S!r} must be a non-negative int")
    S = full_size(k_shard, 2, ctx.S if ctx is not None else None, world, op="sp_attention")
    for what, t in (("q_shard", q_shard), ("k_shard", k_shard)):
        lo, hi = check_rows("sp_attention", f"the sequence in {what}", t.shape[2], S, world)
    if S == 0:  # an empty sequence on every rank (S is shared): nothing to gather or attend to
        return torch.empty(q_shard.shape, dtype=q_shard.dtype, device=world.device)
    B, H, _, D = q_shard.shape
    shared = dict(S=S, heads=H, kv_heads=k_shard.shape[1], head_dim=D, causal=causal, batch=B)
    if select_path("sp_attention", path, world, shared, {}, q_shard.dtype) == "plain":
        return plain.sp_attention(q_shard, k_shard, v_shard, S, causal, world)
    per = -(-S // world.world_size)
    out_dtype = q_shard.dtype
    q_in, k_in, v_in = _kernel_inputs(q_shard, k_shard, v_shard)
    o = torch.empty(q_in.shape, dtype=q_in.dtype, device=world.device)
    B, Hkv, _, D = k_shard.shape
    meta = attention_config(D, q_in.dtype, world.device.type)
    # K and V travel sequence-major, as (1, 1, rows, B*Hkv*D): the copy engine moves contiguous bytes
    # (the NVSHMEM backend refuses strided views), and a rank's rows along dim 2 of a (B, Hkv, S, D)
    # buffer are B*Hkv separate ranges; sequence-major they are one. The kernel reads them through
    # the strides of the FULL gathered (S, B, Hkv, D) tensor.
    k_seq, v_seq = (t.permute(2, 0, 1, 3).reshape(1, 1, hi - lo, B * Hkv * D) for t in (k_in, v_in))
    # a view where B * Hkv is 1 keeps the caller's base, which the kernel's tensor descriptors need 16-byte aligned
    # where it reads the shard itself (a world of one rank)
    k_seq, v_seq = _descriptor_ready(k_seq, v_seq)
    _launch(attention_kernels.sp_attention_fwd_kernel, q_in, k_seq, v_seq, o, S, Hkv, lo, lo, max(per, 1), causal,
            (Hkv * D, D, B * Hkv * D), meta)
    return o if o.dtype == out_dtype else o.to(out_dtype)
