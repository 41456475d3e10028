"""Tensor-parallel overlapped operators: AllGather + GEMM and GEMM + ReduceScatter.

``ag_gemm(a_shard, b)``: ``a_shard`` is this rank's rows of A (M, K) — rank ``r`` holds rows
``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))`` — and ``b`` this rank's (K, N) weight; returns the full
(M, N) product on every rank. ``gemm_rs(a, b_shard)``: ``a`` is this rank's (M, K_r) activation
slice, ``b_shard`` its (K_r, N) weight slice; returns this rank's rows of the summed (M, N) product.

M = 0 (no rows anywhere: every rank agrees, it is the shared full size) returns an empty result on every
rank, (0, N) and this rank's (0, N) rows, without communication; every operator of :mod:`tilelink.ops` does
the same for an empty communicated dimension (``ag_moe``/``moe_rs`` with no tokens, ``sp_attention`` with
S = 0).

Both launch the annotated kernels of :mod:`tilelink.ops.tp_kernels`; the symmetric buffers and
channels of a shape are created on the first call and reused (the kernels' launchers cache them).
Every argument is checked before anything runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from tilelink.errors import LaunchError
from tilelink.mapping import shard_range
from tilelink.ops import plain
from tilelink.ops.contract import (
    CallPlans,
    aligned,
    check_tensor,
    descriptor_ready,
    descriptor_size,
    full_size,
    interpreter_dtype,
    interpreter_inputs,
    interpreting,
    operand_key,
    persistent_grid,
    persistent_wanted,
)
from tilelink.ops.gemm import _install_allocator, _num_sms
from tilelink.ops.path import check as check_path
from tilelink.ops.path import select as select_path
from tilelink.runtime.world import current_world


@dataclass(frozen=True)
class TPContext:
    """What a rank cannot know from its own shard: the full row count M of the gathered dimension.

    Create it once (``tilelink.ops.TPContext(M=8192)``) and pass it to every call; without it,
    ``ag_gemm`` learns M with one host all-gather of the shard sizes per call.
    """

    M: int


def _compute_sms(device: torch.device, kernel) -> int:
    """Programs of a persistent compute kernel: every SM but the communication kernel's. A persistent
    kernel holding all SMs would keep the partner's spinning programs (or its own) from ever running."""
    launch = kernel.plan.launch
    comm = launch.comm_sms if launch.via == "sm" else 0
    sms = _num_sms(device.index or 0) if device.type == "cuda" else INTERPRETED_SMS
    return max(1, sms - comm)


def _config(dtype: torch.dtype) -> dict:
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    if dtype == torch.float32:
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)


def _check_pair(name: str, a: torch.Tensor, b: torch.Tensor, world) -> None:
    for what, t in (("the first operand", a), ("the second operand", b)):
        check_tensor(name, what, t, 2, world.device)
    if a.dtype != b.dtype:
        raise LaunchError(f"{name}: operands have different dtypes ({a.dtype}, {b.dtype})")
    if a.shape[1] != b.shape[0]:
        raise LaunchError(f"{name}: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")


#: programs of a persistent kernel in the interpreter (the emulated world's stand-in for the SM count)
INTERPRETED_SMS = 4


def _persistent(world, shared_dim: int, dtype: torch.dtype, persistent: bool | None = None) -> bool:
    """Whether every rank takes the persistent kernels: decided from what the ranks share (the device
    type or the caller's ``persistent``, the dtype, and the dimension ``shared_dim`` every rank has the same
    size of), never from this rank's own shard sizes (see :func:`tilelink.ops.contract.aligned`)."""
    return persistent_wanted(world.device, persistent) and (shared_dim * dtype.itemsize) % 16 == 0


@functools.lru_cache(maxsize=256)
def _persistent_launch(kernel, device: torch.device, tiles: int, tail: bool, meta: tuple) -> tuple[tuple[int], dict]:
    """The grid and launch meta of a persistent GEMM of ``tiles`` tiles (``meta``: its items): the same every call
    of these sizes, read once (the SM count and the tail split were host work of every call)."""
    return persistent_grid(tiles, _compute_sms(device, kernel), dict(meta), tail)


def _check_shard_rows(got: int, M: int, world, ctx: TPContext | None) -> None:
    """This rank holds its rows of A, ``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))``: the ranks' shards then sum to
    M (with a TPContext, the context's; without, M is their sum and only the split can be wrong)."""
    lo, hi = shard_range(M, world.rank, world.world_size)
    if got == hi - lo:
        return
    source = f"TPContext.M={M}" if ctx is not None else f"M={M}, the sum of the ranks' shards"
    hint = (f"; {got} rows is all of A: pass each rank only its own rows, a[{lo}:{hi}] here" if got == M and
            world.world_size > 1 else "")
    raise LaunchError(f"ag_gemm: rank {world.rank} got {got} rows of A, but must hold rows [{lo}, {hi}) ({hi - lo} "
                      f"rows: {source} over {world.world_size} ranks; the ranks' shards must sum to M){hint}")


@dataclass(frozen=True)
class _Plan:
    """What ``ag_gemm``'s or ``gemm_rs``'s checks and choices computed for one form of call (:class:`tilelink.ops.
    contract.CallPlans`), all but what depends on the call's data: its path (chosen at each call, the environment
    may change it), its operands' addresses (an operand not 16-byte aligned is copied for a tensor descriptor) and
    its result."""

    M: int  # the full rows
    K: int  # the inner dimension: gemm_rs's own slice, before padding
    N: int  # the columns: ag_gemm's own
    rows: int  # the rows of the result this rank returns
    kernel: object  # the annotated GEMM; None when there is nothing to launch (an empty dimension)
    persistent: bool
    dtype: torch.dtype  # the operands' dtype as the kernel gets them (contract.interpreter_dtype)
    pad: bool  # persistent: the padded operand's dimension is not a 16-byte multiple (padded whatever its address)
    run: int  # the padded dimension (ag_gemm: B's columns; gemm_rs: K), as the kernel gets it
    grid: tuple
    meta: dict  # the kernel's launch meta
    #: the launch's int arguments -> its prepared launch (OverlappedKernel.prepared), or _checked: a call of the plan
    #: whose ints were seen launches its tensors without the kernel's launch path (the ints fix the rest: strides of
    #: a copy, padded sizes)
    launches: dict = field(default_factory=dict, compare=False)


def _launch_plan(kernel, persistent: bool, meta: dict, device: torch.device, M: int, N: int,
                 tail: bool = False) -> tuple[tuple, dict]:
    """The grid and launch meta of one of the annotated GEMMs (:func:`_start`): the persistent TMA one on every SM
    its partner leaves free, or the pointer one on a grid of C tiles. ``tail``: the persistent kernel cuts its last
    wave's tiles in ``TAIL_SPLIT`` pieces (:func:`tilelink.ops.contract.tail_split`)."""
    tiles = -(-M // meta["BLOCK_M"]) * -(-N // meta["BLOCK_N"])  # triton.cdiv is a jit function: slower to call
    if persistent:
        return _persistent_launch(kernel, device, tiles, tail, tuple(meta.items()))
    return (tiles,), meta


def _start(plan: _Plan, args: tuple, world) -> None:
    """Launch a plan's kernel with ``args``: every overlapped GEMM of ``ag_gemm`` and ``gemm_rs`` starts here."""
    if plan.persistent and world.device.type == "cuda":
        _install_allocator()
    ints = args[3:]  # args: the operands and the result, then ints
    launch = plan.launches.get(ints)
    if launch is not None and launch(*args[:3]):
        return
    plan.kernel[plan.grid](*args, **plan.meta)
    if launch is None and len(plan.launches) < _LAUNCHES:
        from tilelink.runtime import graphs

        if not graphs.capturing(world.device):  # made on an uncaptured call: it may allocate
            plan.launches[ints] = plan.kernel.prepared(plan.grid, args, plan.meta, (0, 1, 2)) or _checked


#: prepared launches a plan keeps (one, but for operands copied at some calls and not at others: other strides)
_LAUNCHES = 8


def _checked(*tensors) -> bool:
    """The prepared launch of a call that takes the kernel's launch path every time (a world of several ranks)."""
    return False


def _call_key(a: object, b: object, persistent: object, path: object, out_dtype: object, a_scale: object,
              b_scale: object, *rest) -> tuple | None:
    """The key of ``ag_gemm``'s and ``gemm_rs``'s :class:`tilelink.ops.contract.CallPlans` (``rest``: what else the
    operator's checks read), or ``None`` for a call checked in full: FP8 scales or an ``out_dtype``, an operand
    that is not a tensor, ``persistent`` or ``path`` of another type than they take."""
    if a_scale is not None or b_scale is not None or out_dtype is not None or type(path) is not str or not (
            persistent is None or persistent is True or persistent is False):
        return None
    ka, kb = operand_key(a), operand_key(b)
    if ka is None or kb is None:
        return None
    return ka, kb, persistent, path, interpreting(), *rest


_AG_PLANS = CallPlans()
_RS_PLANS = CallPlans()


def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, ctx: TPContext | None = None, *,
            persistent: bool | None = None, a_scale: torch.Tensor | None = None, b_scale: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None, path: str = "auto") -> torch.Tensor:
    """AllGather(A) @ B with the gather overlapped: returns the full (M, N) product on every rank.

    FP8: ``float8_e4m3fn`` operands with fp32 ``a_scale`` (per tensor, or per row of ``a_shard``, gathered with
    the rows) and ``b_scale`` (per tensor, or per column) give ``(A @ B) * a_scale * b_scale`` in ``out_dtype``
    (default bf16); see :mod:`tilelink.ops.tp_fp8`.

    ``persistent``: ``True`` forces the persistent tensor-descriptor kernel (the copy engine's gather), where
    K allows it, also in the interpreter; ``False`` the pointer kernel (SM pull); ``None`` (default) the
    persistent one on a GPU. Every rank must pass the same.

    ``path``: ``"overlap"`` the overlapped kernels, ``"plain"`` cuBLAS after a ``torch.distributed`` all-gather,
    ``"auto"`` (default) the one the cost model predicts faster, alike on every rank (:mod:`tilelink.ops.path`).

    Raises :class:`tilelink.LaunchError` before anything runs when this rank's shard is not its rows of A
    (with ``ctx``, of ``ctx.M`` rows; every rank passing the whole A is refused so). Without ``ctx`` the ranks
    exchange their shard sizes (bounded; a rank that does not come is named)."""
    if ctx is None:
        known = None
    elif type(ctx) is TPContext and type(ctx.M) is int:
        known = ctx.M
    else:  # a context the key does not cover: checked in full
        known = _UNKEYED
    key = _call_key(a_shard, b, persistent, path, out_dtype, a_scale, b_scale, known)
    plan = _AG_PLANS.find(key)
    if plan is not None:
        world = _AG_PLANS.world
    else:
        from tilelink.ops import tp_fp8

        if tp_fp8.wants_fp8(a_shard, b, a_scale, b_scale):
            return tp_fp8.ag_gemm_fp8(a_shard, b, ctx, a_scale, b_scale, out_dtype, persistent, path)
        tp_fp8.refuse_out_dtype("ag_gemm", a_shard, out_dtype)
        world = current_world()
        plan = _ag_plan(a_shard, b, ctx, persistent, path, world)
        if known is not _UNKEYED and (ctx is not None or world.world_size == 1):  # else M is exchanged every call
            _AG_PLANS.put(key, world, plan)
    M, K, N = plan.M, plan.K, plan.N
    out_dtype = a_shard.dtype
    if M == 0:  # no rows on any rank (M is shared): nothing to gather or compute
        return torch.empty((0, N), dtype=out_dtype, device=world.device)
    if select_path("ag_gemm", path, world, dict(M=M, K=K), dict(N=N), out_dtype) == "plain":
        return plain.ag_gemm(a_shard, b, M, world)
    a_in, b_in = interpreter_inputs(a_shard, b, dtype=plan.dtype)
    if K == 0:  # every rank has K == 0 (the ranks share K): nothing to gather
        return torch.zeros((M, N), dtype=out_dtype, device=world.device)
    # N is this rank's own: pad it rather than let it choose the kernel; with N == 0 this rank still
    # takes part in the gather the others wait for, on one dummy column
    if plan.persistent:
        b_run = aligned(b_in, -1) if plan.pad or not descriptor_ready(b_in) else b_in
    else:
        b_run = b_in if N else b_in.new_zeros((K, 1))
    n_run = plan.run
    c = torch.empty((M, n_run), dtype=a_in.dtype, device=world.device)
    _start(plan, (a_in, b_run, c, M, n_run, K, K, 1, b_run.stride(0), b_run.stride(1), n_run, 1), world)
    if n_run != N:
        c = c[:, :N].contiguous()
    return c if c.dtype == out_dtype else c.to(out_dtype)


#: a key term of a call whose context the key does not cover (never kept)
_UNKEYED = object()


def _ag_plan(a_shard, b, ctx: TPContext | None, persistent: bool | None, path: str, world) -> _Plan:
    """``ag_gemm``'s checks, and what it computes from the call's form."""
    _check_pair("ag_gemm", a_shard, b, world)
    check_path("ag_gemm", path)
    if ctx is not None and (not isinstance(ctx.M, int) or isinstance(ctx.M, bool) or ctx.M < 0):
        raise LaunchError(f"ag_gemm: TPContext.M={ctx.M!r} must be a non-negative int (the rows of the full A)")
    M = full_size(a_shard, 0, ctx.M if ctx is not None else None, world, op="ag_gemm")
    _check_shard_rows(a_shard.shape[0], M, world, ctx)
    K, N = b.shape
    dtype = interpreter_dtype(a_shard.dtype)
    persistent = _persistent(world, K, dtype, persistent)
    n_run = descriptor_size(N, dtype.itemsize) if persistent else max(N, 1)
    from tilelink.ops import tp_kernels

    kernel = tp_kernels.ag_gemm_persistent_kernel if persistent else tp_kernels.ag_gemm_kernel
    grid, meta = _launch_plan(kernel, persistent, _config(dtype), world.device, M, n_run, tail=True)
    return _Plan(M, K, N, M, kernel, persistent, dtype, persistent and n_run != N, n_run, grid, meta)


def gemm_rs(a: torch.Tensor, b_shard: torch.Tensor, *, persistent: bool | None = None,
            a_scale: torch.Tensor | None = None, b_scale: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None, path: str = "auto") -> torch.Tensor:
    """(sum over ranks of A_r @ B_r), reduce-scattered: returns this rank's rows of the (M, N) sum.
    FP8: ``float8_e4m3fn`` operands with this rank's fp32 ``a_scale`` and ``b_scale`` (per tensor, per row of
    ``a``, per column), as for :func:`ag_gemm`: each rank scales its partial product before the reduction.
    M = 0 returns this rank's (0, N) rows at once, as every operator does with an empty shared dimension.
    ``persistent``: as for :func:`ag_gemm` (``True``: the persistent kernel and the hybrid reduce-scatter,
    where N allows it; ``False``: the pointer kernel and the SM pull; ``None``: the persistent one on a GPU).
    ``path``: as for :func:`ag_gemm` (``"plain"``: cuBLAS, then a ``torch.distributed`` reduce-scatter)."""
    key = _call_key(a, b_shard, persistent, path, out_dtype, a_scale, b_scale)
    plan = _RS_PLANS.find(key)
    if plan is not None:
        world = _RS_PLANS.world
    else:
        from tilelink.ops import tp_fp8

        if tp_fp8.wants_fp8(a, b_shard, a_scale, b_scale):
            return tp_fp8.gemm_rs_fp8(a, b_shard, a_scale, b_scale, out_dtype, persistent, path)
        tp_fp8.refuse_out_dtype("gemm_rs", a, out_dtype)
        world = current_world()
        plan = _rs_plan(a, b_shard, persistent, path, world)
        _RS_PLANS.put(key, world, plan)
    M, K, N = plan.M, plan.K, plan.N
    out_dtype = a.dtype
    a_in, b_in = interpreter_inputs(a, b_shard, dtype=plan.dtype)
    out = torch.empty((plan.rows, N), dtype=a_in.dtype, device=world.device)
    if plan.kernel is None:  # M == 0 or N == 0
        return out.to(out_dtype)
    if select_path("gemm_rs", path, world, dict(M=M, N=N), dict(K=K), out_dtype) == "plain":
        return plain.gemm_rs(a, b_shard, world)
    if K == 0:  # this rank contributes nothing: a zero slice still takes part in the reduction
        a_in = torch.zeros((M, 1), dtype=a_in.dtype, device=world.device)
        b_in = torch.zeros((1, N), dtype=a_in.dtype, device=world.device)
    if plan.persistent:  # K is this rank's own: pad it with zero columns of A and rows of B (they add nothing)
        if plan.pad or not descriptor_ready(a_in):
            a_in = aligned(a_in, -1)  # both round K up to the same 16 bytes
        if plan.pad or not descriptor_ready(b_in):
            b_in = aligned(b_in, 0)
    _start(plan, (a_in, b_in, out, M, N, plan.run, a_in.stride(0), a_in.stride(1), b_in.stride(0), b_in.stride(1),
                  N, 1), world)
    return out if out.dtype == out_dtype else out.to(out_dtype)


def _rs_plan(a, b_shard, persistent: bool | None, path: str, world) -> _Plan:
    """``gemm_rs``'s checks, and what it computes from the call's form."""
    _check_pair("gemm_rs", a, b_shard, world)
    check_path("gemm_rs", path)
    M, K = a.shape
    N = b_shard.shape[1]
    lo, hi = shard_range(M, world.rank, world.world_size)
    dtype = interpreter_dtype(a.dtype)
    if M == 0 or N == 0:
        return _Plan(M, K, N, hi - lo, None, False, dtype, False, K, (), {})
    k_eff = K or 1  # K == 0: one zero column
    persistent = _persistent(world, N, dtype, persistent)
    k_run = descriptor_size(k_eff, dtype.itemsize) if persistent else k_eff
    from tilelink.ops import tp_kernels

    kernel = tp_kernels.gemm_rs_persistent_kernel if persistent else tp_kernels.gemm_rs_kernel
    grid, meta = _launch_plan(kernel, persistent, _config(dtype), world.device, M, N)
    return _Plan(M, K, N, hi - lo, kernel, persistent, dtype, persistent and k_run != k_eff, k_run, grid, meta)
