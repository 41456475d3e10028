"""TileLink's operators as ``torch.library`` custom ops (namespace ``tilelink``), so that ``torch.compile``
traces the layers whole.

Dynamo cannot trace into an overlapped launch (its Triton launchers, streams and events, the symmetric heap),
and Inductor cannot analyse the primitives' inline assembly. Each operator is therefore one opaque node of
the graph: ``torch.ops.tilelink.ag_gemm``, ``gemm_rs``, ``gemm_ar``, ``ag_moe``, ``moe_rs``, ``sp_attention``,
and the pieces the layers need around them (``silu_mul``, ``moe_route``, ``all_gather_shards``). Its real
implementation is the operator of :mod:`tilelink.ops.tp`, :mod:`~tilelink.ops.tp_ar`, :mod:`~tilelink.ops.moe` or
:mod:`~tilelink.ops.attention`, unchanged; its fake implementation gives the output's shape, dtype and device
from the inputs, the rank and the world size.

What Python objects carried becomes plain arguments: a ``TPContext`` or ``SPContext`` passes its size (``M``,
``S``; None without a context), the world its ``rank`` and ``world`` (ints read when tracing, so a graph is
specialised to its world: an op called in another world refuses to run), and a routing its tensors
(:func:`route`: the per-expert counts on the device and on the host, so the two parts of an MoE layer still
cross to the host once). Every output is a new tensor (nothing is mutated).

The communicating ops are registered as *ordered* effects: ``torch.compile`` keeps them in program order and
never drops one whose result is unused. Every rank must call the collectives in the same order, and each must
run on every rank (a rank whose result is empty still serves the others), so a graph pass that moved or
removed one on a single rank would leave its peers waiting.

Sizes known only at run time: without a context, ``ag_gemm``'s M (the sum of the ranks' rows) and the rows
of :func:`all_gather_shards` are unbacked symbolic sizes; the fake implementation asserts that this rank
holds its share of them (rank ``r`` holds rows ``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))``), so a reduce-scatter
of them has as many rows as the input shard and a residual add traces without a graph break.

The functions below are what the layers call. Eagerly (nothing tracing) they call the operators directly:
a dispatch through a custom op costs some 10-30 us of host time per call, and an overlapped operator's
host time per call is on its critical path on a GPU. Under ``torch.compile`` (or a fake or dispatch mode)
they call the custom ops.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch._library.effects import EffectType

from tilelink.errors import LaunchError

__all__ = ["TracedRouting", "ag_gemm", "ag_moe", "all_gather_shards", "gemm_ar", "gemm_rs", "moe_rs", "route",
           "silu_mul", "sp_attention"]


# ------------------------------------------------------------------------------------------------
# helpers


def _shard_rows(size, rank: int, world: int):
    """Rows rank ``rank`` holds of ``size`` (an int or a symbolic size): ``tilelink.mapping.shard_range``'s
    length, written with ``torch.sym_min`` so that a symbolic size gives an expression, not a guard."""
    per = (size + world - 1) // world
    return torch.sym_min(size, (rank + 1) * per) - torch.sym_min(size, rank * per)


def _rank_world() -> tuple[int, int]:
    """This process's rank and world size (read when tracing: the graph is specialised to them)."""
    from tilelink.runtime import current_world

    world = current_world()
    return world.rank, world.world_size


def _check_world(op: str, rank: int, world: int) -> None:
    """Refuse a call traced for another world: its fake shapes, and the order of its collectives, were
    those of rank ``rank`` of ``world``."""
    here = _rank_world()
    if here != (rank, world):
        raise LaunchError(f"tilelink::{op}: this call was traced for rank {rank} of {world} ranks, but this process "
                          f"is rank {here[0]} of {here[1]}: trace it again in this world (torch._dynamo.reset(), "
                          f"or a new torch.compile)")


def _unknown_rows(local_rows, rank: int, world: int):
    """A new unbacked size M for rows gathered from every rank, of which this rank holds ``local_rows``.

    ``ctx.new_dynamic_size()`` refuses outside ``fullgraph=True`` unless
    ``torch._dynamo.config.capture_dynamic_output_shape_ops`` is set, and Dynamo then breaks the graph at the
    op. That policy is for sizes that depend on a tensor's values (``nonzero``); M is the other ranks' row
    count, one number per call that the assertion below ties to this rank's rows. So the size is made in
    the fake mode's shape environment directly (what ``new_dynamic_size`` does), and a plain
    ``torch.compile(layer)`` traces one graph too."""
    ctx = torch.library.get_ctx()
    shape_env = getattr(ctx, "_shape_env", None)
    if shape_env is None or shape_env.allow_dynamic_output_shape_ops:
        M = ctx.new_dynamic_size()
    else:
        from torch._library.fake_impl import allocate_size

        M = allocate_size(shape_env)
    torch._check(_shard_rows(M, rank, world) == local_rows,
                 lambda: f"rank {rank} of {world} must hold its share of the gathered rows")
    return M


def _traced(*tensors: torch.Tensor) -> bool:
    """Whether a call is being traced (Dynamo, a fake tensor, a dispatch mode such as ``make_fx``'s): then it
    goes through the custom op; eagerly it calls the operator itself."""
    if torch.compiler.is_compiling():
        return True
    plain = torch.Tensor.__torch_dispatch__
    if any(t is not None and type(t).__torch_dispatch__ is not plain for t in tensors):
        return True
    if torch._C._len_torch_dispatch_stack() == 0:
        return False
    from tilelink.runtime.graphs import recording_only

    return not recording_only()  # an emulated graph's capture records the operator's own steps, as a GPU's does


def _ordered(name: str) -> None:
    """Keep ``tilelink::name`` in program order under torch.compile and never drop it (see the module's
    docstring)."""
    torch.library._register_effectful_op(f"tilelink::{name}", EffectType.ORDERED)


# ------------------------------------------------------------------------------------------------
# the custom ops


@torch.library.custom_op("tilelink::ag_gemm", mutates_args=())
def _ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, M: int | None, rank: int, world: int,
             persistent: bool | None) -> torch.Tensor:
    from tilelink.ops.tp import TPContext
    from tilelink.ops.tp import ag_gemm as impl

    _check_world("ag_gemm", rank, world)
    return impl(a_shard, b, None if M is None else TPContext(M), persistent=persistent)


@_ag_gemm.register_fake
def _(a_shard, b, M, rank, world, persistent):
    if M is None:
        M = a_shard.shape[0] if world == 1 else _unknown_rows(a_shard.shape[0], rank, world)
    return a_shard.new_empty((M, b.shape[1]))


@torch.library.custom_op("tilelink::gemm_rs", mutates_args=())
def _gemm_rs(a: torch.Tensor, b_shard: torch.Tensor, rank: int, world: int, persistent: bool | None) -> torch.Tensor:
    from tilelink.ops.tp import gemm_rs as impl

    _check_world("gemm_rs", rank, world)
    return impl(a, b_shard, persistent=persistent)


@_gemm_rs.register_fake
def _(a, b_shard, rank, world, persistent):
    return a.new_empty((_shard_rows(a.shape[0], rank, world), b_shard.shape[1]))


@torch.library.custom_op("tilelink::gemm_ar", mutates_args=())
def _gemm_ar(a: torch.Tensor, b_shard_rows: torch.Tensor, M: int | None, rank: int, world: int,
             mode: str | None) -> torch.Tensor:
    from tilelink.ops.tp import TPContext
    from tilelink.ops.tp_ar import gemm_ar as impl

    _check_world("gemm_ar", rank, world)
    return impl(a, b_shard_rows, None if M is None else TPContext(M), mode=mode)


@_gemm_ar.register_fake
def _(a, b_shard_rows, M, rank, world, mode):
    return a.new_empty((a.shape[0], b_shard_rows.shape[1]))


@torch.library.custom_op("tilelink::ag_gemm_fp8", mutates_args=())
def _ag_gemm_fp8(a_shard: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor | None, b_scale: torch.Tensor | None,
                 out_dtype: torch.dtype, M: int | None, rank: int, world: int, persistent: bool | None) -> torch.Tensor:
    from tilelink.ops.tp import TPContext
    from tilelink.ops.tp import ag_gemm as impl

    _check_world("ag_gemm_fp8", rank, world)
    return impl(a_shard, b, None if M is None else TPContext(M), persistent=persistent, a_scale=a_scale,
                b_scale=b_scale, out_dtype=out_dtype)


@_ag_gemm_fp8.register_fake
def _(a_shard, b, a_scale, b_scale, out_dtype, M, rank, world, persistent):
    if M is None:
        M = a_shard.shape[0] if world == 1 else _unknown_rows(a_shard.shape[0], rank, world)
    return a_shard.new_empty((M, b.shape[1]), dtype=out_dtype)


@torch.library.custom_op("tilelink::gemm_rs_fp8", mutates_args=())
def _gemm_rs_fp8(a: torch.Tensor, b_shard: torch.Tensor, a_scale: torch.Tensor | None, b_scale: torch.Tensor | None,
                 out_dtype: torch.dtype, rank: int, world: int, persistent: bool | None) -> torch.Tensor:
    from tilelink.ops.tp import gemm_rs as impl

    _check_world("gemm_rs_fp8", rank, world)
    return impl(a, b_shard, persistent=persistent, a_scale=a_scale, b_scale=b_scale, out_dtype=out_dtype)


@_gemm_rs_fp8.register_fake
def _(a, b_shard, a_scale, b_scale, out_dtype, rank, world, persistent):
    return a.new_empty((_shard_rows(a.shape[0], rank, world), b_shard.shape[1]), dtype=out_dtype)


for _name in ("ag_gemm_fp8", "gemm_rs_fp8"):  # FP8 operands with scales (tilelink.ops.tp_fp8)
    _ordered(_name)


def _fp8_call(a: torch.Tensor, b: torch.Tensor, a_scale, b_scale) -> bool:
    """Whether a call goes to the FP8 op: an 8-bit float operand or a scale (as :func:`tilelink.ops.tp.ag_gemm`
    decides)."""
    return a_scale is not None or b_scale is not None or a.element_size() == 1 or b.element_size() == 1


def _routing(topk_ids: torch.Tensor, num_experts: int, counts: torch.Tensor | None,
             host_counts: torch.Tensor | None):
    """The :class:`tilelink.ops.moe_routing.Routing` that ``moe_route`` made (no second copy to the host),
    or ``topk_ids`` itself for the operator to route."""
    if counts is None or host_counts is None:
        return topk_ids
    from tilelink.ops.moe_routing import Routing

    if counts.numel() != num_experts or host_counts.numel() != num_experts:
        raise LaunchError(f"the routing was made for {counts.numel()} experts, not {num_experts}")
    return Routing(topk_ids, num_experts, topk_ids.contiguous().view(-1), counts, tuple(host_counts.tolist()))


@torch.library.custom_op("tilelink::moe_route", mutates_args=())
def _moe_route(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    from tilelink.ops.moe_routing import route as impl

    routing = impl(topk_ids, num_experts)
    # a copy: the counts are a view of the routing's statistics, and an op's outputs are its own tensors
    return routing.counts.clone(), routing.host_counts


@_moe_route.register_fake
def _(topk_ids, num_experts):
    return (topk_ids.new_empty((num_experts,), dtype=torch.int64),
            torch.empty((num_experts,), dtype=torch.int64, device="cpu"))


@torch.library.custom_op("tilelink::ag_moe", mutates_args=())
def _ag_moe(x_shard: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, counts: torch.Tensor | None,
            host_counts: torch.Tensor | None, rank: int, world: int, persistent: bool | None) -> torch.Tensor:
    from tilelink.ops.moe import ag_moe as impl

    _check_world("ag_moe", rank, world)
    return impl(x_shard, w, _routing(topk_ids, w.shape[0], counts, host_counts), persistent=persistent)


@_ag_moe.register_fake
def _(x_shard, w, topk_ids, counts, host_counts, rank, world, persistent):
    return x_shard.new_empty((topk_ids.shape[0] * topk_ids.shape[1], w.shape[2]))


@torch.library.custom_op("tilelink::moe_rs", mutates_args=())
def _moe_rs(h: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
            counts: torch.Tensor | None, host_counts: torch.Tensor | None, rank: int, world: int,
            persistent: bool | None) -> torch.Tensor:
    from tilelink.ops.moe import moe_rs as impl

    _check_world("moe_rs", rank, world)
    return impl(h, w, _routing(topk_ids, w.shape[0], counts, host_counts), topk_weights, persistent=persistent)


@_moe_rs.register_fake
def _(h, w, topk_ids, topk_weights, counts, host_counts, rank, world, persistent):
    return h.new_empty((_shard_rows(topk_ids.shape[0], rank, world), w.shape[2]))


@torch.library.custom_op("tilelink::sp_attention", mutates_args=())
def _sp_attention(q_shard: torch.Tensor, k_shard: torch.Tensor, v_shard: torch.Tensor, causal: bool, S: int | None,
                  rank: int, world: int) -> torch.Tensor:
    from tilelink.ops.attention import SPContext
    from tilelink.ops.attention import sp_attention as impl

    _check_world("sp_attention", rank, world)
    return impl(q_shard, k_shard, v_shard, causal, None if S is None else SPContext(S))


@_sp_attention.register_fake
def _(q_shard, k_shard, v_shard, causal, S, rank, world):
    return q_shard.new_empty(q_shard.shape)


@torch.library.custom_op("tilelink::silu_mul", mutates_args=())
def _silu_mul(x: torch.Tensor) -> torch.Tensor:
    from tilelink.ops.gemm import silu_mul as impl

    return impl(x)


@_silu_mul.register_fake
def _(x):
    return x.new_empty((x.shape[0], x.shape[1] // 2))


@torch.library.custom_op("tilelink::all_gather_shards", mutates_args=())
def _all_gather_shards(local: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    from tilelink.ops.moe_layers import _gather_rows
    from tilelink.runtime import current_world

    _check_world("all_gather_shards", rank, world)
    out = _gather_rows(local, current_world())
    return out.clone() if out is local else out  # never the input itself


@_all_gather_shards.register_fake
def _(local, rank, world):
    rows = local.shape[0] if world == 1 else _unknown_rows(local.shape[0], rank, world)
    return local.new_empty((rows, *local.shape[1:]))


for _name in ("ag_gemm", "gemm_rs", "gemm_ar", "ag_moe", "moe_rs", "sp_attention", "all_gather_shards"):
    _ordered(_name)


# ------------------------------------------------------------------------------------------------
# what the layers call: the operators' own signatures


class TracedRouting(NamedTuple):
    """:func:`route`'s result while tracing: the ids and what ``moe_route`` counted, as tensors (a
    :class:`~tilelink.ops.moe_routing.Routing` holds the counts as Python ints, which a graph cannot)."""

    topk_ids: torch.Tensor
    num_experts: int
    counts: torch.Tensor  # slots per expert, on the ids' device
    host_counts: torch.Tensor  # the same on the host


def _routing_args(topk_ids, num_experts: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    from tilelink.ops.moe_routing import Routing

    if isinstance(topk_ids, TracedRouting):
        return topk_ids.topk_ids, topk_ids.counts, topk_ids.host_counts
    if isinstance(topk_ids, Routing):  # made outside the graph: its ints cannot enter it, the op routes again
        return topk_ids.topk_ids, None, None
    return topk_ids, None, None


def _eager_routing(topk_ids, num_experts: int):
    if isinstance(topk_ids, TracedRouting):
        return _routing(topk_ids.topk_ids, num_experts, topk_ids.counts, topk_ids.host_counts)
    return topk_ids


def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, ctx=None, *, persistent: bool | None = None,
            a_scale: torch.Tensor | None = None, b_scale: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """:func:`tilelink.ops.tp.ag_gemm`, traceable (``torch.ops.tilelink.ag_gemm``, or ``ag_gemm_fp8`` for FP8
    operands with scales)."""
    if not _traced(a_shard, b, a_scale, b_scale):
        from tilelink.ops.tp import ag_gemm as impl

        return impl(a_shard, b, ctx, persistent=persistent, a_scale=a_scale, b_scale=b_scale, out_dtype=out_dtype)
    rank, world = _rank_world()
    if _fp8_call(a_shard, b, a_scale, b_scale):
        return torch.ops.tilelink.ag_gemm_fp8(a_shard, b, a_scale, b_scale, out_dtype or torch.bfloat16,
                                              None if ctx is None else ctx.M, rank, world, persistent)
    return torch.ops.tilelink.ag_gemm(a_shard, b, None if ctx is None else ctx.M, rank, world, persistent)


def gemm_rs(a: torch.Tensor, b_shard: torch.Tensor, *, persistent: bool | None = None,
            a_scale: torch.Tensor | None = None, b_scale: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """:func:`tilelink.ops.tp.gemm_rs`, traceable (``torch.ops.tilelink.gemm_rs``, or ``gemm_rs_fp8`` for FP8
    operands with scales)."""
    if not _traced(a, b_shard, a_scale, b_scale):
        from tilelink.ops.tp import gemm_rs as impl

        return impl(a, b_shard, persistent=persistent, a_scale=a_scale, b_scale=b_scale, out_dtype=out_dtype)
    rank, world = _rank_world()
    if _fp8_call(a, b_shard, a_scale, b_scale):
        return torch.ops.tilelink.gemm_rs_fp8(a, b_shard, a_scale, b_scale, out_dtype or torch.bfloat16, rank, world,
                                              persistent)
    return torch.ops.tilelink.gemm_rs(a, b_shard, rank, world, persistent)


def gemm_ar(a: torch.Tensor, b_shard_rows: torch.Tensor, ctx=None, *, mode: str | None = None) -> torch.Tensor:
    """:func:`tilelink.ops.tp_ar.gemm_ar`, traceable (``torch.ops.tilelink.gemm_ar``)."""
    if not _traced(a, b_shard_rows):
        from tilelink.ops.tp_ar import gemm_ar as impl

        return impl(a, b_shard_rows, ctx, mode=mode)
    rank, world = _rank_world()
    return torch.ops.tilelink.gemm_ar(a, b_shard_rows, None if ctx is None else ctx.M, rank, world, mode)


def route(topk_ids: torch.Tensor, num_experts: int):
    """:func:`tilelink.ops.moe_routing.route` (one copy to the host for both parts of an MoE layer);
    while tracing, a :class:`TracedRouting` (``torch.ops.tilelink.moe_route``)."""
    if not _traced(topk_ids):
        from tilelink.ops.moe_routing import route as impl

        return impl(topk_ids, num_experts)
    counts, host_counts = torch.ops.tilelink.moe_route(topk_ids, num_experts)
    return TracedRouting(topk_ids, num_experts, counts, host_counts)


def ag_moe(x_shard: torch.Tensor, w: torch.Tensor, topk_ids, *, persistent: bool | None = None) -> torch.Tensor:
    """:func:`tilelink.ops.moe.ag_moe`, traceable (``torch.ops.tilelink.ag_moe``); ``topk_ids`` may be
    :func:`route`'s result."""
    if not _traced(x_shard, w):
        from tilelink.ops.moe import ag_moe as impl

        return impl(x_shard, w, _eager_routing(topk_ids, w.shape[0]), persistent=persistent)
    ids, counts, host_counts = _routing_args(topk_ids, w.shape[0])
    rank, world = _rank_world()
    return torch.ops.tilelink.ag_moe(x_shard, w, ids, counts, host_counts, rank, world, persistent)


def moe_rs(h: torch.Tensor, w: torch.Tensor, topk_ids, topk_weights: torch.Tensor, *,
           persistent: bool | None = None) -> torch.Tensor:
    """:func:`tilelink.ops.moe.moe_rs`, traceable (``torch.ops.tilelink.moe_rs``); ``topk_ids`` may be
    :func:`route`'s result."""
    if not _traced(h, w, topk_weights):
        from tilelink.ops.moe import moe_rs as impl

        return impl(h, w, _eager_routing(topk_ids, w.shape[0]), topk_weights, persistent=persistent)
    ids, counts, host_counts = _routing_args(topk_ids, w.shape[0])
    rank, world = _rank_world()
    return torch.ops.tilelink.moe_rs(h, w, ids, topk_weights, counts, host_counts, rank, world, persistent)


def sp_attention(q_shard: torch.Tensor, k_shard: torch.Tensor, v_shard: torch.Tensor, causal: bool = False,
                 ctx=None) -> torch.Tensor:
    """:func:`tilelink.ops.attention.sp_attention`, traceable (``torch.ops.tilelink.sp_attention``)."""
    if not _traced(q_shard, k_shard, v_shard):
        from tilelink.ops.attention import sp_attention as impl

        return impl(q_shard, k_shard, v_shard, causal=causal, ctx=ctx)
    rank, world = _rank_world()
    return torch.ops.tilelink.sp_attention(q_shard, k_shard, v_shard, causal, None if ctx is None else ctx.S, rank,
                                           world)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """:func:`tilelink.ops.gemm.silu_mul`, traceable (``torch.ops.tilelink.silu_mul``)."""
    if not _traced(x):
        from tilelink.ops.gemm import silu_mul as impl

        return impl(x)
    return torch.ops.tilelink.silu_mul(x)


def all_gather_shards(local: torch.Tensor) -> torch.Tensor:
    """Every rank's rows of a row-sharded tensor, in rank order (``torch.distributed`` on the world's group),
    where this rank holds its share (``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))``) of the M rows; ``local``
    itself in a world of one. Traceable (``torch.ops.tilelink.all_gather_shards``; M is then an unbacked
    size)."""
    from tilelink.runtime import current_world

    if not _traced(local):
        from tilelink.ops.moe_layers import _gather_rows

        return _gather_rows(local, current_world())
    rank, world = _rank_world()
    if world == 1:
        return local
    return torch.ops.tilelink.all_gather_shards(local, rank, world)
