"""GEMM + AllReduce, overlapped: the row-parallel linear layer of decode.

``gemm_ar(a, b_shard_rows)``: ``a`` is this rank's (M, K_r) slice of the activations' inner dimension and
``b_shard_rows`` its (K_r, N) rows of the weight; returns the whole (M, N) sum over the ranks of ``a @
b_shard_rows`` on every rank, the same bits on each. The product's tiles are summed across the ranks as they
are stored (:mod:`tilelink.rules.all_reduce`): one-shot for small messages (a few decode tokens), two-shot for
large ones, or as ``mode=`` says. M = 0 returns an empty (0, N) result at once, without communicating; a rank
whose K slice is empty still takes part with zeros.
"""

from __future__ import annotations

import torch
import triton

from tilelink.errors import LaunchError
from tilelink.ops.contract import check_tensor, interpreter_inputs, interpreting

MODES = ("one_shot", "two_shot")


def _config(M: int, N: int, dtype: torch.dtype) -> dict:
    """Tiles for an M of decode tokens: a tile no taller than the rows there are, and narrow tiles with a deep K
    step (a few tokens' GEMM is a read of the weight, spread over the SMs). Chosen by a sweep on an H200 over the
    decode shapes of ``tlxform bench decode`` (docs/PERFORMANCE.md); up to 16 tokens, four stages rather than three
    keep more of the deep K slices' weight in flight (on one H100, 0.84 -> 0.96 of torch.matmul on gemma-2-27b's
    `down_proj`, K = 4608 a rank at world 8; 0.86 -> 0.88 over the shapes)."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    wide = 1 if dtype == torch.float32 else 2  # K elements per 128-byte step of the narrower types
    if M <= 16:
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128 * wide, GROUP_M=8, num_warps=4, num_stages=4)
    if M <= 64:
        return dict(BLOCK_M=32 if M <= 32 else 64, BLOCK_N=64, BLOCK_K=64 * wide, GROUP_M=8, num_warps=4,
                    num_stages=4)
    if triton.cdiv(M, 128) * triton.cdiv(N, 128) < 128:  # too few 128-wide tiles to fill the SMs
        return dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64 * wide, GROUP_M=8, num_warps=4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32 * wide, GROUP_M=8, num_warps=8, num_stages=4)


def gemm_ar(a: torch.Tensor, b_shard_rows: torch.Tensor, ctx=None, *, mode: str | None = None,
            path: str = "auto") -> torch.Tensor:
    """(sum over ranks of A_r @ B_r), all-reduced: the whole (M, N) sum on every rank.

    ``ctx``: a :class:`tilelink.ops.TPContext` whose ``M`` is the rows of ``a`` (checked), or None (every rank
    holds all M rows: nothing to learn). ``mode``: ``"one_shot"``, ``"two_shot"`` or None (by the message's
    size); every rank must pass the same.

    ``path``: ``"overlap"`` the fused kernel, ``"plain"`` cuBLAS then a ``torch.distributed`` all-reduce,
    ``"auto"`` (default) the one the cost model predicts faster, alike on every rank (:mod:`tilelink.ops.path`):
    at a few decode tokens the host time of a call decides, and cuBLAS + NCCL is usually the faster.

    The fused kernel can be captured in a CUDA graph (``torch.cuda.graph``) once a call with the same shapes has
    run outside the capture; each replay sums the ranks' partial products of that replay."""
    from tilelink.ops import plain, tp_ar_kernels
    from tilelink.ops.path import check as check_path
    from tilelink.ops.path import select as select_path
    from tilelink.runtime import current_world

    world = current_world()
    for what, t in (("the activations' K slice", a), ("the weight's K slice", b_shard_rows)):
        check_tensor("gemm_ar", what, t, 2, world.device)
    if a.dtype != b_shard_rows.dtype:
        raise LaunchError(f"gemm_ar: operands have different dtypes ({a.dtype}, {b_shard_rows.dtype})")
    if a.shape[1] != b_shard_rows.shape[0]:
        raise LaunchError(f"gemm_ar: the K slices differ: {tuple(a.shape)} @ {tuple(b_shard_rows.shape)} (a is "
                          f"(M, K_r), b_shard_rows (K_r, N), the same K_r rows of the inner dimension)")
    check_path("gemm_ar", path)
    if mode is not None and mode not in MODES:
        raise LaunchError(f"gemm_ar: mode={mode!r} is not one of {', '.join(map(repr, MODES))} (or None: chosen by "
                          f"the message's size)")
    M, K = a.shape
    N = b_shard_rows.shape[1]
    if ctx is not None and ctx.M != M:
        raise LaunchError(f"gemm_ar: TPContext.M={ctx.M} but a has {M} rows; every rank passes all M rows of its K "
                          f"slice")
    out_dtype = a.dtype
    if M == 0 or N == 0:  # M and N are every rank's: nothing to sum
        return torch.zeros((M, N), dtype=out_dtype, device=world.device)
    if select_path("gemm_ar", path, world, dict(M=M, N=N), dict(K=K), a.dtype) == "plain":
        return plain.gemm_ar(a, b_shard_rows, world)
    a_in, b_in = interpreter_inputs(a, b_shard_rows)
    if K == 0:  # this rank contributes nothing: a zero slice still takes part in the reduction
        a_in = torch.zeros((M, 1), dtype=a_in.dtype, device=world.device)
        b_in = torch.zeros((1, N), dtype=a_in.dtype, device=world.device)
        K = 1
    kernel = tp_ar_kernels.gemm_ar_kernel if mode is None else tp_ar_kernels.FORCED[mode]
    c = torch.empty((M, N), dtype=a_in.dtype, device=world.device)
    meta = _config(M, N, a_in.dtype)
    grid = (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    kernel[grid](a_in, b_in, c, M, N, K, a_in.stride(0), a_in.stride(1), b_in.stride(0), b_in.stride(1), N, 1,
                 **meta)
    return c if c.dtype == out_dtype else c.to(out_dtype)
