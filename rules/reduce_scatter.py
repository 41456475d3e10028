"""Reduce-scatter producer: the kernel's stores are partial sums reduced across ranks (paper Fig. 4).

Spec: ``tilelink.reduce_scatter("c_ptr", dim=0)``. Rank ``r`` passes its output shard (rows
``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))`` of the summed result); every other argument is the full
problem's. The kernel itself writes the full partial result into a symmetric buffer.

Rewrite of the user's kernel (the producer):
- after each store to the tensor, count the elements the tile stored in each channel it overlaps
  and notify those channels (``producer_tile_notify``, release). A channel is complete when its
  count reaches ``rows(channel) * row_elems`` per call, whatever the producer's tile sizes, so
  autotuning the kernel never changes the consumer;
- rotate the tile index so that each rank starts with the rows the next rank reduces first
  (``order="ring"``), spreading the consumers' first waits over different producers;
- add the channel parameters (``tlk_*``).

Partner kernels (the consumer), chosen by ``via``:
- ``sm`` (``mode="pull"``, the default): :func:`rs_pull_consumer` on ``comm_sms`` programs pulls, for
  each of this rank's channels, every rank's partial rows once they are notified (full-mesh pull, ring
  start), sums them (and each token's top-k expert slots for MoE) in fp32 and writes this rank's
  output shard;
- ``sm`` with ``mode="push"``: :func:`rs_ring_consumer`, the ring of the paper's Figure 4 (partial sums
  travel rank to rank, each adding its own, with peer_tile_wait / peer_tile_notify between them);
- ``copy_engine`` (the paper's hybrid): the host copies each finished channel into the receive slot
  of the rank that owns it and flags it; :func:`rs_reduce_received` sums what arrived and this rank's
  own rows (read where the GEMM wrote them, not copied), on every SM (``REDUCE_PROGRAMS_PER_SM``
  programs each: it starts after the GEMM's last tile). With ``topk=`` (MoE) a third kernel comes first,
  :func:`rs_topk_reduce`, behind the GEMM on every SM: it sums each token's top-k expert slots channel by
  channel (the copy engine's order) and flags each channel, so the copy engine moves a token's one summed row
  instead of its top-k slot rows (``1 / topk`` of the bytes) while the next channel is summed.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
import torch
import triton
import triton.language as tl

import tilelink.language as tll
import tilelink.mapping as tlm
from tilelink.analysis import KernelAnalysis, Where, code, expanded, names_in, parse_offsets
from tilelink.errors import AnnotationError, LaunchError
from tilelink.mapping import RowSharding
from tilelink.plan import Insertion, ReportEntry, RewritePlan
from tilelink.rules.emit import (
    CHANNEL_PARAMS,
    MAPPING_ARGS,
    channels_of_row_vector,
    channels_of_tile,
    describe_rows,
    plus,
    remap_order,
    tile_end,
    tile_rows,
)
from tilelink.rules.launch import Launcher, Streams, cdiv, vector_peer_table
from tilelink.runtime import (
    Channel,
    Diagnostics,
    peer_tensor,
    races,
    rank_copy_data,
    rank_notify,
    rank_wait,
    symmetric_empty,
)
from tilelink.spec import Options, ReduceScatterSpec

RULE = "reduce_scatter"
DEFAULTS = dict(via="sm", mode="pull", order="ring", comm_sms=16)
#: programs per SM of the hybrid's reduction (it runs after the GEMM, on every SM): enough resident
#: programs that each SM keeps several blocks' loads in flight
REDUCE_PROGRAMS_PER_SM = 8


def _comparison(node: cst.BaseExpression, axis_slice: int) -> tuple[str, str] | None:
    """``name[:, None] < bound`` (axis 0) or ``name[None, :] < bound`` (axis 1) -> (name, bound), for a
    bound with no subscript (a scalar, not another vector)."""
    if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1
            and isinstance(node.comparisons[0].operator, cst.LessThan)):
        return None
    name = expanded(node.left, axis_slice)
    bound = node.comparisons[0].comparator
    if name is None or m.findall(bound, m.Subscript()):
        return None
    return name, code(bound)


def _live_columns(an: KernelAnalysis, access, cols: str, bound: str) -> str:
    """The columns a row of the tile stores: ``clamp(bound - start, 0, SIZE)`` when the column vector is
    ``start + tl.arange(0, SIZE)`` as the store sees it (:func:`_column_range`), scalar arithmetic on every
    thread; otherwise counted from the vector itself, ``sum(cols < bound)``, a reduction across the
    program's threads (in a tile loop it costs 5-8% of a short-K grouped GEMM on an H200)."""
    span = _column_range(an, access, cols)
    if span is not None:
        start, size = span
        return f"tl.minimum(tl.maximum(({bound}) - ({start}), 0), {size})"
    return f"tl.sum(({cols} < ({bound})).to(tl.int32))"


def _before(a: Where, b: Where) -> bool:
    return (a.line, a.column) < (b.line, b.column)


def _column_range(an: KernelAnalysis, access, cols: str) -> tuple[str, str] | None:
    """``(start, SIZE)`` when ``cols`` is assigned once, as ``start + tl.arange(0, SIZE)`` (no modulo), before
    the store, and every binding of a name of ``start`` comes before that assignment (none after it, even
    after the store in a loop) and is not the target of a loop that ends before the store: ``start`` then
    means at the store what it meant there."""
    values, binds = an.values.get(cols, ()), an.bindings.get(cols, ())
    if len(values) != 1 or len(binds) != 1:
        return None
    node = cst.parse_expression(values[0])
    parsed = parse_offsets(node) if isinstance(node, cst.BinaryOperation) and isinstance(node.operator,
                                                                                        cst.Add) else None
    defined, store = binds[0][0], access.where
    if parsed is None or not _before(defined, store):
        return None
    start = cst.parse_expression(parsed[0])
    if m.findall(start, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("load")))):
        return None  # a load may read something the kernel wrote since
    for name in names_in(start):
        for at, loop_end in an.bindings.get(name, ()):
            # bound after the column vector was made (before the store, or later in a loop around both or
            # around the store only): at the store it may mean something else
            if _before(defined, at):
                return None
            if loop_end is not None and _before(loop_end, store):
                return None
    return parsed


def _mask_halves(an: KernelAnalysis, access) -> tuple[tuple[cst.BaseExpression, cst.BaseExpression], ...]:
    """The store mask ``a & b`` (its one value when the mask is a variable) as ``((a, b), (b, a))``, each
    pair a candidate (row part, column part); ``()`` for any other mask."""
    if access.mask is None:
        return ()
    values = an.values.get(access.mask, ())
    try:
        node = cst.parse_expression(values[0] if len(values) == 1 else access.mask)
    except cst.ParserSyntaxError:
        return ()
    if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitAnd)):
        return ()
    return (node.left, node.right), (node.right, node.left)


def separable_columns(an: KernelAnalysis, access, tile, size_param: str | None) -> str | None:
    """For a store masked by ``(rows[:, None] < M) & (cols[None, :] < N)`` with ``rows`` the tile's
    offsets: the scalar count of the columns each of its rows stores; otherwise ``None``."""
    if size_param is None:
        return None
    for rows_side, cols_side in _mask_halves(an, access):
        rows, cols = _comparison(rows_side, 0), _comparison(cols_side, 1)
        if rows is None or cols is None or rows[1] != size_param:
            continue
        row_defs = an.values.get(rows[0], ())
        if len(row_defs) != 1:
            continue
        if parse_offsets(cst.parse_expression(row_defs[0])) == (tile.start, tile.size):
            return _live_columns(an, access, *cols)
    return None


def _row_vector(node: cst.BaseExpression) -> str | None:
    """``rows[:, None]`` -> ``rows``; ``rows[:, None] < bound`` -> ``rows < (bound)``: a per-row condition."""
    compared = _comparison(node, 0)
    if compared is not None:
        return f"{compared[0]} < ({compared[1]})"
    return expanded(node, 0)


def row_times_columns(an: KernelAnalysis, access) -> tuple[str, str] | None:
    """For a store masked by ``<row condition>[:, None] & (cols[None, :] < N)``: ``(row condition,
    columns stored per row)``, so that each row's stored count is ``where(row condition, columns, 0)``,
    the per-element count of that mask without its 2-D reduction; otherwise ``None``."""
    for rows_side, cols_side in _mask_halves(an, access):
        rows, cols = _row_vector(rows_side), _comparison(cols_side, 1)
        if rows is not None and cols is not None:
            return rows, _live_columns(an, access, *cols)
    return None


def _descriptor_notify(an: KernelAnalysis, a, t, spec: ReduceScatterSpec, pending: str | None) -> tuple[str, ...]:
    """The notify after a tensor-descriptor store ``desc.store([o0, o1, ...], value)``: wait for the
    asynchronous store to reach memory, then add to each channel its rows of the box times the box's
    columns inside the tensor (a descriptor store writes the part of its box inside ``shape``).
    ``pending``: the held adds' variable of the tile loop's form (:func:`_grouped_notify`), which waits for
    the store itself; None for a notify per tile."""
    cols = f"tlk_cols = {_box_columns(an, a, t)}"
    if pending is not None:
        return (_GROUPED_COMMENT.format(dim=spec.dim), cols, *_grouped_notify(t, pending))
    return (
        f"# tilelink: notify the channels whose rows this tile completed (reduce_scatter, dim {spec.dim})",
        "tll.bulk_store_wait()  # the descriptor store is asynchronous: wait until it has written memory",
        cols,
        *_notify_rows(an, t),
    )


def _box_columns(an: KernelAnalysis, a, t) -> str:
    """The elements of each row a descriptor store ``desc.store([o0, o1, ...], value)`` writes: the part of
    its box inside the tensor's ``shape`` along every inner dimension."""
    box = an.descriptor_box(a)
    if t.dynamic or box is None:
        raise AnnotationError(
            f"cannot tell which elements the descriptor store to {a.tensor!r} writes",
            file=a.where.file, line=a.where.line, column=a.where.column,
            hint="make the descriptor once with tl.make_tensor_descriptor(ptr, shape=[...], strides=[...], "
                 "block_shape=[...]) and store with a literal offsets list; a gathered (index=) store needs "
                 "tl.store with pointers")
    offsets, block, shape = box
    # the box [o, o + b) clipped to [0, n) along each inner dimension
    inner = [f"tl.maximum(tl.minimum({plus(o, b)}, {n}) - tl.maximum({o}, 0), 0)"
             for o, b, n in zip(offsets[1:], block[1:], shape[1:], strict=True)]
    return " * ".join(inner) if inner else "1"


_GROUPED_COMMENT = ("# tilelink: notify the channels whose rows this tile completed, four tiles at a time "
                   "(reduce_scatter, dim {dim})")


def _grouped_notify(t, pending: str) -> tuple[str, ...]:
    """The notify of a store in a tile loop with a compile-time tile height: one barrier and one system
    fence per four tiles (:func:`tilelink.language.producer_tile_notify_rows_grouped`); ``pending`` is the
    store's own loop variable of held adds (the tile count, then the first channel, its add, the last channel
    and its add of up to three tiles), carried from one notify to the next."""
    return (f"{pending} = tll.producer_tile_notify_rows_grouped(\n"
            f"    tlk_barriers, {pending}, {t.start}, {tile_end(t)}, tlk_cols,\n"
            f"    {MAPPING_ARGS}, {t.size})",)


def _grouped_loop(a, pending: str) -> list[Insertion]:
    """Around the tile loop of a grouped notify: nothing held before it, what is left sent after it."""
    return [Insertion(a.loop, "before", (
                "# tilelink: a tile's adds are held until its group of four tiles is done (reduce_scatter)",
                f"{pending} = tll.no_pending_tiles()")),
            Insertion(a.loop, "after", (
                "# tilelink: send the adds the loop's last group still holds (reduce_scatter)",
                f"tll.producer_tile_notify_flush(tlk_barriers, {pending})"))]


def _store_variable(base: str, a, stores) -> str:
    """The name of a variable that belongs to store ``a`` (its swept count, its held adds): ``base`` when it is
    the only store, ``base_<index>`` otherwise, so that a second store's loop (after this one's, or inside or
    around it) neither clears nor resends this one's."""
    return base if len(stores) == 1 else f"{base}_{stores.index(a)}"


def _groups(an: KernelAnalysis, a, t) -> bool:
    """Whether the store's notify takes the grouped form: it is a statement of a tile loop's body, and its
    tile height is a compile-time constant."""
    return a.loop is not None and (t.size in an.constexpr_params or t.size.isdigit()) and not t.dynamic


#: the loop body that adds ``tlk_done`` to channel ``tlk_first + tlk_i`` (a notify loop over the channels)
_NOTIFY_CHANNEL = ("    tll.producer_tile_notify(tlk_barriers, tlk_first + tlk_i, tlk_done, tlk_barriers, tlk_rank, "
                   "tlk_world, 0)")


def _notify_rows(an: KernelAnalysis, t) -> tuple[str, ...]:
    """Add ``tlk_cols`` times its rows of the tile to each channel the tile's rows span. With a
    compile-time tile height (a power of two, as tile sizes are), one loop-free primitive (a flattened
    tile loop stays flattened); otherwise a loop over the channels."""
    if t.size in an.constexpr_params or t.size.isdigit():
        return (f"tll.producer_tile_notify_rows(tlk_barriers, {t.start}, {tile_end(t)}, tlk_cols,\n"
                f"    {MAPPING_ARGS}, {t.size})",)
    return (
        channels_of_tile(t),
        "for tlk_i in range(0, tlk_count):",
        f"    tlk_done = tlk_cols * tlm.tl_channel_overlap(\n"
        f"        tlk_first + tlk_i, {t.start}, {tile_end(t)},\n        {MAPPING_ARGS})",
        _NOTIFY_CHANNEL,
    )


def _stored_per_element(a) -> str:
    """Elements the store wrote, per element of its value: 1 where its mask holds."""
    shape = f"({a.value}).shape"
    return (f"tl.where({a.mask}, 1, 0) + tl.zeros({shape}, tl.int32)" if a.mask
            else f"tl.full({shape}, 1, tl.int32)")


def _dynamic_comment(spec: ReduceScatterSpec) -> str:
    return (f"# tilelink: notify the channels of the rows this tile scattered through {spec.index} "
            f"(reduce_scatter, dynamic mapping)")


def _dynamic_count(an: KernelAnalysis, a, target: str) -> str:
    """``target`` the elements a gathered (``index=``) store wrote per row: rows x columns when its mask
    separates, else a sum over each row of its mask."""
    separable = row_times_columns(an, a)
    if separable is not None:
        rows_ok, columns = separable
        return f"{target} tl.where({rows_ok}, {columns}, 0)"
    return f"{target} tl.sum({_stored_per_element(a)}, axis=1)"


def _dynamic_notify(t, spec: ReduceScatterSpec) -> tuple[str, ...]:
    """Each row's channel, and the notify adding ``tlk_stored`` of each row to its channel."""
    return (*channels_of_row_vector(f"({t.start}) // {spec.topk}" if spec.topk else t.start),
            "tll.producer_tile_notify_channels(tlk_barriers, tlk_channel, tlk_stored)")


def _swept(an: KernelAnalysis, a, t, spec: ReduceScatterSpec, total: str) -> list[Insertion]:
    """A store in a loop over the columns of rows fixed before the loop (``a.anchor``): count in ``total``
    (a name of this store's own: another store's notify may reuse ``tlk_cols`` / ``tlk_stored`` inside the
    loop) what each iteration stored, and notify the rows' channels once, after the loop (one barrier and
    fence for the whole sweep instead of one per iteration)."""
    loop = a.anchor
    if t.dynamic:
        return [Insertion(loop, "before", ("# tilelink: the loop below stores the same rows each iteration: "
                                           "count per row what it stored (reduce_scatter)",
                                           f"{total} = tl.zeros_like({t.start}).to(tl.int32)")),
                Insertion(a.where, "after", (_dynamic_count(an, a, f"{total} +="),)),
                Insertion(loop, "after", (_dynamic_comment(spec), f"tlk_stored = {total}", *_dynamic_notify(t, spec)))]
    if a.descriptor:
        columns = _box_columns(an, a, t)
        wait: tuple[str, ...] = ("tll.bulk_store_wait()  # the descriptor stores are asynchronous: wait until "
                                 "they have written memory",)
    else:
        columns = separable_columns(an, a, t, spec.size or t.size_param)
        wait = ()
        if columns is None:
            raise AnnotationError(
                f"cannot count the elements the store to {a.tensor!r} writes in each iteration of the loop at "
                f"line {a.anchor.line}", file=a.where.file, line=a.where.line, column=a.where.column,
                hint="mask the store with (rows < M)[:, None] & (columns < N)[None, :], or store once per tile "
                     "outside the loop")
    return [Insertion(loop, "before", ("# tilelink: the loop below stores the same rows each iteration: "
                                       "count the columns it stored (reduce_scatter)", f"{total} = 0")),
            Insertion(a.where, "after", (f"{total} += {columns}",)),
            Insertion(loop, "after", (
                f"# tilelink: notify the channels whose rows the loop completed (reduce_scatter, dim {spec.dim})",
                *wait, f"tlk_cols = {total}", *_notify_rows(an, t)))]


#: functions whose value at a sum is not the sum of their values (an activation, a normalisation)
_NONLINEAR = {"maximum", "minimum", "exp", "exp2", "log", "log2", "log1p", "sqrt", "sqrt_rn", "rsqrt", "sigmoid",
              "abs", "erf", "tanh", "sin", "cos", "clamp", "softmax", "pow", "fast_expf", "fast_dividef", "max",
              "min", "argmax", "argmin", "sort", "floor", "ceil", "round", "div_rn", "umulhi", "cumprod", "fma",
              "where", "gelu", "silu", "relu"}
#: calls whose value is their first argument's, reshaped or converted (linear)
_SHAPE = {"to", "cast", "reshape", "view", "trans", "permute", "broadcast_to", "expand_dims", "sum", "cumsum",
          "flip", "join", "split", "interleave", "T"}
#: calls whose value does not depend on data (index arithmetic, constructors)
_INDEX = {"arange", "program_id", "num_programs", "cdiv", "multiple_of", "max_contiguous", "static_range", "range",
          "full", "zeros", "zeros_like", "full_like"}

# what a value is, as far as the reduction is concerned: the partial sums (a tl.dot, an accumulator of them),
# data read by this rank (a load), a constant, or zero
_ZERO, _CONST, _DATA, _SUM = "zero", "constant", "data", "partial sums"


class _Epilogue(Exception):
    def __init__(self, node: cst.CSTNode, why: str):
        super().__init__(why)
        self.source, self.why = code(node), why


def _join(a: str, b: str, node: cst.CSTNode) -> str:
    kinds = {a, b} - {_ZERO}
    if _SUM in kinds and kinds & {_CONST, _DATA}:  # `out = acc` on one path, `out = 1.0` on another
        raise _Epilogue(node, "a value that is the partial sums on one path and not on another")
    for kind in (_SUM, _DATA, _CONST):
        if kind in kinds:
            return kind
    return _ZERO


def _classify(an: KernelAnalysis, node: cst.BaseExpression, visiting: set[str]) -> str:
    """What ``node`` is (see above); raises :class:`_Epilogue` where the reduction of the ranks' stored values
    would not be the value of the full problem."""
    if isinstance(node, cst.Name):
        if node.value in visiting:  # an accumulator's own earlier value: neutral for the join
            return _ZERO
        sources = an.values.get(node.value, ()) + an.updates.get(node.value, ())
        if not sources:
            return _CONST  # a parameter, a constant, `None`
        kind = _ZERO
        for src in sources:
            kind = _join(kind, _classify(an, cst.parse_expression(src), visiting | {node.value}), node)
        return kind
    if isinstance(node, (cst.Integer, cst.Float)):
        return _ZERO if float(node.value.replace("_", "")) == 0 else _CONST
    if isinstance(node, (cst.SimpleString, cst.Attribute)) and not isinstance(node, cst.Call):
        return _CONST
    if isinstance(node, cst.Subscript):
        return _classify(an, node.value, visiting)
    if isinstance(node, cst.UnaryOperation):
        kind = _classify(an, node.expression, visiting)
        if kind == _SUM and not isinstance(node.operator, (cst.Minus, cst.Plus)):
            raise _Epilogue(node, f"`{code(node.operator)}` of the partial sums")
        return kind
    if isinstance(node, cst.BinaryOperation):
        left, right = _classify(an, node.left, visiting), _classify(an, node.right, visiting)
        op = node.operator
        if _SUM not in (left, right):
            return _join(left, right, node) if _ZERO not in (left, right) or not isinstance(op, cst.Multiply) \
                else _ZERO
        if isinstance(op, (cst.Add, cst.Subtract)):
            other = right if left == _SUM else left
            if other in (_SUM, _ZERO):
                return _SUM
            raise _Epilogue(node, f"a {other} term added to the partial sums, which every rank would add")
        if isinstance(op, cst.Multiply):
            if left == right == _SUM:
                raise _Epilogue(node, "a product of partial sums")
            return _ZERO if _ZERO in (left, right) else _SUM
        if isinstance(op, cst.Divide) and left == _SUM and right != _SUM:
            return _SUM
        raise _Epilogue(node, f"`{code(op).strip()}` with the partial sums")
    if isinstance(node, cst.Call):
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
            else ""
        args = [a.value for a in node.args if a.keyword is None or a.keyword.value in ("acc", "input", "x")]
        if name == "load" or (isinstance(func, cst.Attribute) and name in ("load", "gather")):
            return _DATA
        if name in _INDEX:
            return _ZERO if name in ("zeros", "zeros_like") or (
                name == "full" and len(args) > 1 and _classify(an, args[1], visiting) == _ZERO) else _CONST
        if name == "dot":
            kinds = [_classify(an, a, visiting) for a in args]
            if kinds[:2].count(_SUM) == 2:
                raise _Epilogue(node, "a product of partial sums")
            return _SUM if len(kinds) < 3 or kinds[2] in (_SUM, _ZERO) else _join(_SUM, kinds[2], node)
        if name == "where" and len(args) == 3:
            if _SUM in (_classify(an, args[0], visiting),):
                raise _Epilogue(node, "a choice by the values of the partial sums")
            return _join(_classify(an, args[1], visiting), _classify(an, args[2], visiting), node)
        if name in _SHAPE:
            first = func.value if isinstance(func, cst.Attribute) and not (
                isinstance(func.value, cst.Name) and func.value.value == "tl") else (args[0] if args else None)
            return _classify(an, first, visiting) if first is not None else _CONST
        kinds = [_classify(an, a, visiting) for a in args]
        if isinstance(func, cst.Attribute) and not (isinstance(func.value, cst.Name) and func.value.value == "tl"):
            kinds.append(_classify(an, func.value, visiting))
        if _SUM in kinds:
            what = f"`{name}`" if name in _NONLINEAR or code(func).startswith("tl.") else \
                f"the helper `{name}` (TileLink does not read its body)"
            raise _Epilogue(node, f"{what} applied to the partial sums")
    if isinstance(node, cst.Comparison):
        kinds = [_classify(an, node.left, visiting)] + [_classify(an, c.comparator, visiting)
                                                        for c in node.comparisons]
        if _SUM in kinds:
            raise _Epilogue(node, "a comparison of the partial sums")
        return _DATA if _DATA in kinds else _CONST
        return _DATA if _DATA in kinds else _CONST
    kinds = [_classify(an, child, visiting) for child in node.children if isinstance(child, cst.BaseExpression)]
    if _SUM in kinds:
        raise _Epilogue(node, "an expression TileLink cannot follow, on the partial sums")
    return _DATA if _DATA in kinds else _CONST


def _nonlinear_epilogue(an: KernelAnalysis, a) -> tuple[str, str] | None:
    """Where the value stored by ``a`` is not linear in the partial sums, as ``(source, what)``: the sum over the
    ranks of what each stores must be what the full problem stores. Loads are this rank's data (a weight, a
    routing weight, a partial input); they may scale the partial sums, not be added to them."""
    try:
        _classify(an, cst.parse_expression(a.value), set())
    except _Epilogue as exc:
        return exc.source, exc.why
    return None


def rewrite(an: KernelAnalysis, spec: ReduceScatterSpec, options: Options) -> RewritePlan:
    """Plan the producer-side rewrite of ``an`` for ``spec``."""
    opts = options.resolved(**DEFAULTS)
    if spec.dim != 0:
        raise AnnotationError(f"reduce_scatter over dim {spec.dim} is not supported yet", file=an.file,
                              line=an.where.line, column=an.where.column,
                              hint="scatter along dim 0 (rows); transpose the output if needed")
    stores = [a for t in spec.tensors for a in an.accesses_of(t, "store")]
    names = " or ".join(repr(t) for t in spec.tensors)
    if not stores:
        raise AnnotationError(f"kernel {an.name!r} never stores to {names}", file=an.file,
                              line=an.where.line, column=an.where.column,
                              hint="annotate the pointer the kernel writes its partial result to")
    reads = [a for t in spec.tensors for a in an.accesses_of(t, "load")]
    if reads:
        a = reads[0]
        raise AnnotationError(
            f"kernel {an.name!r} reads {a.tensor!r}, which reduce_scatter replaces by a buffer of this rank's partial "
            f"sums: the read would see neither the caller's tensor nor the reduced result",
            file=a.where.file, line=a.where.line, column=a.where.column,
            hint=f"pass what the kernel reads as a separate input (`c = a @ b + d`: load d_ptr, store {a.tensor})")
    report: list[ReportEntry] = []
    insertions: list[Insertion] = []
    for a in stores:
        if a.tile is None:
            raise AnnotationError(
                f"cannot tell which rows of {a.tensor!r} this store writes "
                f"({'descriptor' if a.descriptor else 'pointer'} `{a.pointer}`)",
                file=a.where.file, line=a.where.line, column=a.where.column,
                hint="store with a literal offsets list, `desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc)`, "
                     "to a descriptor made once by tl.make_tensor_descriptor(..., block_shape=[...])"
                if a.descriptor else
                "compute the offsets as `offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)` and "
                "index with offs_cm[:, None], or pass tile=(\"<start>\", \"<size>\")")
        if not a.anchor_is_access and not a.swept:
            raise AnnotationError(
                f"the store to {a.tensor!r} must be a statement of its own (`tl.store(ptrs, value, mask=...)` or "
                f"`desc.store([offsets], value)`) in the block where its tile is computed, or directly in the "
                f"body of a loop over the tile's columns", file=a.where.file, line=a.where.line,
                column=a.where.column,
                hint="move the store out of the nested block (an `if` or an inner loop), or compute its row "
                     "offsets outside the loop that sweeps the columns; that loop may change only the column "
                     "terms of the address (`offs_n[None, :]`), not a pointer it advances")
        t = a.tile
        assert t is not None and a.anchor is not None and a.value is not None
        bad = None if spec.linear_epilogue else _nonlinear_epilogue(an, a)
        if bad is not None:
            raise AnnotationError(
                f"the value stored to {a.tensor!r} goes through {bad[1]} (`{bad[0]}`): reduce_scatter sums what every "
                f"rank stores, and that sum would not be the full problem's value (the sum of f(partial sums) is not "
                f"f of their sum)", file=a.where.file,
                line=a.where.line, column=a.where.column,
                hint="store the partial sums themselves and apply the function after the reduction (on the "
                     "reduced rows), or pass reduce_scatter(..., linear_epilogue=True) if what is stored is linear "
                     "in the partial sums after all")
        if a.branch is not None:
            report.append(ReportEntry(an.name, RULE, "note",
                                      f"the store at line {a.where.line} is in a branch of the `if` at line "
                                      f"{a.branch.line}: a tile that takes no storing branch leaves its rows "
                                      f"unnotified, and the reduction's wait for them times out naming them", a.where))
        if opts.via == "copy_engine" and spec.topk:
            report.append(ReportEntry(an.name, RULE, "note",
                                      f"no notify after the store at line {a.where.line}: with topk= on the copy "
                                      "engine the top-k reduce runs behind this kernel on its stream (a rank's "
                                      "tokens are spread over every expert, so no channel is complete before the "
                                      "last tile)", a.where))
            continue
        if a.swept:
            insertions += _swept(an, a, t, spec, _store_variable("tlk_swept", a, stores))
            report.append(ReportEntry(an.name, RULE, "applied",
                                      f"the loop at line {a.anchor.line} stores the same rows on every iteration "
                                      f"(line {a.where.line}): it counts what they stored and notifies once, "
                                      "after the loop", a.anchor))
            continue
        columns = (separable_columns(an, a, t, spec.size or t.size_param)
                   if not t.dynamic and not a.descriptor else None)
        grouped = _groups(an, a, t) and (a.descriptor or columns is not None)
        pending = _store_variable("tlk_pending", a, stores) if grouped else None
        if grouped:
            insertions += _grouped_loop(a, pending)
            report.append(ReportEntry(an.name, RULE, "applied",
                                      f"the tile loop at line {a.loop.line} notifies four tiles at a time (one barrier "
                                      "and fence per four tiles; a tile's adds at most three tiles late)", a.loop))
        if a.descriptor:
            insertions.append(Insertion(a.anchor, "after", _descriptor_notify(an, a, t, spec, pending)))
            what = ("producer_tile_notify_rows_grouped (it waits for the bulk store)" if grouped
                    else "bulk_store_wait + producer_tile_notify")
            report.append(ReportEntry(an.name, RULE, "applied",
                                      f"{what} after the descriptor store at line {a.where.line} ({describe_rows(t)})",
                                      a.where))
            continue
        if t.dynamic:
            lines = (_dynamic_comment(spec), _dynamic_count(an, a, "tlk_stored ="),
                     *_dynamic_notify(t, spec))
        elif columns is not None and grouped:
            lines = (_GROUPED_COMMENT.format(dim=spec.dim), f"tlk_cols = {columns}", *_grouped_notify(t, pending))
        elif columns is not None:
            # the mask is (rows < M) & (columns < N): a channel's count is rows x valid columns, all scalar
            lines = (
                f"# tilelink: notify the channels whose rows this tile completed (reduce_scatter, dim {spec.dim})",
                f"tlk_cols = {columns}",
                *_notify_rows(an, t),
            )
        else:
            stored = _stored_per_element(a)
            if t.ndim == 2:  # elements stored per row of the tile
                stored = f"tl.sum({stored}, axis={1 - spec.dim})"
            lines = (
                f"# tilelink: notify the channels whose rows this tile completed (reduce_scatter, dim {spec.dim})",
                f"tlk_stored = {stored}",
                f"tlk_row = {tile_rows(t)}",
                channels_of_tile(t),
                "for tlk_i in range(0, tlk_count):",
                f"    tlk_lo, tlk_hi = tlm.tl_channel_range(\n        tlk_first + tlk_i, {MAPPING_ARGS})",
                "    tlk_done = tl.sum(tl.where((tlk_row >= tlk_lo) & (tlk_row < tlk_hi), tlk_stored, 0))",
                _NOTIFY_CHANNEL,
            )
        insertions.append(Insertion(a.anchor, "after", lines))
        what = "producer_tile_notify_rows_grouped" if grouped else "producer_tile_notify"
        report.append(ReportEntry(an.name, RULE, "applied",
                                  f"{what} after the store at line {a.where.line} "
                                  f"({describe_rows(t)})", a.where))
    first = stores[0]
    tile = first.tile
    assert tile is not None
    size_param = spec.size or tile.size_param
    if tile.dynamic and spec.size is None:
        raise AnnotationError(
            f"reduce_scatter with index={spec.index!r} needs the full row count of the reduced result",
            file=first.where.file, line=first.where.line, column=first.where.column,
            hint="pass size=\"<parameter or expression>\", e.g. size=\"num_valid_tokens // top_k\"")
    if size_param is None:
        raise AnnotationError(
            f"cannot find the parameter holding the full size of dim 0 of {first.tensor!r}",
            file=first.where.file, line=first.where.line, column=first.where.column,
            hint=f"mask the store with `{tile.offsets or 'offs'}[:, None] < M`, or pass size=\"M\"")
    shift = f"(((tlk_rank + 1) % tlk_world) * tlk_rows_per_rank) // ({tile.size})"
    if tile.dynamic:
        report.append(ReportEntry(an.name, RULE, "note", f"dynamic mapping through {spec.index}"
                                  + (f", top-k reduction (topk={spec.topk})" if spec.topk else "")
                                  + ("" if opts.via == "copy_engine" and spec.topk
                                     else ": each tile notifies the channels of the rows it stored")))
    else:
        more, entry = remap_order(an, first, RULE, opts.order, shift)
        insertions += more
        report.append(entry)
    if opts.via == "copy_engine":
        report.append(ReportEntry(an.name, RULE, "note",
                                  ("consumer: hybrid - after the GEMM an SM kernel sums each token's top-k slots, "
                                   "channel by channel; " if spec.topk else "consumer: hybrid - ")
                                  + "the copy engine scatters each finished channel to the rank that owns its rows, "
                                    "then an SM kernel sums what it received (paper §7.2)"))
    elif opts.mode == "push":
        report.append(ReportEntry(an.name, RULE, "note",
                                  f"consumer: SM ring on {opts.comm_sms} programs - each rank adds its partial rows "
                                  "to what the next rank pushed and pushes the sum to the previous one (paper Fig. 4)"))
    else:
        report.append(ReportEntry(an.name, RULE, "note",
                                  f"consumer: SM mesh pull on {opts.comm_sms} programs, comm tile "
                                  + (f"{opts.comm_block} rows" if opts.comm_block else "128 rows")))
    launch = {"rule": RULE, "tensors": list(spec.tensors), "dim": spec.dim, "size_param": size_param,
              "index": spec.index, "topk": spec.topk,
              "via": opts.via, "mode": opts.mode, "order": opts.order, "comm_block": opts.comm_block,
              "comm_sms": opts.comm_sms, "channels_per_rank": opts.channels_per_rank}
    if opts.via == "sm" and opts.mode == "push" and spec.topk:
        raise AnnotationError("reduce_scatter with topk= reduces by pulling", file=an.file, line=an.where.line,
                              column=an.where.column, hint="drop mode='push' for the MoE reduction")
    if opts.via == "copy_engine":  # with top-k, the slots are summed before the copy engine moves them
        partners = ("rs_topk_reduce", "rs_reduce_received") if spec.topk else ("rs_reduce_received",)
    else:
        partners = ("rs_ring_consumer",) if opts.mode == "push" else ("rs_pull_consumer",)
    return RewritePlan(an.name, RULE, spec, opts, CHANNEL_PARAMS, tuple(insertions), partners, launch, tuple(report))


# --------------------------------------------------------------------------- partner kernel
@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def rs_pull_consumer(partial_ptr, peer_table, out_ptr, tlk_barriers, barrier_table, tlk_epoch, tlk_rank, tlk_world,
                     tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems, tlk_diag,
                     tlk_budget, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """Sum every rank's partial rows of this rank's channels into ``out_ptr`` (this rank's shard).

    ``partial_ptr`` is the local copy of the symmetric partial buffer: (rows, row_elems), or with
    ``TOPK > 1`` (MoE: GroupGEMM -> top-k reduce -> reduce-scatter, paper §7.2) (rows * TOPK,
    row_elems) whose rows ``t * TOPK + k`` are token ``t``'s expert slots, summed too. Channel by
    channel, the blocks of a channel are dealt round-robin over the programs; a program waits once per
    channel and rank, before its first block of the channel (a channel of ``n`` output elements is
    complete on a rank once its barrier word reaches ``epoch * n * TOPK``). Waiting per block instead
    polled a peer's flag over the link for every 1024 elements.
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblocks = tl.cdiv(tlk_rows_per_channel * row_elems, BLOCK)
    rank_lo = tlk_rank * tlk_rows_per_rank
    for j in range(0, tlk_channels_per_rank):
        ch = tlk_rank * tlk_channels_per_rank + j
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                      tlk_channels_per_rank)
        n = (hi - lo) * row_elems
        # this program's first block of the channel: blocks are dealt round-robin across the channels
        first = (pid + nprog - (j * nblocks) % nprog) % nprog
        if first < tl.cdiv(n, BLOCK):
            # once per channel and source (not per block): each wait polls a peer's flag over the link
            token = tl.zeros((), dtype=tl.int32)
            for p in range(0, tlk_world):
                src = (tlk_rank + 1 + p) % tlk_world
                src_barriers = tll.peer_ptr(barrier_table, tlk_barriers, src)
                token += tll.consumer_tile_wait(src_barriers, ch, 1, n.to(tl.int64) * TOPK * tlk_epoch, tlk_diag,
                                                tlk_budget)
            for off in range(first * BLOCK, n, nprog * BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < n
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                # four sources (and every top-k slot) at a time, unrolled: their loads are in flight
                # together; a pull is a round trip over the link, and one load at a time per thread
                # left the consumer latency-bound
                for p0 in range(0, tlk_world, 4):
                    for q in tl.static_range(4):
                        src = (tlk_rank + 1 + p0 + q) % tlk_world
                        live = mask & (tl.full([BLOCK], p0 + q, tl.int32) < tlk_world)
                        # whole symmetric buffers (checked at launch): a peer's rows load as vectors
                        peer = tll.peer_ptr_aligned(peer_table, partial_ptr, src)
                        if TOPK == 1:
                            x = tl.load(peer + lo * row_elems + idx + token, mask=live, other=0)
                            acc += x.to(tl.float32)
                        else:
                            row = lo + idx // row_elems
                            col = idx % row_elems
                            for k in tl.static_range(TOPK):
                                x = tl.load(peer + (row * TOPK + k) * row_elems + col + token, mask=live, other=0)
                                acc += x.to(tl.float32)
                tl.store(out_ptr + (lo - rank_lo) * row_elems + idx, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def rs_ring_consumer(partial_ptr, out_ptr, recv_ptr, recv_table, tlk_barriers, recv_flags, flag_table, tlk_epoch,
                     tlk_rank, tlk_world, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank,
                     row_elems, tlk_diag, tlk_budget, BLOCK: tl.constexpr):
    """Ring reduce-scatter (paper Fig. 4). For each channel ``j`` of every rank's rows, in ``world``
    steps: at step ``s`` this rank takes segment ``d = rank + s + 1`` (mod world), waits for its own
    partial rows of channel ``(d, j)`` (producer_tile_wait on the local barrier) and, after the first
    step, for the running sum the next rank pushed (peer_tile_wait), adds them, and pushes the sum to
    the previous rank (a store into its landing buffer + peer_tile_notify) -- or, at the last step (``d == rank``),
    writes it to this rank's output. ``recv_ptr`` is the symmetric (world, rows_per_rank, row_elems)
    landing buffer, slot ``d`` for segment ``d``; running sums travel in the output's dtype.
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    prev = (tlk_rank + tlk_world - 1) % tlk_world
    slot_elems = tlk_rows_per_rank * row_elems
    # the previous rank's landing buffer, a whole symmetric buffer (checked at launch): the running sums
    # are stored there as vectors
    prev_recv = tll.peer_ptr_aligned(recv_table, recv_ptr, prev)
    for j in range(pid, tlk_channels_per_rank, nprog):
        for s in range(0, tlk_world):
            d = (tlk_rank + s + 1) % tlk_world
            ch = d * tlk_channels_per_rank + j
            lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                          tlk_channels_per_rank)
            n = (hi - lo) * row_elems
            at = d * slot_elems + (lo - d * tlk_rows_per_rank) * row_elems
            token = tll.consumer_tile_wait(tlk_barriers, ch, 1, n.to(tl.int64) * tlk_epoch, tlk_diag, tlk_budget)
            if s > 0:
                token += tll.peer_tile_wait(recv_flags, ch, tlk_epoch, tlk_diag, tlk_budget)
            for off in range(0, n, BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < n
                acc = tl.load(partial_ptr + lo * row_elems + idx + token, mask=mask).to(tl.float32)
                if s > 0:
                    acc += tl.load(recv_ptr + at + idx + token, mask=mask).to(tl.float32)
                if s == tlk_world - 1:
                    tl.store(out_ptr + (lo - d * tlk_rows_per_rank) * row_elems + idx,
                             acc.to(out_ptr.dtype.element_ty), mask=mask)
                else:
                    tl.store(prev_recv + at + idx, acc.to(recv_ptr.dtype.element_ty), mask=mask)
            if s < tlk_world - 1:
                tll.peer_tile_notify(flag_table, recv_flags, ch, prev, 1)


@triton.jit
def rs_topk_reduce(partial_ptr, reduced_ptr, reduced_barriers, tlk_rank, tlk_world, tlk_rows, tlk_rows_per_rank,
                   tlk_rows_per_channel, tlk_channels_per_rank, row_elems, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """Hybrid reduce-scatter with ``topk=`` (MoE), the SM stage between the GEMM and the copy engine
    (GroupGEMM -> top-k reduce -> reduce-scatter, paper §7.2): sum each token's ``TOPK`` expert slot rows
    (rows ``t * TOPK + k`` of ``partial_ptr``, as the GEMM stored them) into its row ``t`` of ``reduced_ptr``,
    in fp32. Launched behind the GEMM on its stream (a rank's tokens are spread over every expert, so no
    channel is complete before the GEMM's last tiles). Channels go in the order the copy engine sends them
    (the next rank's first, this rank's own last); each program adds the elements it wrote to
    ``reduced_barriers[ch]`` once per channel (release), so a channel of ``n`` rows is complete at
    ``epoch * n * row_elems`` and the copy engine moves it, ``1 / TOPK`` of the slot rows' bytes, while the
    next channel is being summed."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    row_blocks = tl.cdiv(row_elems, BLOCK)  # a block: a piece of one token row
    dealt = 0  # blocks of the channels before: each channel's first block goes to the next program in turn
    for step in range(1, tlk_world + 1):
        dst = (tlk_rank + step) % tlk_world
        for j in range(0, tlk_channels_per_rank):
            ch = dst * tlk_channels_per_rank + j
            lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                          tlk_channels_per_rank)
            count = (hi - lo) * row_blocks
            written = 0
            for b in range((pid + nprog - dealt % nprog) % nprog, count, nprog):
                row = lo + b // row_blocks
                col = (b % row_blocks) * BLOCK + tl.arange(0, BLOCK)
                mask = col < row_elems
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                for k in tl.static_range(TOPK):  # the slots' loads in flight together
                    x = tl.load(partial_ptr + (row * TOPK + k) * row_elems + col, mask=mask)
                    acc += x.to(tl.float32)
                tl.store(reduced_ptr + row * row_elems + col, acc.to(reduced_ptr.dtype.element_ty), mask=mask)
                written += tl.sum(mask.to(tl.int32))
            if written > 0:
                tll.notify_value(reduced_barriers + ch, written.to(tl.int64))
            dealt += count


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def rs_reduce_received(recv_ptr, partial_ptr, out_ptr, recv_barriers, tlk_barriers, tlk_epoch, tlk_rank, tlk_world,
                       tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems, tlk_diag,
                       tlk_budget, BLOCK: tl.constexpr):
    """Hybrid reduce-scatter, SM half: into ``out_ptr``, sum this rank's own partial rows where they were
    written (``partial_ptr``, (rows, row_elems): complete once ``tlk_barriers[ch]`` reaches ``epoch * n``
    for a channel of ``n`` elements; no copy) and the partial rows every peer's copy engine delivered into
    the receive buffer ``recv_ptr`` (world, rows_per_rank, row_elems), slot ``p`` from rank ``p``, announced
    on ``recv_barriers[p * channels_per_rank + j]``. With ``topk=`` (MoE) these are the rows
    :func:`rs_topk_reduce` summed over each token's expert slots, and its channels."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rank_lo = tlk_rank * tlk_rows_per_rank
    slot_elems = tlk_rows_per_rank * row_elems
    nblocks = tl.cdiv(tlk_rows_per_channel * row_elems, BLOCK)  # a channel's rows are one range
    for j in range(0, tlk_channels_per_rank):
        ch = tlk_rank * tlk_channels_per_rank + j
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank)
        n = (hi - lo) * row_elems
        first = (pid + nprog - (j * nblocks) % nprog) % nprog  # blocks dealt round-robin across the channels
        if first < tl.cdiv(n, BLOCK):
            # once per channel and source, not per block (each wait is a poll and a barrier)
            token = tll.consumer_tile_wait(tlk_barriers, ch, 1, n.to(tl.int64) * tlk_epoch, tlk_diag, tlk_budget)
            for p in range(0, tlk_world - 1):
                src = (tlk_rank + 1 + p) % tlk_world
                token += tll.consumer_tile_wait(recv_barriers, src * tlk_channels_per_rank + j, 1, tlk_epoch,
                                                tlk_diag, tlk_budget)
            for off in range(first * BLOCK, n, nprog * BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < n
                acc = tl.load(partial_ptr + lo * row_elems + idx + token, mask=mask).to(tl.float32)
                for p in range(0, tlk_world - 1):
                    src = (tlk_rank + 1 + p) % tlk_world
                    x = tl.load(recv_ptr + src * slot_elems + (lo - rank_lo) * row_elems + idx + token, mask=mask)
                    acc += x.to(tl.float32)
                tl.store(out_ptr + (lo - rank_lo) * row_elems + idx, acc.to(out_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launch plan
@dataclass
class ReduceScatterContext:
    """The symmetric partial-result buffer of one shape and its channels."""

    sharding: RowSharding
    partial: torch.Tensor  # symmetric (M, row_elems) partial sums of this rank
    table: torch.Tensor
    channel: Channel
    diag: Diagnostics
    streams: Streams
    scratch: torch.Tensor
    recv: torch.Tensor | None = None  # what peers deliver: ring (world, rows_per_rank, ...); hybrid (2, ...) by call
    recv_channel: Channel | None = None
    reduced: torch.Tensor | None = None  # hybrid with top-k: (rows, ...) each token's slots summed (rs_topk_reduce)
    reduced_channel: Channel | None = None  # ... its channels, complete at epoch * rows(channel) * row_elems
    recv_table: torch.Tensor | None = None  # the ring's: every rank's copy of recv (vector stores)
    variants: set = field(default_factory=set)  # the rewritten kernel's variants loaded (warm_up)
    satisfied: torch.Tensor | None = None  # a world of one: every wait passes
    scatter_plans: dict = field(default_factory=dict)  # parity -> the hybrid copy engine's views (_scatter_plan)
    ready: Channel | None = None  # the hybrid's: word r is the last call rank r has reached (Launcher.handshake)

    @property
    def row_elems(self) -> int:
        """Elements of one row of the partial sums."""
        return math.prod(self.partial.shape[1:])

    @property
    def topk(self) -> int:
        """Partial rows per output row: a token's top-k expert slots (MoE, one contiguous range), else 1."""
        return self.partial.shape[0] // self.sharding.size

    @property
    def sent(self) -> torch.Tensor:
        """The rows the hybrid's copy engine sends and its reduction reads for this rank: each token's
        slots summed with top-k, else the partial sums."""
        return self.partial if self.reduced_channel is None else self.reduced

    @property
    def sent_channel(self) -> Channel:
        """The channels that say when rows of :attr:`sent` are complete."""
        return self.channel if self.reduced_channel is None else self.reduced_channel


class ReduceScatterLauncher(Launcher):
    """``kernel[grid](..., c_shard, ...)``: run the rewritten producer into a symmetric buffer and
    reduce this rank's rows from every rank into ``c_shard``."""

    #: :func:`rs_topk_reduce` on a GPU: 4096-element blocks, 8 warps, 4 programs per SM. On an H200 (MoE-4 and
    #: MoE-6 slot rows, 8192 tokens of 4096) 3.1-3.7 TB/s, against 2.1-2.5 TB/s for 1024-element blocks of 4
    #: warps, 8 per SM
    TOPK_REDUCE_GPU = {"BLOCK": 4096, "num_warps": 8, "per_sm": 4}

    def context(self, bound: dict) -> ReduceScatterContext:
        world = self.world()
        size = self.size_of(bound)
        sharding = self.sharding(world, size)
        (name,) = self.meta["tensors"]
        out = self.tensor_arg(bound, name, world)
        lo, hi = sharding.rank_range(world.rank)
        if out.dim() < 1 or out.shape[0] != hi - lo:
            raise LaunchError(
                f"{self.okernel.name}: rank {world.rank} must pass its output rows [{lo}, {hi}) as {name} "
                f"({hi - lo} rows, for {self.meta['size_param']}={size} over {world.world_size} ranks), "
                f"got shape {list(out.shape)}")
        topk = self.topk(bound)
        shape = (size * topk, *out.shape[1:])
        if math.prod(shape) >= 2**31:  # the partner kernels index the partial sums with 32-bit offsets
            raise LaunchError(f"{self.okernel.name}: the partial sums of one call would hold {math.prod(shape)} "
                              f"elements ({' x '.join(map(str, shape))}), past the 2**31 the reduce-scatter "
                              f"kernels address; split the call along {self.meta['size_param']}")
        key = (size, shape, str(out.dtype))
        ctx = self.contexts.get(key)
        if ctx is None:
            partial = symmetric_empty(shape, out.dtype)
            ctx = ReduceScatterContext(sharding, partial, vector_peer_table(partial), Channel(sharding.num_channels),
                                       Diagnostics(), Streams.for_world(world),
                                       torch.zeros(sharding.num_channels, dtype=torch.int64, device=world.device))
            if self.meta["via"] == "copy_engine" or self.meta["mode"] == "push":
                # the receive slots hold a peer's partial rows of this rank's tokens (top-k slots summed);
                # the hybrid's in two sets, odd and even calls (_launch_hybrid: no barrier between calls)
                sets = (2,) if self.meta["via"] == "copy_engine" else ()
                if world.world_size > 1:  # alone, nothing is received
                    ctx.recv = symmetric_empty((*sets, world.world_size, sharding.rows_per_rank, *out.shape[1:]),
                                               out.dtype)
                    ctx.recv_table = vector_peer_table(ctx.recv)
                ctx.recv_channel = Channel(sharding.num_channels)
            if self.meta["via"] == "copy_engine" and world.world_size > 1:
                ctx.ready = Channel(world.world_size)  # word r: the last call rank r has reached (handshake)
            if self.meta["via"] == "copy_engine" and topk > 1:
                ctx.reduced_channel = Channel(sharding.num_channels)
                if world.world_size > 1:  # alone, the summed slots go straight into the output
                    ctx.reduced = torch.empty((size, *out.shape[1:]), dtype=out.dtype, device=world.device)
            self.contexts[key] = ctx
        return ctx

    def topk(self, bound: dict) -> int:
        """Expert slots per output row (MoE top-k reduction), 1 without."""
        name = self.meta.get("topk")
        if not name:
            return 1
        value = bound.get(name)
        if not isinstance(value, int) or value < 1:
            raise LaunchError(f"{self.okernel.name}: {name}={value!r} must be a positive int (the top-k)")
        return value

    def _consumer(self, ctx: ReduceScatterContext, world, out, barriers, table, epoch: int, dry: bool = False) -> None:
        sh = ctx.sharding
        row_elems = ctx.row_elems
        if self.meta["mode"] == "push":  # the SM ring
            recv, flags = ctx.recv, ctx.recv_channel.barriers
            recv_table, flag_table = ctx.recv_table, ctx.recv_channel.peer_table
            if dry:  # a private landing buffer and flags: the dry run must not write into a peer
                recv, flags = torch.empty_like(recv), ctx.scratch
                recv_table = torch.full((world.world_size,), recv.data_ptr(), dtype=torch.int64, device=world.device)
                flag_table = table
            self.partner("rs_ring_consumer")[(max(1, min(self.meta["comm_sms"], sh.channels_per_rank)),)](
                ctx.partial, out, recv, recv_table, barriers, flags, flag_table, epoch, world.rank,
                world.world_size, sh.size, sh.rows_per_rank, sh.rows_per_channel, sh.channels_per_rank, row_elems,
                ctx.diag.buffer, ctx.diag.budget_ns, BLOCK=self.BLOCK)
            return
        meta = self.pull_meta(world, self.PULL_CONSUMER_GPU)
        grid = (max(1, min(self.meta["comm_sms"], sh.channels_per_rank * cdiv(sh.rows_per_channel * row_elems,
                                                                             meta["BLOCK"]))),)
        common = (ctx.partial, ctx.table, out, barriers, table, epoch, world.rank, world.world_size, sh.size,
                  sh.rows_per_rank, sh.rows_per_channel, sh.channels_per_rank, row_elems)
        self.partner("rs_pull_consumer")[grid](*common, ctx.diag.buffer, ctx.diag.budget_ns,
                                               TOPK=ctx.topk, **meta)

    def _programs(self, world, per_sm: int = REDUCE_PROGRAMS_PER_SM) -> int:
        """Programs of the hybrid's SM kernels on a GPU (``per_sm`` per SM: they run when the GEMM is done,
        and on ``comm_sms`` programs they would be latency-bound, one block's loads in flight per SM: 1.05 ms
        for 96 MB on 2 H200s, against the GEMM's 0.48 ms); ``comm_sms`` in the emulated world."""
        if world.device.type == "cuda":
            return per_sm * torch.cuda.get_device_properties(world.device).multi_processor_count
        return self.meta["comm_sms"]

    def _topk_reduce(self, ctx: ReduceScatterContext, world, reduced, barriers) -> None:
        """Sum each token's top-k slots into ``reduced`` (:func:`rs_topk_reduce`), flagging ``barriers``."""
        sh = ctx.sharding
        meta = self.pull_meta(world, self.TOPK_REDUCE_GPU)
        per_sm = meta.pop("per_sm", REDUCE_PROGRAMS_PER_SM)
        blocks = sh.size * cdiv(ctx.row_elems, meta["BLOCK"])
        self.partner("rs_topk_reduce")[(max(1, min(self._programs(world, per_sm), blocks)),)](
            ctx.partial, reduced, barriers, world.rank, world.world_size, sh.size, sh.rows_per_rank,
            sh.rows_per_channel, sh.channels_per_rank, ctx.row_elems, TOPK=ctx.topk, **meta)

    def _reduce(self, ctx: ReduceScatterContext, world, out, recv_barriers, barriers, epoch: int) -> None:
        # launched behind the side stream's wait for this rank's own rows: every SM is free by then
        sh = ctx.sharding
        blocks = sh.channels_per_rank * cdiv(sh.rows_per_channel * ctx.row_elems, self.BLOCK)
        self.partner("rs_reduce_received")[(max(1, min(self._programs(world), blocks)),)](
            ctx.recv[epoch % 2], ctx.sent, out, recv_barriers, barriers, epoch, world.rank, world.world_size, sh.size,
            sh.rows_per_rank, sh.rows_per_channel, sh.channels_per_rank, ctx.row_elems, ctx.diag.buffer,
            ctx.diag.budget_ns, BLOCK=self.BLOCK)

    def _scatter_plan(self, ctx: ReduceScatterContext, world, parity: int) -> list:
        """The hybrid copy engine's work for the receive slots of ``parity``, made once per context: for each
        destination rank (ring order: the next rank first, this rank last), for each of its channels, the
        channel, its rows and the (own rows, peer's receive slot) views to copy (``None`` for this rank's
        own rows, which stay where they are). Views made per call cost the host microseconds each."""
        plan = ctx.scatter_plans.get(parity)
        if plan is not None:
            return plan
        sh, sent = ctx.sharding, ctx.sent
        plan = []
        for step in range(1, world.world_size + 1):
            dst = (world.rank + step) % world.world_size
            dst_lo = sh.rank_range(dst)[0]
            peer_recv = peer_tensor(ctx.recv, dst) if dst != world.rank else None
            channels = []
            for j in range(sh.channels_per_rank):
                ch = dst * sh.channels_per_rank + j
                lo, hi = sh.channel_range(ch)
                views = None
                if peer_recv is not None and hi > lo:
                    views = (sent[lo:hi], peer_recv[parity, world.rank, lo - dst_lo:hi - dst_lo])
                channels.append((j, ch, hi - lo, views))
            plan.append((dst, peer_recv is not None, channels))
        ctx.scatter_plans[parity] = plan
        return plan

    def _scatter(self, ctx: ReduceScatterContext, world, epoch: int) -> None:
        """Hybrid, copy-engine half: as each channel's rows are complete here, copy them into the
        receive slot of the rank that owns them and tell it (ring order: the next rank first). This
        rank's own rows stay where they were written (the reduction reads them there); the stream only
        waits for them, so that the reduction, launched next, starts after the GEMM's last tile."""
        sh, row_elems = ctx.sharding, ctx.row_elems
        stream = ctx.streams.side
        for dst, remote, channels in self._scatter_plan(ctx, world, epoch % 2):
            for j, ch, rows, views in channels:
                if rows > 0:
                    # the host goes on enqueueing; a stuck wait is released and raised by finish()
                    rank_wait(ctx.sent_channel, ch, epoch * rows * row_elems, stream, block=False)
                    if views is not None:
                        rank_copy_data(*views, stream)
                if remote:
                    rank_notify(ctx.recv_channel, world.rank * sh.channels_per_rank + j, epoch, dst, stream)

    def _launch_hybrid(self, grid, call: dict, ctx: ReduceScatterContext, world, out) -> None:
        alone = world.world_size == 1
        reduced = out if alone else ctx.reduced  # with top-k, where the summed slots go: alone, the result

        def partners() -> None:
            if ctx.reduced_channel is not None:
                self._topk_reduce(ctx, world, reduced, ctx.scratch)
            if not alone:
                self._reduce(ctx, world, out, ctx.scratch, ctx.scratch, 0)

        self.warm_up(ctx, world, grid, call, partners=partners)
        epoch = ctx.channel.advance()
        ctx.recv_channel.advance()
        if ctx.reduced_channel is not None:
            ctx.reduced_channel.advance()
        main, side = ctx.streams.main, ctx.streams.side
        # No barrier between calls: a peer writes this rank's receive slots only, in the set of its call's
        # parity. Its copy for call n + 2 comes after its reduction of call n + 1, which waited for this rank's
        # copy of n + 1, which this rank's stream runs after its own reduction of call n: the set a peer
        # overwrites has been read. (A barrier here would cost the ranks' skew on every call: 0.1-0.5 ms on 2 H200s.)
        # The copies and the reduction start once every peer has reached this call (Launcher.handshake): the
        # reduction's waits then cover the peers' GPU work, not their hosts' time between calls. The GEMM waits
        # for nobody.
        args = self.channel_args(ctx.channel.barriers, epoch, world, ctx.sharding, ctx.diag)
        start = None
        if side is not None:
            start = torch.cuda.Event()
            start.record(main)
        if not alone:
            self.handshake(ctx.ready, world, epoch, main, side)
        self._produce(grid, call, args, ctx, epoch)  # the GEMM keeps every SM
        if ctx.reduced_channel is not None:  # behind the GEMM on its stream: no channel is complete before its end
            self._topk_reduce(ctx, world, reduced, ctx.reduced_channel.barriers)
        if not alone:
            if side is not None:
                side.wait_event(start)
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                self._scatter(ctx, world, epoch)
                self._reduce(ctx, world, out, ctx.recv_channel.barriers, ctx.sent_channel.barriers, epoch)
        self.finish(ctx)

    def launch(self, grid, bound: dict) -> None:
        world = self.world()
        ctx = self.context(bound)
        ctx.streams.follow_caller(world.device)
        if world.world_size == 1 and not self.meta.get("topk"):  # the output shard is the whole result
            self.alone(grid, dict(bound), ctx, world)
            return
        (name,) = self.meta["tensors"]
        out = bound[name]
        call = {**bound, name: ctx.partial}  # the kernel writes its partial sums to the symmetric buffer
        if self.meta["via"] == "copy_engine":
            self._launch_hybrid(grid, call, ctx, world, out)
            return
        self.warm_up(ctx, world, grid, call, partners=lambda: self._consumer(
            ctx, world, out, ctx.scratch, self.scratch_table(ctx, world), 0, dry=True))
        epoch = ctx.channel.advance()
        if ctx.recv_channel is not None:
            ctx.recv_channel.advance()
        main, side = ctx.streams.main, ctx.streams.side
        world.stream_barrier(main)  # every rank is done reading the previous call's partial sums
        args = self.channel_args(ctx.channel.barriers, epoch, world, ctx.sharding, ctx.diag)
        if side is not None:
            # the consumer takes its few SMs first; the producer never waits for it
            side.wait_stream(main)
            with torch.cuda.stream(side):
                self._consumer(ctx, world, out, ctx.channel.barriers, ctx.channel.peer_table, epoch)
            self.kernel[grid](**call, **args)
        else:
            self._produce(grid, call, args, ctx, epoch)
            self._consumer(ctx, world, out, ctx.channel.barriers, ctx.channel.peer_table, epoch)
        self.finish(ctx)

    def _produce(self, grid, call: dict, args: dict, ctx: ReduceScatterContext, epoch: int) -> None:
        """Run the rewritten producer. On the race-exposing schedule (emulated, :mod:`tilelink.runtime.races`)
        the partial sums start as poison and each channel's rows are taken at the moment the producer's notifies
        complete it, as a consumer polling that channel would read them; the consumer then reads those: a store
        after the notify that publishes it, or a notify that counts more than was stored, changes the result."""
        if not races.enabled() or ctx.partial.device.type != "cpu":
            self.kernel[grid](**call, **args)
            return
        sh, topk, row_elems, partial = ctx.sharding, ctx.topk, ctx.row_elems, ctx.partial
        barriers = args["tlk_barriers"]
        races.poison_(partial)
        taken: dict[int, torch.Tensor] = {}

        def take(ch: int) -> None:
            lo, hi = sh.channel_range(ch)
            if ch not in taken and int(barriers[ch]) >= epoch * (hi - lo) * row_elems * topk:
                taken[ch] = partial[lo * topk:hi * topk].clone()

        with races.watch(barriers, on_release=take):
            self.kernel[grid](**call, **args)
        for ch, rows in taken.items():
            lo, hi = sh.channel_range(ch)
            partial[lo * topk:hi * topk].copy_(rows)
