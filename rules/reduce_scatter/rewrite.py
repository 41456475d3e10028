"""The rewrite of the reduce_scatter rule: where its waits or notifies go in the user's kernel."""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import re
from typing import NamedTuple

import libcst as cst
import libcst.matchers as m

from tilelink.analysis import (
    _EFFECTS,
    ANY_AXIS,
    BranchSide,
    KernelAnalysis,
    Where,
    _arg,
    _bare,
    _conjuncts,
    _returned_value,
    _terms,
    code,
    expanded,
    helpers_that,
    names_in,
    names_outside_loads,
    parse_offsets,
    position_helpers,
    position_reads,
    widened_value,
)
from tilelink.errors import AnnotationError
from tilelink.plan import Insertion, ReduceScatterLaunch, ReportEntry, RewritePlan
from tilelink.rules.emit import (
    CHANNEL_PARAMS,
    MAPPING_ARGS,
    channels_of_row_vector,
    channels_of_tile,
    constant_height,
    describe_rows,
    plus,
    remap_order,
    tile_end,
    tile_rows,
)
from tilelink.spec import Options, ReduceScatterSpec
from tilelink.tile_rows import Poly
from tilelink.tile_rows import _add as poly_add
from tilelink.tile_rows import _mul as poly_mul
from tilelink.tile_rows import code as poly_code
from tilelink.tile_rows import show as poly_show

RULE = "reduce_scatter"
DEFAULTS = dict(via="sm", mode="pull", order="ring", comm_sms=16)


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
    """``(start, SIZE)`` when ``cols`` is assigned once, as ``start + tl.arange(0, SIZE)`` (no modulo; ``start`` 0 for
    ``tl.arange(0, SIZE)`` alone), before
    the store, and every binding of a name of ``start`` comes before that assignment (none after it, even
    after the store in a loop) and is not the target of a loop that ends before the store: ``start`` then
    means at the store what it meant there."""
    values, binds = an.values.get(cols, ()), an.bindings.get(cols, ())
    reaching = an.reaching_at_stores.get((cols, access.where))
    if reaching is not None:  # bound again (made anew before the store): the binding the store's address reads
        values, binds = (reaching[0],), ((reaching[1], None),)
    if len(values) != 1 or len(binds) != 1:
        return None
    # `cols = tl.arange(0, BLOCK_N)` alone: the columns from 0 (a row a program's)
    parsed = parse_offsets(_bare(cst.parse_expression(values[0])), wraps=False, alone=True)
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
    return a.loop is not None and constant_height(an, t) and not t.dynamic


#: the loop body that adds ``tlk_done`` to channel ``tlk_first + tlk_i`` (a notify loop over the channels)
_NOTIFY_CHANNEL = ("    tll.producer_tile_notify(tlk_barriers, tlk_first + tlk_i, tlk_done, tlk_barriers, tlk_rank, "
                   "tlk_world, 0)")


def _notify_rows(an: KernelAnalysis, t) -> tuple[str, ...]:
    """Add ``tlk_cols`` times its rows of the tile to each channel the tile's rows span. With a
    compile-time tile height (a power of two, as tile sizes are), one loop-free primitive (a flattened
    tile loop stays flattened); otherwise a loop over the channels."""
    if constant_height(an, t):
        return (f"tll.producer_tile_notify_rows(tlk_barriers, {t.start}, {tile_end(t)}, tlk_cols,\n"
                f"    {MAPPING_ARGS}, {t.size})",)
    return (
        channels_of_tile(t),
        "for tlk_i in range(0, tlk_count):",
        f"    tlk_done = tlk_cols * tlm.tl_channel_overlap(\n"
        f"        tlk_first + tlk_i, {t.start}, {tile_end(t)},\n        {MAPPING_ARGS})",
        _NOTIFY_CHANNEL,
    )


def _one_element(an: KernelAnalysis, a, t) -> bool:
    """Whether the pointer store ``a`` of tile ``t`` writes one element a row at the row's start (a GEMV's `y_ptr +
    row`, a tile of one row given by its start): its address, not its value, says how many elements it writes."""
    return _by_address(a, t) and a.where not in an.row_columns


#: why a loop that holds a store and keeps its rows is not a sweep (``KernelAnalysis.sweep_misses``): what the store
#: does on the loop's steps, and what to write instead
_SWEEP_MISSES = {
    "exits": ("stores the same rows of {tensor!r} on every iteration (line {line}), and a step may leave it before the "
              "store (a `break`, `continue` or `return`): the row's channel counts each step's columns, and one a step "
              "skips is never counted",
              "store on every step of the loop (mask what a step must not write), and return only after it"),
    "same": ("stores the same elements of {tensor!r} on every iteration (line {line}): each notify counts what its "
             "store wrote, so the row's channel would count them once an iteration and complete before the rest of "
             "the row is stored",
             "store once, after the loop; or move the columns with the loop (`for off in range(0, N, BLOCK_N):` with "
             "`cols = off + tl.arange(0, BLOCK_N)`), each iteration storing a block of its own"),
    "columns": ("stores the same rows of {tensor!r} on every iteration (line {line}), but TileLink cannot tell that "
                "each iteration stores other columns than the others, made once on each step before the store: each "
                "notify counts what its store wrote, so a column stored twice would complete its row's channel before "
                "the rest of it is stored",
                "step the loop by the columns' block and start the columns at its target (`for off in range(0, N, "
                "BLOCK_N):` with `cols = off + tl.arange(0, BLOCK_N)`), or count the blocks (`for t in range(0, "
                "tl.cdiv(N, BLOCK_N)):` with `cols = t * BLOCK_N + tl.arange(0, BLOCK_N)`)"),
}


def _sweep_refused(a, loop: Where, why: str) -> AnnotationError:
    """The refusal of the store ``a`` directly in the loop at ``loop``, which is not a sweep for ``why``."""
    reason, hint = _SWEEP_MISSES[why]
    return AnnotationError(f"the loop at line {loop.line} " + reason.format(tensor=a.tensor, line=a.where.line),
                           file=a.where.file, line=a.where.line, column=a.where.column, hint=hint)


def _and_more(an: KernelAnalysis, mask: str) -> bool:
    """Whether the mask ``mask`` may be more than the columns' bound: a conjunction (`(cols < N) & (row < M)`), also
    through a local (`mask = (cols < N) & (cols < 4)`, one made more than once too)."""
    node = cst.parse_expression(mask)
    if isinstance(_bare(node), cst.Name) and _bare(node).value in an.bindings:  # type: ignore[attr-defined]
        values = an.values.get(_bare(node).value, ())  # type: ignore[attr-defined]
        if len(values) != 1 or len(an.bindings[_bare(node).value]) != 1:  # type: ignore[attr-defined]
            return True
        node = cst.parse_expression(values[0])
    return bool(m.findall(node, m.BinaryOperation(operator=m.BitAnd()) | m.BooleanOperation() | m.Call()))


def _by_address(a, t) -> bool:
    """Whether the pointer store ``a`` of tile ``t`` writes one row, by its address: one element (`y_ptr + row`) or a
    vector of the row's columns (`y_ptr + row * stride + cols`). A scalar address takes a value of any shape (a vector
    left unsummed broadcasts onto it) and writes one element: the address, not the value, counts what it writes."""
    return not a.descriptor and t.ndim == 1 and t.size == "1" and t.offsets is None


def _stored_per_element(a, by_address: bool = False) -> str:
    """Elements the store wrote, per element of its value (``by_address``: of its address, for a tile of one row given
    by its start, where a scalar address takes a value of any shape and writes one element): 1 where its mask
    holds."""
    # a value with effects (`x + 0 * tl.atomic_add(...)`) is not written again for its shape: the notify would run
    # them a second time; the address has the stored block's shape too
    by_address = by_address or bool(m.findall(cst.parse_expression(a.value), _EFFECTS))
    shape = f"({a.pointer if by_address else a.value}).shape"
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
        if a.where in an.row_columns:  # one row a program: the elements its address and mask let through
            columns = f"tl.sum({_stored_per_element(a, by_address=True)})"
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
          "flip", "split", "T"}
#: calls whose value holds each of their arguments' (their elements side by side)
_PAIRS = {"join", "interleave", "cat"}
#: calls whose value does not depend on data (index arithmetic, constructors)
_INDEX = {"arange", "program_id", "num_programs", "cdiv", "multiple_of", "max_contiguous", "static_range", "range",
          "full", "zeros", "zeros_like", "full_like"}

# what a value is, as far as the reduction is concerned: the partial sums (a tl.dot, an accumulator of them),
# data read by this rank (a load), a constant, or zero
_ZERO, _CONST, _DATA, _SUM = "zero", "constant", "data", "partial sums"
# a term read by the first rank only (`first_rank_terms`: zeros on the others): summed over the ranks it is itself,
# as the partial sums are the full problem's; it may be added to them, scaled by a constant, chosen or reshaped, but
# not multiply this rank's data (a dot operand, `a * bias`: the other ranks' products would be lost) nor be an
# argument of a non-linear function, as the partial sums may not
_ONCE = "a term read by the first rank only"
_SUMMED = (_SUM, _ONCE)


#: the names holding addresses made from the pointer parameters the launcher replaces by zeros on every rank but
#: the first (:func:`first_rank_terms`), while the stored values are classified
_FIRST_RANK: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("first_rank", default=frozenset())
#: the parameters that hold the K extent of a loop that sums (`K` of `range(0, tl.cdiv(K, BLOCK_K))`): each rank
#: passes its own slice's, so a value scaled by one differs between the ranks (`acc / K`, `bias * K`)
_SLICED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("sliced", default=frozenset())


@contextlib.contextmanager
def _holding(var: contextvars.ContextVar, value):
    """``var`` set to ``value`` within the block."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def _loop_targets(an: KernelAnalysis) -> dict[tuple[Where, Where], str]:
    """Each `for` loop (where it starts and ends) -> its target."""
    return {(b, e): n for n, binds in an.bindings.items() for b, e in binds if e is not None}


class _Epilogue(Exception):
    def __init__(self, node: cst.CSTNode, why: str):
        super().__init__(why)
        self.source, self.why = code(node), why
        self.site: Where | None = None  # the statement (an assignment, an update, the store) that does it
        self.tensor = ""  # the annotated tensor of the store whose value it is
        self.carried = False  # the accumulator is scaled within the loop that sums it (see `_check_carried`)


def _bindings(an: KernelAnalysis, name: str) -> list[tuple[str, Where | None]]:
    """Each value bound to ``name`` (assignments, then in-place updates) with the statement that binds it."""
    pairs = []
    for values, sites in ((an.values.get(name, ()), an.assignments.get(name, ())),
                          (an.updates.get(name, ()), an.update_sites.get(name, ()))):
        pairs += [(src, sites[i] if i < len(sites) else None) for i, src in enumerate(values)]
    return pairs


def _skipped(an: KernelAnalysis, site: Where | None, skip: frozenset[BranchSide]) -> bool:
    return site is not None and any(side in skip for side in an.branch_sides.get(site, ()))


def _join(a: str, b: str, node: cst.CSTNode) -> str:
    kinds = {a, b} - {_ZERO}
    if kinds & set(_SUMMED) and kinds & {_CONST, _DATA}:  # `out = acc` on one path, `out = 1.0` on another
        raise _Epilogue(node, "a value that is the partial sums on one path and not on another")
    for kind in (_SUM, _ONCE, _DATA, _CONST):
        if kind in kinds:
            return kind
    return _ZERO


def _classify(an: KernelAnalysis, node: cst.BaseExpression, visiting: dict[str, str],
              skip: frozenset[BranchSide] = frozenset()) -> str:
    """What ``node`` is (see above); raises :class:`_Epilogue` where the reduction of the ranks' stored values
    would not be the value of the full problem. ``visiting``: the names being classified, each with the kind its
    own earlier value is taken to have in its updates (``acc = acc * tl.sigmoid(acc)``). ``skip``: branch sides
    whose bindings are left out (sides no launch that compiles takes)."""
    if isinstance(node, cst.Name):
        if node.value in visiting:
            return visiting[node.value]
        every = _bindings(an, node.value)
        if not every:
            return _CONST  # a parameter, a constant, `None`
        sources = [(src, site) for src, site in every if not _skipped(an, site, skip)]
        if not sources:
            return _ZERO  # bound only in branches no compiled launch takes

        def joined(own: str, accumulated: bool = False) -> str:
            kind = _ZERO
            for src, site in sources:
                value = cst.parse_expression(src)
                added = _added(value, node.value) if accumulated else None
                if added is not None and _data_product(an, added, {**visiting, node.value: own}, skip):
                    kind = _join(kind, _SUM, node)  # a product of this rank's data added: partial sums too
                    continue
                targets = an.unpacked.get(site, ()) if site is not None else ()
                if isinstance(value, (cst.Tuple, cst.List)) and node.value in targets and len(targets) == len(
                        value.elements) and targets.count(node.value) == 1:
                    value = value.elements[targets.index(node.value)].value  # `out, rest = f(acc), acc`: `f(acc)`
                try:
                    this = _classify(an, value, {**visiting, node.value: own}, skip)
                except _Epilogue as exc:
                    exc.site = exc.site or site  # the innermost binding the failure is in
                    raise
                # a mix of the partial sums and another value over the bindings is no one binding's doing
                kind = _join(kind, this, node)
            return kind

        # first with the name's own earlier value neutral: whether any of its values brings the partial sums in;
        # if one does, its updates are read again with that value as the partial sums, so that an update which
        # applies a function to the accumulator in place is judged like any other use of the partial sums
        try:
            kind = joined(_ZERO)
        except _Epilogue as neutral:
            # `acc = f(acc)` on one path, `acc = tl.dot(...)` on another: `f` of the partial sums says more
            try:
                joined(_SUM)
            except _Epilogue:
                raise
            raise neutral from None
        if kind == _DATA and any(_data_product(an, _added(cst.parse_expression(src), node.value),
                                               {**visiting, node.value: _ZERO}, skip) for src, _ in sources):
            # this rank's data summed into an accumulator (`acc += a[:, None] * b[None, :]`, a rank-1 update over
            # its slice of K) is its partial sums, as a tl.dot's are: its other bindings are read again with it so
            # (`acc = tl.maximum(acc, 0.0)` after the loop applies a function to them)
            kind = joined(_SUM, accumulated=True)
        elif kind in _SUMMED:
            kind = joined(kind)
        if kind == _SUM:
            _check_carried(an, node.value, sources)
        return kind
    if isinstance(node, (cst.Integer, cst.Float)):
        return _ZERO if float(node.value.replace("_", "")) == 0 else _CONST
    if isinstance(node, cst.Attribute) and node.attr.value == "T":  # `acc.T`: the values, transposed
        return _classify(an, node.value, visiting, skip)
    if isinstance(node, (cst.SimpleString, cst.Attribute)) and not isinstance(node, cst.Call):
        return _CONST  # a string, a type (`c_ptr.dtype.element_ty`), a shape
    if isinstance(node, cst.Subscript):
        return _classify(an, node.value, visiting, skip)
    if isinstance(node, cst.UnaryOperation):
        kind = _classify(an, node.expression, visiting, skip)
        if kind in _SUMMED and not isinstance(node.operator, (cst.Minus, cst.Plus)):
            raise _Epilogue(node, f"`{code(node.operator)}` of the partial sums")
        return kind
    if isinstance(node, cst.BinaryOperation):
        left, right = _classify(an, node.left, visiting, skip), _classify(an, node.right, visiting, skip)
        op = node.operator
        if left not in _SUMMED and right not in _SUMMED:
            return _join(left, right, node) if _ZERO not in (left, right) or not isinstance(op, cst.Multiply) \
                else _ZERO
        summed, other = (left, right) if left in _SUMMED else (right, left)
        sliced = _SLICED.get() & _names_through(an, node.right if left in _SUMMED else node.left)
        if sliced and isinstance(op, (cst.Multiply, cst.Divide)):
            raise _Epilogue(node, f"the partial sums scaled by `{sorted(sliced)[0]}`, the K extent of the loop that "
                                  f"sums them, which each rank passes as its own slice's")
        if isinstance(op, (cst.Add, cst.Subtract)):
            if other in (*_SUMMED, _ZERO):
                return _SUM if _SUM in (left, right) else summed
            raise _Epilogue(node, f"a {other} term added to the partial sums, which every rank would add")
        if isinstance(op, cst.Multiply):
            if other in _SUMMED:
                raise _Epilogue(node, "a product of partial sums")
            if summed == _ONCE and other == _DATA:
                raise _Epilogue(node, f"{_ONCE} multiplying this rank's data")
            return _ZERO if other == _ZERO else summed
        if isinstance(op, cst.Divide) and left in _SUMMED and right not in _SUMMED and not (
                left == _ONCE and right == _DATA):
            return left
        raise _Epilogue(node, f"`{code(op).strip()}` with the partial sums")
    if isinstance(node, cst.Call):
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
            else ""
        args = [a.value for a in node.args if a.keyword is None or a.keyword.value in ("acc", "input", "x")]
        if name == "load" or (isinstance(func, cst.Attribute) and name in ("load", "gather")):
            first = _FIRST_RANK.get()
            pointer = _arg(node, 0, "pointer") if m.matches(func, m.Attribute(value=m.Name("tl"))) else (
                func.value if isinstance(func, cst.Attribute) else None)
            # zeros on every rank but the first: summed over the ranks, the value once, as the partial sums are
            return _ONCE if first and pointer is not None and names_in(pointer) & first else _DATA
        if name in ("multiple_of", "max_contiguous") and args:  # a compiler hint: its argument's values
            return _classify(an, args[0], visiting, skip)
        if name in ("full", "full_like") and len(args) > 1:  # every element the fill value
            return _classify(an, args[1], visiting, skip)
        if name in _INDEX:
            return _ZERO if name in ("zeros", "zeros_like") or (
                name == "full" and len(args) > 1 and _classify(an, args[1], visiting, skip) == _ZERO) else _CONST
        if name == "dot":
            kinds = [_classify(an, a, visiting, skip) for a in args]
            if kinds[:2].count(_SUM) == 2:
                raise _Epilogue(node, "a product of partial sums")
            if _ONCE in kinds[:2]:
                raise _Epilogue(node, f"{_ONCE} multiplying this rank's data")
            return _SUM if len(kinds) < 3 or kinds[2] in (_SUM, _ZERO) else _join(_SUM, kinds[2], node)
        if name == "where" and len(args) == 3:
            if _classify(an, args[0], visiting, skip) in _SUMMED:
                raise _Epilogue(node, "a choice by the values of the partial sums")
            return _join(_classify(an, args[1], visiting, skip), _classify(an, args[2], visiting, skip), node)
        if name in _PAIRS:  # `tl.join(acc, bias)`: the stored elements are each argument's
            kind = _ZERO
            for arg in args:
                kind = _join(kind, _classify(an, arg, visiting, skip), node)
            return kind
        if name in _SHAPE:
            first = func.value if isinstance(func, cst.Attribute) and not (
                isinstance(func.value, cst.Name) and func.value.value == "tl") else (args[0] if args else None)
            kind = _classify(an, first, visiting, skip) if first is not None else _CONST
            if kind in _SUMMED and name in ("to", "cast") and _to_integer(node):
                raise _Epilogue(node, "a conversion of the partial sums to an integer type, which truncates them")
            # a sum over an axis of this rank's data (`tl.sum(w * x[None, :], axis=1)`, a GEMV's K slice) is its
            # partial sums, as a tl.dot of them is: a function applied to it afterwards is judged as on a dot's
            return _SUM if name in ("sum", "cumsum") and kind == _DATA else kind
        if isinstance(func, cst.Name) and name in an.helpers:
            # a helper of the kernel's file: what it returns, written out over the arguments, where TileLink reads
            # its body (straight-line, one return); otherwise its value is unknown, and may be partial sums (a
            # helper returning `tl.dot(a, b, acc)`) if it reads this rank's data
            returned = _helper_return(an, node)
            if returned is not None:
                try:
                    return _classify(an, returned, visiting, skip)
                except _Epilogue as inner:  # said of the call the user wrote, with what its return does
                    raise _Epilogue(node, f"the helper `{name}` applied to the partial sums, whose return goes "
                                          f"through {inner.why} (`{inner.source}`)") from None
            every = [_classify(an, a.value, visiting, skip) for a in node.args]
            if set(every) & {*_SUMMED, _DATA}:
                said = "the partial sums" if set(every) & set(_SUMMED) else \
                    "this rank's data, whose value may be partial sums"
                raise _Epilogue(node, f"the helper `{name}` (TileLink does not read its body) applied to {said}")
            return _CONST
        kinds = [_classify(an, a, visiting, skip) for a in args]
        if isinstance(func, cst.Attribute) and not (isinstance(func.value, cst.Name) and func.value.value == "tl"):
            kinds.append(_classify(an, func.value, visiting, skip))
        if set(kinds) & set(_SUMMED):
            what = f"`{name}`" if name in _NONLINEAR or code(func).startswith("tl.") else \
                f"the helper `{name}` (TileLink does not read its body)"
            raise _Epilogue(node, f"{what} applied to the partial sums")
        if isinstance(func, cst.Name) and _DATA in kinds:
            raise _Epilogue(node, f"`{name}` (TileLink does not know it) applied to this rank's data, whose value "
                                  f"may be partial sums")
        return _DATA if _DATA in kinds else _CONST
    if isinstance(node, (cst.Tuple, cst.List)):  # a tuple unpacked into names, each taken as the whole of it
        kind = _ZERO
        for element in node.elements:
            kind = _join(kind, _classify(an, element.value, visiting, skip), node)
        return kind
    if isinstance(node, cst.Comparison):
        kinds = [_classify(an, node.left, visiting, skip)] + [_classify(an, c.comparator, visiting, skip)
                                                        for c in node.comparisons]
        if set(kinds) & set(_SUMMED):
            raise _Epilogue(node, "a comparison of the partial sums")
        return _DATA if _DATA in kinds else _CONST
        return _DATA if _DATA in kinds else _CONST
    kinds = [_classify(an, child, visiting, skip) for child in node.children if isinstance(child, cst.BaseExpression)]
    if set(kinds) & set(_SUMMED):
        raise _Epilogue(node, "an expression TileLink cannot follow, on the partial sums")
    return _DATA if _DATA in kinds else _CONST


def _names_through(an: KernelAnalysis, node: cst.BaseExpression, outside_loops: bool = True) -> set[str]:
    """The names ``node`` reads, and those the values of those names read, in turn; with ``outside_loops``, only
    through the values bound outside every loop (`inv = 1.0 / K`; not a loop's step, `k = step % k_tiles`, which is no
    scale by the extent)."""
    loops = _loops(an) if outside_loops else set()
    seen, todo = set(), list(names_in(node))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [n for src, w in _bindings(an, name) if not _within(w, loops)
                 for n in names_in(cst.parse_expression(src))]
    return seen


def _helper_return(an: KernelAnalysis, call: cst.Call) -> cst.BaseExpression | None:
    """What the helper ``call`` calls returns, written out over its arguments (straight-line helpers of one
    ``return``, ``analysis._returned_value``); ``None`` where TileLink does not read it."""
    found = cst.parse_module(an.helpers[call.func.value]).body  # type: ignore[attr-defined]
    fn = found[0] if len(found) == 1 and isinstance(found[0], cst.FunctionDef) else None
    return None if fn is None else _returned_value(fn, call)


def _check_mask_by_position(an: KernelAnalysis, a, rule: str) -> None:
    """A store's mask that reads data (``c_mask & (acc > 0)``, a loaded flag) leaves elements of the tile unstored on
    some calls: their channels, which count every element of their rows, would never complete, and the reduction
    would wait for them until its timeout. Refused: the mask must bound the tile by position (program ids, the
    arguments, ``tl.arange``). Rows from an ``index=`` count what they store and are not concerned."""
    try:
        kind = _classify(an, cst.parse_expression(a.mask), {})
    except _Epilogue:
        kind = _SUM
    if kind not in (_DATA, *_SUMMED) and _reads_a_load(an, a.mask):
        kind = _DATA  # through a value the classification takes as a constant (`tl.where(flag > 0, True, False)`)
    if kind in (_DATA, *_SUMMED):
        raise AnnotationError(
            f"the mask of the store to {a.tensor!r} reads {'the partial sums' if kind == _SUM else 'loaded data'} "
            f"(`{a.mask}`): the elements it leaves out are never stored, while {rule} waits for every element of "
            f"a finished tile's rows, so the reduction would wait for them until its timeout",
            file=a.where.file, line=a.where.line, column=a.where.column,
            hint="mask the store by position only (`(offs_m[:, None] < M) & (offs_n[None, :] < N)`), and choose the "
                 "value with tl.where where it depends on data")


def _added(value: cst.BaseExpression, name: str) -> cst.BaseExpression | None:
    """What ``name + x``, ``x + name`` or ``name - x`` adds to the accumulator ``name`` (an update ``name += x``
    reads so); ``None`` for any other value."""
    if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, (cst.Add, cst.Subtract)):
        return None
    if m.matches(_bare(value.left), m.Name(name)):
        return value.right
    if isinstance(value.operator, cst.Add) and m.matches(_bare(value.right), m.Name(name)):
        return value.left
    return None


def _cast_of(node: cst.BaseExpression, name: str) -> bool:
    """``name`` itself or converted to a float type (``name.to(tl.float32)``, ``tl.cast(name, ...)``): the same
    values, rounded (a conversion to an integer type truncates them)."""
    node = _bare(node)
    if m.matches(node, m.Name(name)):
        return True
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.args and not _to_integer(node):
        if node.func.attr.value == "to":
            return _cast_of(node.func.value, name)
        if node.func.attr.value == "cast" and m.matches(node.func.value, m.Name("tl")):
            return _cast_of(node.args[0].value, name)
    return False


def _to_integer(call: cst.Call) -> bool:
    """A conversion (``x.to(tl.int32)``, ``tl.cast(x, tl.uint8)``) to an integer type, which truncates."""
    func = call.func
    which = 1 if m.matches(func, m.Attribute(value=m.Name("tl"), attr=m.Name("cast"))) else 0
    dtype = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "dtype"), None)
    positional = [a.value for a in call.args if a.keyword is None]
    dtype = dtype or (positional[which] if len(positional) > which else None)
    return dtype is not None and re.fullmatch(r"(tl\.)?u?int\d+", code(dtype).strip()) is not None


def _carried_slot(value: cst.BaseExpression, name: str) -> list[cst.BaseExpression] | None:
    """What an update that carries the accumulator ``name`` unscaled adds to it (``acc + x``, ``x + acc``,
    ``acc - x``, ``tl.dot(a, b, acc)``, the accumulator converted), or ``None`` where ``value`` holds it otherwise."""
    value = _bare(value)
    if _cast_of(value, name):
        return []
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract)):
        if _cast_of(value.left, name):
            return [value.right]
        if isinstance(value.operator, cst.Add) and _cast_of(value.right, name):
            return [value.left]
    if isinstance(value, cst.Call) and m.matches(value.func, m.Attribute(attr=m.Name("dot"))):
        positional = [a for a in value.args if a.keyword is None]
        acc = next((a for a in value.args if a.keyword is not None and a.keyword.value == "acc"), None)
        acc = acc or (positional[2] if len(positional) > 2 else None)
        if acc is not None and _cast_of(acc.value, name):
            return [a.value for a in value.args if a is not acc]
    return None


#: what to write instead of an accumulator carried other than by adding its terms (`_check_carried`)
_CARRIED_HINT = ("add the terms to the accumulator unscaled in the loop (`acc += tl.dot(a, b)`, or `acc += "
                 "tl.dot(a, b) * s` to scale a term) and scale the sum once after the loop")


def _loops(an: KernelAnalysis) -> set[tuple[Where, Where]]:
    """Where each loop of the kernel starts and ends (`for` loops through their targets' bindings, `while` loops)."""
    return {(b, e) for binds in an.bindings.values() for b, e in binds if e is not None} | set(an.while_loops)


def _inside(site: Where, loop: tuple[Where, Where]) -> bool:
    return (loop[0].line, loop[0].column) < (site.line, site.column) <= (loop[1].line, loop[1].column)


def _within(site: Where | None, loops) -> bool:
    """Whether ``site`` is inside one of ``loops`` (``None``, a parameter's default, is in none)."""
    return site is not None and any(_inside(site, lp) for lp in loops)


def _innermost(loops, at: Where) -> tuple[Where, Where] | None:
    """The innermost of ``loops`` around ``at``."""
    return max((lp for lp in loops if _inside(at, lp)), key=lambda lp: (lp[0].line, lp[0].column), default=None)


#: a product or a sum of this rank's data: what makes a binding an accumulator of partial sums
_SUMS = m.Call(func=m.Attribute(attr=m.Name("dot") | m.Name("sum")) | m.Name("dot"))


def _without_loads(value: cst.BaseExpression) -> tuple[cst.BaseExpression, bool]:
    """``value`` with each load (``tl.load``, a descriptor's ``.load``, ``gather``) as the name ``_loaded``, and
    whether it had one: what a load reads is where this step's data is, not part of the value."""
    loads = m.findall(value, m.Call(func=m.Attribute(attr=m.Name("load") | m.Name("gather"))))
    for call in loads:
        value = value.deep_replace(call, cst.Name("_loaded")) if value is not call else cst.Name("_loaded")
    return value, bool(loads)


def _unbroadcast(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` without its parentheses and broadcasts (``offs_k[None, :]`` -> ``offs_k``)."""
    node = _bare(node)
    while isinstance(node, cst.Subscript) and all(isinstance(e.slice, cst.Slice) or (
            isinstance(e.slice, cst.Index) and m.matches(e.slice.value, m.Name("None"))) for e in node.slice):
        node = _bare(node.value)
    return node


def _check_carried(an: KernelAnalysis, name: str, sources: list[tuple[str, Where | None]]) -> None:
    """The partial sums ``name`` must be carried through the loop that sums them unscaled: each rank runs that loop
    over its own slice of K, so ``acc = tl.dot(a, b, acc * 0.5)`` weighs a term by its place in the rank's slice,
    not in the full loop, and the ranks' sum is not the full problem's. In every loop around each binding that
    reads ``name`` (unless a binding of it that does not read it runs first on every pass: a persistent kernel's
    `acc = tl.zeros(...)` per tile), every binding of ``name`` that reads it must add to it (``acc += x``,
    ``tl.dot(a, b, acc)``) values that do not read it, or convert it to another float type; what it adds may not
    depend on the step's place in the loop other than through what it loads (``* (k + 1)``, ``* w`` with ``w``
    halved on each step); and it may not be started again inside the loop, unless the loop stores the tensor and
    starts it right after a store of it (a persistent kernel's flattened loop). A loop whose passes store the tensor
    and sum in a loop inside it (a persistent kernel's tile loop) runs alike on every rank: a scale across its
    passes is left to the linearity check."""
    loops = _loops(an)
    targets = _loop_targets(an)
    inside = _inside

    def pos(w: Where) -> tuple[int, int]:
        return (w.line, w.column)

    def reads(node: cst.BaseExpression) -> bool:  # reads `name`, through the values of the names it reads
        todo, seen = [node], set()
        while todo:
            for other in names_in(todo.pop()) - seen:
                if other == name:
                    return True
                seen.add(other)
                todo += [cst.parse_expression(src) for src, _ in _bindings(an, other)]
        return False

    def placed(node: cst.BaseExpression, loop: tuple[Where, Where]) -> str | None:
        """A name ``node`` reads, other than through what it loads, whose value depends on the step of ``loop``
        (its variable, a loop's in it, or a name bound in it from one of them or from its own earlier value)."""
        todo, seen = [node], set()
        while todo:
            value, _ = _without_loads(todo.pop())  # what a load reads is where this step's data is, not a weight
            for other in names_in(value) - seen:
                seen.add(other)
                if any(inside(lp[0], loop) or lp == loop for lp, n in targets.items() if n == other and (
                        lp == loop or inside(lp[0], loop))):
                    return other
                there = [(src, w) for src, w in _bindings(an, other) if w is not None and inside(w, loop)]
                if there and all(carries(other, src, loop) for src, _ in there):
                    return other  # carried from step to step (`w = w * 0.5`; not `b = tl.load(...)`, `b = b.to(...)`)
                todo += [cst.parse_expression(src) for src, _ in there]
                # a value chosen by a test the step decides (`if k == 0: w = 3.0`)
                todo += [cst.parse_expression(side.test) for _, w in there for side in an.branch_sides.get(w, ())
                         if inside(side.where, loop)]
        return None

    def carries(other: str, src: str, loop: tuple[Where, Where]) -> bool:
        """``src``, a value of ``other`` bound in ``loop``, reads ``other`` itself, directly or through names bound
        in the loop (`w_prev = w; w = w_prev * 0.5`)."""
        todo, seen = [cst.parse_expression(src)], set()
        while todo:
            for n in names_in(todo.pop()) - seen:
                if n == other:
                    return True
                seen.add(n)
                todo += [cst.parse_expression(v) for v, w in _bindings(an, n) if w is not None and inside(w, loop)]
        return False

    stores = [a.where for a in an.accesses if a.kind == "store"]
    parsed = [(cst.parse_expression(src), site) for src, site in sources if site is not None]
    own = [(value, site) for value, site in parsed if name in names_in(value) or reads(value)]
    adding = {id(v) for v, _ in own if _carried_slot(_written_helper(an, v), name)}
    # where `name` is read: each expression the kernel evaluates that reads it
    uses = [w for src, w in list(an.effects) + [(src, w) for n in set(an.values) | set(an.updates)
                                                for src, w in _bindings(an, n) if w is not None]
            if name in names_in(cst.parse_expression(src))]

    def read_outside(loop: tuple[Where, Where]) -> bool:
        """``name`` is read outside ``loop`` (after it, or before it on a later pass of a loop around it): there
        it holds what the loop's last step left."""
        return any(not inside(w, loop) for w in uses)

    def innermost(at: Where) -> tuple[Where, Where] | None:
        return _innermost(loops, at)

    def refuse(node: cst.BaseExpression, at: Where, why: str) -> _Epilogue:
        bad = _Epilogue(node, why)
        bad.site, bad.carried = at, True
        return bad

    def zero(value: cst.BaseExpression) -> bool:
        try:
            return _classify(an, value, {name: _ZERO}) == _ZERO
        except _Epilogue:
            return False

    # bound anew from this step's values (`acc = tl.dot(a, b)`, not `acc += ...`) in a loop that stores nothing, and
    # read after it: what is read is the last step's sum, of a different step on each rank
    for value, site in parsed:
        if any(value is o for o, _ in own) or zero(value):
            continue
        for loop in sorted((lp for lp in loops if inside(site, lp)), key=lambda lp: pos(lp[0])):
            if not any(inside(st, loop) for st in stores) and read_outside(loop):
                raise refuse(value, site, f"the partial sums `{name}` bound anew on each step of the loop at line "
                                          f"{loop[0].line}, which stores nothing, without adding to what the steps "
                                          f"before left: after the loop they hold the last step's sum only")

    for value, site, loop in [(v, w, lp) for v, w in own for lp in loops if inside(w, lp)]:
        # a tile loop: it stores the tensor on its passes, and sums in a loop inside it (the K loop); every rank
        # runs its passes alike, so what it carries from one to the next is left to the linearity check. The loop
        # that sums (also a persistent kernel's flattened one, which stores too) is checked
        if any(inside(st, loop) for st in stores) and any(
                id(v) in adding and inside(w, loop) and innermost(w) != loop for v, w in own) and not any(
                id(v) in adding and innermost(w) == loop for v, w in own) and (
                id(value) not in adding or innermost(site) != loop):
            continue

        # the `if` sides within `loop` around each binding that starts the accumulator again before this one, outside
        # the loops in `loop`: on every pass one of them runs when they cover each side of an `if` (`if ONE_K: acc =
        # tl.dot(...)` / `else: acc = tl.zeros(...)`)
        fresh = [(v, s) for v, s in parsed if all(v is not o for o, _ in own) and inside(s, loop)
                 and not any(inside(s, inner) for inner in loops if inner != loop and inside(inner[0], loop))]
        starts = [tuple(side for side in an.branch_sides.get(s, ()) if inside(side.where, loop))
                  for _, s in fresh if pos(s) < pos(site)]
        here = tuple(side for side in an.branch_sides.get(site, ()) if inside(side.where, loop))

        if _every_pass(starts) or any(path == here[:len(path)] for path in starts):
            # started again on every pass before it, or before it in a block that holds it (`acc =
            # tl.reshape(accumulator, ...)` then `acc = tl.permute(acc, ...)` under one `if`): nothing is carried;
            # but sums added on each step of a loop that stores nothing keep the last step's only, which matters
            # where they are read after it (not where each pass's sum is added to another accumulator in the loop)
            if id(value) not in adding or any(inside(st, loop) for st in stores) or not read_outside(loop):
                continue
            v, s = fresh[0]
            raise refuse(v, s, f"the accumulator `{name}` started again on every step of its loop at line "
                               f"{loop[0].line}, which stores nothing: the sum it keeps is of the last step only")
        if fresh and not any(inside(st, loop) for st in stores):
            v, s = fresh[0]
            raise refuse(v, s, f"the accumulator `{name}` started again on some steps only of its loop at line "
                               f"{loop[0].line}, which stores nothing: the sum it keeps is of the steps after that")

        def sides(at: Where, loop: tuple[Where, Where] = loop) -> tuple[BranchSide, ...]:
            return tuple(side for side in _sides_of(an, at) if inside(side.where, loop))

        # in a loop that stores (a persistent kernel's flattened loop), started again right after a store of the
        # sums, under the same tests (`if ki == k_tiles - 1: tl.store(...); acc = tl.zeros(...)`): what it kept is
        # stored first. Started again otherwise (`if ki % 2 == 1: acc = 0`), it drops terms of the tile
        for v, s in fresh:
            if not any(inside(st, loop) and pos(st) < pos(s) and sides(st) == sides(s) for st in stores):
                raise refuse(v, s, f"the accumulator `{name}` started again at line {s.line} on some steps only of "
                                   f"its loop at line {loop[0].line}, not right after a store of it: the sum it "
                                   f"keeps is of the steps after that")
        for other, there in own:
            if not inside(there, loop):
                continue
            added = _carried_slot(_written_helper(an, other), name)
            # added on the steps a test of the step picks (`if k == tl.cdiv(K, BLOCK_K) - 1: acc += ...`): each rank
            # picks by the step's place in its own slice
            chosen = next((side for side in an.branch_sides.get(there, ()) if inside(side.where, loop)
                           and placed(cst.parse_expression(side.test), loop) is not None), None)
            if added and chosen is not None:
                raise refuse(other, there, f"a term added to the accumulator `{name}` only on the steps of its loop "
                                           f"at line {loop[0].line} that the test `{chosen.test}` at line "
                                           f"{chosen.where.line} picks by the step")
            if added is not None and not any(reads(x) for x in added):
                weight = next((w for x in added if (w := placed(x, loop)) is not None), None)
                if weight is None:
                    continue
                raise refuse(other, there, f"a term added to the accumulator `{name}` that depends on the step of its "
                                           f"loop at line {loop[0].line} through `{weight}`, not only through what "
                                           f"it loads")
            raise refuse(other, there, f"the accumulator `{name}` carried through its loop at line {loop[0].line} "
                                       f"other than by adding to it")


def _check_accumulators(an: KernelAnalysis, a, rule: str) -> None:
    """:func:`_check_carried` for every name the kernel adds to in place inside a loop (``acc += x``, ``acc =
    tl.dot(a, b, acc)``), where ``linear_epilogue=True`` leaves the rest of the classification out."""
    loops = _loops(an)
    for name in sorted(set(an.values) | set(an.updates)):
        every = _bindings(an, name)
        # bound from itself inside a loop, and from a tl.dot or a tl.sum somewhere: an accumulator of sums
        looped = any(_within(site, loops) and name in names_in(cst.parse_expression(src)) for src, site in every)
        if not looped or not any(m.findall(_written_helper(an, cst.parse_expression(src)), _SUMS) for src, _ in every):
            continue
        try:
            _check_carried(an, name, every)
        except _Epilogue as bad:
            site = bad.site or a.where
            raise AnnotationError(_refused_message(a.tensor, rule, bad, f" at line {site.line}"), file=a.where.file,
                                  line=a.where.line, column=a.where.column,
                                  hint=_CARRIED_HINT) from None


def _position_facts(an: KernelAnalysis, node: cst.BaseExpression) -> tuple[set[str], set[str], int, bool, bool]:
    """What ``node`` is made of, through the values of the names it reads: (the parameters, the other names that
    have no value of their own (loop targets), how many ``tl.arange`` it reads (one for the K offsets, two where the
    rows' offsets join them), whether it reads a program id, loaded data). What a load reads is where its data is,
    not part of the value."""
    params, atoms, aranges, program, loaded = set(), set(), 0, False, False
    todo, seen = [node], set()
    while todo:
        value, read = _without_loads(todo.pop())
        loaded = loaded or read
        for call in m.findall(value, m.Call(func=m.Attribute(attr=m.Name())) | m.Call(func=m.Name())):
            called = call.func.attr.value if isinstance(call.func, cst.Attribute) else call.func.value
            aranges += called == "arange"
            program = program or called in ("program_id", "num_programs")
        for name in names_in(value) - seen - {"_loaded", "tl", "None", "True", "False"}:
            seen.add(name)
            if name in an.params:
                params.add(name)
                continue
            sources = _bindings(an, name)
            if not sources:
                atoms.add(name)
            todo += [cst.parse_expression(src) for src, _ in sources]
    return params, atoms, aranges, program, loaded


def _scalar_row(an: KernelAnalysis, a) -> str | None:
    """The one scalar term of a store's address besides the tensor (`y_ptr + row`, `row = tl.program_id(0)`): the row
    a program stores, which the annotation can name as its tile; ``None`` for any other address."""
    terms = [t for t in re.split(r"\s*\+\s*", a.pointer.strip()) if t != a.tensor]
    if len(terms) != 1 or not re.fullmatch(r"[A-Za-z_]\w*", terms[0]) or terms[0] in an.aliases.get(a.tensor, ()):
        return None  # not a name, or a pointer (`y_ptrs`), not a row
    return None if _position_facts(an, cst.Name(terms[0]))[2] else terms[0]


def _mask_terms(an: KernelAnalysis, source: str, depth: int = 0,
                within: frozenset[str] = frozenset()) -> list[cst.BaseExpression]:
    """The terms of a mask joined by ``&`` (``analysis._conjuncts``), read through the names it reads (`mask =
    a_mask & k_mask`; each value of a name bound more than once) and broadcasts (`k_mask[None, :]`, `(rk <
    left)[None, :]`)."""
    found = []
    for term in _conjuncts(source, set(an.params)):
        node = _unbroadcast(term)
        sources = _bindings(an, node.value) if isinstance(node, cst.Name) and node.value not in within else []
        if sources and depth < 8:  # each value the name may hold (`msk` bound again for another load)
            for source, _ in sources:  # its earlier value in its own update (`ka = ka[None, :]`) is its other values
                found += _mask_terms(an, source, depth + 1, within | {node.value})
        elif not (isinstance(node, cst.Name) and node.value in within):
            found.append(node)
    return found


def _range_args(call) -> list:
    """A range's bounds and step as positional arguments, `tl.range`'s keywords `arg1`, `arg2`, `step` in their
    places (`tl.range(0, K, step=BLOCK_K)` is `range(0, K, BLOCK_K)`)."""
    pos = [a.value for a in call.args if a.keyword is None]
    named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    slots = (pos + [None, None, None])[:3]
    for i, key in enumerate(("arg1", "arg2", "step")):
        if slots[i] is None and key in named:
            slots[i] = named[key]
    if slots[0] is not None and slots[1] is None and slots[2] is not None:
        slots = [cst.Integer("0"), slots[0], slots[2]]  # `tl.range(N, step=F)`: from 0
    while slots and slots[-1] is None:
        slots.pop()
    return pos if None in slots else slots


def _loop_extent(an: KernelAnalysis, loop: tuple[Where, Where], target: str | None
                 ) -> tuple[cst.BaseExpression | None, tuple[str, ...], bool]:
    """The K extent ``X`` a loop runs over, read from its range, with the factors of what the step adds to the
    columns on each step, and whether it counts down from ``X`` to 0: ``range(0, tl.cdiv(X, F))`` (``k * F``;
    also ``range(k_tiles)`` with ``k_tiles = tl.cdiv(X, F)`` bound once), ``range(0, X, F)`` (``k`` itself, the
    factors ``()``), ``range(X, 0, -F)`` (``k`` is what is left). ``(None, (), False)`` where TileLink does not read
    it: a literal count, a loop target, a count the kernel computes otherwise."""
    header = next((src for src, w in an.effects if w == loop[0] and target and src.startswith(f"({target} :=")), None)
    parsed = cst.parse_expression(header) if header else None
    call = _bare(parsed.value) if isinstance(_bare(parsed), cst.NamedExpr) else None  # type: ignore[union-attr]
    if not isinstance(call, cst.Call):
        return None, (), False
    args = _range_args(call)
    if len(args) == 3 and m.matches(args[1], m.Integer("0")) and m.matches(
            _bare(args[2]), m.UnaryOperation(operator=m.Minus()) | m.BinaryOperation(
                left=m.UnaryOperation(operator=m.Minus()))):
        return _bound_value(an, args[0]), (), True
    if len(args) == 3 and m.matches(_bare(args[2]), m.Integer("1")):
        args = args[:2]  # `range(0, n, 1)` is `range(0, n)`
    ranged = len(args) == 3 and not m.matches(_bare(args[2]), m.UnaryOperation())
    if ranged and _tile_count(an, args[1]) is None:
        # `range(start, X, F)`: `k` is the column the step starts at (a split's too)
        return _bound_value(an, args[1]), (), False
    # `range(start, tl.cdiv(X, F), S)` (a split's `range(pid_k, k_tiles, SPLIT_K)`) counts tiles, as `range(0,
    # tl.cdiv(X, F))` does
    stop = args[1] if ranged else args[0] if len(args) == 1 else args[1] if len(args) > 1 and m.matches(
        args[0], m.Integer("0")) else None
    if isinstance(stop, cst.Name) and stop.value in set(an.params) - set(an.constexpr_params):
        return stop, (), False  # `range(0, K)`: a column a step, `k` itself
    for _ in range(4):  # through a name bound once (`k_tiles = tl.cdiv(K, BLOCK_SIZE_K)`)
        if isinstance(stop, cst.Name) and stop.value not in an.params and len(_bindings(an, stop.value)) == 1:
            stop = cst.parse_expression(_bindings(an, stop.value)[0][0])
        # a count chosen against none at all (`tl.where(expert >= 0, tl.cdiv(K, BLOCK_K), 0)`): the steps it runs are
        # those of the other side
        if isinstance(stop, cst.Call) and m.matches(stop.func, m.Attribute(attr=m.Name("where"))) and len(
                stop.args) == 3:
            sides = [a.value for a in stop.args[1:]]
            if m.matches(_bare(sides[1]), m.Integer("0")):
                stop = sides[0]
            elif m.matches(_bare(sides[0]), m.Integer("0")):
                stop = sides[1]
    counted = _tile_count(an, stop) if stop is not None else None
    return (counted[0], _factor_codes(counted[1]), False) if counted is not None else (None, (), False)


def _tile_count(an: KernelAnalysis, node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """``(X, F)`` where ``node`` is a count of F-wide tiles of X: `tl.cdiv(X, F)`, `(X + F - 1) // F`, through a name
    bound once; ``None`` otherwise."""
    node = _bare(_bound_value(an, node, params_only=False))
    if isinstance(node, cst.Call) and m.matches(node.func, m.Attribute(attr=m.Name("cdiv"))) and len(node.args) == 2:
        return _bare(node.args[0].value), node.args[1].value
    return _ceil_divided(node)


def _bound_value(an: KernelAnalysis, node: cst.BaseExpression, params_only: bool = True) -> cst.BaseExpression:
    """``node`` read through the locals it names that are bound once, down to four of them: where that ends at a
    parameter (`k_end = K`), or with ``params_only`` off, at any value (`prev = prev_multiple_of(K, BLOCK_K)`);
    otherwise ``node`` as it is."""
    value = node
    for _ in range(4):
        bare = _bare(value)
        if not isinstance(bare, cst.Name) or bare.value in an.params or len(_bindings(an, bare.value)) != 1:
            break
        value = cst.parse_expression(_bindings(an, bare.value)[0][0])
    bare = _bare(value)
    return value if not params_only or isinstance(bare, cst.Name) and bare.value in an.params else node


def _ceil_divided(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """``(X, F)`` where ``node`` is the ceiling division ``tl.cdiv(X, F)`` written out: ``(X + F - 1) // F`` or
    ``(X + (F - 1)) // F``."""
    node = _bare(node)
    if not m.matches(node, m.BinaryOperation(operator=m.FloorDivide())):
        return None
    total, f = _bare(node.left), code(_bare(node.right)).strip()

    def less_one(x: cst.BaseExpression) -> bool:  # `F - 1`
        x = _bare(x)
        return m.matches(x, m.BinaryOperation(operator=m.Subtract(), right=m.Integer("1"))) and \
            code(_bare(x.left)).strip() == f

    if m.matches(total, m.BinaryOperation(operator=m.Subtract(), right=m.Integer("1"))):
        inner = _bare(total.left)  # `X + F - 1`: `(X + F) - 1`
        if m.matches(inner, m.BinaryOperation(operator=m.Add())) and code(_bare(inner.right)).strip() == f:
            return _bare(inner.left), _bare(node.right)
    if m.matches(total, m.BinaryOperation(operator=m.Add())) and less_one(total.right):
        return _bare(total.left), _bare(node.right)
    return None


def _factor_codes(node: cst.BaseExpression) -> tuple[str, ...]:
    """The factors of a product, each in source, sorted (``k * (BLOCK_K * SPLIT_K)`` -> ``BLOCK_K, SPLIT_K, k``)."""
    parts, todo = [], [_bare(node)]
    while todo:
        item = _bare(todo.pop())
        if isinstance(item, cst.BinaryOperation) and isinstance(item.operator, cst.Multiply):
            todo += [item.left, item.right]
        else:
            parts.append(code(item).strip())
    return tuple(sorted(parts))


def _sum_terms(an: KernelAnalysis, node: cst.BaseExpression, keep: str | None,
               depth: int = 0) -> list[tuple[cst.BaseExpression, bool]]:
    """The terms of a sum, through broadcasts (`offs_k[None, :]`) and locals bound once (`offs_k = k * BLOCK_K +
    tl.arange(0, BLOCK_K)`, `k_remaining = K - k * BLOCK_K`), each with whether it is subtracted; ``keep`` (the loop's
    target) and parameters are left as they are."""
    found = []
    for term, negative in _terms(_bare(node)):
        term = _unbroadcast(term)
        binds = _bindings(an, term.value) if isinstance(term, cst.Name) and term.value != keep else []
        if len(binds) == 1 and depth < 8:
            found += [(t, n != negative) for t, n in _sum_terms(an, cst.parse_expression(binds[0][0]), keep,
                                                                 depth + 1)]
        elif isinstance(term, cst.BinaryOperation) and isinstance(term.operator, (cst.Add, cst.Subtract)):
            found += [(t, n != negative) for t, n in _sum_terms(an, term, keep, depth + 1)]
        elif isinstance(term, cst.Call) and term.args and m.matches(term.func, _HINTS) and depth < 8:
            # a hint to the compiler (`tl.multiple_of(k * BLOCK_K, BLOCK_K)`) has the value it is given
            found += [(t, n != negative) for t, n in _sum_terms(an, term.args[0].value, keep, depth + 1)]
        elif (inner := widened_value(term)) is not None and depth < 8:
            # widened to 64 bits (FlagGems' `rk = (start_k + tl.arange(0, BLOCK_K)).to(tl.int64)`): the same values
            found += [(t, n != negative) for t, n in _sum_terms(an, inner, keep, depth + 1)]
        else:
            found.append((term, negative))
    return found


#: the compiler hints whose value is their first argument
_HINTS = m.Attribute(value=m.Name("tl"),
                     attr=m.Name("multiple_of") | m.Name("max_contiguous") | m.Name("max_constancy"))


def _bounds_k(an: KernelAnalysis, node: cst.BaseExpression, target: str | None,
              extent: tuple[cst.BaseExpression | None, tuple[str, ...], bool], stored: set[str],
              shape_only: bool = False) -> bool:
    """``node`` compares the columns of this step along K with the loop's K extent ``X`` (``extent``,
    :func:`_loop_extent`): the offsets (one ``tl.arange``) plus the step's ``k * F`` on one side, ``X`` on the other,
    the step's term on either (`offs_k[None, :] < X - k * BLOCK_K`, `(k * BLOCK_K + rk)[None, :] < X`), or `rk[None,
    :] < k` in a loop counting down from X. A bound that reads other offsets (`<= rm[:, None]`), program ids, data, a
    literal (`k < 1`, `X - k * BLOCK_K - 8`) or another parameter (`< BLOCK_K`), a step term of another size (`2 * k *
    BLOCK_K`, `k * BLOCK_N`), offsets that join the rows' (`(k * BLOCK_K + rk)[None, :] - rm[:, None]`), or a loop whose
    extent TileLink does not read, is not one. Offsets that move through names of their own (`offs_k += BLOCK_K`)
    are bounded by ``X`` alone, or, where the extent is not read, by one passed parameter if they are the output's
    own (``stored``: the names the reduced store's address reads; a flattened persistent loop's `rn[None, :] < N`):
    K offsets bounded so (`offs_k < N` in a loop over a passed count) may run past a rank's slice."""
    if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1 or not isinstance(
            node.comparisons[0].operator, (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)):
        return False
    sides = (node.left, node.comparisons[0].comparator)
    if isinstance(node.comparisons[0].operator, (cst.GreaterThan, cst.GreaterThanEqual)):
        sides = sides[::-1]
    position, bound = _position_facts(an, sides[0]), _position_facts(an, sides[1])
    X, step, down = extent
    if target is None or position[2] != 1 or bound[2] or bound[3] or bound[4]:
        return False
    # the step's terms on one side, the columns (`P`) less the bound (`B`): `P - B < 0`; the bound's other terms are
    # the extent (the columns may start at a split's position, `pid_z * BLOCK_K + tl.arange(0, BLOCK_K)`)
    columns, limit = _sum_terms(an, sides[0], target), _sum_terms(an, sides[1], target)
    moving = [(t, n) for t, n in columns if target in names_in(t)] + [
        (t, not n) for t, n in limit if target in names_in(t)]
    fixed = sorted((n, code(t).replace(" ", "")) for t, n in limit if target not in names_in(t))
    # read through the locals it names as the bound is (`K = ks2`, torch's size aliases: both read `ks2`)
    extent_terms = sorted((n, code(_bare(t)).replace(" ", "")) for t, n in _sum_terms(an, X, target)) \
        if X is not None else None
    if not moving and len(fixed) == 1 and not fixed[0][0] and fixed[0][1] in set(an.params) - set(
            an.constexpr_params):
        # offsets that move with the step through names of their own (columns advanced in place, `offs_k +=
        # BLOCK_K`; a tile's rows in a flattened persistent loop, `rn[None, :] < N`), bounded by one passed
        # parameter: the loop's own extent where its range says it (`offs_k < N` in a loop over `tl.cdiv(K,
        # BLOCK_K)` would read past the rank's slice of K), any one where the range does not
        if extent_terms is None:
            # a step counted by a name of its own (a flattened loop's `k = step % k_tiles`, `k_tiles = tl.cdiv(K,
            # BLOCK_K)`): its cycle is the extent
            cycles = {c for t, _ in columns for n in names_in(t) if (c := _cycle_extent(an, n)) is not None}
            if len(cycles) == 1:
                return fixed == list(next(iter(cycles)))
            return shape_only or bool(columns) and all(names_in(t) <= stored for t, _ in columns)
        return fixed == extent_terms
    if X is None:
        # ``shape_only``: whether the term has the form of a bound by the extent (`offs + k * F < X`), X passed
        return shape_only and len(moving) == 1 and not moving[0][1] and bool(fixed) and all(
            not n and f in set(an.params) - set(an.constexpr_params) for n, f in fixed)
    if down:  # `P - k < 0`: the step's own value is what is left
        return len(moving) == 1 and moving[0][1] and m.matches(moving[0][0], m.Name(target)) and not fixed
    # `P + k * F - X < 0`, with F what the range steps by
    return len(moving) == 1 and not moving[0][1] and _factor_codes(moving[0][0]) == tuple(sorted(
        (target, *step))) and fixed == extent_terms


def _cycle_extent(an: KernelAnalysis, name: str) -> tuple[tuple[bool, str], ...] | None:
    """The terms of ``X`` where ``name`` is bound once to ``s % C`` and ``C`` to ``tl.cdiv(X, F)`` (through a name
    bound once): a step of K counted in a flattened loop, over the blocks of ``X``."""
    binds = _bindings(an, name)
    value = _bare(cst.parse_expression(binds[0][0])) if len(binds) == 1 else None
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Modulo)):
        return None
    count = _bare(value.right)
    if isinstance(count, cst.Name) and count.value not in an.params and len(_bindings(an, count.value)) == 1:
        count = _bare(cst.parse_expression(_bindings(an, count.value)[0][0]))
    if isinstance(count, cst.Call) and m.matches(count.func, m.Attribute(attr=m.Name("cdiv"))) and len(
            count.args) == 2:
        return tuple(sorted((n, code(_bare(t)).replace(" ", "")) for t, n in _terms(_bare(count.args[0].value))))
    divided = _ceil_divided(count)
    if divided is not None:
        return tuple(sorted((n, code(_bare(t)).replace(" ", "")) for t, n in _terms(divided[0])))
    return None


def _summing_loops(an: KernelAnalysis) -> set[tuple[Where, Where]]:
    """The loops that sum: for each update of an accumulator that adds a product (`tl.dot(a, b, acc)`) or this
    step's data (`acc += a * x[None, :]`, a GEMV summed after the loop), not a counter or a pointer's advance, the
    loop over K around it. Each rank runs them over its own slice of K. That is the innermost loop around the
    update whose step moves where the loads read and whose K extent TileLink reads from its range, else the
    innermost whose step moves the loads, else the innermost: an inner loop that does not move the loads (`for r
    in tl.static_range(0, 2): acc += ...`, or one counted by the extent, refused then) is not the loop over K. The
    loops looked at stop at one that stores or starts the accumulator again (a persistent kernel's tile loop)."""
    loops = _loops(an)
    located = _located(an)
    summing: set[tuple[Where, Where]] = set()
    for name in set(an.values) | set(an.updates):
        binds = _bindings(an, name)
        for src, site in binds:
            value = _written_helper(an, cst.parse_expression(src))
            added = _carried_slot(value, name) if site is not None and name in names_in(value) else None
            if not added or not (m.findall(value, _SUMS) or any(_reads_a_load(an, code(x)) for x in added)):
                continue
            # a loop that starts the accumulator afresh before the update (a persistent kernel's tile loop, adding a
            # bias after its K loop) runs one pass per tile: it does not sum over K
            around = sorted((lp for lp in loops if _inside(site, lp) and not any(
                w is not None and _inside(w, lp) and _before(w, site) and name not in names_in(cst.parse_expression(v))
                for v, w in binds)), key=lambda lp: (lp[0].line, lp[0].column), reverse=True)
            if not around:
                continue
            looked = [around[0]]
            for lp in around[1:]:
                if any(_inside(w, lp) and m.findall(cst.parse_expression(text), _STORES) for text, w in located) \
                        or any(w is not None and _inside(w, lp) and name not in names_in(cst.parse_expression(v))
                               for v, w in binds):
                    break
                looked.append(lp)
            moving = [lp for lp in looked if any(load.steps for load in _summing_loads(an, lp)[0])]
            read = [lp for lp in moving if _loop_extent(an, lp, _loop_targets(an).get(lp))[0] is not None]
            summing.add((read or moving or around)[0])
    return summing


#: a store of a tensor, through a pointer or a descriptor
_STORES = m.Call(func=m.Attribute(attr=m.Name("store") | m.Name("atomic_add") | m.Name("store_tensor_descriptor")))


#: a load through a pointer the launcher zeroes on every rank but the first, in :func:`_first_rank_reads`
_ONCE_NAME = "tlk_first_rank_value"
#: what makes an address from a pointer other than adding offsets to it: its first argument is the pointer
_ADDRESSING = m.Call(func=m.Attribute(attr=m.Name("make_tensor_descriptor") | m.Name("make_block_ptr")
                                      | m.Name("advance")))


def _address_of(node: cst.BaseExpression, pointers: set[str]) -> bool | None:
    """Whether ``node`` is an address made from one of ``pointers``: the pointer plus offsets that do not read
    them (`bias_ptr + offs_n`, `ptrs + BLOCK_N`), or a descriptor or block pointer made from one (True); reads none of
    them (False); reads them otherwise (`bias_ptr * 2`, `q_ptr + bias_ptr`): None."""
    node = _bare(node)
    if not names_in(node) & pointers:
        return False
    if m.matches(node, _ADDRESSING):
        base = _arg(node, 0, "base")
        rest = [a.value for a in node.args if a.value is not base]
        return None if base is None or any(names_in(x) & pointers for x in rest) else _address_of(base, pointers)
    terms = [(_unbroadcast(t), negative) for t, negative in _terms(node)]
    bases = [t for t, negative in terms if not negative and isinstance(t, cst.Name) and t.value in pointers]
    others = [t for t, _ in terms if not any(t is b for b in bases)]
    return True if len(bases) == 1 and not any(names_in(t) & pointers for t in others) else None


#: a load's padding past the bounds that reads zero (`""` leaves it to the hardware's zero fill)
_ZERO_PADDING = m.SimpleString('"zero"') | m.SimpleString("'zero'") | m.SimpleString('""') | m.SimpleString("''")


class _OnceLoads(cst.CSTTransformer):
    """A value with each load through ``pointers`` as the name ``_ONCE_NAME`` and each tensor's type (`bias_ptr.dtype`,
    the same for zeros in its place) as ``_type``; ``clean`` turns false where such a load's address reads them
    otherwise than as its base, or its mask or other arguments read ``pointers``, ``values`` or another such load
    (what zeros in the pointer's place would change there)."""

    def __init__(self, pointers: set[str], values: set[str]):
        super().__init__()
        self.pointers, self.values, self.clean = pointers, values, True

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return cst.Name("_type") if updated.attr.value == "dtype" else updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        func = updated.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "load"):
            return updated
        pointer = _arg(updated, 0, "pointer") if m.matches(func.value, m.Name("tl")) else func.value
        address = _address_of(pointer, self.pointers) if pointer is not None else False
        if not address:
            self.clean = self.clean and address is not None
            return updated
        rest = [a.value for a in updated.args if a.value is not pointer]
        if any(names_in(x) & (self.pointers | self.values | {_ONCE_NAME}) for x in rest):
            self.clean = False
        # what a masked-out lane reads stays on every rank: only zero (or nothing) there is added once
        other = _arg(updated, 2, "other") if m.matches(func.value, m.Name("tl")) else None
        padding = _arg(updated, 4, "padding_option") if m.matches(func.value, m.Name("tl")) else None
        if other is not None and not (isinstance(_bare(other), (cst.Integer, cst.Float))
                                      and _bare(other).evaluated_value == 0) or \
                padding is not None and not m.matches(padding, _ZERO_PADDING):
            self.clean = False
        return cst.Name(_ONCE_NAME)


def _once_loads(node: cst.BaseExpression, pointers: set[str], values: set[str]) -> tuple[cst.BaseExpression, bool]:
    visitor = _OnceLoads(pointers, values)
    out = cst.Module([cst.SimpleStatementLine([cst.Expr(node)])]).visit(visitor)
    return out.body[0].body[0].value, visitor.clean  # type: ignore[attr-defined]


def _storing_helpers(helpers: dict[str, str]) -> frozenset[str]:
    """The helpers that store or add into memory: themselves, or through a helper that does."""
    return helpers_that(helpers, lambda name, source, called: bool(re.search(r"\b(store|atomic_\w+)\s*\(", source)))


def _first_rank_reads(an: KernelAnalysis, param: str, stores, summing: set[tuple[Where, Where]]) -> set[str] | None:
    """The names that hold addresses made from the pointer parameter ``param`` (itself among them), where what is
    loaded through them goes only into the values the reduced stores store, so that zeros in its place on every rank
    but the first change nothing else: no mask, address, test, loop range or other store reads it, no helper that
    stores gets it, and the loops that sum over K (whose steps differ between a rank's slice and the full K)
    neither load it nor add it to anything but carry it (`acc = bias; ...: acc += tl.dot(a, b)`). ``None`` where
    ``param`` is read otherwise, or never loaded through."""
    pointers: set[str] = {param}
    values: set[str] = set()
    bindings = [(n, src, site) for n in set(an.values) | set(an.updates) for src, site in _bindings(an, n)]
    grown = True
    while grown:
        grown = False
        for name, src, _ in bindings:
            node, clean = _once_loads(cst.parse_expression(src), pointers, values)
            address = _address_of(node, pointers)
            if not clean or address is None:
                return None
            if address and name not in pointers:
                pointers.add(name)
                grown = True
            if names_in(node) & (values | {_ONCE_NAME}) and name not in values:
                values.add(name)
                grown = True
    if pointers & values:
        return None
    for name, src, _ in bindings:
        # a name holding the pointer's addresses on one path and another tensor's on another: a load through it
        # would be taken for the pointer's, which the other ranks would not read as zeros
        if name in pointers and not _address_of(_once_loads(cst.parse_expression(src), pointers, values)[0], pointers):
            return None
    held = values | {_ONCE_NAME}
    storing = _storing_helpers(an.helpers)
    updates = {w for sites in an.update_sites.values() for w in sites}
    stored = {a.where: a for a in stores}
    loaded = False
    for name, src, site in [*bindings, *((None, src, site) for src, site in an.effects if site not in updates)]:
        node, clean = _once_loads(cst.parse_expression(src), pointers, values)
        if not clean:
            return None
        loaded = loaded or _ONCE_NAME in names_in(node)
        for call in m.findall(node, m.Call()):
            func = call.func
            base = func
            while isinstance(base, cst.Attribute):
                base = base.value
            # a helper that stores (itself or through another), or a function of a module (`mod.save(...)`), which
            # TileLink does not read: it may write it elsewhere
            foreign = isinstance(func, cst.Attribute) and isinstance(base, cst.Name) and base.value not in (
                "tl", "triton", *an.params, *pointers, *held) and not _bindings(an, base.value)
            if (code(func) in storing or foreign) and names_in(call) & (pointers | held):
                return None
        if names_in(node) & held and _within(site, summing):
            # in a loop that sums over K, it may only be carried (its steps are a rank's, not the full K's)
            added = _carried_slot(node, name) if name is not None and name in names_in(node) else None
            if added is None or any(names_in(x) & held for x in added):
                return None
        if name is not None:
            continue  # a binding: what it binds was followed above
        if m.matches(_bare(node), m.Name(param) | m.UnaryOperation(operator=m.Not(), expression=m.Name(param))
                     | m.Comparison(left=m.Name(param), comparisons=[m.ComparisonTarget(
                         operator=m.Is() | m.IsNot(), comparator=m.Name("None"))])):
            # whether the pointer is given (vLLM's `if bias_ptr:`): the zeros passed in its place on the other ranks
            # are given as the tensor is, and None stays None
            continue
        store = stored.get(site)
        value = _arg(node, 1, "value") if store is not None and isinstance(node, cst.Call) else None
        rest = node.deep_replace(value, cst.Name("_value")) if value is not None else node
        if names_in(rest) & (pointers | held) or value is not None and names_in(value) & pointers:
            return None  # a test, a loop's range, an address or mask, another store, or the type of a pointer
    return pointers if loaded else None


def first_rank_terms(an: KernelAnalysis, spec, stores, rule: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """The pointer parameters to pass as zeros on every rank but the first (``ReduceScatterLaunch.first_rank_only``),
    with the names holding their addresses: those read only in terms added to the stored partial sums (a bias,
    `acc * alpha + bias * beta`, an accumulator started from one), which every rank would add. With them zero on the
    other ranks, the sum over the ranks adds them once. Chosen only where the stores are refused without them (a
    kernel that builds as it is keeps every argument), as the fewest that refuse the fewest launches. Rows from an
    index (``index=``: an expert's rows are computed on one rank only) and ``linear_epilogue=True`` take none."""
    if spec.linear_epilogue or getattr(spec, "index", None) or any(a.tile is None or not a.value for a in stores):
        return (), frozenset()

    def outcome(pointers: frozenset[str]) -> tuple[int, int]:
        with _holding(_FIRST_RANK, pointers):
            refused: dict[BranchSide, _Epilogue] = {}
            try:
                for a in stores:
                    _epilogue_branches(an, a, rule, refused)
            except AnnotationError:
                return 1, 0
            return 0, len(refused)

    best = outcome(frozenset())
    if best == (0, 0):
        return (), frozenset()
    summing = _summing_loops(an)
    reads = {p: r for p in an.params if p not in spec.tensors and p not in an.constexpr_params
             and (r := _first_rank_reads(an, p, stores, summing)) is not None}
    chosen: tuple[str, ...] = ()
    for size in range(1, min(len(reads), 3) + 1):
        for subset in itertools.combinations(reads, size):
            result = outcome(frozenset().union(*(reads[p] for p in subset)))
            if result < best:
                best, chosen = result, subset
    return chosen, frozenset().union(*(reads[p] for p in chosen))


def _located(an: KernelAnalysis) -> list[tuple[str, Where]]:
    """Every binding's value and every other expression the kernel evaluates, with where it is, in source order."""
    return sorted([(src, site) for n in set(an.values) | set(an.updates) for src, site in _bindings(an, n)
                   if site is not None] + list(an.effects), key=lambda e: (e[1].line, e[1].column, e[0]))


def _varying(an: KernelAnalysis, loop: tuple[Where, Where], target: str | None) -> set[str]:
    """The names whose value changes from one step of ``loop`` to the next: its target, what it carries (a pointer it
    advances), and what is bound in it from them."""
    varying = {target} if target else set()
    bound_in = [(n, names_in(cst.parse_expression(src))) for n in set(an.values) | set(an.updates)
                for src, site in _bindings(an, n) if site is not None and _inside(site, loop)]
    # carried through other names too (`a_next = tl.advance(a_blocks, ...)`, `a_blocks = a_next`): a name its own
    # bindings in the loop reach
    graph: dict[str, set[str]] = {}
    for n, read in bound_in:
        graph.setdefault(n, set()).update(read)
    for n in graph:
        seen, todo = set(), list(graph[n])
        while todo:
            x = todo.pop()
            if x not in seen:
                seen.add(x)
                todo += graph.get(x, ())
        if n in seen:
            varying.add(n)
    grown = True
    while grown:
        more = {n for n, read in bound_in if read & varying} - varying
        varying |= more
        grown = bool(more)
    return varying


def _loop_header(an: KernelAnalysis, loop: tuple[Where, Where]) -> str:
    """The source of what ``loop`` runs over (its range, its `while` test), for a message; "" where none is kept."""
    header = next((src for src, w in an.effects if w == loop[0]), "")
    return header.split(":=", 1)[-1].strip().removesuffix(")").strip() if ":=" in header else header.strip()


def _check_k_masks(an: KernelAnalysis, a, rule: str) -> None:
    """Each rank runs the loop that sums over its own slice of K, counting from its start: a load's mask that reads
    the loop's step must bound the offsets along K by the K extent the call passes (`offs_k[None, :] < K - k *
    BLOCK_K`). One that relates the step to other offsets (a triangular `(k * BLOCK_K + rk)[None, :] <=
    rm[:, None]`), to a literal (`k < 1`) or to loaded data picks, on each rank, terms by their place in the rank's
    slice, not in the full K: the ranks' sum is not the full problem's value. Refused."""
    targets = _loop_targets(an)
    summing = _summing_loops(an)
    if not an.__dict__.setdefault("_k_tiling_read", False):
        # the loops' own checks, once per analysis: they read the loops, not the store (the frozen analysis' own
        # dict keeps that they ran, as _summing_loads keeps its answers)
        _check_whole_extent(an, summing, targets, a, rule)
        _check_step_blocks(an, summing, targets, a, rule)
        _check_restarted(an, summing, targets, a, rule)
        an.__dict__["_k_tiling_read"] = True
    # the names the store's address reads, through their values: the output's own offsets
    stored = _names_through(an, cst.parse_expression(a.pointer), outside_loops=False)
    # in source order, so that the first load refused is the one reported, on every build
    every = _located(an)
    for loop in sorted(summing, key=lambda lp: (lp[0].line, lp[0].column)):
        target = targets.get(loop)
        extent = _loop_extent(an, loop, target)
        varying = _varying(an, loop, target)
        # the loads masked by K (source): how they fill past K where not with zero, and whether with a finite literal
        masked: dict[str, tuple[str, bool] | None] = {}
        unmasked: list[Where] = []  # the loads stepping along K with no mask or bounds check at all
        for src, site in every:
            if not _inside(site, loop):
                continue
            for call in m.findall(cst.parse_expression(src), m.Call(func=m.Attribute(attr=m.Name("load")))):
                _check_padding(an, call, site, loop, a, rule)
                mask = _arg(call, 1, "mask")
                if _unmasked_step(an, call, varying):
                    unmasked.append(site)
                if mask is None:
                    continue
                for term in _mask_terms(an, code(mask)):
                    if not (names_in(term) & varying):
                        continue
                    if _bounds_k(an, term, target, extent, stored):
                        other = _arg(call, 2, "other") if m.matches(call.func, m.Attribute(value=m.Name("tl"))) \
                            else None
                        masked[code(call).strip()] = None if other is None or _zero(an, other) else (
                            f"`other={code(other).strip()}` at line {site.line}", _finite(an, other))
                        continue
                    if extent[0] is None and (_bounds_k(an, term, target, extent, stored, shape_only=True)
                                              if target is not None else _extent_shaped(an, term, stored)):
                        # the form of a bound by the loop's extent, which is not known; or a `while` loop, whose
                        # step TileLink does not read at all
                        header = _loop_header(an, loop)
                        unread = ("read that loop's K extent from its range" if target is not None
                                  else "read the K extent of a `while` loop")
                        raise AnnotationError(
                            f"the mask of the load at line {site.line} bounds the offsets along K in the loop at "
                            f"line {loop[0].line}, which sums the partial sums of {a.tensor!r}, but TileLink does not "
                            f"{unread}{f' (`{header}`)' if header else ''}: each rank "
                            f"runs the loop over its own slice of K, and TileLink can check neither that the loop "
                            f"covers the slice nor that the mask's bound (`{code(term).strip()}`) is the slice's end",
                            file=site.file, line=site.line, column=site.column,
                            hint="loop over `range(0, tl.cdiv(K, BLOCK_K))` (or `range(0, K, BLOCK_K)`, a count "
                                 "bound once to `tl.cdiv(K, BLOCK_K)`) with the mask `offs_k[None, :] < K - k * "
                                 "BLOCK_K`")
                    raise AnnotationError(
                        f"the mask of the load at line {site.line} reads the step of the loop at line "
                        f"{loop[0].line}, which sums the partial sums of {a.tensor!r}, other than by bounding the "
                        f"offsets along K by the parameters (`{code(term).strip()}`): each rank runs that loop over "
                        f"its own slice of K, counting from its start, so such a mask picks terms by their place in "
                        f"the rank's slice, and the sum {rule} makes over the ranks would not be the full problem's "
                        f"value", file=site.file, line=site.line, column=site.column,
                        hint="bound the K offsets by the K extent alone (`mask=... & (offs_k[None, :] < K - k * "
                             "BLOCK_K)`), and apply a condition on rows or data to the reduced result instead")
        if masked:
            _check_padded_terms(an, loop, masked, a, rule)
        _whole_steps(an, loop, target, extent[0], unmasked)


#: what the columns past K add to a sum: nothing (zero there), what reads no load masked by K, or something else;
#: and a literal zero, zero everywhere
_PAD_ZERO, _PAD_FREE, _PAD_SOME, _PAD_NIL = "zero", "free", "some", "nil"
#: not finite there (a fill of `float("inf")`, a division by a zero-filled load): zero times it is no zero
_PAD_WILD = "wild"
#: calls whose value at a column is their first argument's there, converted or moved (`a.to(tl.float16)`,
#: `tl.trans(b)`): zero where it is zero
_PAD_KEEPS = frozenset({"to", "cast", "trans", "reshape", "permute", "broadcast_to", "view", "expand_dims",
                        "multiple_of", "max_contiguous", "sum"})


def _check_padded_terms(an: KernelAnalysis, loop: tuple[Where, Where], masked: dict[str, tuple[str, bool] | None], a,
                        rule: str) -> None:
    """Each rank's loads masked by K (``masked``: their source, and how they fill where the mask is false if not
    with zero) read their `other` at the columns past the end of its own slice: on the full K in the last block only.
    What an update of the loop adds there must be zero, or it is summed once per rank whose slice ends inside a block
    rather than once past the full K. A product with a zero-filled load is zero there (`tl.dot(a, b, acc)`, `a *
    x[None, :]`, `(b - zp) * s` beside a zero-filled `a`, also beside `b` filled with `other=1.0`); a sum with
    anything else is not (`tl.dot(a + 1.0, b + 1.0, acc)`, `tl.exp(a)`, a product of two loads filled with `1.0`):
    refused at the update."""
    fills = [fill[0] for fill in masked.values() if fill is not None]
    for name in sorted(set(an.values) | set(an.updates)):
        for src, site in _bindings(an, name):
            if site is None or not _inside(site, loop):
                continue
            value = _written_helper(an, cst.parse_expression(src))
            added = _carried_slot(value, name) if name in names_in(value) else None
            if not added or not (m.findall(value, _SUMS) or any(_reads_a_load(an, code(x)) for x in added)):
                continue  # no sum: a counter, a pointer's advance
            if m.matches(_bare(value), m.Call(func=m.Attribute(attr=m.Name("dot")))):
                operands = [x.value for x in _bare(value).args if x.keyword is None][:2]
                kind = _pad_product([_pad_kind(an, x, masked, {name}) for x in operands])
            else:
                kind = _pad_sum([_pad_kind(an, x, masked, {name}) for x in added])
            if kind not in (_PAD_SOME, _PAD_WILD):
                continue
            filled = f", its loads filled with {', '.join(fills)}" if fills else ""
            raise AnnotationError(
                f"the update of `{name}` at line {site.line}, in the loop at line {loop[0].line} that sums the partial "
                f"sums of {a.tensor!r}, adds something other than zero at the columns its loads masked by K leave "
                f"out (`{code(value).strip()}`{filled}): each rank runs that loop over its own slice of K, so those "
                f"columns are past the end of each rank's slice rather than past the full K, and the sum {rule} makes "
                f"over the ranks would not be the full problem's value", file=site.file, line=site.line,
                column=site.column,
                hint="fill the masked columns with zero (`other=0.0`) and keep what the update adds zero there: a "
                     "product with a zero-filled load (`tl.dot(a, b - zp, acc)` with `a` loaded with `other=0.0`)")


def _pad_product(kinds: list[str]) -> str:
    if _PAD_WILD in kinds:
        return _PAD_WILD
    if _PAD_NIL in kinds:
        return _PAD_NIL
    if _PAD_ZERO in kinds:
        return _PAD_ZERO
    return _PAD_SOME if _PAD_SOME in kinds else _PAD_FREE


def _pad_sum(kinds: list[str]) -> str:
    kinds = [k for k in kinds if k != _PAD_NIL]  # adding zero changes nothing
    if not kinds:
        return _PAD_NIL
    if _PAD_WILD in kinds:
        return _PAD_WILD
    if all(k == _PAD_ZERO for k in kinds):
        return _PAD_ZERO
    return _PAD_FREE if all(k == _PAD_FREE for k in kinds) else _PAD_SOME


def _pad_kind(an: KernelAnalysis, node: cst.BaseExpression, masked: dict[str, tuple[str, bool] | None],
              visiting: set[str], depth: int = 0) -> str:
    """What ``node`` holds at the columns past K of the loads masked by K (``masked``, as for
    :func:`_check_padded_terms`): zero there, nothing read from such a load, or anything else."""
    node = _bare(node)
    if depth > 24:
        return _PAD_SOME
    if isinstance(node, (cst.Integer, cst.Float)):
        return _PAD_NIL if node.evaluated_value == 0 else _PAD_FREE
    if isinstance(node, cst.Name):
        binds = _bindings(an, node.value)
        if node.value in visiting or not binds:
            return _PAD_FREE if not binds else _PAD_ZERO  # a parameter; a name carried through itself: its others
        every = [_pad_kind(an, cst.parse_expression(src), masked, visiting | {node.value}, depth + 1)
                 for src, _ in binds]
        kinds = [k for k in every if k != _PAD_NIL]  # bound to zero on one side: the others tell
        if not kinds:
            return _PAD_NIL
        binds = [b for b, k in zip(binds, every, strict=True) if k != _PAD_NIL]
        if _PAD_WILD in kinds or _PAD_SOME in kinds:
            return _PAD_WILD if _PAD_WILD in kinds else _PAD_SOME
        # bound on the two sides of an `if` (`if EVEN_K: a = tl.load(A)` else masked): zero where it is masked
        return _PAD_ZERO if _PAD_ZERO in kinds and all(
            k == _PAD_ZERO or _reads_a_load(an, src) for k, (src, _) in zip(kinds, binds, strict=True)) else (
            _PAD_SOME if _PAD_ZERO in kinds else _PAD_FREE)
    if isinstance(node, cst.UnaryOperation):
        inner = _pad_kind(an, node.expression, masked, visiting, depth + 1)
        if isinstance(node.operator, (cst.Minus, cst.Plus)) or inner == _PAD_WILD:
            return inner
        return _PAD_FREE if inner == _PAD_FREE else _PAD_SOME  # `~0` is -1, `not 0` is true
    if isinstance(node, cst.Subscript):
        return _pad_kind(an, node.value, masked, visiting, depth + 1)
    if isinstance(node, cst.BinaryOperation):
        left = _pad_kind(an, node.left, masked, visiting, depth + 1)
        right = _pad_kind(an, node.right, masked, visiting, depth + 1)
        if isinstance(node.operator, (cst.Multiply, cst.MatrixMultiply)):
            return _pad_product([left, right])
        if isinstance(node.operator, (cst.Divide, cst.FloorDivide, cst.Modulo)):
            if right in (_PAD_ZERO, _PAD_NIL, _PAD_WILD):
                return _PAD_WILD  # divided by zero there
            return left if left in (_PAD_ZERO, _PAD_NIL) else _pad_sum([left, right])
        return _pad_sum([left, right])
    if isinstance(node, cst.Call):
        if (source := code(node).strip()) in masked:
            fill = masked[source]
            return _PAD_ZERO if fill is None else _PAD_SOME if fill[1] else _PAD_WILD
        func = node.func
        attr = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
            else None
        args = [x.value for x in node.args if x.keyword is None]
        if attr in ("load", "load_tensor_descriptor", "gather"):
            return _PAD_FREE
        if attr == "dot" and len(args) >= 2:
            return _pad_product([_pad_kind(an, x, masked, visiting, depth + 1) for x in args[:2]])
        if attr == "where" and len(args) == 3:
            sides = [_pad_kind(an, x, masked, visiting, depth + 1) for x in args[1:]]
            if all(k in (_PAD_ZERO, _PAD_NIL) for k in sides):
                return _pad_sum(sides)
            test = _pad_kind(an, args[0], masked, visiting, depth + 1)
            return _pad_sum(sides) if test in (_PAD_FREE, _PAD_NIL) else _PAD_WILD if _PAD_WILD in (
                test, *sides) else _PAD_SOME  # a test of a masked load may hold there
        if attr in _PAD_KEEPS:
            method = isinstance(func, cst.Attribute) and not m.matches(func.value, m.Name("tl"))
            inner = func.value if method else args[0] if args else None  # `a.sum(axis=1)`: `a`'s
            return _pad_kind(an, inner, masked, visiting, depth + 1) if inner is not None else _PAD_FREE
        if isinstance(func, cst.Attribute) and not m.matches(func.value, m.Name("tl")):
            args = [func.value, *args]  # a method: of the tensor it is called on too
        kinds = [_pad_kind(an, x, masked, visiting, depth + 1) for x in args]
        return _PAD_FREE if all(k in (_PAD_FREE, _PAD_NIL) for k in kinds) else _PAD_WILD if _PAD_WILD in kinds \
            else _PAD_SOME
    if isinstance(node, (cst.Comparison, cst.BooleanOperation)):
        kinds = [_pad_kind(an, x, masked, visiting, depth + 1) for x in (
            [node.left, *(c.comparator for c in node.comparisons)] if isinstance(node, cst.Comparison)
            else [node.left, node.right])]
        return _PAD_FREE if all(k in (_PAD_FREE, _PAD_NIL) for k in kinds) else _PAD_SOME  # `a == 0` holds there
    if isinstance(node, (cst.Attribute, cst.SimpleString, cst.Tuple, cst.List)):
        return _PAD_FREE  # a type, a shape
    return _PAD_SOME


def _unmasked_step(an: KernelAnalysis, call: cst.Call, varying: set[str]) -> bool:
    """Whether the pointer load ``call`` moves with the loop and reads its block whole: no mask (or one of other
    dims only), no `boundary_check` of a block pointer. A descriptor's load pads past the shape itself."""
    if not m.matches(call.func, m.Attribute(value=m.Name("tl"), attr=m.Name("load"))):
        return False
    pointer = _arg(call, 0, "pointer")
    if pointer is None or not _reads_varying(an, pointer, varying) or _arg(call, 3, "boundary_check") is not None:
        return False
    mask = _arg(call, 1, "mask")
    return mask is None or not any(names_in(term) & varying for term in _mask_terms(an, code(mask)))


def _whole_steps(an: KernelAnalysis, loop: tuple[Where, Where], target: str | None, extent, unmasked: list[Where]
                 ) -> None:
    """Loads that read whole blocks along K with no mask (``unmasked``) end at each rank's last column only where its
    slice is a whole number of the loop's steps; on the full K the kernel asks that of K alone. Each call with more
    than one rank checks it (``row_multiples``: the extent, the columns a step moves, the compile-time test the load
    is under), kept in the analysis' own dict for :func:`whole_steps`."""
    step = an.__dict__.get("_step_columns", {}).get(loop)
    bound = _bare(_bound_value(an, extent)) if extent is not None else None
    if not unmasked or step is None or not isinstance(bound, cst.Name) or target is None:
        return
    for site in unmasked:
        # the compile-time sides around the load, as the row checks read them: one decided by the kernel's own
        # constants (`if EVEN_K:` with `EVEN_K: tl.constexpr = True`) is the same on every launch, and the check asks
        # the call nothing about it
        test = an.launch_test(site) if an.launch_test is not None else ""
        an.__dict__.setdefault("_whole_steps", []).append(((bound.value,), step, test, site.line))


def whole_steps(an: KernelAnalysis) -> tuple[tuple[tuple[str, ...], str, str, int], ...]:
    """What the loops that sum with loads of whole blocks ask of each call (:func:`_whole_steps`), as
    ``LaunchPlan.row_multiples``."""
    return tuple(dict.fromkeys(an.__dict__.get("_whole_steps", ())))


def _check_padding(an: KernelAnalysis, call: cst.Call, site: Where, loop, a, rule: str) -> None:
    """A block pointer's load past its bounds, or a descriptor's, reads its `padding_option`: past the end of each
    rank's slice of K rather than of the full K, as a mask's `other` (:func:`_check_padded_terms`). Only zero
    (`"zero"`, or `""`, which Triton leaves to the hardware's zero fill) is summed the same: `"nan"` is refused."""
    padding = None
    if m.matches(call.func, m.Attribute(value=m.Name("tl"))):
        padding = _arg(call, 4, "padding_option")
    elif isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name):
        made = _made_address(an, call.func.value.value)  # a descriptor made with its padding
        padding = next((x.value for x in made.args if x.keyword is not None
                        and x.keyword.value == "padding_option"), None) if made is not None else None
    if padding is None or m.matches(_bare(padding), _ZERO_PADDING):
        return
    raise AnnotationError(
        f"the load at line {site.line} pads what it reads past the tensor's bounds with "
        f"`padding_option={code(padding).strip()}` in the loop at line {loop[0].line}, which sums the partial sums "
        f"of {a.tensor!r}: each rank runs that loop over its own slice of K, so the padded columns are past the end "
        f"of each rank's slice rather than past the full K, and the sum {rule} makes over the ranks would not be "
        f"the full problem's value", file=site.file, line=site.line, column=site.column,
        hint='pad with zero (`padding_option="zero"`)')


def _finite(an: KernelAnalysis, node: cst.BaseExpression) -> bool:
    """Whether ``node`` is a number literal (signed or not), through names bound once: a fill a zero-filled factor
    beside it makes zero (not `float("inf")`, nor a value TileLink does not read)."""
    return isinstance(_unsigned(an, node), (cst.Integer, cst.Float))


def _unsigned(an: KernelAnalysis, node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` through names bound once, a sign before it left out (`-0.0`, `+1`)."""
    value = _bare(_bound_value(an, node, params_only=False))
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, (cst.Minus, cst.Plus)):
        value = _bare(value.expression)
    return value


def _zero(an: KernelAnalysis, node: cst.BaseExpression) -> bool:
    """Whether ``node`` is zero: a literal (signed or not), `tl.zeros(...)` or `tl.full(shape, 0, ...)` (the
    fill triton.ops.matmul writes, `_0 = tl.zeros((1, 1), dtype=...)`), through names bound once."""
    value = _unsigned(an, node)
    if m.matches(value, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("zeros")))):
        return True
    if m.matches(value, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("full")))):
        fill = _arg(value, 1, "value")
        return fill is not None and _zero(an, fill)
    return isinstance(value, (cst.Integer, cst.Float)) and value.evaluated_value == 0


def _check_whole_extent(an: KernelAnalysis, summing, targets: dict, a, rule: str) -> None:
    """A loop that sums must run over the whole K extent the call passes (`range(0, K, BLOCK_K)`, `range(0,
    tl.cdiv(K, BLOCK_K))`, `range(K, 0, -BLOCK_K)`; through a name bound once): each rank runs it over its own slice
    of K, so a loop over a part of K computed from the extent (`K // 2`, `K - BLOCK_K`) covers that part of each
    rank's slice, not of the full K, and the ranks' sum is not the full problem's value. A loop TileLink does not
    read the extent of is judged by the other checks; a last step peeled out of the loop is refused as such, naming
    its load (:func:`_check_k_offsets`)."""
    for loop in sorted(summing, key=lambda lp: (lp[0].line, lp[0].column)):
        extent, _, down = _loop_extent(an, loop, targets.get(loop))
        header = _loop_header(an, loop)
        if extent is None:
            continue
        bound = value = _bare(_bound_value(an, extent, params_only=False))
        if (counted := _tile_count(an, value)) is not None:
            # a count of K's blocks over which a split-K program takes every S-th (`range(pid_k, k_tiles, SPLIT_K)`,
            # `k_tiles = tl.cdiv(K, BLOCK_K)`): where the blocks start and how they move are the other checks'
            value = _bare(counted[0])
        if isinstance(value, cst.Name) and value.value in an.params:
            binds = [(src, w) for src, w in _bindings(an, value.value)
                     if not (m.matches(v := _bare(cst.parse_expression(src)), m.Call(func=_HINTS)) and v.args
                             and m.matches(_bare(v.args[0].value), m.Name(value.value)))
                     and not m.matches(widened_value(_bare(cst.parse_expression(src))), m.Name(value.value))]
            if binds:
                at = next((w for _, w in binds if w is not None), None)
                raise _loop_refused(
                    loop, a, rule, f"runs over `{value.value}`, which the kernel binds again"
                                   f"{f' at line {at.line}' if at else ''}",
                    "a value the kernel binds may cover another part of each rank's slice than the argument the call "
                    "passes", f"loop over the argument itself (`range(0, {value.value}, BLOCK_K)`), and give the value "
                              f"the kernel computes a name of its own")
            if not down:  # `range(K, 0, -BLOCK_K)` counts what is left: it starts at the extent itself
                _check_range_start(an, loop, header, a, rule)
            continue
        loads = _summing_loads(an, loop)[0]
        stepped = {load.root for load in loads if load.steps}
        if any(load.root in stepped and _peeled(an, loop, header, load)
               for load in _summing_loads(an, loop, outside=True)[0]):
            continue  # refused as a peeled last step, naming its load (_check_k_offsets)
        said, value = code(_bare(extent)).strip(), code(bound).strip()
        through = f" (`{said} = {value}`)" if value != said else ""
        raise _loop_refused(
            loop, a, rule, f"runs over `{said}`{through}, not over the K extent the call passes",
            f"it covers `{said}` of each rank's slice, not of the full K",
            "loop over all of K (`range(0, K, BLOCK_K)`, or `range(0, tl.cdiv(K, BLOCK_K))`) and mask the last step's "
            "columns by K (`mask=offs_k[None, :] < K - k * BLOCK_K`, `other=0.0`)")


def _product_of(factors: tuple[str, ...], coefficient: int = 1) -> tuple[int, tuple[str, ...]]:
    """A product as ``(coefficient, the other factors sorted)``: its integer literals multiplied into the
    coefficient."""
    names = []
    for f in factors:
        if f.isdigit():
            coefficient *= int(f)
        else:
            names.append(f)
    return coefficient, tuple(sorted(names))


def _single_product(poly: Poly) -> tuple[int, tuple[str, ...]] | None:
    """A sum of products as one product: ``(0, ())`` for no term, the term's product for one, ``None`` for more."""
    if len(poly) != 1:
        return None if poly else (0, ())
    ((monomial, coefficient),) = poly.items()
    return _product_of(monomial, coefficient)


def _show_product(product: tuple[int, tuple[str, ...]]) -> str:
    coefficient, names = product
    factors = ([str(coefficient)] if coefficient != 1 or not names else []) + list(names)
    return " * ".join(f"({f})" if len(factors) > 1 and not _atomic(f) else f for f in factors)


def _atomic(source: str) -> bool:
    """Whether ``source`` reads as one factor of a product without brackets (a name, a call, `pid_m`; not `pid_m %
    2`)."""
    try:
        return isinstance(_bare(cst.parse_expression(source)), (cst.Name, cst.Attribute, cst.Call, cst.Subscript,
                                                                cst.Integer, cst.Float))
    except cst.ParserSyntaxError:
        return False


def _less(factors: tuple[str, ...], rest: tuple[str, ...]) -> tuple[str, ...] | None:
    """``factors`` less the factors ``rest`` (each once), or ``None`` where ``rest`` is not among them."""
    left = list(factors)
    for f in rest:
        if f not in left:
            return None
        left.remove(f)
    return tuple(left)


def _column_blocks(an: KernelAnalysis, start: Poly, moves: Poly, moving: str | None, root: str | None,
                   axes: frozenset[int] = frozenset()) -> list[tuple]:
    """The blocks of K columns an address reads a step, each ``(width, advance, strided, start, split)``: a block is
    a term ``tl.arange(0, W) * rest`` of ``start``; its advance on each step, the terms of ``moves`` that are ``rest``
    times more (read without the name ``moving``, the loop's target, where it is given); where it starts, the other
    terms of ``start`` that are ``rest`` times more (``(0, ())``: none; ``None``: more than one), all as products.
    ``strided``: ``rest`` is not empty, so the advance is along the block's own stride (`k * BLOCK_K * stride_ak`
    beside `rk * stride_ak`), or the advance is made of block sizes alone (`k + tl.arange(0, BLOCK_K)`, `k *
    BLOCK_M + ...`), where otherwise an advance may be a row's (`b_ptr + k * N + offs_n` walks B's rows, `offs_n` its
    columns). A term that is another block's rest times more is that block's (the rows' `pid_m * BLOCK_M *
    stride_am` beside `rm * stride_am`), and so is a position times a run-time parameter (`offs_m * stride_am`
    beside columns with no stride, an expert's `e * K * N` beside `offs_k * N`); so is the pointer ``root`` itself.
    ``split``: how far apart the programs along a split-K axis (``axes``: the grid axes the write-back's address does
    not read) start, from a term that is their index times more (`pid_k * BLOCK_K`), as ``(product, axis)``; ``None``
    without one. A block that also starts at another program's position (a tile's, a loaded value, an outer loop's
    target) has the source of that term as its start, which :func:`_check_step_blocks` refuses."""
    aranges = [(m_[i], m_[:i] + m_[i + 1:], c) for m_, c in start.items()
               for i, atom in enumerate(m_) if atom.startswith("arange:") and sum(
                   x.startswith("arange:") for x in m_) == 1]
    steps = [(m_ if moving is None else _less(m_, (moving,)), c) for m_, c in moves.items()
             if moving is None or m_.count(moving) == 1]
    blocks = []
    for atom, rest, width_coefficient in aranges:
        matched = [(left, c) for others, c in steps if others is not None
                   and (left := _less(others, rest)) is not None]
        if not matched or width_coefficient != 1:
            continue  # not columns the steps move, or strided columns: not a block
        others = [r for a_, r, _ in aranges if (a_, r) != (atom, rest) and len(r) > len(rest)]
        shifts, placed, split = [], "", None
        for monomial, c in start.items():
            left = _less(monomial, rest)
            if left is None or atom in monomial or (moving is not None and moving in monomial) or \
                    monomial == (root,) or any(_less(monomial, r) is not None for r in others):
                continue
            if any(_placed(an, x) for x in left):
                at = _split_offset({left: c}, an, axes)
                if at is None and any(x in an.params and x not in an.constexpr_params for x in left):
                    # a position times a run-time parameter is another dim's: the rows' `offs_m * stride_am` beside
                    # columns with no stride, an expert's `e * K * N` beside `offs_k * N`
                    continue
                if at is None or split is not None:
                    placed = _show_product(_product_of(left, c))
                    break
                split = (at[1], at[2])
                continue
            shifts.append(_product_of(left, c))
        width = _product_of(_factor_codes(cst.parse_expression(atom[len("arange:"):])))
        begin = placed or ((0, ()) if not shifts else shifts[0] if len(shifts) == 1 else None)
        # an advance of block sizes alone (`k + tl.arange(0, BLOCK_K)`, `k * BLOCK_M + ...`, `a_ptrs += BLOCK_K`)
        # moves columns whatever their stride; one that reads a run-time parameter may be a row's (`k * D`)
        blocks += [(width, _product_of(left, c), bool(rest) or all(
            x in an.constexpr_params for x in left if not x.isdigit()), begin, split) for left, c in matched]
    return blocks


def _split_axes(an: KernelAnalysis, a) -> frozenset[int]:
    """The grid axes that split K for ``a``'s tensor: those no write of it reads in its address, whose programs add
    into the same tile (a split-K write-back, ``tl.atomic_add``: :func:`split_k`), or store the same one, which each
    launch allows one program along them only (``stored_tiles``: triton.ops.matmul's `if SPLIT_K == 1:` side)."""
    addressed = _program_axes(an, [x.pointer for x in an.accesses_of(a.tensor, "store")])
    return frozenset() if -1 in addressed else frozenset({0, 1, 2} - addressed)


def _split_index(an: KernelAnalysis, atom: str, axes: frozenset[int]) -> int | None:
    """The split axis ``atom`` is the index of (`tl.program_id(axis=1)`, one of ``axes``), or ``None``."""
    node = _bare(cst.parse_expression(atom))
    if not m.matches(node, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("program_id")))):
        return None
    read = _program_axes(an, [atom])
    return next(iter(read)) if len(read) == 1 and read <= axes else None


def _split_offset(terms: Poly, an: KernelAnalysis, axes: frozenset[int]
                  ) -> tuple[Poly, tuple[int, tuple[str, ...]], int] | None:
    """``terms`` with one term a split index times a product (`pid_k * BLOCK_K`) as ``(the other terms, that product,
    the split axis)``; ``None`` where no term is, or where a term reads another program's position (a tile's, a
    loaded value, a loop's target) or the index twice."""
    found, other = None, {}
    for monomial, c in terms.items():
        placed = [x for x in monomial if _placed(an, x)]
        if not placed:
            other[monomial] = c
            continue
        axis = _split_index(an, placed[0], axes) if len(placed) == 1 else None
        if axis is None or found is not None:
            return None
        found = (_product_of(_less(monomial, (placed[0],)), c), axis)
    return None if found is None else (other, found[0], found[1])


def _moved(an: KernelAnalysis, name: str, loop: tuple[Where, Where], reader, at: Where | None = None
           ) -> tuple[Poly, Poly] | None:
    """A name the loop carries (a pointer it advances, `offs_k += BLOCK_K`) as ``(its first binding, what each step
    adds to it)``, read as sums of products; ``None`` where it is bound otherwise than once before the loop and once
    in it."""
    binds = _bindings(an, name)
    moved = [(src, w) for src, w in binds if w is not None and _inside(w, loop)]
    start, total = _before_loop(an, name, loop, reader) if moved else None, {}
    if start is None:
        return None
    if len(moved) > 1 and any(_inside(side.where, loop) for _, w in moved for side in an.branch_sides.get(w, ())):
        return None  # advances under an `if`: a step may take some of them only
    for src, w in moved:  # each advance in the step (a step unrolled by hand advances it once a block)
        step = reader.read(cst.parse_expression(src))
        if step is None or step.get((name,)) != 1:
            return None
        added = {m_: c for m_, c in step.items() if m_ != (name,)}
        total = poly_add(total, added)
        if at is not None and _before(w, at):
            start = poly_add(start, added)  # where the load reads: past the advances before it
    return start, total


def _before_loop(an: KernelAnalysis, name: str, loop: tuple[Where, Where], reader) -> Poly | None:
    """What ``name`` holds where the loop starts, read as a sum of products: a parameter (itself) or its first
    binding, plus what each `name += X` (or `name = name + X`) before the loop adds (`a_ptr += pid_b * stride_ab`,
    `a_ptrs += pid_n * BLOCK_K * stride_ak`); ``None`` where it is bound after the loop too, or otherwise, or under an
    `if` or in another loop before it."""
    binds = sorted([(src, w) for src, w in _bindings(an, name) if w is not None and not _inside(w, loop)],
                   key=lambda b: (b[1].line, b[1].column))
    if any(not _before(w, loop[0]) for _, w in binds):
        return None
    if name in an.params:
        start, more = {(name,): 1}, binds
    elif binds:
        start, more = reader.read(cst.parse_expression(binds[0][0])), binds[1:]
    else:
        return None
    around = [lp for lp in _loop_targets(an) if _inside(loop[0], lp)] + [loop]
    for src, w in more:
        if start is None or any(_inside(w, lp) for lp in _loop_targets(an) if lp not in around) or not set(
                an.branch_sides.get(w, ())) <= set(an.branch_sides.get(loop[0], ())):
            return None  # moved in another loop, or under an `if` the loop is not under
        step = reader.read(cst.parse_expression(src))
        if step is None or step.get((name,)) != 1:
            return None
        start = poly_add(start, {m_: c for m_, c in step.items() if m_ != (name,)})
    return start


def _at_loop_start(an: KernelAnalysis, poly: Poly, loop: tuple[Where, Where], reader, varying: set[str]) -> Poly:
    """``poly`` with each name the loop does not change that is moved before the loop (a parameter `a_ptr += ...`, a
    pointer made and then moved) written out as what it holds where the loop starts (:func:`_before_loop`), where it
    is one term of its own."""
    for name in sorted({x for m_ in poly for x in m_ if x not in varying}):
        binds = [w for _, w in _bindings(an, name) if w is not None and not _inside(w, loop)]
        if not binds or name not in an.params and len(binds) < 2 or poly.get((name,)) != 1 or sum(
                name in m_ for m_ in poly) != 1:
            continue
        start = _before_loop(an, name, loop, reader)
        if start is not None:
            poly = poly_add({m_: c for m_, c in poly.items() if m_ != (name,)}, start)
    return poly


def _advanced(an: KernelAnalysis, name: str, loop: tuple[Where, Where], reader, at: Where
              ) -> list[tuple[Poly, Poly, tuple[int, tuple[str, ...]]]] | str | None:
    """A block pointer the loop moves (`p = tl.make_block_ptr(..., offsets=(o0, o1), block_shape=(b0, b1), ...)`
    before it, `p = tl.advance(p, (d0, d1))` in it) as each dim's ``(its offset where the load at ``at`` reads, what a
    step adds to it, its block's width)``; ``None`` where the loop does not bind it; else why TileLink does not read
    its moves: made or moved otherwise (more than once before the loop, through another name, `p.advance(...)`), an
    advance under an `if`, or more than one dim moved."""
    binds = _bindings(an, name)
    first = [src for src, w in binds if w is None or not _inside(w, loop)]
    moved = [(src, w) for src, w in binds if w is not None and _inside(w, loop)]
    if not moved or not first and len(moved) == 1 and m.matches(
            _bare(cst.parse_expression(moved[0][0])), m.Call(func=m.Attribute(attr=m.Name("make_block_ptr")))):
        return None  # not moved, or made afresh on each step from the step's offsets
    made = _bare(cst.parse_expression(first[0])) if len(first) == 1 else None
    if made is None or not m.matches(made, m.Call(func=m.Attribute(attr=m.Name("make_block_ptr")))):
        return "is made or moved more than once outside the loop"
    if any(_inside(side.where, loop) for _, w in moved for side in an.branch_sides.get(w, ())):
        return "is advanced under an `if`, so a step may not move it"
    parts = _block_ptr_parts(made)
    if parts is None:
        return "is made with offsets or a block shape TileLink does not read"
    offsets, shape = parts
    starts = [reader.read(e.value) for e in offsets.elements]
    steps: list[Poly] = [{} for _ in starts]
    for src, w in moved:
        step = _bare(cst.parse_expression(src))
        if not m.matches(step, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("advance")),
                                      args=[m.Arg(m.Name(name)), m.Arg()])):
            return f"is bound in the loop otherwise than by `tl.advance({name}, ...)` (`{src}`)"
        deltas = _bare(step.args[1].value)
        if not isinstance(deltas, (cst.Tuple, cst.List)) or len(deltas.elements) != len(starts):
            return f"is advanced by offsets TileLink does not read (`{src}`)"
        for i, e in enumerate(deltas.elements):
            added = reader.read(e.value)
            if added is None or starts[i] is None:
                return f"is advanced by offsets TileLink does not read (`{src}`)"
            steps[i] = poly_add(steps[i], added)
            if _before(w, at):
                starts[i] = poly_add(starts[i], added)  # where the load reads: past the advances before it
    if sum(bool({m_: c for m_, c in x.items() if c}) for x in steps) > 1:
        return "is advanced along more than one dim"
    along = [i for i, x in enumerate(steps) if {m_: c for m_, c in x.items() if c}]
    why = _block_ptr_along_k(an, made, along[0], loop) if along else None
    if why is not None:
        return why
    return [(start, step, _product_of(_factor_codes(e.value))) for start, step, e in zip(
        starts, steps, shape.elements, strict=True)]


def _block_ptr_parts(made: cst.Call) -> tuple[cst.Tuple | cst.List, cst.Tuple | cst.List] | None:
    """The offsets and the block shape of `tl.make_block_ptr(base, shape, strides, offsets, block_shape, order)`, by
    place or keyword, one entry a dim; ``None`` where either is no tuple or list of as many entries."""
    offsets, shape = (_bare(x) if x is not None else None for x in (
        _block_ptr_arg(made, 3, "offsets"), _block_ptr_arg(made, 4, "block_shape")))
    if not isinstance(offsets, (cst.Tuple, cst.List)) or not isinstance(shape, (cst.Tuple, cst.List)) or len(
            offsets.elements) != len(shape.elements):
        return None
    return offsets, shape


def _made_afresh(an: KernelAnalysis, name: str, loop: tuple[Where, Where]
                 ) -> list[tuple[cst.BaseExpression, str]] | str | None:
    """A block pointer made once on each step of the loop from the step's offsets (`p = tl.make_block_ptr(...,
    offsets=(pid_m * BLOCK_M, k), block_shape=(BLOCK_M, BLOCK_K), ...)` in it) as each dim's ``(offset, block
    width)``, read as a descriptor's load's; ``None`` where it is not bound so; why not where its offsets or block
    shape are not read."""
    binds = _bindings(an, name)
    if len(binds) != 1 or binds[0][1] is None or not _inside(binds[0][1], loop):
        return None
    return _made_parts(an, _bare(cst.parse_expression(binds[0][0])), loop)


def _made_parts(an: KernelAnalysis, made: cst.BaseExpression, loop: tuple[Where, Where]
                ) -> list[tuple[cst.BaseExpression, str]] | str | None:
    """:func:`_made_afresh` of the call ``made`` itself (also one written in the load, `tl.load(tl.make_block_ptr(
    ...))`); ``None`` where it is no `tl.make_block_ptr`. Its base must not move with the loop: TileLink reads the
    columns from the offsets."""
    if not m.matches(made, m.Call(func=m.Attribute(attr=m.Name("make_block_ptr")))) or not made.args:
        return None
    parts = _block_ptr_parts(made)
    if parts is None:
        return "is made with offsets or a block shape TileLink does not read"
    target = _loop_targets(an).get(loop)
    base = _block_ptr_arg(made, 0, "base")
    if base is None or _reads_varying(an, base, _varying(an, loop, target)):
        return "is made at a base that moves with the loop"
    along = [i for i, o in enumerate(parts[0].elements) if target is not None and target in _names_through(
        an, o.value, outside_loops=False)]
    why = _block_ptr_along_k(an, made, along[0], loop) if len(along) == 1 else None
    if why is not None:
        return why
    return [(o.value, code(b.value).strip()) for o, b in zip(parts[0].elements, parts[1].elements, strict=True)]


def _block_ptr_arg(made: cst.Call, place: int, keyword: str) -> cst.BaseExpression | None:
    """The argument of `tl.make_block_ptr(base, shape, strides, offsets, block_shape, order)` at ``place`` or
    ``keyword``."""
    named = next((a.value for a in made.args if a.keyword is not None and a.keyword.value == keyword), None)
    if named is not None:
        return named
    return made.args[place].value if len(made.args) > place and made.args[place].keyword is None else None


def _block_ptr_along_k(an: KernelAnalysis, made: cst.Call, dim: int, loop: tuple[Where, Where]) -> str | None:
    """Why a block pointer moved along its dim ``dim`` by the loop does not read the columns its offsets say, or
    ``None``: its shape there must be the K extent the call passes (`(M, K - BLOCK_K)` leaves out each rank's last
    columns, not the full K's), and its base where the loop starts must not be moved along that dim (`a_ptr +=
    BLOCK_K * stride_ak` before the loop starts each rank's columns further in)."""
    reader, target = _Offsets(an), _loop_targets(an).get(loop)
    shape, strides = (_bare(_bound_value(an, x, params_only=False)) if x is not None else None
                      for x in (_block_ptr_arg(made, 1, "shape"), _block_ptr_arg(made, 2, "strides")))
    extent = _loop_extent(an, loop, target)[0]
    if extent is not None and isinstance(shape, (cst.Tuple, cst.List)) and dim < len(shape.elements):
        want = code(_bare(_bound_value(an, extent, params_only=False))).strip()
        have = code(_bare(_bound_value(an, shape.elements[dim].value, params_only=False))).strip()
        if have != want and code(_bare(extent)).strip() != have:
            return f"is made with `{have}` along K where the loop runs over `{want}`"
    base = _block_ptr_arg(made, 0, "base")
    if base is None or not isinstance(strides, (cst.Tuple, cst.List)) or dim >= len(strides.elements):
        return None
    start, stride = reader.read(base), reader.read(strides.elements[dim].value)
    if start is None or stride is None or len(stride) != 1:
        return None
    start = _at_loop_start(an, start, loop, reader, {target} if target else set())
    ((unit, _),) = stride.items()
    moved = [m_ for m_ in start if len(m_) > 1 or m_ and m_[0] not in an.params]
    moved = [m_ for m_ in moved if _less(m_, unit) is not None]
    if moved:
        return f"is made at a base moved along K (`{_show_term(start, moved[0])}`) where the loop starts"
    return None


def _check_range_start(an: KernelAnalysis, loop: tuple[Where, Where], header: str, a, rule: str) -> None:
    """A loop that sums over `range(start, K, F)` must start at 0, or at a split-K program's own first column
    (`pid_k * BLOCK_K`, `pid_k` a grid axis the write-back's address does not read; its steps are read by
    :func:`_check_step_blocks`): each rank runs it over its own slice of K, so a loop that starts further in
    (`range(BLOCK_K, K, BLOCK_K)`, `range(K // 2, K, ...)`), or at a tile's position (`range(pid_m * BLOCK_M, K,
    BLOCK_K)`, a triangular product's), leaves out the first columns of each rank's slice, not of the full K."""
    try:
        args = _range_args(cst.parse_expression(header))  # type: ignore
    except (cst.ParserSyntaxError, AttributeError):
        return
    if len(args) != 3 or m.matches(_bare(_bound_value(an, args[0], params_only=False)), m.Integer("0")):
        return
    start = code(_bare(args[0])).strip()
    read = _Offsets(an).read(args[0])
    split = _split_offset(read, an, _split_axes(an, a)) if read is not None else None
    if split is not None and not split[0]:
        return
    placed = read is not None and any(_placed(an, x) for m_ in read for x in m_)
    raise _loop_refused(loop, a, rule, f"starts at `{start}` (`{header}`), not at 0",
                        f"it leaves out the first `{start}` columns of each rank's slice, not of the full K",
                        "start the loop at 0 (`range(0, K, BLOCK_K)`) and mask the last step's columns by K"
                        + ("; a split-K program may start at its own block (`range(pid_k * BLOCK_K, K, BLOCK_K * "
                           "SPLIT_K)`, `pid_k` the program id of a grid axis the tl.atomic_add's address does not "
                           "read)" if placed else ""))


def _check_restarted(an: KernelAnalysis, summing, targets: dict, a, rule: str) -> None:
    """A pointer, a parameter or offsets the loop that sums advances along K (`a_ptrs += BLOCK_K * stride_ak`,
    `a_bp = tl.advance(a_bp, ...)`) must be made again on each pass of every other loop around it (a persistent
    kernel's tile loop): one made before that loop starts each pass where the last ended, past K. The plain kernel
    reads past K there too; each rank's slice of K ends elsewhere, so the ranks' sum is not even that kernel's value.
    Refused at the first load that reads it."""
    for loop in sorted(summing, key=lambda lp: (lp[0].line, lp[0].column)):
        outers = sorted((lp for lp in targets if lp != loop and lp not in summing and _inside(loop[0], lp)),
                        key=lambda lp: (lp[0].line, lp[0].column))
        if not outers:
            continue
        loads, _, carried = _summing_loads(an, loop)
        for load in sorted(loads, key=lambda ld: (ld.site.line, ld.site.column)):
            read = set(load.pointers).union(*(names_in(node) for node in load.offsets))
            for name in sorted(read & carried - {targets.get(loop)}):
                binds = [(src, w) for src, w in _bindings(an, name) if w is not None]
                if any(_inside(w, loop) and name not in names_in(cst.parse_expression(src)) for src, w in binds):
                    continue  # made afresh in the loop that sums too (`if k == 0: a_ptrs = ...`): its own checks
                for outer in outers:
                    # made again on each pass: in that loop, before the loop that sums, from other values than its own
                    # (`a_ptrs = a_ptrs + 0` is no new start), under no `if` the loop that sums is not under
                    if any(_inside(w, outer) and _before(w, loop[0]) and name not in names_in(cst.parse_expression(
                            src)) and set(an.branch_sides.get(w, ())) <= set(an.branch_sides.get(loop[0], ()))
                           for src, w in binds):
                        continue
                    made = "is a parameter" if name in an.params and not any(
                        not _inside(w, loop) for _, w in binds) else "is made before it"
                    through = f"`{name}`" if name == load.root else f"`{load.root or name}` through `{name}`"
                    raise AnnotationError(
                        f"the load at line {load.site.line} reads {through}, which the loop at line {loop[0].line} "
                        f"advances along K as it sums the partial sums of {a.tensor!r}; "
                        f"`{name}` {made} and is not made again on the passes of the loop at line {outer[0].line} "
                        f"around it, so each pass starts it where the last one ended, past K. Each rank runs the loop "
                        f"over its own slice of K, which ends elsewhere, and the sum {rule} makes over the ranks would "
                        f"not be the kernel's value", file=load.site.file, line=load.site.line,
                        column=load.site.column,
                        hint=f"advance a pointer made from `{name}` on each pass of the loop at line {outer[0].line} "
                             f"(`{name}s = {name} + ...` there), not `{name}` itself" if name in an.params else
                        f"make `{name}` on each pass of the loop at line {outer[0].line}, before the loop that sums "
                        f"(`{name} = ...` there)")


def _check_step_blocks(an: KernelAnalysis, summing, targets: dict, a, rule: str) -> None:
    """The steps of a loop that sums must tile K: on each step, the blocks of K columns the loads of one tensor read
    (`tl.arange(0, W)` times the column stride in an address, in a pointer's or an offsets vector's first binding
    where the loop advances it, a descriptor's `block_shape` entry) start at 0, W, 2W, ... (n blocks: one, or a step
    unrolled by hand) and move by n W a step (`k * BLOCK_K + tl.arange(0, BLOCK_K)`, `start_k` over `range(0, K,
    BLOCK_K)`, `a_ptrs += BLOCK_K * stride_ak`); and the loop moves by what some tensor's blocks move by (`range(0,
    tl.cdiv(K, BLOCK_K))`, `range(0, K, BLOCK_K)`, `range(K, 0, -BLOCK_K)`). Each rank runs the loop over its own slice
    of K: steps that leave columns out between them (`k * 2 * BLOCK_K + tl.arange(0, BLOCK_K)`), read some twice,
    start past the slice's first column (`k * BLOCK_K + BLOCK_K + ...`) or are counted by another width, leave out or
    repeat other columns on each rank than on the full K, and the ranks' sum is not the full problem's value.
    Refused. A split-K program's blocks also start at its split index's place (`pid_k * BLOCK_K + ...`, or a range
    from `pid_k * BLOCK_K`, `pid_k` in tiles): the programs must start n W apart and move by S n W a step, where S,
    the number of programs along the split axis, is checked at each launch against the grid (``split_steps``, kept
    in the analysis' own dict for :func:`split_steps`). Blocks TileLink does not read (strided columns, a start of
    several terms, another program's position, an advance along another dim) are left to the other checks."""
    reader, axes = _Offsets(an), _split_axes(an, a)
    checked = an.__dict__.setdefault("_split_steps", [])
    for loop in sorted(summing, key=lambda lp: (lp[0].line, lp[0].column)):
        target = targets.get(loop)
        extent, factors, down = _loop_extent(an, loop, target)
        if extent is None or target is None:
            continue
        header = _loop_header(an, loop)
        try:
            args = [_bound_value(an, x, params_only=False) for x in _range_args(cst.parse_expression(header))]
        except (cst.ParserSyntaxError, AttributeError):
            continue
        ranged = len(args) == 3 and not down
        started = None  # a split-K program's own start, `range(pid_k * BLOCK_K, K, ...)`: (its index's factor, axis)
        if ranged and not m.matches(_bare(args[0]), m.Integer("0")):
            split = _split_offset(reader.read(args[0]) or {}, an, axes)
            if split is None or split[0]:
                continue  # refused by _check_range_start
            started = split[1:]
        if down:  # `range(K, 0, -F)`: what is left drops by F a step
            step = _bare(args[2])
            step = step.expression if isinstance(step, cst.UnaryOperation) else step
            count = units = _product_of(tuple(f.lstrip("-") for f in _factor_codes(step)))
        else:
            # the columns of a tile where the range counts tiles (`tl.cdiv(K, BLOCK_K)`), one column where it counts
            # columns (`range(0, K, BLOCK_K)`)
            tile = _product_of(tuple(f for x in factors for f in _factor_codes(
                _bound_value(an, cst.parse_expression(x), params_only=False))))
            units = _product_of(_factor_codes(args[2])) if ranged else tile
            # a range over a count of tiles with a step (`range(pid_k, k_tiles, SPLIT_K)`) moves by S tiles a step
            count = _times(units, tile) if ranged else units
        loads, _, carried = _summing_loads(an, loop)
        # each tensor's blocks: (width, advance, start, line, split)
        found: dict[str, list] = {}
        for load in loads:
            if not load.steps or load.helper or load.root is None:
                continue
            blocks, direct = [], []  # direct: blocks moved by the target itself, which moves by `units` in a range
            if load.blocks or len(load.offsets) > 1:  # a descriptor's block of each offset, moved along K
                for node, block in zip(load.offsets, load.blocks or (None,) * len(load.offsets), strict=True):
                    poly = reader.read(node)
                    if poly is None or down:
                        continue
                    width = _product_of(_factor_codes(cst.parse_expression(block))) if block else None
                    for name in sorted({x for m_ in poly for x in m_ if x in carried and x != target}):
                        read = _moved(an, name, loop, reader, load.site)  # an offset the loop advances
                        if read is None or len(read[1]) != 1 or any(_placed(an, x) for m_ in read[1] for x in m_):
                            continue
                        first, split = _unplaced(an, read[0], axes)
                        blocks.append((width, _single_product(read[1]), True,
                                       _single_product(first) if first is not None else _elsewhere(an, read[0], axes),
                                       split))
                    direct += _offset_block(an, poly, width, target, axes)
            else:
                for node in load.offsets:
                    inline = _made_parts(an, _bare(node), loop)  # `tl.load(tl.make_block_ptr(...))`
                    if inline is not None:
                        direct += _afresh_blocks(an, inline, "a block pointer that", "the block pointer", load, loop,
                                                 a, rule, down, axes)
                        continue
                    poly = reader.read(node)
                    if poly is None:
                        continue
                    twice = sorted(x for m_ in poly for x in m_ if x not in carried and x != target and sum(
                        w is not None and _inside(w, loop) for _, w in _bindings(an, x)) > 1)
                    if twice:  # a step unrolled by hand through one name (`offs_k = ...` made twice a step)
                        raise _step_refused(
                            load.site, loop, a, rule, f"reads `{load.root}` at offsets made more than once in the "
                                                      f"loop (`{twice[0]}`),", "",
                            "TileLink does not read which columns each of those makes, nor that they cover each "
                            "rank's slice of K once", f"give each block's offsets a name of its own (`{twice[0]}0`, "
                                                      f"`{twice[0]}1`), each made once a step")
                    for name in sorted({x for m_ in poly for x in m_ if x != target and (
                            x in carried or _made_address(an, x) is not None)}):
                        afresh = _made_afresh(an, name, loop)
                        if afresh is not None:  # made on each step at the step's offsets: a descriptor's load
                            direct += _afresh_blocks(an, afresh, f"the block pointer `{name}`, which",
                                                     f"`{name}`", load, loop, a, rule, down, axes)
                            continue
                        if _made_address(an, name) is not None:  # a block pointer the loop moves by `tl.advance`
                            dims = _advanced(an, name, loop, reader, load.site)
                            if isinstance(dims, str):
                                raise _step_refused(
                                    load.site, loop, a, rule, f"reads `{load.root}` through the block pointer "
                                                              f"`{name}`, which {dims},", "",
                                    "TileLink cannot check that its steps cover each rank's slice of K once",
                                    f"make `{name}` once before the loop and move it along K alone, by one "
                                    f"`{name} = tl.advance({name}, (0, BLOCK_K))` a step (or use a tensor "
                                    f"descriptor, `desc.load([row, k * BLOCK_K])`)")
                            for dim in dims or ():
                                first, split = _unplaced(an, dim[0], axes)
                                if dim[1] and len(dim[1]) == 1:
                                    blocks.append((dim[2], _single_product(dim[1]), True, _single_product(first)
                                                   if first is not None else _elsewhere(an, dim[0], axes), split))
                            continue
                        read = _moved(an, name, loop, reader, load.site)  # a pointer or offsets the loop advances
                        if read is not None:
                            start = read[0]
                            if poly.get((name,)) == 1 and sum(name in m_ for m_ in poly) == 1:
                                # the address around it (`a_ptr + offs` over a parameter the loop advances)
                                start = poly_add({m_: c for m_, c in poly.items() if m_ != (name,)}, start)
                            blocks += _column_blocks(an, start, read[1], None, load.root, axes)
                    poly = _at_loop_start(an, poly, loop, reader, carried | {target})
                    if not down and any(target in m_ for m_ in poly):
                        direct += _column_blocks(an, poly, poly, target, load.root, axes)
            if ranged:
                moved_direct = []
                for w, adv, strided, begin, split in direct:
                    if started is not None:  # the programs' first blocks, `pid_k * F` steps of the target apart
                        if split is not None:  # both the range and the address start at the split: twice apart
                            raise _loop_refused(
                                loop, a, rule, f"starts at a split-K program's position (`{header}`), and the load "
                                               f"at line {load.site.line} adds that position again",
                                "its programs' blocks are twice as far apart as its steps assume",
                                "offset the columns by the split's position once: in the range (`offs_k = k + "
                                "tl.arange(0, BLOCK_K)`) or in the address (`range(0, K, BLOCK_K * SPLIT_K)`)")
                        split = (_times(adv, started[0]), started[1])
                    moved_direct.append((w, _times(adv, units), strided, begin, split))
                direct = moved_direct
            for width, advance, strided, begin, split in blocks + direct:
                if not (strided or width is None or advance[1] == width[1]):
                    continue  # no block of K columns: an advance along another dim (a GEMV's `k * D` beside `offs_d`)
                if isinstance(begin, str):
                    what = ("which moves with the loop's step besides the pointer's own advance" if re.search(
                        rf"\b{re.escape(target)}\b", begin) else "which reads a program's position, a loaded value "
                                                                  "or another loop's target")
                    raise _step_refused(
                        load.site, loop, a, rule, f"reads `{load.root}`'s columns along K from `{begin}` on, {what},",
                        "",
                        "the columns it leaves out or reads twice are other columns of each rank's slice than of the "
                        "full K",
                        "read each step's block of K from where the step starts (`k * BLOCK_K + tl.arange(0, "
                        "BLOCK_K)`) in every program; a split-K program may start at its split's block (`pid_k * "
                        "BLOCK_K + ...`, `pid_k` the program id of a grid axis the write's address does not read)")
                found.setdefault(load.root, []).append((width, advance, begin, load.site, split))
        if count != (1, ()) and all(f in an.params for f in count[1]):  # what each rank's K must be a multiple of
            an.__dict__.setdefault("_step_columns", {})[loop] = " * ".join(
                ([str(count[0])] if count[0] != 1 else []) + list(count[1]))
        read = _refuse_gaps(an, found, count, loop, header, a, rule)
        if started is not None and not read:
            raise _loop_refused(
                loop, a, rule, f"starts at a split-K program's position (`{header}`), but TileLink reads no block of "
                               f"K columns (`k + tl.arange(0, BLOCK_K)`) its steps move",
                "it cannot check that the programs along the split axis cover each rank's slice once",
                "read each step's columns as a block, `offs_k = k + tl.arange(0, BLOCK_K)` over `range(pid_k * "
                "BLOCK_K, K, BLOCK_K * SPLIT_K)`")
        checked += read


def _afresh_blocks(an: KernelAnalysis, dims, pointer: str, named: str, load, loop: tuple[Where, Where], a, rule: str,
                   down: bool, axes: frozenset[int]) -> list[tuple]:
    """The blocks of K columns a block pointer made on each step reads (``dims``: :func:`_made_parts`, each dim's
    offset and block), as a descriptor's load's (:func:`_offset_block`); refused where TileLink does not read it
    (``dims`` says why), ``pointer`` and ``named`` naming it in the message and the hint."""
    if isinstance(dims, str):
        raise _step_refused(
            load.site, loop, a, rule, f"reads `{load.root}` through {pointer} {dims},", "",
            "TileLink cannot check that its steps cover each rank's slice of K once",
            f"make {named} at the tensor's own base, with a tuple of offsets (`(pid_m * BLOCK_M, k)`) and a tuple of "
            f"block sizes, one a dim")
    reader, target, blocks = _Offsets(an), _loop_targets(an).get(loop), []
    for node, block in dims:
        offset = reader.read(node)
        if offset is not None and not down:
            blocks += _offset_block(an, offset, _product_of(_factor_codes(cst.parse_expression(block))), target, axes)
    return blocks


def _offset_block(an: KernelAnalysis, poly: Poly, width, target: str, axes: frozenset[int]) -> list[tuple]:
    """A descriptor's or a block pointer's offset along one dim, ``width`` wide, as the block of K columns it reads
    (:func:`_column_blocks`' form), where the loop's target alone moves it (`k * BLOCK_K`, `pid_k * BLOCK_K + k`);
    none where it does not."""
    moved = [(_less(m_, (target,)), c) for m_, c in poly.items() if m_.count(target) == 1]
    if len(moved) != 1 or moved[0][0] is None:
        return []  # not moved along K by the step alone
    still = {m_: c for m_, c in poly.items() if target not in m_}
    rest, split = _unplaced(an, still, axes)
    return [(width, _product_of(*moved[0]), True, _single_product(rest) if rest is not None
             else _elsewhere(an, still, axes), split)]


def _times(x: tuple[int, tuple[str, ...]], y: tuple[int, tuple[str, ...]]) -> tuple[int, tuple[str, ...]]:
    return x[0] * y[0], tuple(sorted(x[1] + y[1]))


def _unplaced(an: KernelAnalysis, terms: Poly, axes: frozenset[int]
              ) -> tuple[Poly | None, tuple[tuple[int, tuple[str, ...]], int] | None]:
    """``terms`` as ``(its terms but a split index's, (that term's factor, the split axis))``: ``(terms, None)``
    where none reads a program's position, ``(None, None)`` where one reads another's (a tile's, a loaded value)."""
    if not any(_placed(an, x) for m_ in terms for x in m_):
        return terms, None
    split = _split_offset(terms, an, axes)
    return (None, None) if split is None else (split[0], split[1:])


def _elsewhere(an: KernelAnalysis, terms: Poly, axes: frozenset[int]) -> str:
    """The source of the term of ``terms`` that reads a position other than a split index's (a tile's, a loaded
    value, an outer loop's target), or of the first that reads any where each is a split's (one split added twice)."""
    placed = [(m_, c) for m_, c in terms.items() if any(_placed(an, x) for x in m_)]
    other = [(m_, c) for m_, c in placed if _split_offset({m_: c}, an, axes) is None]
    return _show_product(_product_of(*(other or placed)[0]))


def _divided(x: tuple[int, tuple[str, ...]], y: tuple[int, tuple[str, ...]]) -> tuple[int, tuple[str, ...]] | None:
    """The product ``x / y``, where ``y`` divides it (its coefficient and each of its factors), else ``None``."""
    left = _less(x[1], y[1])
    return None if left is None or y[0] == 0 or x[0] % y[0] else (x[0] // y[0], left)


#: what to write where the tensors' K blocks do not all move with one split index
_SAME_SPLIT = ("offset every block of K columns of every tensor by the same split index (`pid_k * BLOCK_K + "
               "tl.arange(0, BLOCK_K)`, `pid_k` one grid axis's program id)")


def _refuse_gaps(an: KernelAnalysis, found: dict[str, list], count: tuple[int, tuple[str, ...]],
                 loop: tuple[Where, Where], header: str, a, rule: str) -> list[tuple[str, int, int, str]]:
    """Refuse the blocks of :func:`_check_step_blocks` (each tensor's ``(width, advance, start, site, split)``) that do
    not tile K, or a loop ``count`` (what it moves by a step) that no tensor's blocks move by. Returns what a split-K
    loop's steps ask of the launch: ``(the number of programs along the split axis, as source, that axis, the loop's
    line, what it moves by a step)``."""
    advances, splits = [], []
    for root, blocks in found.items():
        widths, moves = {b[0] for b in blocks}, {b[1] for b in blocks}
        if len(widths) > 1 and None in widths:
            widths.discard(None)
        if len(widths) != 1 or len(moves) != 1:
            continue  # blocks of several widths: not read
        (width,), (advance,) = widths, moves
        starts = sorted({b[2] for b in blocks}, key=lambda s_: (s_ is None, s_ or (0, ())))
        if width is None:  # a descriptor whose block TileLink does not see: as wide as each step moves by its loads
            width = (advance[0] // len(starts), advance[1]) if advance[0] % len(starts) == 0 else advance
        places = sorted(s_[0] // width[0] if s_ == (0, ()) or (
            s_ is not None and s_[1] == width[1] and s_[0] % width[0] == 0) else -1 for s_ in starts)
        site = blocks[0][3]
        if places != list(range(len(places))):
            shifted = next(s_ for s_ in starts if s_ != (0, ()))
            raise _step_refused(
                next(b[3] for b in blocks if b[2] == shifted), loop, a, rule,
                f"reads `{root}`'s columns along K from "
                f"`{_show_product(shifted) if shifted else 'a start of several terms'}` on, past where the step's "
                f"block starts", "", "it leaves out (or reads twice) other columns of each rank's slice than of the "
                                     "full K",
                f"read each step's block from where the step starts (`k * {_show_product(width)} + tl.arange(0, "
                f"{_show_product(width)})`); a step unrolled by hand reads its blocks at 0, {_show_product(width)}, "
                f"... of the step")
        whole = (width[0] * len(places), width[1])
        split = {b[4] for b in blocks}
        if len(split) > 1:
            raise _step_refused(
                site, loop, a, rule, f"reads `{root}`'s columns along K from a split-K program's position on some "
                                     f"blocks and not on others", "",
                "the programs along the split axis would read other columns of each rank's slice than of the full K",
                _SAME_SPLIT)
        (split,) = split
        if split is not None:
            _split_tiles(an, split, whole, advance, root, site, loop, header, a, rule, splits)
        elif advance != whole:
            raise _step_refused(
                site, loop, a, rule, f"reads `{_show_product(whole)}` columns of `{root}` along K",
                f", and moves them by `{_show_product(advance)}` a step",
                "the columns the steps leave out or read twice are other columns on each rank than on the full K",
                f"move the columns by the block's width on each step (`k * {_show_product(whole)} + tl.arange(0, "
                f"{_show_product(whole)})`, a descriptor's offset `k * {_show_product(whole)}`, or a pointer advanced "
                f"by `{_show_product(whole)}` columns), and count the steps by it (`range(0, tl.cdiv(K, "
                f"{_show_product(whole)}))`)")
        advances.append((advance, site))
    if len({s_[1] for s_ in splits}) > 1:
        root = next(iter(found))
        axes = ", ".join(sorted({str(s_[1]) for s_ in splits}))
        raise _step_refused(
            found[root][0][3], loop, a, rule, f"reads its tensors' columns along K from the positions of programs "
                                              f"along different split axes ({axes})",
            "", "the programs would multiply other columns of one tensor than of another",
            _SAME_SPLIT)
    if splits and len(found) != len({root for root, blocks in found.items() if {b[4] for b in blocks} != {None}}):
        root = next(root for root, blocks in found.items() if {b[4] for b in blocks} == {None})
        raise _step_refused(
            found[root][0][3], loop, a, rule, f"reads `{root}`'s columns along K at the same place in every program "
                                              f"along the split axis, while other tensors' move with it", "",
            "the programs along the split axis would multiply other columns of each rank's slice than of the full K",
            _SAME_SPLIT)
    if advances and count != (1, ()) and all(adv != count for adv, _ in advances):
        advance, site = advances[0]
        raise _loop_refused(
            loop, a, rule, f"moves by `{_show_product(count)}` a step (`{header}`), while the load at line "
                           f"{site.line} reads `{_show_product(advance)}` columns along K a step",
            "its steps cover another part of each rank's slice than of the full K",
            f"step the loop by the block's width: `range(0, tl.cdiv(K, {_show_product(advance)}))` or "
            f"`range(0, K, {_show_product(advance)})`")
    return [(programs, axis, loop[0].line, _show_product(advance)) for programs, axis, advance in
            {(s_[0], s_[1], s_[2]) for s_ in splits}]


def _split_tiles(an: KernelAnalysis, split, whole, advance, root: str, site: Where, loop, header: str, a, rule: str,
                 splits: list) -> None:
    """A split-K tensor's blocks (:func:`_refuse_gaps`): the programs along the split axis start ``whole`` columns
    apart (``split``: their distance, and the axis) and each moves by a whole number S of such steps, S the number of
    programs along that axis, which the launch checks against its grid (appended to ``splits``)."""
    apart, axis = split
    if apart != whole:
        raise _step_refused(
            site, loop, a, rule, f"reads `{_show_product(whole)}` columns of `{root}` along K",
            f", and the programs along the split axis {axis} start `{_show_product(apart)}` columns apart",
            "the programs would leave out or read twice other columns of each rank's slice than of the full K",
            f"start each split's block where the one before ends: `pid_k * {_show_product(whole)} + tl.arange(0, "
            f"{_show_product(whole)})`, moved by `{_show_product(whole)} * SPLIT_K` a step")
    programs = _divided(advance, whole)
    names = set(programs[1]) if programs else set()
    counted = programs is not None and names <= set(an.params)
    if not counted:
        raise _step_refused(
            site, loop, a, rule, f"reads `{_show_product(whole)}` columns of `{root}` along K",
            f", and each program along the split axis {axis} moves them by `{_show_product(advance)}` a step, " + (
                "no whole number of the programs' blocks" if programs is None else
                f"`{_show_product(programs)}` times their blocks, a number TileLink cannot read at the launch"),
            "the programs would leave out or read twice other columns of each rank's slice than of the full K",
            f"move each program's block by `{_show_product(whole)} * SPLIT_K` a step, SPLIT_K a parameter equal to "
            f"the grid's size along axis {axis}")
    splits.append((_show_product(programs), axis, advance))


def _step_refused(site: Where, loop: tuple[Where, Where], a, rule: str, reads: str, after: str, why: str,
                  hint: str) -> AnnotationError:
    """The refusal of a load whose steps do not tile K (:func:`_refuse_gaps`): what it ``reads`` a step, and ``why``,
    on each rank's own slice of K, the ranks' sum is then not the full problem's value."""
    return AnnotationError(
        f"the load at line {site.line} {reads} on each step of the loop at line {loop[0].line}, which sums the partial "
        f"sums of {a.tensor!r}{after}: each rank runs that loop over its own slice of K, so {why}, and the sum {rule} "
        f"makes over the ranks would not be the full problem's value", file=site.file, line=site.line,
        column=site.column, hint=hint)


def _loop_refused(loop: tuple[Where, Where], a, rule: str, what: str, why: str, hint: str) -> AnnotationError:
    """The refusal of a loop that sums the partial sums of ``a``'s tensor: ``what`` it does, and ``why``, on each
    rank's own slice of K, the ranks' sum is then not the full problem's value."""
    return AnnotationError(
        f"the loop at line {loop[0].line}, which sums the partial sums of {a.tensor!r}, {what}: each rank runs it "
        f"over its own slice of K, so {why}, and the sum {rule} makes over the ranks would not be the full problem's "
        f"value", file=loop[0].file, line=loop[0].line, column=loop[0].column, hint=hint)


def _extent_shaped(an: KernelAnalysis, term: cst.BaseExpression, stored: set[str]) -> bool:
    """Whether a mask term in a `while` loop (whose step TileLink does not read) has the form of a bound of the K
    offsets by what is left of K: one `<` or `<=` comparison whose bound reads a parameter passed at run time, of no
    loaded data nor the output's rows (a triangular `(k + rk)[None, :] <= rm[:, None]` is refused for what it is)."""
    if not (isinstance(term, cst.Comparison) and len(term.comparisons) == 1 and isinstance(
            term.comparisons[0].operator, (cst.LessThan, cst.LessThanEqual))):
        return False
    passed = set(an.params) - set(an.constexpr_params)
    return (not m.findall(term, m.Call(func=m.Attribute(attr=m.Name("load"))))
            and not (names_in(term) & stored) - {"None"} and bool(names_in(term.comparisons[0].comparator) & passed))


def _written_helper(an: KernelAnalysis, value: cst.BaseExpression) -> cst.BaseExpression:
    """``value``, a call of a helper TileLink reads written out as what it returns (`acc = step(a, b, acc)`)."""
    bare = _bare(value)
    if isinstance(bare, cst.Call) and isinstance(bare.func, cst.Name) and bare.func.value in an.helpers:
        return _helper_return(an, bare) or value
    return value


def _every_pass(paths: list[tuple[BranchSide, ...]]) -> bool:
    """Whether, of statements each under the `if` sides of its path (outermost first), one runs whichever sides are
    taken: one is under none, or some `if` has each of its two sides covered so by the statements under it."""
    if any(not path for path in paths):
        return True
    return any(all(_every_pass([p[1:] for p in paths if p[0].where == where and p[0].body == body])
                   for body in (True, False)) for where in {p[0].where for p in paths})


def _data_product(an: KernelAnalysis, node: cst.BaseExpression | None, visiting: dict[str, str],
                  skip: frozenset[BranchSide]) -> bool:
    """``a[:, None] * b[None, :]`` of two values of this rank's data: a rank-1 update over its slice of K, which
    summed into an accumulator makes its partial sums (a sum of loaded values alone, a bias, does not)."""
    node = _bare(node) if node is not None else None
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply) and all(
        _classify(an, side, visiting, skip) == _DATA for side in (node.left, node.right))


def _reads_a_load(an: KernelAnalysis, source: str) -> bool:
    """Whether ``source`` reads, through the values of the names it reads, anything loaded (``tl.load``, a
    descriptor's ``.load``)."""
    todo, seen = [source], set()
    while todo:
        node = cst.parse_expression(todo.pop())
        if m.findall(node, m.Call(func=m.Attribute(attr=m.Name("load") | m.Name("gather")))):
            return True
        for name in names_in(node) - seen:
            seen.add(name)
            todo += list(an.values.get(name, ())) + list(an.updates.get(name, ()))
    return False


def _nonlinear_epilogue(an: KernelAnalysis, a, skip: frozenset[BranchSide] = frozenset()) -> _Epilogue | None:
    """Where the value stored by ``a`` is not linear in the partial sums (what, in which source, at which
    statement): the sum over the ranks of what each stores must be what the full problem stores. Loads are this
    rank's data (a weight, a routing weight, a partial input); they may scale the partial sums, not be added to
    them. ``skip``: as for :func:`_classify`."""
    try:
        _classify(an, cst.parse_expression(a.value), {}, skip)
    except _Epilogue as exc:
        exc.site = exc.site or a.where
        return exc
    return None


def _refused_message(tensor: str, rule: str, bad: _Epilogue, where: str = "") -> str:
    """``where``: where the value is made, when not at the store (" at line 12")."""
    if bad.carried:
        return (f"the value stored to {tensor!r} goes through {bad.why} (`{bad.source}`{where.replace(' at', ',', 1)}"
                f"): each rank runs that loop over its own slice of K, and the sum {rule} makes over the ranks would "
                f"not be the full problem's value")
    return (f"the value stored to {tensor!r} goes through {bad.why} (`{bad.source}`){where}: {rule} sums what every "
            f"rank stores, and that sum would not be the full problem's value (the sum of f(partial sums) is not f of "
            f"their sum)")


def _fixed_test(an: KernelAnalysis, test: str) -> bool | None:
    """The value of an `if` test every launch gives the same value (`if True:`, `if 1:`, a test of locals bound once
    to literals, `MODE: tl.constexpr = "gelu"`), or None when a launch decides it (a parameter, a call)."""
    env: dict[str, object] = {}
    for name in names_in(cst.parse_expression(test)) - {"True", "False", "None"}:
        values = an.values.get(name, ())
        if name in an.params or len(values) != 1 or len(an.bindings.get(name, ())) != 1:
            return None
        value = _literal(values[0])
        if value is _UNFIXED:
            return None
        env[name] = value
    value = _literal(test, env)
    return None if value is _UNFIXED else bool(value)


_UNFIXED = object()


def _literal(source: str, env: dict[str, object] | None = None) -> object:
    """The value of ``source`` when it is literals and operators of them (and of the names in ``env``)."""
    node = cst.parse_expression(source)
    if names_in(node) - {"True", "False", "None"} - set(env or ()) or \
            m.findall(node, m.Call() | m.Attribute() | m.Subscript() | m.Lambda() | m.NamedExpr()):
        return _UNFIXED
    try:
        return eval(compile(source.strip(), "<test>", "eval"), {"__builtins__": {}}, dict(env or {}))  # noqa: S307
    except Exception:  # noqa: BLE001 - an operator the literals do not support (`"a" - 1`): a launch never runs it
        return _UNFIXED


def _always_taken(an: KernelAnalysis, side: BranchSide) -> bool:
    """Whether every launch takes ``side``: a static assert there would refuse them all."""
    fixed = _fixed_test(an, side.test) if side.static else None
    return fixed is not None and fixed == side.body


def _epilogue_branches(an: KernelAnalysis, a, rule: str, refused: dict[BranchSide, _Epilogue]) -> None:
    """Checks that the value stored by ``a`` is linear in the partial sums on every launch that compiles. A
    non-linear epilogue inside a branch whose test is known at compile time (``if ACTIVATION == "leaky_relu":``)
    leaves that branch in ``refused`` (a static assert at its top refuses the launches that take it); any other
    raises. ``refused`` is shared by the stores of the kernel."""
    while (bad := _nonlinear_epilogue(an, a, frozenset(refused))) is not None:
        sides = an.branch_sides.get(bad.site, ()) if bad.site is not None else ()
        static = [s for s in sides if s.static and s.first is not None and s not in refused
                  and not _always_taken(an, s)]
        if static:
            bad.tensor = a.tensor
            refused[static[-1]] = bad
            continue
        runtime = next((s for s in reversed(sides) if not s.static), None)
        site = bad.site or a.where
        hint = ("store the partial sums themselves and apply the function after the reduction (on the reduced rows), "
                f"or pass {rule}(..., linear_epilogue=True) if what is stored is linear in the partial sums after all")
        if bad.carried:
            hint = _CARRIED_HINT
        if runtime is not None:
            hint = (f"the `if {runtime.test}:` at line {runtime.where.line} is decided at run time: make its test "
                    f"compile-time (tl.constexpr parameters and literals, as `if ACTIVATION == \"leaky_relu\":`) and "
                    f"{rule} builds the kernel, refusing at compile time only the launches that take this branch; "
                    f"or {hint}")
        where = f" at line {site.line}" if site.line != a.where.line else ""
        always = next((s for s in reversed(sides) if _always_taken(an, s)), None)
        if always is not None and runtime is None:
            where += (f", in the {'`if' if always.body else '`else:` of the `if'} {always.test}:` at line "
                      f"{always.where.line}, which every launch takes (its test does not depend on the launch)")
        if runtime is not None:
            where += (f", in the `if {runtime.test}:` at line {runtime.where.line}, which is decided at run time (with "
                      f"a compile-time test, {rule} would build and refuse only the launches that take the branch)")
        raise AnnotationError(_refused_message(a.tensor, rule, bad, where), file=a.where.file, line=a.where.line,
                              column=a.where.column, hint=hint)


class _Inline(cst.CSTTransformer):
    def __init__(self, values: dict[str, cst.BaseExpression]):
        super().__init__()
        self.values = values

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        value = self.values.get(updated.value)
        return updated if value is None else value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _launch_test(an: KernelAnalysis, side: BranchSide) -> str:
    """The test, in the kernel's constexpr parameters, that a launch takes ``side``: its own and those of the
    compile-time sides around it (a run-time `if` around it is compiled either way), with the locals bound once to a
    compile-time value (`MODE: tl.constexpr = "gelu"`) replaced by their value."""
    sides = [s for s in an.branch_sides.get(side.where, ()) if s.static] + [side]
    expr = cst.parse_expression(" and ".join(f"({s.test})" if s.body else f"not ({s.test})" for s in sides))
    for _ in range(8):  # a local's value may name another local
        local = {n: cst.parse_expression(an.values[n][0]) for n in names_in(expr)
                 if n not in an.params and len(an.values.get(n, ())) == 1 and len(an.bindings.get(n, ())) == 1}
        if not local:
            break
        expr = expr.visit(_Inline(local))
    return code(expr)


def _refuse_in_branches(an: KernelAnalysis, refused: dict[BranchSide, _Epilogue],
                        rule: str) -> tuple[list[Insertion], list[ReportEntry], list[tuple[str, str]]]:
    """A ``tl.static_assert(False, ...)`` at the top of each branch in ``refused`` and a note saying so; raises
    where every side of an `if` (its `elif`s included) is refused: no launch would compile. Returns the insertions,
    the notes, and for the launcher each refused side's test in the constexpr parameters with the assert's message
    (``ReduceScatterLaunch.refused``)."""
    ifs: dict[Where, list[BranchSide]] = {}
    for side in {s for sides in an.branch_sides.values() for s in sides}:
        ifs.setdefault(side.where, []).append(side)

    def all_refused(where: Where) -> bool:
        sides = {s.body: s for s in ifs.get(where, ())}
        if sides.get(True) not in refused or False not in sides:
            return False
        other = sides[False]
        if other.first is not None:
            return other in refused
        elif_ = next((w for w in ifs if an.branch_sides.get(w, ())[-1:] == (other,)), None)
        return elif_ is not None and all_refused(elif_)

    def head(where: Where) -> Where:  # the `if` that starts the chain an `elif` is in
        around = an.branch_sides.get(where, ())[-1:]
        return head(around[0].where) if around and not around[0].body and around[0].first is None else where

    # every side of an inner compile-time `if` refused: the launches that reach it are those of the compile-time side
    # around it, which is refused instead (its assert covers the inner ones), until an `if` has a side left
    while (inner := next((s for s in sorted(refused, key=lambda s: (-s.where.line, s.body))
                          if all_refused(head(s.where))), None)) is not None:
        outer = [s for s in an.branch_sides.get(head(inner.where), ())
                 if s.static and s.first is not None and not _always_taken(an, s)]
        if not outer:
            break
        chain, bad = head(inner.where), _Epilogue.__new__(_Epilogue)
        bad.__dict__.update(refused[inner].__dict__)
        bad.why += (f" on one side of the `if {ifs[chain][0].test}:` at line {chain.line}, and a non-linear "
                    "function of them on each other side")
        for s in [s for s in refused if outer[-1] in an.branch_sides.get(s.where, ())]:
            del refused[s]
        refused.setdefault(outer[-1], bad)
    insertions, report, guards = [], [], []
    for side, bad in sorted(refused.items(), key=lambda kv: (kv[0].where.line, not kv[0].body)):
        site, tensor = bad.site or side.where, bad.tensor
        if all_refused(chain := head(side.where)):
            raise AnnotationError(
                f"{_refused_message(tensor, rule, bad, f' at line {site.line}')}, and every side of the `if "
                f"{ifs[chain][0].test}:` at line {chain.line} stores a function of the partial sums that is not "
                "linear: no launch of the kernel would store their sum", file=site.file, line=site.line,
                column=site.column,
                hint="store the partial sums themselves on one side and apply the function after the reduction "
                     "(on the reduced rows)")
        keyword = "if" if head(side.where) == side.where else "elif"
        branch = f"`{keyword} {side.test}:`" if side.body else f"`else:` of the `{keyword} {side.test}:`"
        message = (f"{site.file}:{site.line}: {_refused_message(tensor, rule, bad)}. A launch that takes the "
                   f"{branch} at line {side.where.line} cannot be reduced over ranks: launch the kernel so that "
                   f"it takes another side, or apply the function to the reduced rows")
        guards.append((_launch_test(an, side), message))
        insertions.append(Insertion(side.first, "before", (
            f"# tilelink: a launch that takes this branch does not compile ({rule}: not linear in the partial sums)",
            f"tl.static_assert(False, {message!r})")))
        report.append(ReportEntry(an.name, rule, "note",
                                  f"in the {branch} at line {side.where.line}, the value stored to {tensor!r} goes "
                                  f"through {bad.why} (`{bad.source}`, line {site.line}): its test is known at "
                                  f"compile time, so a tl.static_assert at the top of that branch makes a launch "
                                  f"that takes it fail to compile, naming line {site.line}; the launches that do not "
                                  f"take it build and store the partial sums", side.where))
    return insertions, report, guards


def _loaded(an: KernelAnalysis, exprs) -> str | None:
    """A load (or an atomic) that ``exprs`` read, directly or through the kernel's assignments: what decides them is
    data, not the program's position."""
    todo, seen = list(exprs), set()
    while todo:
        node = cst.parse_expression(todo.pop())
        for call in m.findall(node, m.Call(func=m.Attribute(attr=m.Name()))):
            if call.func.attr.value == "load" or call.func.attr.value.startswith("atomic_"):  # type: ignore[union-attr]
                return code(call)
        for name in sorted(names_in(node) - seen):
            seen.add(name)
            todo.extend(an.values.get(name, ()))
    return None


def _skipping_returns(an: KernelAnalysis, stores, rule: str) -> list[ReportEntry]:
    """A note for each ``return`` on a condition read from memory (``if tl.load(flag_ptr + pid) == 0: return``) that
    comes before every store of a tile whose rows are the program's own: a program that returns there stores nothing,
    so its rows' channels stay short and the reduction's wait for them times out naming them. A store before the
    ``return`` (the zeros an MoE kernel writes for an expert on another rank) and rows read from an index (a padded
    block past the routed tokens has none) are not noted."""
    static = [a for a in stores if a.tile is not None and not a.tile.dynamic]
    if not static:
        return []
    notes = []
    for where, tests in an.returns:
        if any(not _before(where, a.where) for a in stores):
            continue
        loaded = _loaded(an, tests)
        if loaded is not None:
            notes.append(ReportEntry(
                an.name, rule, "note", f"the kernel returns at line {where.line} on a value it loads (`{loaded}`), "
                f"before the store at line {static[0].where.line}: a program that returns there leaves its rows "
                f"unstored and unnotified, and the reduction's wait for them times out naming them (store its tile, "
                f"zeros if need be, before returning)", where))
    return notes


class _Columns:
    """Reads a store's columns as sums of products (``tilelink.tile_rows``' form): names the kernel binds once are
    written out, ``tl.arange(0, W)`` is the atom ``arange:W``, anything else an atom of its own."""

    def __init__(self, an: KernelAnalysis):
        self.an = an

    def read(self, node: cst.BaseExpression, depth: int = 0) -> Poly | None:
        an = self.an
        node = _bare(node)
        if isinstance(node, cst.Integer):
            value = int(node.evaluated_value)
            return {(): value} if value else {}
        if isinstance(node, cst.Name):
            name = node.value
            values = an.values.get(name, ())
            if depth < 8 and len(values) == 1 and name not in an.rebound and name not in an.params \
                    and len(an.bindings.get(name, ())) <= 1:
                return self.read(cst.parse_expression(values[0]), depth + 1)
            return {(name,): 1}
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract, cst.Multiply)):
            left, right = self.read(node.left, depth), self.read(node.right, depth)
            if left is None or right is None:
                return None
            if isinstance(node.operator, cst.Multiply):
                return poly_mul(left, right)
            return poly_add(left, right, -1 if isinstance(node.operator, cst.Subtract) else 1)
        if m.matches(node, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("arange")))) and len(node.args) == 2:
            lo, hi = self.read(node.args[0].value, depth), self.read(node.args[1].value, depth)
            if lo is None or hi is None:
                return None
            return poly_add(lo, {("arange:" + poly_show(poly_add(hi, lo, -1)),): 1})
        if m.matches(node, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("load")))):
            return None  # read from memory: the two stores may see different values
        if (inner := widened_value(node)) is not None:
            return self.read(inner, depth)  # widened to 64 bits (`(k + tl.arange(0, BLOCK_K)).to(tl.int64)`)
        return {(code(node),): 1}

    def span(self, access) -> tuple[Poly, Poly] | None:
        """``(start, width)`` of the columns one row of the store writes, in elements of its column axis: a
        descriptor store's second offset and block width (2-D), a pointer store's column vector ``start +
        tl.arange(0, W)`` indexed ``[None, :]`` (times the same stride in both stores, compared by the caller);
        ``None`` when it cannot tell."""
        an = self.an
        if access.descriptor:
            box = an.descriptor_box(access)
            if box is None or len(box[0]) != 2:
                return None
            start, width = self.read(cst.parse_expression(box[0][1])), self.read(cst.parse_expression(box[1][1]))
            return None if start is None or width is None else (start, width)
        vector = self.term(access)
        if vector is None:
            return None
        read = self.read(vector[0])
        if read is None:
            return None
        ranges = [k for k in read if len(k) == 1 and k[0].startswith("arange:")]
        if len(ranges) != 1 or read[ranges[0]] != 1:
            return None
        start = {k: v for k, v in read.items() if k != ranges[0]}
        if any(a.startswith("arange:") for k in start for a in k):
            return None
        width = self.read(cst.parse_expression(ranges[0][0][len("arange:"):]))
        return None if width is None else (start, width)

    def term(self, access) -> tuple[cst.BaseExpression, str] | None:
        """The one term of a pointer store's address indexed ``[None, :]``: (its vector, the source of what
        scales it, ``1`` when nothing does)."""
        an = self.an
        pointer: cst.BaseExpression = cst.parse_expression(access.pointer)
        for _ in range(8):  # a pointer alias bound once: its value
            if not isinstance(pointer, cst.Name):
                break
            values = an.values.get(pointer.value, ())
            if len(values) != 1 or pointer.value in an.rebound or len(an.bindings.get(pointer.value, ())) > 1:
                return None
            pointer = cst.parse_expression(values[0])
        terms: list[cst.BaseExpression] = []

        def flatten(node: cst.BaseExpression) -> None:
            node = _bare(node)
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
                flatten(node.left)
                flatten(node.right)
            else:
                terms.append(node)

        flatten(pointer)
        found = []
        for term in terms:
            factors = [term]
            while isinstance(factors[0], cst.BinaryOperation) and isinstance(factors[0].operator, cst.Multiply):
                factors[0:1] = [factors[0].left, factors[0].right]
            columns = [f for f in factors if expanded(f, 1) is not None]
            if columns:
                if len(columns) != 1 or m.findall(term, m.Subscript()) and len(
                        [f for f in factors if m.findall(f, m.Subscript())]) != 1:
                    return None
                found.append((columns[0].value, " * ".join(sorted(code(f) for f in factors if f is not columns[0]))
                              or "1"))
        return found[0] if len(found) == 1 else None


def _exclusive(an: KernelAnalysis, a, b) -> bool:
    """Whether ``a`` and ``b`` lie on the two sides of one ``if`` (an ``elif`` is the ``else`` side of the ``if``
    before it): a program runs one of them at most."""
    sides_a, sides_b = an.branch_sides.get(a.anchor, ()), an.branch_sides.get(b.anchor, ())
    return any(x.where == y.where and x.body != y.body for x in sides_a for y in sides_b)


def _returns_between(an: KernelAnalysis, a, b) -> bool:
    """Whether a ``return`` in the block of ``a`` (the store first in the source), after it and before ``b``, ends
    the program once ``a`` has run (the zeros an MoE kernel stores for an expert on another rank, then returns).
    A store whose rows are not found yet has no anchor: its own statement stands for it (the later refusal of its
    rows says what to pass)."""
    first, second = a.anchor or a.where, b.anchor or b.where
    block = an.blocks.get(first)
    return block is not None and any(
        an.blocks.get(where) == block and _before(first, where) and _before(where, second)
        for where, _ in an.returns)


def _always_negative(gap: Poly, widths: set[str]) -> bool:
    """Whether ``gap`` is below 0 for every value of its atoms, each a block's width (at least 1): its terms other
    than the constant have no positive coefficient, so it is largest with every width 1."""
    terms = {k: v for k, v in gap.items() if k}
    if any(v > 0 or any(atom not in widths for atom in k) for k, v in terms.items()):
        return False
    return gap.get((), 0) + sum(terms.values()) < 0


def _stored_once(an: KernelAnalysis, stores, rule: str) -> tuple[list[Insertion], list[ReportEntry]]:
    """Each element of the reduced tensors is stored once by a program. Every store adds the elements it wrote to
    its channels' counts, so a tile stored twice (`tl.store(ptrs, zeros)` then `tl.store(ptrs, acc)`, or two
    `@triton.jit` helpers that each store it) counts its rows twice: the channel reaches its target while other tiles
    of it are unstored, and the reduction reads them. Two stores of one tensor a program may both run (not on the two
    sides of one ``if``, not one store then a ``return`` before the other; in one tile loop or in two) must write
    disjoint columns of the same pass of one block, apart by blocks' widths: ``start + tl.arange(0, W)`` and
    ``start + W + tl.arange(...)`` (times one stride), or a descriptor's ``[o, c]`` and ``[o, c + W]`` with blocks
    ``W`` wide. Where the proof needs a value only the compiled kernel knows (a host descriptor's ``block_shape``, a
    constexpr gap), a ``tl.static_assert`` before the later store checks it at compile time, over constexpr
    parameters and literals; anything else is refused at the later store. Returns the asserts' insertions and the
    notes that say so."""
    columns = _Columns(an)
    inserts: list[Insertion] = []
    notes: list[ReportEntry] = []
    ordered = sorted((s for s in stores if not s.atomic), key=lambda s: (s.where.line, s.where.column))
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            # stores of two tile loops are compared too: a loop storing zeros over every tile, then one storing the
            # sums, writes each tile twice, and TileLink cannot tell the two loops' rows apart
            if a.tensor != b.tensor or _exclusive(an, a, b) or _returns_between(an, a, b):
                continue
            gap = None
            if not a.swept and not b.swept and a.descriptor == b.descriptor and (
                    a.pointer == b.pointer or not a.descriptor):
                spans = columns.span(a), columns.span(b)
                terms = (None, None) if a.descriptor else (columns.term(a), columns.term(b))
                scales = tuple(t[1] if t else None for t in terms)  # the stride the columns are in
                if None not in spans and (a.descriptor or None not in scales) and scales[0] == scales[1]:
                    (start_a, width_a), (start_b, width_b) = spans
                    gaps = [poly_add(start_b, poly_add(start_a, width_a), -1),
                            poly_add(start_a, poly_add(start_b, width_b), -1)]
                    read = {n for p in (*spans[0], *spans[1]) for k in p for atom in k
                            if not atom.startswith("arange:") for n in names_in(cst.parse_expression(atom))}
                    moved = any(_before(a.where, at) and _before(at, b.where)  # bound again between the stores
                                for n in read for at, _ in an.bindings.get(n, ()))
                    # a gap is non-negative by its form when its coefficients are and each of its atoms is a block's
                    # width (an arange's or a descriptor's block, which Triton compiles only above 0: a width that is
                    # a positive multiple of one name, not a part of a sum, `BLOCK_D + 2 * PAD`, whose `PAD` may be
                    # 0 or below); any other name (`c2 = BLOCK_D + G + cols` with `G` a parameter) may be negative:
                    # the compiled kernel checks a constexpr one below, anything else is refused
                    widths = {k[0] for w in (width_a, width_b) if len(w) == 1
                              for k, v in w.items() if len(k) == 1 and v > 0}
                    if not moved and any(all(v >= 0 for v in g.values()) and all(
                            atom in widths for k in g for atom in k) for g in gaps):
                        continue
                    # mixed signs (`BLOCK_N // 2 - c_desc.block_shape[1]`): the compiled kernel can tell; a gap
                    # negative for every width (`-2 * (BLOCK_D // 2) + 1`, the second half starting one column
                    # inside the first) is refused here rather than by an assert no launch can pass
                    gap = None if moved else next(
                        (g for g in gaps if any(v > 0 for v in g.values()) and _compile_time(an, g)
                         and not _always_negative(g, widths)), None)
            where = f"{a.where.file}:{b.where.line}"
            if gap is not None:
                message = (f"{where}: the stores to {a.tensor!r} at lines {a.where.line}, {b.where.line} write "
                           f"overlapping columns; each notify counts what its store wrote, so an element stored twice "
                           f"completes its channel before the channel's other tiles are stored")
                inserts.append(Insertion(b.anchor, "before", (
                    f"# tilelink: the stores at lines {a.where.line}, {b.where.line} write disjoint columns "
                    f"(each element is counted once in its channel's notifies)",
                    f"tl.static_assert({poly_code(gap)} >= 0, {message!r})")))
                notes.append(ReportEntry(an.name, rule, "note", f"the stores at lines {a.where.line}, "
                                         f"{b.where.line} write the same rows; a tl.static_assert before the second "
                                         f"checks at compile time that their columns do not overlap "
                                         f"(`{poly_code(gap)} >= 0`)", b.where))
                continue
            raise AnnotationError(
                f"the stores to {a.tensor!r} at lines {a.where.line}, {b.where.line} may both write the same "
                f"elements in one program: each store's notify adds what it wrote to its channels' counts, so an "
                f"element stored twice completes its channel while other tiles of it are still unstored, and the "
                f"{rule} reads them", file=b.where.file, line=b.where.line, column=b.where.column,
                hint="store each element once (compute the final value, then store it: no zeros stored first), put "
                     "the stores on the two sides of an `if`, or return after the first; two stores of one tile must "
                     "write disjoint columns, `cols + tl.arange(0, W)` and `cols + W + tl.arange(0, W)` (a "
                     "descriptor's `[o, c]` and `[o, c + W]`)")
    return inserts, notes


def _store_columns(an: KernelAnalysis, a) -> tuple[str, str] | None:
    """``(start, width)`` in source, at the store ``a``, of the columns one row of its tile writes: a descriptor's
    second offset and block width (2-D), a pointer's column vector ``start + tl.arange(0, W)`` indexed ``[None, :]``;
    ``None`` where the tile spans whole rows (no column term, a 1-D tile, a sweep over the columns) or TileLink cannot
    read the columns (the launch then takes the tile as whole rows)."""
    if a.swept:
        return None
    if a.descriptor:
        box = an.descriptor_box(a)
        return (box[0][1], box[1][1]) if box is not None and len(box[0]) == 2 else None
    term = _Columns(an).term(a)
    if term is None:
        return None
    shift: list[str] = []
    vector = term[0]
    for _ in range(8):
        vector = _bare(vector)
        if isinstance(vector, cst.Name):
            found = _column_range(an, a, vector.value)
            if found is not None:
                return " + ".join([f"({found[0]})", *shift]), found[1]
            # `cols2 = cols + BLOCK_N // 2`: a column vector bound once, before the store, as another plus a scalar;
            # `n_offs = n_offs_untagged` (kernl): as another itself
            values, binds = an.values.get(vector.value, ()), an.bindings.get(vector.value, ())
            if len(values) != 1 or len(binds) != 1 or not _before(binds[0][0], a.where):
                return None
            value = cst.parse_expression(values[0])
            value = _bare(value)
            if isinstance(value, cst.Name):
                scalar, inner = [], value
            elif isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
                scalar = [x for x in (value.left, value.right) if not _is_vector_source(an, x)]
                if len(scalar) != 1:
                    return None
                inner = value.right if scalar[0] is value.left else value.left
            else:
                return None
            # what it was made from holds at the store what it held there: nothing it reads bound after it (the
            # columns' own range is read at the store)
            if any(_before(binds[0][0], at) for n in names_in(value) for at, _ in an.bindings.get(n, ())):
                return None
            shift += [f"({code(x)})" for x in scalar]
            vector = inner
        elif isinstance(vector, cst.BinaryOperation) and isinstance(vector.operator, cst.Add):
            found = parse_offsets(vector)
            return None if found is None else (" + ".join([f"({found[0]})", *shift]), found[1])
        else:
            return None
    return None


def _is_vector_source(an: KernelAnalysis, node: cst.BaseExpression) -> bool:
    """Whether ``node`` may be a vector: it calls ``tl.arange``, indexes, or reads a name bound to such."""
    seen: set[str] = set()
    todo = [node]
    while todo:
        x = todo.pop()
        if m.findall(x, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("arange"))) | m.Subscript()):
            return True
        for n in names_in(x) - seen:
            seen.add(n)
            if n in an.params:
                continue
            values = an.values.get(n, ())
            if not values or n in an.rebound:
                return True  # a loop's target or a name bound other than by assignment: not read as a scalar here
            todo += [cst.parse_expression(v) for v in values]
    return False


def _moves_with_its_loops(an: KernelAnalysis, a, position: str) -> None:
    """The tile a store writes, written out (``position``), must move with every loop around the store: one that
    does not is stored (and counted) again on each step of that loop. A column sweep's own loop is the exception
    (its notify counts the sweep once, after the loop)."""
    read = {int(x) for x in re.findall(r"\bloop=(\d+)", position)}
    where = dict(file=a.where.file, line=a.where.line, column=a.where.column)
    for at, end in an.while_loops:
        if (at.line, at.column) < (a.where.line, a.where.column) < (end.line, end.column):
            raise AnnotationError(
                f"the store to {a.tensor!r} at line {a.where.line} is inside the `while` loop at line {at.line}: "
                f"TileLink cannot tell which tile each of its passes stores, and each notify counts what its store "
                f"wrote, so a tile stored on two passes would complete its channel while other tiles of it are "
                f"unstored", **where, hint="walk the tiles with a `for` loop over `tl.range(start, stop, step)` and "
                                           "take the tile's position from its target")
    sweep = a.anchor.line if a.swept and a.anchor is not None else None
    for at, end in (span for spans in an.bindings.values() for span in spans):
        if end is None or at.line in read or at.line == sweep or not (
                (at.line, at.column) < (a.where.line, a.where.column) < (end.line, end.column)):
            continue
        raise AnnotationError(
            f"the store to {a.tensor!r} at line {a.where.line} is inside the loop at line {at.line}, but the tile it "
            f"writes does not move with that loop: each step stores the same elements again, and each notify counts "
            f"what its store wrote, so the tile's channel would complete while other tiles of it are unstored",
            **where, hint="store the tile once, after the loop, or take its position from the loop's target (a tile "
                          "loop, `for tile_id in tl.range(start_pid, num_tiles, NUM_SMS)`)")


def _live_per_row(an: KernelAnalysis, a, t, spec) -> str | None:
    """The elements of each row of its tile that the store ``a`` writes, as its notify counts them, in the kernel's
    source: the mask's columns of a pointer store ``(rows < M)[:, None] & (cols < N)[None, :]``, the box of a
    descriptor store inside the tensor; ``None`` where the notify counts them otherwise."""
    if a.descriptor:
        try:
            return _box_columns(an, a, t)
        except AnnotationError:
            return None
    return separable_columns(an, a, t, spec.size or t.size_param)


def _returned_before(an: KernelAnalysis, a) -> list[str] | None:
    """For each `return` before the store ``a``, the test, written out, under which a program returns there (so does
    not store): ``None`` where one cannot be written out or is inside a loop (it ends the program's later steps too)."""
    loops = _loops(an)
    found = []
    for where, _ in an.returns:
        if not _before(where, a.where):
            continue
        if _within(where, loops):
            return None
        parts = [_side_written(an, side) for side in an.branch_sides.get(where, ())]
        if None in parts:
            return None
        found.append(" and ".join(parts) or "True")
    return found


def _side_written(an: KernelAnalysis, side: BranchSide) -> str | None:
    """The test under which a program takes ``side`` of its `if`, written out over the launch's values (`(test)`, or
    `not (test)` for an `else`); ``None`` where it cannot be."""
    test = an.written_out(side.test, side.where) if an.written_out is not None else None
    return None if test is None else f"({test})" if side.body else f"not ({test})"


def stored_tiles(an: KernelAnalysis, spec) -> tuple[tuple[str, str, str, str, str, int, str], ...]:
    """What each store of the reduced tensors writes, for the launch to check that no two programs (or two steps of
    a program's tile loop) store the same elements: a notify counts what its store wrote, so an element stored by two
    programs completes its channel while other tiles of it are unstored; and that they store every element of the
    output's rows, for a channel whose elements are not all stored never completes. Each is ``(row start, rows,
    column start, columns, test, line, stored per row)`` in source over program ids and the arguments as passed (a
    loop's target as ``tl.range(a, b, step)``), the columns ``""`` where the tile spans whole rows or they cannot be
    written out (then the launch takes the tile as whole rows), ``test`` the ``if`` tests that hold where the store
    runs (``""``: always; a program that returns before it does not run it), ``stored per row`` the elements of each
    of the tile's rows it writes (``""``: TileLink cannot tell). A split-K write-back's adds are such tiles too (the
    launch takes the programs along its split axes as one); rows from an index are not. Raises where the rows' start
    cannot be written out: the launch could not tell the programs' tiles apart."""
    found = []
    for a in (s for t in spec.tensors for s in an.accesses_of(t, "store")):
        t = a.tile
        if t is None or t.dynamic or an.written_out is None:
            continue
        live = _live_per_row(an, a, t, spec)
        live = an.written_out(live, a.where) or "" if live is not None else ""
        tests = []
        if _one_element(an, a, t):
            # one element a row, stored where the mask holds (`mask=row < M`): the mask is the test of the store
            mask = an.written_out(a.mask, a.where) if a.mask else "True"
            live = "1" if mask is not None else ""
            if a.mask and mask is not None:
                tests.append(f"({mask})")
        elif a.where in an.row_columns and a.mask and not _and_more(an, a.mask):
            # one row a program, the columns its mask lets through (`cols < N`, the mask's only term)
            columns, bound = an.row_columns[a.where]
            live = an.written_out(_live_columns(an, a, columns, bound), a.where) or ""
        def written(source: str, a=a) -> str | None:
            host = a.descriptor and a.pointer in an.params and re.fullmatch(
                rf"{re.escape(a.pointer)}\.block_shape\[\d\]", source.strip())
            return source.strip() if host else an.written_out(source, a.where)  # a host descriptor's block

        row, rows = written(t.start), written(t.size)
        if row is None or rows is None:
            raise AnnotationError(
                f"the store to {a.tensor!r} at line {a.where.line} writes the rows from `{t.start}`, which TileLink "
                f"cannot write out over program ids and the arguments as passed: it could not check at the launch that "
                f"no two programs store the same rows, and each notify counts what its store wrote (a tile stored "
                f"twice completes its channel while other tiles of it are unstored)", file=a.where.file,
                line=a.where.line, column=a.where.column,
                hint="compute the tile's position from tl.program_id (or a tile loop's target) and the arguments as "
                     "passed, in locals bound once or bound last before the store")
        columns = _store_columns(an, a)
        col = cols = ""
        if columns is not None:
            start, width = written(columns[0]), written(columns[1])
            if start is not None and width is not None:
                col, cols = start, width
        _moves_with_its_loops(an, a, row + " " + col)
        # the `if` tests around the store, for the launch to tell which programs run it (`if pid % 2 == 0:`, a
        # constexpr `if EPILOGUE_SUBTILE:`); a test it cannot write out leaves the store run by every program
        for side in an.branch_sides.get(a.where) or an.branch_sides.get(a.anchor, ()):
            if (test := _side_written(an, side)) is not None:
                tests.append(test)
            else:
                live = ""  # where the store runs is not known: what it leaves unstored is not either
        # a program that returns before the store stores nothing (`if pid_n == 1: return`)
        returned = _returned_before(an, a)
        if returned is None:
            live = ""
        else:
            tests += [f"not ({r})" for r in returned]
        found.append((row, rows, col, cols, " and ".join(tests), a.where.line, live))
    return tuple(dict.fromkeys(found))


#: calls whose value has the type of their operands, or the one they are told (`dtype=`, `out_dtype=`, `.to(T)`)
_INTEGER_KEEPING = frozenset({"zeros", "full", "dot", "to", "cast", "sum", "reshape", "trans", "permute",
                              "expand_dims", "broadcast_to", "where", "maximum", "minimum", "multiple_of",
                              "max_contiguous", "arange", "program_id", "num_programs", "cdiv"})


class _Operands(cst.CSTTransformer):
    """A value with what it reads of this rank's data left out: each load, and the two operands of each ``tl.dot``,
    as a name of their own (the type of the sums is the dot's, not its operands')."""

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = code(updated.func).strip().rsplit(".", 1)[-1]
        if name in ("load", "gather"):
            return cst.Name("_loaded")
        if name == "dot":
            args = [a.with_changes(value=cst.Name("_operand")) if i < 2 and a.keyword is None else a
                    for i, a in enumerate(updated.args)]
            return updated.with_changes(args=args)
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        # a tensor's type (`c_ptr.dtype.element_ty`), read at compile time: not a value of the sums
        return cst.Name("_type") if updated.attr.value == "dtype" else updated


def sums_dtypes(an: KernelAnalysis, spec) -> tuple[str, ...]:
    """The types the partial sums stored into the reduced tensors are started with (``tl.zeros(..., dtype=X)``,
    ``tl.full(..., dtype=X)``, ``tl.dot(..., out_dtype=X)``), in source over literals and the constexpr parameters:
    a rank's float sums stored into an integer tensor are truncated before they are added, so the launch reduces
    into an integer tensor only where every one of these is an integer type (an int8 GEMM summing into int32). Empty
    where the stored value may be float whatever they are (a float literal, `/`, a conversion to a float type, a
    loaded value other than a dot's operands: `acc * 0.5` is float) or is not started so: the launch then takes the
    sums as float."""
    found: list[str] = []
    todo, seen = [a.value for t in spec.tensors for a in an.accesses_of(t, "store") if a.value], set()
    while todo:
        node = cst.parse_expression(todo.pop()).visit(_Operands())
        calls = [(call, code(call.func).strip()) for call in m.findall(node, m.Call())]
        if m.findall(node, m.Float() | m.BinaryOperation(operator=m.Divide() | m.Power()) | m.Name("_loaded")) or any(
                func.rsplit(".", 1)[-1] in ("to", "cast") and not _to_integer(call)
                and re.search(r"\b(b?float|fp)\w*", code(call)) for call, func in calls) or any(
                func.rsplit(".", 1)[-1] not in _INTEGER_KEEPING for _, func in calls) or (names_in(node) & (
                set(an.params) - set(an.constexpr_params))):
            return ()  # float, or of a type TileLink does not read (`acc * alpha`, `tl.fdiv(acc, 2)`)
        for call, func in calls:
            name = func.rsplit(".", 1)[-1]
            keyword = {"zeros": "dtype", "full": "dtype", "dot": "out_dtype"}.get(name)
            if keyword is None or not (func.startswith("tl.") or name == "dot"):
                continue
            chosen = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)
            positional = [a.value for a in call.args if a.keyword is None]
            at = {"zeros": 1, "full": 2}.get(name)
            if chosen is None and at is not None and len(positional) > at:
                chosen = positional[at]
            if chosen is not None:
                found.append(code(chosen).strip())
            elif name in ("zeros", "full") and len(positional) > 1:
                found.append("tl.float32")  # their default type
        for other in sorted(names_in(node) - seen - {"_loaded", "_operand", "_type"}):  # the same order on every build
            seen.add(other)
            todo += [src for src, _ in _bindings(an, other)]
    return tuple(dict.fromkeys(found))


def _compile_time(an: KernelAnalysis, p: Poly) -> bool:
    """Whether every atom of ``p`` is a constexpr parameter, a descriptor's ``block_shape[i]`` or made of them with
    ``//``: a ``tl.static_assert`` can evaluate it."""
    allowed = set(an.constexpr_params)
    for key in p:
        for atom in key:
            node = cst.parse_expression(atom)
            if m.matches(node, m.Subscript(value=m.Attribute(attr=m.Name("block_shape")))):
                continue
            if not names_in(node) <= allowed or m.findall(node, m.Call()):
                return False
    return True


class Producer(NamedTuple):
    """What :func:`notify_stores` makes of a reduction's stores."""

    insertions: list[Insertion]
    report: list[ReportEntry]
    size_param: str  # the full size of the reduced dimension, in source
    refused: tuple[tuple[str, str], ...]  # ``ReduceScatterLaunch.refused``
    rotations: tuple[tuple[str, str, str, str, int, bool], ...]  # ``LaunchPlan.rotations``
    first_rank_only: tuple[str, ...]  # ``ReduceScatterLaunch.first_rank_only``


def notify_stores(an: KernelAnalysis, spec, opts: Options, rule: str = RULE) -> Producer:
    """The producer side of a reduction over ranks, shared by the rules whose kernel stores partial sums
    (``reduce_scatter``, ``all_reduce``): the soundness checks of the stores, a notify after each (the count of
    what it stored in each channel it overlaps) and the tile order (:class:`Producer`, its report's entries under
    ``rule``). ``opts``: resolved."""
    if spec.dim != 0:
        raise AnnotationError(f"{rule} over dim {spec.dim} is not supported yet", file=an.file,
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
            f"kernel {an.name!r} reads {a.tensor!r}, which {rule} replaces by a buffer of this rank's partial "
            f"sums: the read would see neither the caller's tensor nor the reduced result",
            file=a.where.file, line=a.where.line, column=a.where.column,
            hint=f"pass what the kernel reads as a separate input (`c = a @ b + d`: load d_ptr, store {a.tensor})")
    report: list[ReportEntry] = []
    insertions: list[Insertion] = []
    report += _skipping_returns(an, stores, rule)
    asserts, notes = _stored_once(an, stores, rule)
    insertions += asserts
    report += notes
    with _holding(_SLICED, _sliced(an)):
        first_rank, pointers = first_rank_terms(an, spec, stores, rule)
        if first_rank:
            said = ", ".join(f"'{p}'" for p in first_rank)
            insertions.append(Insertion(min((a.anchor for a in stores if a.anchor is not None),
                                            key=lambda w: (w.line, w.column)), "before", (
                f"# tilelink: every rank would add what it loads through {said} to its partial sums: the ranks",
                f"# but the first are launched with zeros in its place, so that the sum over them adds it once "
                f"({rule})")))
            report.append(ReportEntry(an.name, rule, "applied",
                                      f"{said} is read only in terms added to the partial sums (a bias): every rank "
                                      f"but the first is launched with zeros of the same layout in its place, so that "
                                      f"the sum over the ranks adds those terms once", stores[0].where))
        with _holding(_FIRST_RANK, pointers):  # loads through them are summed over the ranks, as partial sums are
            return Producer(*_notify_each(an, spec, opts, rule, stores, insertions, report), first_rank)


def _summing_updates(an: KernelAnalysis, summing: set[tuple[Where, Where]]) -> set[tuple[str, Where]]:
    """The updates of an accumulator in the loops that sum (:func:`_summing_loops`): `(name, where)` of each binding
    that adds a product or this step's data to the name's own value there."""
    found = set()
    for name in set(an.values) | set(an.updates):
        for src, site in _bindings(an, name):
            if not _within(site, summing):
                continue
            value = _written_helper(an, cst.parse_expression(src))
            added = _carried_slot(value, name) if name in names_in(value) else None
            if added and (m.findall(value, _SUMS) or any(_reads_a_load(an, code(x)) for x in added)):
                found.add((name, site))
    return found


def check_sliced_reads(an: KernelAnalysis, spec) -> None:
    """Each rank runs the loops that sum over its own slice of K: the K extent it passes (``_SLICED``), those loops'
    targets, and whatever they bind other than the sums (a flag `big = K > 20`, a counter `n += 1`, the last step's
    data), are the rank's own after them. A store outside those loops whose value, mask or address reads one (through
    any binding: `acc = tl.where(K > 20, acc * 2, acc)`), or that an `if` outside those loops (around it, or around a
    binding of what it stores: `if K > 20: acc = acc * 2`) or a `return` before it tests one on, would take each rank's
    slice for the full problem, and the sum over the ranks would not be the full problem's value (or a rank would
    leave its rows unstored). Refused, naming the read. A store inside a loop that sums (a flattened loop's `if ki ==
    k_tiles - 1:`) steps with it on each rank's own slice: there only the extent itself, read outside every loop, is
    refused. Checked after the stores' other checks, whose messages say more (`acc / K`, a write-back chosen at run
    time)."""
    stores = [a for t in spec.tensors for a in an.accesses_of(t, "store")]
    for src, site in _located(an):
        if m.findall(cst.parse_expression(src), m.Lambda()):
            raise AnnotationError(
                "the kernel calls a lambda, whose body TileLink does not read (and Triton does not compile): it "
                "could read the K extent, which each rank passes as its own slice's",
                file=site.file, line=site.line, column=site.column,
                hint="write what the lambda computes inline, or as a @triton.jit helper")
    sliced, summing = _sliced(an), _summing_loops(an)
    strides = {p: t for p, t in _row_strides(an, summing).items() if p not in sliced} if sliced else {}
    # the sums' own bindings in those loops: their updates, and any other, which `_check_carried` judges (a scale in a
    # compile-time branch refuses only the launches that take it)
    sums = {name for name, _ in _summing_updates(an, summing)}
    # a peeled last step's updates are the loop's own (:func:`_verified_peel`)
    peeled = frozenset().union(*(p.updates for lp in summing if (p := _verified_peel(an, lp)) is not None))
    updates = {(name, w) for name in sums for _, w in _bindings(an, name) if _within(w, summing) or w in peeled}

    # why each name is the rank's own: the extent itself, a target or binding of a loop that sums, or a value read
    why: dict[str, str] = {n: "the K extent of the loop that sums, which each rank passes as its own slice's"
                           for n in sliced}
    why.update((p, f"the row stride of `{t}`, which the loop that sums steps along K: each rank's own slice of K, "
                   f"contiguous, has its own K as that stride") for p, t in strides.items())
    sliced = sliced | frozenset(strides)
    for name, binds in an.bindings.items():
        for b, e in binds:
            if e is not None and (b, e) in summing:
                why.setdefault(name, f"the target of the loop that sums at line {b.line}, which runs over each "
                                     f"rank's own slice")
    # a parameter a `@triton.heuristics` computes from the K extent at the launch (`BIG = args['K'] > 20`), from
    # another such parameter (Triton runs them in turn, each seeing those before), or from arguments TileLink cannot
    # tell; a block size aside (what the kernel's shapes read: a tile of another size stores the same values)
    shapes = _shape_names(an)
    unknown: set[str] = set()
    wrapped: set[str] = set()  # computed by a wrapper TileLink does not read
    derived = {n: why[n] for n in sliced}  # what each value of the K extent, a block size's too, is
    while True:
        more = False
        for name, (at, reads) in an.computed.items():
            names = [p for p in an.constexpr_params if p not in an.computed] if name.startswith("*") else [name]
            names = [p for p in names if p not in derived]
            if not names:
                continue
            if reads is None and sliced and name.startswith("*") and name[1:]:
                said = (f"a parameter that the decorator `@{name[1:]}` at line {at.line} may compute at the launch "
                        f"(TileLink does not read what it does), from the K extent too, which each rank passes as its "
                        f"own slice's")
                wrapped.update(names)
            elif reads is None and sliced:
                said = (f"a parameter that the `@triton.heuristics` at line {at.line} may compute from the K extent, "
                        f"which each rank passes as its own slice's (TileLink reads a dict of `lambda args: ...` that "
                        f"reads `args['NAME']`, written in the decorator or bound once at the module's top level)")
                unknown.update(names)
            elif reads and (found := sorted(reads & set(derived))):
                said = (f"computed by the `@triton.heuristics` at line {at.line} from `{found[0]}`, "
                        + ("the K extent of the loop that sums, which each rank passes as its own slice's"
                           if found[0] in sliced and found[0] not in strides else f"which is {derived[found[0]]}"))
            else:
                continue
            derived.update((p, said) for p in names)
            why.update((p, said) for p in names if p not in shapes)
            more = True
        if not more:
            break
    # the compile-time tests under which each name is the rank's own, as alternatives (each a set of `if` sides): a
    # binding in the loop that sums on one side of a compile-time `if` reaches a read after the loop only on launches
    # that take that side too (vLLM's MoE kernel binds `b_scale` in the loop on its block-quantised path only, and
    # reads it after the loop on the others)
    when: dict[str, set[frozenset]] = {n: {frozenset()} for n in why}
    for name in set(an.values) | set(an.updates):
        for _, site in _bindings(an, name):
            if _within(site, summing) and (name, site) not in updates:
                why.setdefault(name, f"bound at line {site.line} in the loop that sums, so that after it its value "
                                     f"is the rank's own slice's")
                when.setdefault(name, set()).add(_launch_sides(an, site))
    # each binding but a sum's update, with the names it reads and the compile-time sides it is on: not through a
    # load's mask, for what it loads is the rank's slice of the summed data, bounded by the extent (`h = tl.load(...,
    # mask=offs_k[None, :] < K)` summed by one `tl.dot` over the whole slice); where it loads from is read as any value
    # (a row stride read in a pointer a load or store adds its offsets to, `h_ptrs = h_ptr + offs[:, None] *
    # stride_hm`, lays out the rank's own slice, as it does in the loop that sums)
    pointers = {n for src, _ in _located(an) for call in m.findall(cst.parse_expression(src), m.Call(
        func=m.Attribute(attr=m.Name("load") | m.Name("store")))) for arg in call.args[:1]
        if (n := _leading_name(arg.value)) is not None}
    reading = []
    for name in sorted(set(an.values) | set(an.updates)):
        for src, site in _bindings(an, name):
            if (name, site) not in updates:
                node = cst.parse_expression(src)
                reads = names_outside_loads(node) | {n for call in m.findall(node, m.Call(func=m.Attribute(
                    attr=m.Name("load")))) for arg in call.args[:1] for n in names_in(arg.value)}
                if name in pointers:
                    reads -= set(strides)
                reading.append((name, src, site, reads, _launch_sides(an, site)))
    changed = True
    while changed:  # and the values read from those
        changed = False
        for name, src, site, reads, on in reading:
            for other in sorted(reads & set(when)):
                for sides in list(when[other]):
                    joined = _joined_sides(sides, on)
                    alternatives = when.setdefault(name, set())
                    if joined is None or any(known <= joined for known in alternatives):
                        continue
                    alternatives.add(joined)
                    if len(alternatives) > 32:  # too many to tell apart: on every launch
                        alternatives.clear()
                        alternatives.add(frozenset())
                    changed = True
                    why.setdefault(name, f"read from `{name} = {src}`" + (f" at line {site.line}" if site else "")
                                   + f", which reads `{other}`")

    def own(names: set[str], site: Where | None, tested: bool = False) -> list[str]:
        """Of ``names``, those the rank's own on some launch that reaches ``site``; ``tested``: in a test, where a
        block size computed from the extent is one too (`if BLOCK_K == 32:` picks by the rank's slice)."""
        here = _launch_sides(an, site)
        return sorted(n for n in names if any(_joined_sides(sides, here) is not None for sides in when.get(n, ()))
                      or tested and n in derived and n not in sliced)
    targets = _loop_targets(an)
    steps = frozenset({targets[lp] for lp in summing if lp in targets} | {
        n for n in an.values if _cycle_extent(an, n) is not None})
    _check_extent_tests(an, summing, derived, steps)
    flats = [_flat_steps(an, lp) for lp in summing]
    flat = (frozenset().union(*(f[0] for f in flats)), frozenset().union(*(f[1] for f in flats)))
    _check_extent_data(an, summing, _ExtentFacts(derived, sliced, shapes, steps, frozenset(sums), flat))
    read_as_extent = frozenset((set(derived) - shapes) | sliced)
    _check_extent_loops(an, summing, read_as_extent)
    _check_k_offsets(an, summing, read_as_extent, derived)
    if not why and not set(derived) - sliced:
        return
    why = {**derived, **why}  # a block size computed from the extent: said where a test reads it

    def root(name: str) -> str:
        """The first name of the chain that makes ``name`` the rank's own (`K`, a flag bound in the loop)."""
        seen = set()
        while why[name].startswith("read from ") and name not in seen:
            seen.add(name)
            name = why[name].rsplit("`", 2)[-2]
        return name

    def refuse(a, what: str, text: str, name: str) -> AnnotationError:
        first = root(name)
        via = f" (`{name}` is {why[name]})" if name != first else ""
        return AnnotationError(
            f"{what} (`{text}`) reads `{first}`, {why[first]}{via}: outside the loops that sum it differs from rank "
            f"to rank, and the sum of the ranks' stores to {a.tensor!r} would not be the full problem's value",
            file=a.where.file, line=a.where.line, column=a.where.column,
            hint=(f"write the heuristics' dict in the decorator (or bind it once at the module's top level) as "
                  f"`lambda args: ...` reading `args['NAME']`, so that TileLink reads what `{first}` is computed from"
                  if first in unknown else
                  "leave under @tilelink.overlap only the wrappers TileLink reads (@triton.autotune, "
                  "@triton.heuristics with its dict written out) and @triton.jit"
                  if first in wrapped else
                  f"read `{first}` only in the loads' addresses; pass what the epilogue needs as a parameter of its "
                  f"own, the same on every rank" if first in strides else
                  f"read `{first}` only in the loop that sums and in its range; pass what the epilogue needs as a "
                  f"parameter of its own, the same on every rank"))

    for a in stores:
        if _within(a.where, summing):
            # stepping with the loop that sums: the extent read outside every loop only
            for what, text in (("the value stored", a.value), ("the store's mask", a.mask)):
                if text and (names := _names_through(an, cst.parse_expression(text)) & sliced):
                    raise refuse(a, f"{what} at line {a.where.line}", text, sorted(names)[0])
            continue
        for what, text in (("the value stored", a.value), ("the store's mask", a.mask), ("the store's address",
                                                                                         a.pointer)):
            if text and (names := own(names_in(cst.parse_expression(text)), a.where)):
                raise refuse(a, f"{what} at line {a.where.line}", text, names[0])
        # the `if`s outside the loops that sum around the store, and around each binding of what it stores
        sites, todo, seen = {a.where, a.anchor} - {None}, list(names_in(cst.parse_expression(a.value or "0"))), set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for src, w in _bindings(an, name):
                if (name, w) not in updates:
                    sites.add(w)
                    todo += names_in(cst.parse_expression(src))
        for site in sorted(sites - {None}, key=lambda w: (w.line, w.column)):
            for side in an.branch_sides.get(site, ()):
                if not _within(side.where, summing) and (
                        names := own(names_in(cst.parse_expression(side.test)), site, tested=True)):
                    raise refuse(a, f"the `if` at line {side.where.line} around line {site.line}", side.test, names[0])
        for where, tests in an.returns:
            if _before(where, a.where) and not _within(where, summing) and (
                    names := own({n for t in tests for n in names_in(cst.parse_expression(t))}, where, tested=True)):
                raise refuse(a, f"the `return` at line {where.line}, before the store at line {a.where.line},",
                             " and ".join(tests), names[0])


def _launch_sides(an: KernelAnalysis, site: Where | None) -> frozenset[tuple[str, bool]]:
    """The sides of the compile-time `if`s around ``site`` (`(test, taken)`), of tests that have one value per launch
    wherever they are written: of constexpr parameters never bound again (a local, or a parameter bound again, may
    differ between two places that test it)."""
    def fixed(test: str) -> bool:
        return all(n in an.params and not an.bindings.get(n)
                   for n in names_in(cst.parse_expression(test)) - {"True", "False", "None"})

    def sides(node: cst.BaseExpression, taken: bool) -> set[tuple[str, bool]]:
        """The test taken (or not), and what that says of its parts: `not X` taken is `X` not taken, `A and B` taken
        is each of them taken, `A or B` not taken each of them not taken (vLLM's `elif (use_fp8_w8a8 or
        use_int8_w8a8) and not (group_k > 0 and group_n > 0):` is the other side of its `if group_k > 0 and group_n
        > 0:`)."""
        node = _bare(node)
        while isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            node, taken = _bare(node.expression), not taken
        found = {(code(node), taken)}
        if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And if taken else cst.Or):
            found |= sides(node.left, taken) | sides(node.right, taken)
        return found

    return frozenset(x for s in an.branch_sides.get(site, ()) if s.static and fixed(s.test)
                     for x in sides(cst.parse_expression(s.test), s.body)) if site is not None else frozenset()


def _joined_sides(a: frozenset, b: frozenset) -> frozenset | None:
    """The sides of both ``a`` and ``b``, or ``None`` where no launch takes them all (one test taken both ways)."""
    both = a | b
    return None if any((test, not taken) in both for test, taken in both) else both


def _check_extent_tests(an: KernelAnalysis, summing, derived: dict[str, str], steps: frozenset[str]) -> None:
    """Inside a loop that sums, an `if` whose test reads the K extent (or a value computed from it: a heuristic's
    `BIG`, `big = K > 25` bound before the loop) around anything but a load (`if K > 25: a = a * 2`, `if BIG: acc +=
    tl.dot(a, b)`) would treat each rank's slice by a test of its own slice, which differs from rank to rank: refused.
    Around loads alone (`if EVEN_K: a = tl.load(a_ptrs)` / `else: a = tl.load(a_ptrs, mask=...)`) it picks how the
    same data is read."""
    # and what is bound from those (`big = K > 25`, before the loop or in it); a step cycled over the extent, `k = s %
    # k_tiles` in a flattened loop, is the step: a test of the step (`if k == k_tiles - 1:`, the last step of the
    # rank's slice) is judged as the step's
    extent = set(derived)
    while more := {name for name in (set(an.values) | set(an.updates)) - extent - steps
                   for src, site in _bindings(an, name)
                   if names_outside_loads(cst.parse_expression(src)) & extent}:
        extent |= more
    loads = m.Call(func=m.Attribute(attr=m.Name("load")))
    bound = set(an.values) | set(an.updates)

    def same_data(value: cst.BaseExpression) -> bool:
        """A load, or a value that holds none of this rank's data (a mask `k_mask = offs_k < K - k * BLOCK_K`, the
        fill `_0 = tl.zeros((1, 1), dtype=a_ptrs.dtype.element_ty)` of a masked load): how the same data is read."""
        return m.matches(value, loads) or _classify_quietly(an, value) in (_ZERO, _CONST)

    def on_both_sides(name: str, src: str, side: BranchSide) -> bool:
        """The same binding on the other side of the same `if` (`acc = tl.dot(a, b, acc)` after either load)."""
        return any(other == src and w is not None and any(
            s.where == side.where and s.body != side.body for s in an.branch_sides.get(w, ()))
            for other, w in _bindings(an, name))

    def loaded_from(value: cst.BaseExpression) -> str:
        """Where a load reads: its address (`a_ptrs`), or a descriptor and its offsets."""
        if m.matches(value.func, m.Attribute(value=m.Name("tl"))):
            return code(_arg(value, 0, "pointer") or value)
        return code(value.func.value) + "".join(f", {code(a.value)}" for a in value.args)

    def other_data(name: str, value: cst.BaseExpression, site: Where) -> bool:
        """Loads of ``name`` from other addresses in the loop, on the sides of an `if` around ``site`` or before it
        (`a = tl.load(p)` on one side, `tl.load(q)` on the other, or before the `if`): a choice of data, not of how
        the same data is read. A load of the name after the `if` (a second operand read into the same name) is none
        of its sides."""
        if not m.matches(value, loads):
            return False
        loop, sides = _innermost(summing, site), an.branch_sides.get(site, ())
        ifs = {side.where for side in sides}
        first = min(((w.line, w.column) for w in ifs), default=(site.line, site.column))
        found = {loaded_from(v) for src, w in _bindings(an, name) if w is not None and loop is not None
                 and _inside(w, loop) and (ifs & {side.where for side in an.branch_sides.get(w, ())}
                                           or (w.line, w.column) < first)
                 and m.matches(v := _bare(cst.parse_expression(src)), loads)}
        return len(found) > 1

    for name in sorted(bound):
        for src, site in _bindings(an, name):
            value = _bare(cst.parse_expression(src))
            if site is None or not _within(site, summing) or (same_data(value) and not other_data(name, value, site)):
                continue
            for side in an.branch_sides.get(site, ()):
                if not _within(side.where, summing) or on_both_sides(name, src, side):
                    continue
                tested = names_in(cst.parse_expression(side.test))
                read = sorted(tested & extent)
                if read and not tested & steps:
                    said = derived.get(read[0], "read from the K extent of the loop that sums")
                    raise AnnotationError(
                        f"the `if` at line {side.where.line} in the loop that sums (`{side.test}`) reads `{read[0]}`, "
                        f"{said}, and decides `{name} = {src}` at line {site.line}: each rank would treat its slice "
                        f"of K by a test of its own slice, and the sum over the ranks would not be the full "
                        f"problem's value", file=site.file, line=site.line, column=site.column,
                        hint="test the K extent in the loop that sums only to choose how the same data is loaded "
                             "(`if EVEN_K: a = tl.load(a_ptrs)` / `else: a = tl.load(a_ptrs, mask=...)`); pass a "
                             "scale or a choice of the problem's as a parameter of its own, the same on every rank")


class _ExtentFacts(NamedTuple):
    """What :func:`_check_extent_data` reads the loop that sums with."""
    derived: dict[str, str]  # the K extent and what a heuristic computes from it, each with why it is the rank's own
    sliced: frozenset[str]  # the K extent itself (`K` of `range(0, tl.cdiv(K, BLOCK_K))`)
    shapes: frozenset[str]  # the names block shapes read (a tile of another size stores the same values)
    steps: frozenset[str]  # the loops' steps, which the step's own checks judge
    sums: frozenset[str]  # the accumulators
    flat: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())  # :func:`_flat_steps` of those loops


# how a value is used where the K extent is read in the loop that sums: as data; in an address (`a_ptr + rm[:, None] *
# K`, a row stride of the rank's own tensor; a flattened loop's tile `step // k_tiles`), where it and a block size
# computed from it may be read as arithmetic; as the bound of offsets in a mask term (`K - k * BLOCK_K`); as a mask;
# as the offsets a mask term bounds, where only a block size computed from it may be read (`rk * 0 + K > 25` is no
# bound of offsets); or in a test (an `if` expression's, a `tl.where`'s choice, a comparison used as a value)
_AS_DATA, _AS_ADDRESS, _AS_BOUND, _AS_OFFSETS, _AS_MASK, _AS_TEST = (
    "data", "address", "bound", "offsets", "mask", "test")
_ADDRESS_CALLS = ("make_block_ptr", "make_tensor_descriptor", "advance")
_VISITING = object()


class _ExtentRead(NamedTuple):
    name: str  # the K extent, or a value computed from it
    source: str  # the expression, or the binding, that reads it
    site: Where | None  # where the binding that reads it is (None: the update itself, or a parameter's default)
    bound: bool = False  # ``source`` is that binding


def _expressions(node: cst.CSTNode):
    """The expressions right under ``node``, through what holds them (a comparison's targets, a list's elements, a
    call's arguments, a subscript's indexes)."""
    for child in node.children:
        if isinstance(child, cst.BaseExpression):
            yield child
        else:
            yield from _expressions(child)


def _extent_read(an: KernelAnalysis, node: cst.BaseExpression, use: str, facts: _ExtentFacts,
                 memo: dict, site: Where | None = None) -> _ExtentRead | None:
    """Where ``node``, used as ``use``, reads the K extent (or a value computed from it) other than as the loop that
    sums may: as arithmetic of a load's address (`a_ptr + rm[:, None] * K`: each rank's own tensor is laid out by its
    own slice), a descriptor's shape, or the bound of offsets in a mask term (`offs_k[None, :] < K - k * BLOCK_K`).
    Read as data (`a * K`), in a test (`2.0 if K > 25 else 1.0`, `tl.where(BIG, a * 2, a)`, also in an address)
    or, for a value a heuristic computes other than a block size, in an address at all, it weighs or chooses each
    rank's terms by the rank's own slice. ``memo``: what each name read as each use reads."""
    node = _bare(node)

    def inner(child: cst.BaseExpression | None, how: str) -> _ExtentRead | None:
        return None if child is None else _extent_read(an, child, how, facts, memo, site)

    def first(found) -> _ExtentRead | None:
        return next((f for f in found if f is not None), None)

    if use == _AS_MASK:
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr)):
            return first(inner(x, _AS_MASK) for x in (node.left, node.right))
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            return inner(node.expression, _AS_MASK)
        if isinstance(node, cst.Subscript):
            return inner(node.value, _AS_MASK)
        if isinstance(node, cst.Name) and _bindings(an, node.value):
            return _through(an, node.value, _AS_MASK, facts, memo)
        # a term of the mask: offsets that read no extent, compared with a bound that reads it only as arithmetic
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            for offsets, bound in ((node.left, node.comparisons[0].comparator),
                                   (node.comparisons[0].comparator, node.left)):
                if _reads_offsets(an, offsets) and inner(offsets, _AS_OFFSETS) is None:
                    return inner(bound, _AS_BOUND)
        return inner(node, _AS_TEST)
    if isinstance(node, cst.Name):
        name = node.value
        if name in facts.steps or name in facts.sums:
            return None
        if name in facts.derived and not _bindings(an, name):
            allowed = (use in (_AS_ADDRESS, _AS_BOUND) and name in facts.sliced) or (
                use in (_AS_ADDRESS, _AS_BOUND, _AS_OFFSETS) and name in facts.shapes)
            return None if allowed else _ExtentRead(name, code(node), site)
        return _through(an, name, use, facts, memo)
    if isinstance(node, cst.Attribute):
        return inner(node.value, use) if node.attr.value == "T" else None  # a type, a shape: no value of the data
    if isinstance(node, cst.Call):
        func = node.func
        called = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
            else ""
        on_tl = m.matches(func, m.Attribute(value=m.Name("tl")))
        if called in ("load", "gather") and isinstance(func, cst.Attribute):
            if not on_tl:  # a descriptor's load: where it reads
                return first([inner(func.value, _AS_ADDRESS), *(inner(a.value, _AS_ADDRESS) for a in node.args)])
            return first([inner(_arg(node, 0, "pointer"), _AS_ADDRESS), inner(_arg(node, 1, "mask"), _AS_MASK),
                          inner(_arg(node, 2, "other"), use)])
        if called in _ADDRESS_CALLS:  # a block pointer or a descriptor: its base and offsets, its shape and strides
            return first(inner(a.value, _AS_BOUND if a.keyword is not None and a.keyword.value in (
                "shape", "strides", "block_shape", "order") else _AS_ADDRESS) for a in node.args)
        if on_tl and called == "arange" and node.args:
            return inner(node.args[0].value, use)  # its values start at its start (`tl.arange(S, S + 16)`)
        if on_tl and called in ("zeros", "zeros_like"):
            return None  # shapes
        if on_tl and called in ("full", "full_like"):
            return inner(_arg(node, 1, "value" if called == "full" else "fill_value"), use)
        if on_tl and called in ("multiple_of", "max_contiguous", "max_constancy"):
            return inner(_arg(node, 0, "input"), use)
        if on_tl and called == "where" and len(node.args) == 3:
            x, y = node.args[1].value, node.args[2].value
            zero = any(_classify_quietly(an, v) == _ZERO for v in (x, y))
            return first([inner(node.args[0].value, _AS_MASK if zero else _AS_TEST), inner(x, use), inner(y, use)])
        if isinstance(func, cst.Name) and called in an.helpers:
            returned = _helper_return(an, node)
            if returned is not None:
                return inner(returned, use)
            for arg in node.args:
                if (found := inner(arg.value, _AS_TEST)) is not None:
                    return _ExtentRead(found.name, code(node), site)  # what the helper does with it is not read
            return None
        receiver = inner(func.value, use) if isinstance(func, cst.Attribute) and not on_tl else None
        return first([receiver, *(inner(a.value, use) for a in node.args)])
    if isinstance(node, cst.BinaryOperation) and use == _AS_BOUND:
        # what is left of the slice (`K - k * BLOCK_K`), or the slice's end (`K`): the extent as a term added, never
        # scaled or divided (`rk < K // 4` would keep a part of each rank's slice, not of the whole K)
        if isinstance(node.operator, cst.Add):
            return first(inner(x, _AS_BOUND) for x in (node.left, node.right))
        if isinstance(node.operator, cst.Subtract):
            return first([inner(node.left, _AS_BOUND), inner(node.right, _AS_OFFSETS)])
        return first(inner(x, _AS_OFFSETS) for x in (node.left, node.right))
    if isinstance(node, cst.IfExp):
        return first([inner(node.test, _AS_TEST), inner(node.body, use), inner(node.orelse, use)])
    if _taken_apart(an, node, facts.flat):
        return None  # the step taken apart over the extent (a flattened loop's `step // k_tiles`): the step's checks
    if isinstance(node, cst.Comparison) and use != _AS_TEST:
        return inner(node, _AS_TEST)  # a comparison's value is a choice
    return first(inner(child, use) for child in _expressions(node))


def _through(an: KernelAnalysis, name: str, use: str, facts: _ExtentFacts, memo: dict) -> _ExtentRead | None:
    """:func:`_extent_read` of each value bound to ``name``, once per name and use. A name met again while its own
    values are read (`offs_k += BLOCK_K`) reads nothing more there than its other values say; what is found with such
    a turn left open is not kept for later reads."""
    key = (name, use)
    if key in memo:
        found = memo[key]
        if found is _VISITING:
            memo[_VISITING] = memo.get(_VISITING, 0) + 1
            return None
        return found
    memo[key], turns, found = _VISITING, memo.get(_VISITING, 0), None
    for src, site in _bindings(an, name):
        if (found := _extent_read(an, cst.parse_expression(src), use, facts, memo, site)) is not None:
            if not found.bound:
                found = found._replace(source=f"{name} = {src}", site=site, bound=True)
            break
    if found is None and memo.get(_VISITING, 0) != turns:
        del memo[key]
    else:
        memo[key] = found
    return found


def _reads_offsets(an: KernelAnalysis, node: cst.BaseExpression) -> bool:
    """Whether ``node`` reads offsets: what `tl.arange` makes, through the values of the names it reads (not what
    they load)."""
    return _found_through(an, node, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("arange"))),
                          past_loads=False)


def _found_through(an: KernelAnalysis, node: cst.BaseExpression, pattern, names: frozenset[str] = frozenset(),
                   past_loads: bool = True) -> bool:
    """Whether ``node`` holds ``pattern`` or reads one of ``names``, or a value of a name it reads does, in turn
    (without ``past_loads``, not through the names a load's arguments read)."""
    todo, seen = [node], set()
    while todo:
        here = todo.pop()
        if m.findall(here, pattern) or names_in(here) & names:
            return True
        for name in (names_in(here) if past_loads else names_outside_loads(here)) - seen:
            seen.add(name)
            todo += [cst.parse_expression(src) for src, _ in _bindings(an, name)]
    return False


def _classify_quietly(an: KernelAnalysis, node: cst.BaseExpression) -> str | None:
    """:func:`_classify` of ``node``, or ``None`` where it raises."""
    try:
        return _classify(an, node, {})
    except _Epilogue:
        return None


def _check_extent_data(an: KernelAnalysis, summing, facts: _ExtentFacts) -> None:
    """Inside a loop that sums, what is added to an accumulator may read the K extent (or a value computed from it)
    only where it is read (a load's address, a mask bounding the K offsets): each rank passes its own slice's extent,
    so a term weighed or chosen by it (`a * (2.0 if K > 25 else 1.0)`, `tl.where(K > 25, a * 2, a)`, `acc +=
    tl.dot(a, b) * (1 + BIG)` with `BIG` a heuristic of K, a helper TileLink does not read handed `K`) differs from
    rank to rank, and the sum over the ranks would not be the full problem's value. Refused at the update."""
    if not facts.derived:
        return
    for name, at in sorted(_summing_updates(an, summing), key=lambda u: (u[1].line, u[1].column, u[0])):
        for src, site in _bindings(an, name):
            if site != at:
                continue
            added = _carried_slot(_written_helper(an, cst.parse_expression(src)), name) or []
            for term in added:
                found = _extent_read(an, term, _AS_DATA, facts, {})
                if found is None:
                    continue
                said = facts.derived.get(found.name, "read from the K extent of the loop that sums")
                via = f" through `{found.source}`" + (f" at line {found.site.line}" if found.site else "")
                raise AnnotationError(
                    f"what the update at line {at.line} adds to `{name}` (`{code(_bare(term))}`) reads `{found.name}`, "
                    f"{said},{via}: each rank would weigh or choose the terms of its slice of K by its own slice, "
                    f"and the sum over the ranks would not be the full problem's value",
                    file=at.file, line=at.line, column=at.column,
                    hint="in the loop that sums, read the K extent only in its range and in the loads' addresses "
                         "and masks (`offs_k[None, :] < K - k * BLOCK_K`); pass a scale or a choice of the "
                         "problem's as a parameter of its own, the same on every rank")


class _Offsets(_Columns):
    """Reads a load's address as sums of products (:class:`_Columns`' form): a broadcast (`rm[:, None]`,
    `tl.broadcast_to(x, shape)`) is its vector, a hint (`tl.multiple_of(x, 16)`) its value, a load (a gathered
    offset) an atom of its own, and so is a name bound to a block pointer or a descriptor (:func:`_misread` reads
    what it is made from)."""

    def read(self, node: cst.BaseExpression, depth: int = 0) -> Poly | None:
        node = _bare(node)
        if isinstance(node, cst.NamedExpr):  # `(p := a_ptr)`: what it binds
            return self.read(node.value, depth)
        if isinstance(node, cst.Subscript) and all(
                m.matches(e.slice, m.Index(value=m.Name("None")) | m.Slice(lower=None, upper=None, step=None))
                for e in node.slice):
            return self.read(node.value, depth)
        if isinstance(node, cst.Call) and node.args and m.matches(node.func, _HINTS):
            return self.read(node.args[0].value, depth)
        if isinstance(node, cst.Call) and len(node.args) == 2 and m.matches(
                node.func, m.Attribute(value=m.Name("tl"), attr=m.Name("broadcast_to"))):
            return self.read(node.args[0].value, depth)  # `tl.broadcast_to(x, shape)`: x's elements, repeated
        if m.matches(node, m.Call(func=m.Attribute(attr=m.Name("load") | m.Name("gather")))):
            return {(code(node),): 1}
        if isinstance(node, cst.Name) and _made_address(self.an, node.value) is not None:
            return {(node.value,): 1}
        return super().read(node, depth)


def _made_address(an: KernelAnalysis, name: str) -> cst.Call | None:
    """The call that makes ``name`` a block pointer or a descriptor (`tl.make_block_ptr(...)`, `tl.advance(...)`),
    where its first binding is one."""
    binds = _bindings(an, name)
    if not binds or name in an.params:
        return None
    value = _bare(cst.parse_expression(binds[0][0]))
    return value if isinstance(value, cst.Call) and m.matches(value, _ADDRESSING) else None


def _show_term(terms: Poly, monomial: tuple[str, ...]) -> str:
    """A term of :class:`_Offsets`' form as source: an atom written out whole is parenthesised."""
    factors = [a[len("arange:"):].join(("tl.arange(0, ", ")")) if a.startswith("arange:") else
               a if _atomic(a) else f"({a})" for a in monomial]
    coefficient = terms[monomial]
    return " * ".join(([str(coefficient)] if coefficient != 1 else []) + factors) or str(coefficient)


#: what places a value among the rows, or gathers it: an offset that is not a scalar of the launch
_PLACING = m.Call(func=m.Attribute(attr=m.Name("arange") | m.Name("program_id") | m.Name("load") | m.Name("gather")
                                   | m.Name("num_programs")))


def _placed(an: KernelAnalysis, atom: str) -> bool:
    """Whether the atom ``atom`` of an address (:class:`_Offsets`) is an offset among rows or gathered, not a scalar
    the launch passes: `tl.arange`'s, a program id's, a load's, a loop's target (a persistent kernel's `tile_id`, a
    sweep's `pid_n`), through the values of the names it reads."""
    return atom.startswith("arange:") or _found_through(an, cst.parse_expression(atom), _PLACING,
                                                       frozenset(_loop_targets(an).values()))


def _address_root(an: KernelAnalysis, node: cst.BaseExpression) -> str | None:
    """The name an address adds its offsets to (`a_ptr` of `a_ptr + offs`, of `a_ptrs` bound to it, of a descriptor's
    `a_desc.load(...)`): the first term of the sum, through the first binding of a name the kernel binds."""
    for _ in range(8):
        name = _leading_name(node)
        if name is None:
            return None
        binds = _bindings(an, name)
        if name in an.params or not binds:
            return name
        node = cst.parse_expression(binds[0][0])
        if m.matches(node, _ADDRESSING) and node.args:
            node = node.args[0].value
    return None


def _leading_name(node: cst.BaseExpression) -> str | None:
    """The first term of a sum, where it is a name (`a_ptrs` of `a_ptrs + k * BLOCK_K`)."""
    node = _bare(node)
    while isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
        node = _bare(node.left)
    return node.value if isinstance(node, cst.Name) else None


class _Load(NamedTuple):
    """A load in a loop that sums (:func:`_summing_loads`)."""
    site: Where
    offsets: tuple[cst.BaseExpression, ...]  # its pointer, or a descriptor's offsets
    root: str | None  # what it adds its offsets to (:func:`_address_root`)
    steps: bool  # whether where it reads changes with the loop's step
    pointers: frozenset[str] = frozenset()  # the names its address reads (through their values)
    helper: str = ""  # a helper TileLink does not read, handed the pointer ``root``
    #: a descriptor's block shape, in source, one entry per offset (where the kernel makes the descriptor)
    blocks: tuple[str, ...] = ()


def _reads_varying(an: KernelAnalysis, node: cst.BaseExpression, varying: set[str]) -> bool:
    """Whether an address moves with the loop's step: a term of it reads a name that changes from step to step
    (a term multiplied by 0 is none)."""
    terms = _Offsets(an).read(node)
    if terms is None:
        return bool(names_in(node) & varying)
    return any(not atom.startswith("arange:") and names_in(cst.parse_expression(atom)) & varying
               for monomial in terms for atom in monomial)


def _summing_loads(an: KernelAnalysis, loop: tuple[Where, Where], outside: bool = False
                   ) -> tuple[list[_Load], set[str], set[str]]:
    """The loads in ``loop`` (also those a helper it calls returns, and a helper TileLink does not read handed a
    pointer), with the names that change from step to step (:func:`_varying`) and, of those, the ones the loop
    carries (a pointer it advances, `offs_k += BLOCK_K`); with ``outside``, the loads outside it instead. Read once
    per analysis: the checks ask for each loop several times."""
    memo = an.__dict__.setdefault("_summing_loads", {})  # the analysis is frozen: its own dict holds the answers
    if (loop, outside) not in memo:
        memo[loop, outside] = _read_summing_loads(an, loop, outside)
    return memo[loop, outside]


def _read_summing_loads(an: KernelAnalysis, loop: tuple[Where, Where], outside: bool
                        ) -> tuple[list[_Load], set[str], set[str]]:
    """:func:`_summing_loads`, read."""
    varying = _varying(an, loop, _loop_targets(an).get(loop))
    carried = {n for n in varying if any(_inside(w, loop) and n in names_in(cst.parse_expression(src))
                                         for src, w in _bindings(an, n) if w is not None)}
    found = []
    loads = m.Call(func=m.Attribute(attr=m.Name("load") | m.Name("load_tensor_descriptor")))
    for src, site in _located(an):
        if _inside(site, loop) == outside:
            continue
        node = cst.parse_expression(src)
        calls = list(m.findall(node, loads))
        for call in m.findall(node, m.Call(func=m.Name())):
            if call.func.value in an.helpers:  # type: ignore[attr-defined]
                returned = _helper_return(an, call)
                if returned is not None:
                    calls += m.findall(returned, loads)
                else:
                    for arg in call.args:
                        root = _address_root(an, arg.value)
                        if root is not None and root in an.params:
                            found.append(_Load(site, (arg.value,), root, False, frozenset(), call.func.value))
        for call in calls:
            function = m.matches(call.func, m.Attribute(value=m.Name("tl"), attr=m.Name("load_tensor_descriptor")))
            pointer = m.matches(call.func, m.Attribute(value=m.Name("tl"), attr=m.Name("load")))
            given = _arg(call, 1 if function else 0, "offsets" if not pointer else "pointer")
            if given is None:
                continue
            # a descriptor's `load([row, col])`: each offset
            offsets = tuple(e.value for e in given.elements) if not pointer and isinstance(
                given, (cst.List, cst.Tuple)) else (given,)
            base = given if pointer else call.args[0].value if function else call.func.value  # type: ignore
            steps = any(_reads_varying(an, n, varying) for n in offsets) or (not pointer and _reads_varying(
                an, base, varying))
            reads = frozenset(_names_through(an, base, outside_loops=False))
            made = _made_address(an, _bare(base).value) if not pointer and isinstance(_bare(base), cst.Name) else None
            shape = _arg(made, 3, "block_shape") if made is not None and m.matches(made.func, m.Attribute(
                attr=m.Name("make_tensor_descriptor"))) else None
            shape = _bare(_bound_value(an, shape, params_only=False)) if shape is not None else None
            blocks = tuple(code(e.value).strip() for e in shape.elements) if isinstance(
                shape, (cst.List, cst.Tuple)) and len(shape.elements) == len(offsets) else ()
            if pointer and m.matches(_bare(given), m.Call(func=m.Attribute(attr=m.Name("make_block_ptr")))) and \
                    _bare(given).args:  # `tl.load(tl.make_block_ptr(a_ptr, ...))`: the tensor is its base's
                base = _bare(given).args[0].value  # type: ignore[attr-defined]
            found.append(_Load(site, offsets, _address_root(an, base), steps, reads, blocks=blocks))
    return found, varying, carried


def _flat_steps(an: KernelAnalysis, loop: tuple[Where, Where]) -> tuple[frozenset[str], frozenset[str]]:
    """For a flattened loop that sums (its range is no K extent, a name bound in it cycles over `tl.cdiv(K, F)`):
    its target and the extent its step is taken apart over (:func:`_taken_apart`); nothing for any other loop."""
    target = _loop_targets(an).get(loop)
    if target is None or _loop_extent(an, loop, target)[0] is not None:
        return frozenset(), frozenset()
    passed = set(an.params) - set(an.constexpr_params)
    extent = {f for n in set(an.values) if any(w is not None and _inside(w, loop) for _, w in _bindings(an, n))
              and (c := _cycle_extent(an, n)) is not None for _, f in c if f in passed}
    return (frozenset({target}), frozenset(extent)) if extent else (frozenset(), frozenset())


def _taken_apart(an: KernelAnalysis, node: cst.BaseExpression, flat: tuple[frozenset[str], frozenset[str]],
                 operators=(cst.FloorDivide, cst.Modulo)) -> bool:
    """Whether ``node`` is a flattened loop's step taken apart over its count of K blocks (`step // k_tiles`, `step %
    k_tiles` with `k_tiles = tl.cdiv(K, BLOCK_K)`; ``flat``, :func:`_flat_steps`): the tile it is on and the block of
    K. Another loop's step, or a count of anything else, is no such thing (`k % tl.cdiv(K, 2 * BLOCK_K)`)."""
    steps, extent = flat
    if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, operators)):
        return False
    if not (isinstance(_bare(node.left), cst.Name) and _bare(node.left).value in steps):  # type: ignore
        return False
    count = _bare(node.right)
    if isinstance(count, cst.Name) and count.value not in an.params and len(_bindings(an, count.value)) == 1:
        count = _bare(cst.parse_expression(_bindings(an, count.value)[0][0]))
    if m.matches(count, m.Call(func=m.Attribute(attr=m.Name("cdiv")))) and len(count.args) == 2:  # type: ignore
        over = count.args[0].value  # type: ignore[union-attr]
    elif (divided := _ceil_divided(count)) is not None:
        over = divided[0]
    else:
        return False
    return {n for t, _ in _terms(_bare(over)) for n in names_in(t)} <= set(extent) | set(an.constexpr_params)


def _reads_through(an: KernelAnalysis, node: cst.BaseExpression, wanted: frozenset[str] | set[str],
                   flat: tuple[frozenset[str], frozenset[str]], memo: dict[str, set[str]],
                   operators=(cst.FloorDivide, cst.Modulo)) -> set[str]:
    """The names of ``wanted`` that ``node`` reads, through the values of the names it reads; not in a flattened
    loop's step taken apart by ``operators`` (:func:`_taken_apart`)."""
    node = _bare(node)
    if _taken_apart(an, node, flat, operators):
        return set()
    if isinstance(node, cst.Name):
        if node.value not in memo:
            memo[node.value] = read = {node.value} & set(wanted)  # also what a turn back to it reads
            for src, _ in _bindings(an, node.value):
                read |= _reads_through(an, cst.parse_expression(src), wanted, flat, memo, operators)
        return memo[node.value]
    return {n for child in _expressions(node) for n in _reads_through(an, child, wanted, flat, memo, operators)}


def _moves_along(an: KernelAnalysis, atom: str, flat: tuple[frozenset[str], frozenset[str]], moving: set[str]
                 ) -> bool:
    """Whether the atom ``atom`` of an address (:class:`_Offsets`) moves along K with the loop's step: it reads one
    of ``moving`` (the loop's target, what it carries), other than as the tile a flattened loop's step is on (`step
    // k_tiles`)."""
    return not atom.startswith("arange:") and bool(_reads_through(
        an, cst.parse_expression(atom), moving, flat, {}, (cst.FloorDivide,)))


def _step_misread(an: KernelAnalysis, atom: str, flat: tuple[frozenset[str], frozenset[str]],
                  moving: set[str]) -> bool:
    """Whether the atom ``atom`` of an address reads the loop's step other than as where the step's columns start:
    an expression of it (`k % 2`, `tl.where(k > 0, ...)`, a load at an offset of it) other than a flattened loop's
    step taken apart (:func:`_taken_apart`) or a group of the step's columns (`k * BLOCK_K // group_k`, a block
    scale's index)."""
    if atom.startswith("arange:") or not _reads_through(an, cst.parse_expression(atom), moving, flat, {}):
        return False
    node = _bare(cst.parse_expression(atom))
    if isinstance(node, cst.Name):
        return False  # a name the loop carries: its values are read in turn
    if _taken_apart(an, node, flat):
        return False
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.FloorDivide) and not _reads_through(
            an, node.right, moving, flat, {}):
        left = _Offsets(an).read(node.left)
        return left is None or any(_step_misread(an, x, flat, moving) for t in left for x in t) or any(
            sum(1 for x in t if _moves_along(an, x, flat, moving)) > 1 for t in left)
    return True


def _row_strides(an: KernelAnalysis, summing) -> dict[str, str]:
    """The parameters that scale the row offsets of a tensor a loop that sums steps along K (`stride_am` of `a_ptr +
    rm[:, None] * stride_am + ...`), each with that tensor: a rank's own slice of K, contiguous, has its own K as the
    row stride, so outside an address they are the rank's own like the extent. Not one that scales the step along K
    (`k * BLOCK_K * stride_ak`, a pointer advanced by `BLOCK_K * stride_ak`), a split-K program's offset along K
    too. (B's column stride, scaled by its columns, is taken as one: the same on every rank, so only a read of it
    outside an address, which kernels do not make, is refused.)"""
    reader = _Offsets(an)
    passed = set(an.params) - set(an.constexpr_params)
    rows: dict[str, str] = {}
    along: set[str] = set()
    targets = _loop_targets(an)
    for loop in summing:
        loads, varying, carried = _summing_loads(an, loop)
        flat, moving_names = _flat_steps(an, loop), {targets[loop]} | carried if loop in targets else set(carried)
        for load in loads:
            if not load.steps or load.root is None or load.helper:
                continue
            nodes, seen = [(n, False) for n in load.offsets], set()
            while nodes:  # the address, and the values of a pointer advanced on each step
                node, advance = nodes.pop()
                for monomial in reader.read(node) or {}:
                    if set(monomial) & carried:
                        for x in set(monomial) & carried - seen:
                            seen.add(x)
                            nodes += [(cst.parse_expression(src), w is not None and _inside(w, loop))
                                      for src, w in _bindings(an, x)]
                        continue
                    params = set(monomial) & passed - {load.root}
                    # what moves along K with the step: not the tile a flattened loop's step is on (`step // k_tiles`)
                    moving = [x for x in monomial if _moves_along(an, x, flat, moving_names)]
                    if advance or moving:
                        along |= params
                    elif any(_placed(an, x) for x in monomial):
                        for x in sorted(params):
                            rows.setdefault(x, load.root)
    return {p: t for p, t in rows.items() if p not in along}


def _misread(an: KernelAnalysis, node: cst.BaseExpression, extent: frozenset[str], varying: set[str],
             carried: set[str], moving: set[str], flat: tuple[frozenset[str], frozenset[str]], seen: set[str]
             ) -> tuple[str, str] | None:
    """(the extent read, the term) where ``node``, an address in a loop that sums, reads the extent other than as a
    row stride (:func:`_check_k_offsets`); ``carried``: the names the loop carries (a pointer it advances, whose
    values are read in turn); ``moving``: the loop's target and what it carries; ``flat``: :func:`_flat_steps`. The
    step may be read only as where the step's columns start (``k * BLOCK_K``, a pointer advanced on each step):
    `(None, term)` where it is read otherwise (:func:`_step_misread`), or more than once in a term (`k * k`)."""
    bare = _bare(node)
    if isinstance(bare, cst.Call) and m.matches(bare, _ADDRESSING):
        # a block pointer or a descriptor: its base and its offsets (its shape and strides lay out the rank's own
        # slice, as a row stride does)
        called = bare.func.attr.value  # type: ignore[union-attr]
        parts = [_arg(bare, 0, "base")] + ([_arg(bare, 3 if called == "make_block_ptr" else 1, "offsets")]
                                            if called != "make_tensor_descriptor" else [])
        for part in parts:
            for x in (e.value for e in part.elements) if isinstance(part, (cst.Tuple, cst.List)) else [part]:
                if x is not None and (found := _misread(an, x, extent, varying, carried, moving, flat,
                                                        seen)) is not None:
                    return found
        return None
    terms = _Offsets(an).read(node)
    if terms is None:
        return None
    for monomial in terms:
        for atom in monomial:
            if atom.startswith("arange:"):
                continue
            if atom in carried or _made_address(an, atom) is not None:
                if atom not in seen:  # where it starts, what each step adds; what a block pointer is made from
                    seen.add(atom)
                    for src, _ in _bindings(an, atom):
                        if (found := _misread(an, cst.parse_expression(src), extent, varying, carried, moving,
                                              flat, seen)) is not None:
                            return found
                continue
            read = _reads_through(an, cst.parse_expression(atom), extent, flat, {})
            term = _show_term(terms, monomial)
            if read and atom not in extent:
                return sorted(read)[0], term
            if _step_misread(an, atom, flat, moving) or sum(_moves_along(an, x, flat, moving) for x in monomial) > 1:
                return None, term
            if not read:
                continue
            if not any(_placed(an, x) and not _moves_along(an, x, flat, moving) for x in monomial if x != atom):
                return atom, term
    return None


def _peeled(an: KernelAnalysis, loop: tuple[Where, Where], header: str, load: _Load) -> bool:
    """Whether ``load``, after ``loop``, reads K offsets made from where the loop stops (`rk = prev_multiple +
    tl.arange(0, BLOCK_K)` after `for start_k in range(0, prev_multiple, BLOCK_K)`): a last step peeled out of it."""
    site = load.site
    if (site.line, site.column) < (loop[1].line, loop[1].column) or not header.startswith("range("):
        return False
    try:
        args = cst.parse_expression(header).args  # type: ignore[attr-defined]
    except cst.ParserSyntaxError:
        return False
    stop = names_in(args[1].value) if len(args) >= 2 else set()
    read = set().union(*(names_in(o) for o in load.offsets)) if load.offsets else set()
    return bool(stop) and any(
        w is not None and (loop[1].line, loop[1].column) < (w.line, w.column) < (site.line, site.column)
        and "arange" in src and names_in(cst.parse_expression(src)) & stop
        for n in read for src, w in _bindings(an, n))


class _Peel(NamedTuple):
    """A last step of K peeled out of a loop that sums (:func:`_verified_peel`)."""
    loads: frozenset[Where]  # its loads of the tensors the loop steps along
    updates: frozenset[Where]  # its updates of the sums, as the loop's own


def _reaching(an: KernelAnalysis, name: str, loop: tuple[Where, Where], at: Where) -> str | None:
    """The value of ``name`` at ``at``, after ``loop``: its last binding between the two, outside every loop; ``None``
    where there is none."""
    after = [(w, src) for src, w in _bindings(an, name) if w is not None and _before(loop[1], w) and _before(w, at)]
    last = max(after, key=lambda x: (x[0].line, x[0].column), default=None)
    return None if last is None or _within(last[0], _loops(an)) else last[1]


def _expanded(an: KernelAnalysis, reader, poly: Poly, value_of) -> Poly | None:
    """``poly`` with each atom that ``value_of`` gives a value (source) for replaced by that value's terms."""
    out: Poly = {}
    for monomial, c in poly.items():
        term: Poly = {(): c}
        for atom in monomial:
            src = value_of(atom)
            read = reader.read(cst.parse_expression(src)) if src is not None else {(atom,): 1}
            if read is None:
                return None
            term = poly_mul(term, read)
        out = poly_add(out, term)
    return {m_: c for m_, c in out.items() if c}


_PEEL_WIDTHS = (*range(1, 17), 32, 64, 128, 256)


def _peel_start(an: KernelAnalysis, node: cst.BaseExpression, extent: str, width: cst.BaseExpression) -> bool:
    """Whether ``node``, where a loop over `range(0, P, W)` stops and its peeled step starts, is a multiple of W
    within W of the extent: ``K - W <= P <= K`` and ``P % W == 0`` for every K from 1 (`tl.cdiv(K, BLOCK_K) *
    BLOCK_K - BLOCK_K`, `K // BLOCK_K * BLOCK_K`, `K - K % BLOCK_K`, through names bound once and helpers of one
    `return`), so that the loop's blocks and the peeled one cover [0, K) once. ``node`` may read the extent, the
    names of W and literals, with `+ - * // %`, `tl.cdiv`; it is checked for the block widths 1 to 16 and the powers
    of two up to 256, and, each a quasi-affine function of K, over two of its periods."""
    names = {n for n in names_in(width)} | {extent}

    def value(x: cst.BaseExpression, env: dict[str, int], depth: int = 0) -> int | None:
        x = _bare(x)
        if depth > 12:
            return None
        if isinstance(x, cst.Integer):
            return int(x.evaluated_value)
        if isinstance(x, cst.Name):
            if x.value in env:
                return env[x.value]
            binds = _bindings(an, x.value)
            return value(cst.parse_expression(binds[0][0]), env, depth + 1) if len(binds) == 1 else None
        if isinstance(x, cst.UnaryOperation) and isinstance(x.operator, cst.Minus):
            v = value(x.expression, env, depth + 1)
            return None if v is None else -v
        if isinstance(x, cst.Call) and isinstance(x.func, cst.Name) and x.func.value in an.helpers:
            written = _helper_return(an, x)
            return None if written is None else value(written, env, depth + 1)
        if isinstance(x, cst.Call) and m.matches(x.func, m.Attribute(attr=m.Name("cdiv"))) and len(x.args) == 2:
            top, bottom = (value(a.value, env, depth + 1) for a in x.args)
            return None if top is None or not bottom else -(-top // bottom)
        if isinstance(x, cst.BinaryOperation):
            left, right = value(x.left, env, depth + 1), value(x.right, env, depth + 1)
            if left is None or right is None:
                return None
            op = x.operator
            if isinstance(op, cst.Add):
                return left + right
            if isinstance(op, cst.Subtract):
                return left - right
            if isinstance(op, cst.Multiply):
                return left * right
            if isinstance(op, (cst.FloorDivide, cst.Modulo)) and right:
                return left // right if isinstance(op, cst.FloorDivide) else left % right
        return None

    literal = 1  # the literal divisors' product: with the width, a period of the value less the extent
    for div in m.findall(node, m.BinaryOperation(operator=m.FloorDivide() | m.Modulo())):
        if isinstance(_bare(div.right), cst.Integer):
            literal *= max(1, int(_bare(div.right).evaluated_value))
    others = sorted(names - {extent})
    for w in _PEEL_WIDTHS:
        env = dict.fromkeys(others, w)
        step = value(width, env)
        if step is None or step < 1:
            return False
        period = step * literal
        if period > 1 << 16:
            return False
        for k in range(1, 2 * period + 1):
            start = value(node, {**env, extent: k})
            later = value(node, {**env, extent: k + period})
            if start is None or later is None or start % step or not k - step <= start <= k or \
                    later - start != period:
                return False
    return True


def _verified_peel(an: KernelAnalysis, loop: tuple[Where, Where]) -> _Peel | None:
    """A last step of K peeled out of ``loop`` that covers the rest of each rank's slice once, as FlagGems' GEMMs
    write it: the loop runs `range(0, P, W)` with `P` a multiple of W within W of the extent (:func:`_peel_start`),
    each of its loads of a tensor it steps along K is read again after it at `k = P` (the same address, the step's
    names read at their values there) and masked by the extent (`mask_k = rk < K`, `rk = P + tl.arange(0, W)`), and
    each update of the sums after it is one of the loop's own over the values those loads give, run once (under
    compile-time tests only), before every store. ``None`` otherwise (refused by :func:`_check_k_offsets`).
    Memoized per loop."""
    memo = an.__dict__.setdefault("_peels", {})
    if loop not in memo:
        try:
            memo[loop] = _read_peel(an, loop)
        except (cst.ParserSyntaxError, AttributeError, ValueError, TypeError):
            memo[loop] = None
    return memo[loop]


def _read_peel(an: KernelAnalysis, loop: tuple[Where, Where]) -> _Peel | None:
    """:func:`_verified_peel`, read."""
    target = _loop_targets(an).get(loop)
    header = _loop_header(an, loop)
    if target is None or not header.startswith("range("):
        return None
    args = _range_args(cst.parse_expression(header))  # type: ignore[arg-type]
    if len(args) != 3 or not m.matches(_bare(args[0]), m.Integer("0")) or not isinstance(_bare(args[1]), cst.Name):
        return None
    stop, width = _bare(args[1]).value, args[2]
    if stop in an.params or len(_bindings(an, stop)) != 1 or _within(_bindings(an, stop)[0][1], _loops(an)):
        return None
    reader, loops = _Offsets(an), _loops(an)
    loads = _summing_loads(an, loop)[0]
    stepped = {x.root for x in loads if x.steps and x.root is not None}
    after = [x for x in _summing_loads(an, loop, outside=True)[0] if x.root in stepped]
    if not stepped or not after or any(x.helper or len(x.offsets) != 1 for x in loads + after if x.root in stepped):
        return None
    in_loop = {n for n in set(an.values) | set(an.updates) for _, w in _bindings(an, n) if _within(w, {loop})}
    stop_terms = reader.read(cst.Name(stop))
    extent = None
    for peel in after:
        site = peel.site
        if not _before(loop[1], site) or _within(site, loops) or any(
                not side.static for side in _sides_of(an, site)):
            return None

        def at_peel(atom: str, site: Where = site) -> str | None:
            return _reaching(an, atom, loop, site) if atom in in_loop else None

        read = reader.read(peel.offsets[0])
        got = _expanded(an, reader, read, at_peel) if read is not None else None
        # the address some load of the tensor in the loop reads, at the step `k = P`
        matched = False
        for x in loads:
            if x.root != peel.root or not x.steps:
                continue
            inside = reader.read(x.offsets[0])

            def in_step(atom: str, x=x) -> str | None:
                binds = [(w, src) for src, w in _bindings(an, atom) if w is not None and _inside(w, loop)]
                return binds[0][1] if len(binds) == 1 and _before(binds[0][0], x.site) else None

            want = _expanded(an, reader, inside, in_step) if inside is not None else None
            want = _expanded(an, reader, want, lambda a_: stop if a_ == target else None) if want else None
            matched = matched or (want is not None and got is not None and want == got)
        if not matched:
            return None
        # its mask bounds the K offsets `P + tl.arange(0, W)` by the extent
        call = next((c for src, w in _located(an) if w == site for c in m.findall(
            cst.parse_expression(src), m.Call(func=m.Attribute(attr=m.Name("load"))))), None)
        mask = _arg(call, 1, "mask") if call is not None else None
        other = _arg(call, 2, "other") if call is not None else None
        if mask is None or other is not None and (not m.matches(_bare(other), m.Integer() | m.Float()) or float(
                code(_bare(other))) != 0.0):
            return None  # the masked-out columns add zeros (Triton's, where `other` is left out)
        block = poly_add(stop_terms or {}, reader.read(cst.parse_expression(f"tl.arange(0, {code(width)})")) or {})
        bound = _peel_bound(an, reader, mask, block, at_peel)
        if bound is None or extent not in (None, bound):
            return None
        # every other term of the mask is one of the loop's loads' own (the rows' `rm[:, None] < M`): a term that
        # reads the peel's columns otherwise picks them by their place in each rank's slice
        loop_terms = {code(t).strip() for x in loads if x.root == peel.root for src, w in _located(an)
                      if w == x.site for c in m.findall(cst.parse_expression(src), m.Call(
                          func=m.Attribute(attr=m.Name("load")))) if (lm := _arg(c, 1, "mask")) is not None
                      for t in _and_terms(lm)}
        if any(code(t).strip() not in loop_terms and _peel_bound(an, reader, t, block, at_peel) is None
               for t in _and_terms(mask)):
            return None
        extent = bound
    if extent is None or not _peel_start(an, cst.Name(stop), extent, width):
        return None
    # the sums' updates after the loop: the loop's own, over the peeled loads' values, once, before every store
    peel_sites = frozenset(x.site for x in after)
    updates = set()
    for name, w in _summing_updates(an, {loop}):
        src = next(s_ for s_, w_ in _bindings(an, name) if w_ == w)
        for later, lw in _bindings(an, name):
            if lw is None or not _before(loop[1], lw) or later != src:
                continue
            if _within(lw, loops) or any(not side.static for side in _sides_of(an, lw)):
                return None
            for read_name in names_in(cst.parse_expression(later)) & in_loop - {name}:
                # bound after the loop first by a peeled load of its own (`a = tl.load(...)`), then cast at most
                # (`a = a.to(C.dtype.element_ty)`): any other change weighs the peeled block unlike the loop's
                chain = sorted(((w_, src_) for src_, w_ in _bindings(an, read_name) if w_ is not None
                                and _before(loop[1], w_) and _before(w_, lw)), key=lambda x: (x[0].line, x[0].column))
                if not chain or not _peel_load_binding(chain[0][1], chain[0][0], peel_sites) or any(
                        not m.matches(_bare(cst.parse_expression(src_)), m.Call(
                            func=m.Attribute(value=m.Name(read_name), attr=m.Name("to")))) for _, src_ in chain[1:]):
                    return None
            updates.add(lw)
    if not updates:
        return None
    last = max(updates, key=lambda w: (w.line, w.column))
    for name, w in _summing_updates(an, {loop}):
        # each of the loop's updates has one in the peel on the same compile-time sides, and the sums are bound
        # nothing else between the loop and the peel's last update (a scale there would weigh the loop's part alone)
        sides = _launch_sides(an, w)
        meeting = [u for _, u in _bindings(an, name) if u in updates
                   and _joined_sides(sides, _launch_sides(an, u)) is not None]
        # one on the launches that take the loop's update, on every one of them (`if True:` aside)
        if len(meeting) != 1 or not {x for x in _launch_sides(an, meeting[0]) if x != ("True", True)} <= sides:
            return None
        if any(u is not None and _before(loop[1], u) and _before(u, last) and u not in updates
               for _, u in _bindings(an, name)):
            return None
    if any(x.kind == "store" and _before(x.where, last) for x in an.accesses):
        return None
    return _Peel(peel_sites, frozenset(updates))


def _and_terms(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The terms of a conjunction `x & y & ...` (one term for anything else)."""
    node = _bare(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitAnd):
        return _and_terms(node.left) + _and_terms(node.right)
    return [node]


def _peel_load_binding(src: str, where: Where, sites: frozenset[Where]) -> bool:
    """Whether the binding ``src`` at ``where`` is the value of one of the peeled loads at ``sites`` itself."""
    value = _bare(cst.parse_expression(src))
    return m.matches(value, m.Call(func=m.Attribute(attr=m.Name("load")))) and any(
        p.line == where.line or (p.line > where.line and p.line <= where.line + code(value).count("\n"))
        for p in sites)


def _peel_bound(an: KernelAnalysis, reader, mask: cst.BaseExpression, block: Poly, at_peel) -> str | None:
    """The extent parameter a peeled load's ``mask`` bounds its K offsets ``block`` (`P + tl.arange(0, W)`) by, in a
    term `offsets < K` of it (through names bound after the loop, `mask_k[None, :]`), or ``None``."""
    todo, seen = [mask], 0
    while todo and seen < 32:
        seen += 1
        term = _bare(todo.pop())
        if isinstance(term, cst.Subscript):
            todo.append(term.value)
        elif isinstance(term, cst.BinaryOperation) and isinstance(term.operator, cst.BitAnd):
            todo += [term.left, term.right]
        elif isinstance(term, cst.Name) and (src := at_peel(term.value)) is not None:
            todo.append(cst.parse_expression(src))
        elif isinstance(term, cst.Name) and len(_bindings(an, term.value)) == 1 and term.value not in an.params:
            todo.append(cst.parse_expression(_bindings(an, term.value)[0][0]))
        elif isinstance(term, cst.Comparison) and len(term.comparisons) == 1:
            op, left, right = term.comparisons[0].operator, term.left, term.comparisons[0].comparator
            if isinstance(op, cst.GreaterThan):
                left, right, op = right, left, cst.LessThan()
            bound = _bare(right)
            if not isinstance(op, cst.LessThan) or not isinstance(bound, cst.Name) or bound.value not in set(
                    an.params) - set(an.constexpr_params):
                continue
            read = reader.read(left)
            offsets = _expanded(an, reader, read, at_peel) if read is not None else None
            if offsets == {m_: c for m_, c in block.items() if c}:
                return bound.value
    return None


def _check_k_offsets(an: KernelAnalysis, summing, extent: frozenset[str], said: dict[str, str]) -> None:
    """In a loop that sums, each rank reads its own slice of K, whose columns start at 0 and end at its own extent:
    a load's offsets along K may be what the step reads (`k * BLOCK_K + tl.arange(0, BLOCK_K)`, a pointer advanced
    on each step), and the extent may be read in an address only as a row stride (`rm[:, None] * K`). An offset along
    K computed from the extent (`(k * BLOCK_K + rk + K // 2) % K`, `(K - 1) * stride_ak`) reads other columns on each
    rank than on the full problem, and a load of a tensor the loop steps along K at the same offsets on every step
    (`a_ptr + rm[:, None] * stride_am`) reads the first columns of each rank's own slice. Refused at the load."""
    targets = _loop_targets(an)
    for loop in sorted(summing, key=lambda lp: (lp[0].line, lp[0].column)):
        loads, varying, carried = _summing_loads(an, loop)
        flat, moving = _flat_steps(an, loop), {targets[loop]} | carried if loop in targets else set(carried)
        for load in loads:
            for node in load.offsets if not load.helper else ():
                if (found := _misread(an, node, extent, varying, carried, moving, flat, set())) is not None:
                    site = load.site
                    if found[0] is None:
                        raise AnnotationError(
                            f"the address of the load at line {site.line} reads the step of the loop at line "
                            f"{loop[0].line}, which sums, other than as where the step's columns start (`{found[1]}`): "
                            f"each rank runs that loop over its own slice of K, so columns picked by the step's place "
                            f"in the rank's slice are other columns on each rank than on the full problem, and the "
                            f"sum over the ranks would not be its value",
                            file=site.file, line=site.line, column=site.column,
                            hint="offset the K columns by the step as `k * BLOCK_K + tl.arange(0, BLOCK_K)` (or a "
                                 "pointer advanced by `BLOCK_K * stride_ak` on each step), nothing else of it")
                    raise AnnotationError(
                        f"the address of the load at line {site.line}, in the loop at line {loop[0].line} that sums, "
                        f"reads `{found[0]}`, {said.get(found[0], 'computed from the K extent of that loop')} "
                        f"(through `{found[1]}`), other than as a row stride: each rank runs that loop over its own "
                        f"slice of K, whose columns start at 0 and end at its own extent, so an offset along K "
                        f"computed from the extent reads other columns on each rank than the full problem does, and "
                        f"the sum over the ranks would not be its value",
                        file=site.file, line=site.line, column=site.column,
                        hint="offset the K columns by the loop's step alone (`(k * BLOCK_K + tl.arange(0, "
                             "BLOCK_K))[None, :] * stride_ak`, or a pointer advanced by `BLOCK_K * stride_ak` on each "
                             "step); read the extent in an address only as a row stride (`rm[:, None] * K`)")
        stepping = {}
        for load in loads:
            if load.steps and load.root is not None:
                stepping.setdefault(load.root, load.site)
        if stepping and _loop_extent(an, loop, targets.get(loop))[0] is None and not flat[0]:
            header = _loop_header(an, loop)
            raise AnnotationError(
                f"TileLink does not read the K extent of the loop at line {loop[0].line}, which sums"
                f"{f' (`{header}`)' if header else ''}: each rank runs it over its own slice of K, and TileLink can "
                f"check neither that it covers the slice nor that nothing else reads the extent",
                file=loop[0].file, line=loop[0].line, column=loop[0].column,
                hint="loop over `range(0, tl.cdiv(K, BLOCK_K))` (or `range(0, K, BLOCK_K)`, a count bound once to "
                     "`tl.cdiv(K, BLOCK_K)`)")
        for load in _summing_loads(an, loop, outside=True)[0]:
            # on a launch that also steps along it (vLLM's MoE kernel reads `b_scale_ptr` before the loop on one
            # compile-time path and steps along it on another)
            along = [other.site for other in loads if other.steps and other.root == load.root and _joined_sides(
                _launch_sides(an, load.site), _launch_sides(an, other.site)) is not None]
            if along and not load.helper:
                site = load.site
                header = _loop_header(an, loop)
                after = _peeled(an, loop, header, load)
                if after and (peel := _verified_peel(an, loop)) is not None and site in peel.loads:
                    continue  # the loop's last step, peeled: the loop and it cover each rank's slice once
                raise AnnotationError(
                    (f"the load at line {site.line} reads `{load.root}` after the loop at line {loop[0].line} that "
                     f"sums, as a last step of K peeled out of it (the loop steps along the K of `{load.root}` at line "
                     f"{along[0].line})" if after else
                     f"the load at line {site.line} reads `{load.root}` outside the loop at line {loop[0].line} that "
                     f"sums, which steps along its K (the load at line {along[0].line})") + ": each rank holds "
                    f"only its own slice of K of `{load.root}`, so what this load reads differs from rank to rank, "
                    f"and TileLink cannot show that the ranks' sum is the full problem's value",
                    file=site.file, line=site.line, column=site.column,
                    hint=(f"fold the last step into the loop: loop over all of K (`range(0, K, BLOCK_K)` in place of "
                          f"`{header or 'its range'}`) and mask the step's columns by K (`mask=rk[None, :] < K`, "
                          f"`other=0.0`); a masked step costs about what the peeled one did. A peeled step TileLink "
                          f"reads: the loop stops at a multiple of the block within a block of K (`prev = tl.cdiv(K, "
                          f"BLOCK_K) * BLOCK_K - BLOCK_K`, `range(0, prev, BLOCK_K)`), and after it each load of the "
                          f"loop is made again at `prev + tl.arange(0, BLOCK_K)`, masked by `< K`, and added to the "
                          f"sums as the loop adds, once, before the store") if after else
                         f"read `{load.root}` only in the loop that sums, at each step's own columns (Triton "
                         f"pipelines the loop's loads itself: no load before the loop is needed)")
        for load in loads:
            if load.steps:
                continue
            roots = {load.root} if load.root is not None else load.pointers
            hit = sorted(r for r in roots if r in stepping)
            if not hit:
                continue
            site, root = load.site, hit[0]
            if load.helper:
                raise AnnotationError(
                    f"the call of `{load.helper}` at line {site.line}, in the loop at line {loop[0].line} that sums, "
                    f"is handed `{root}`, which the load at line {stepping[root].line} steps along K, and TileLink "
                    f"does not read what the helper loads: each rank holds only its own slice of K of `{root}`",
                    file=site.file, line=site.line, column=site.column,
                    hint=f"load `{root}` in the loop itself, or in a @triton.jit helper that only returns what it "
                         f"computes (one `return` of an expression)")
            text = ", ".join(code(n) for n in load.offsets)
            raise AnnotationError(
                f"the load at line {site.line} reads `{root}` at the same offsets on every step of the loop at "
                f"line {loop[0].line} that sums (`{text}`), while the load at line {stepping[root].line} steps "
                f"along its K: each rank holds only its own slice of K of `{root}`, so this load reads other "
                f"columns on each rank than the full problem does, and the sum over the ranks would not be its "
                f"value", file=site.file, line=site.line, column=site.column,
                hint=f"read `{root}` at each step's own columns (`k * BLOCK_K + tl.arange(0, BLOCK_K)`), or pass "
                     f"what is read on every step as a tensor of its own, the same on every rank")


def _check_extent_loops(an: KernelAnalysis, summing, extent: frozenset[str]) -> None:
    """A loop other than the loops that sum whose passes the K extent counts (`for r in range((K > 25) + 1)`, `while
    r < K // 16`, a heuristic of K in `tl.static_range`) runs a different number of times on each rank, which passes
    its own slice's extent: what it adds or computes would be the rank's own. Refused at the loop."""
    for loop in sorted(_loops(an) - set(summing), key=lambda lp: (lp[0].line, lp[0].column)):
        for src, w in an.effects:
            if w != loop[0]:
                continue
            header = _bare(cst.parse_expression(src))
            if isinstance(header, cst.NamedExpr):  # `(r := range(...))`: the range
                header = header.value
            if read := sorted(_names_through(an, header, outside_loops=False) & extent):
                raise AnnotationError(
                    f"the loop at line {loop[0].line} runs a number of passes read from `{read[0]}` "
                    f"(`{code(header)}`), the K extent of the loop that sums at line "
                    f"{min(lp[0].line for lp in summing)} or a value computed from it: each rank passes its own "
                    f"slice's extent, so the loop would run a different number of passes on each rank, and the sum "
                    f"over the ranks would not be the full problem's value",
                    file=w.file, line=w.line, column=w.column,
                    hint="count such a loop by a parameter the same on every rank (a constexpr, or a literal); the "
                         "loop over K itself is `range(0, tl.cdiv(K, BLOCK_K))`")


def _shape_names(an: KernelAnalysis) -> frozenset[str]:
    """The names the kernel's block shapes read: `tl.arange`'s bounds, the shapes of `tl.zeros` / `tl.full` and a
    descriptor's `block_shape`."""
    shaped = m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("arange") | m.Name("zeros") | m.Name("full")))
    found: set[str] = set()
    for sources in an.values.values():
        for src in sources:
            node = cst.parse_expression(src)
            for call in m.findall(node, shaped):
                if call.func.attr.value == "arange" and not m.matches(call.args[0].value, m.Integer("0")):
                    continue  # `tl.arange(S, S + 16)`: values from `S`, not a size
                args = call.args[1:] if call.func.attr.value == "arange" else call.args[:1]
                found |= {n for arg in args for n in names_in(arg.value)}
            for arg in m.findall(node, m.Arg(keyword=m.Name("block_shape"))):
                found |= names_in(arg.value)
    return frozenset(found)


def _sliced(an: KernelAnalysis) -> frozenset[str]:
    """The parameters holding the K extent of a loop that sums (``_SLICED``): read from its range, or, in a flattened
    loop, from the cycle of a name of its own bound in it (`k = step % k_tiles`)."""
    summing, targets = _summing_loops(an), _loop_targets(an)
    passed = set(an.params) - set(an.constexpr_params)
    found = {n for lp in summing if (x := _loop_extent(an, lp, targets.get(lp))[0]) is not None
             for n in names_in(x) & passed}
    return frozenset(found | {f for lp in summing for n in set(an.values)
                              if any(w is not None and _inside(w, lp) for _, w in _bindings(an, n))
                              and (c := _cycle_extent(an, n)) is not None for _, f in c if f in passed})


def _notify_each(an: KernelAnalysis, spec, opts: Options, rule: str, stores, insertions: list[Insertion],
                 report: list[ReportEntry]
                 ) -> tuple[list[Insertion], list[ReportEntry], str, tuple[tuple[str, str], ...],
                            tuple[tuple[str, str, str, str, int, bool], ...]]:
    """:func:`notify_stores` from the epilogue check of each store on."""
    refused: dict[BranchSide, _Epilogue] = {}  # branches whose epilogue is not linear, refused when compiled
    for a in stores:
        indexed = None if a.tile is not None or getattr(spec, "index", None) else an.index_behind(a)
        if indexed is not None:
            # rows read from a run-time index (an MoE kernel's sorted slots) are found only through index=; the
            # pointer's name may be one the inlining of a helper made, so the message names the index instead
            topk = next((p for p in an.params if p.replace("_", "").lower() == "topk"), None)
            raise AnnotationError(
                f"cannot tell which rows of {a.tensor!r} this store writes: they come through an index, "
                f"`{indexed[0]}`, loaded from {indexed[1]!r}, which {rule} reads only when the annotation names it",
                file=a.where.file, line=a.where.line, column=a.where.column,
                hint=(f"pass index=\"{indexed[1]}\", topk=\"{topk}\" (the parameter holding the slots of one "
                      f"token, reduced together) and size=\"<the full row count of the output>\" (e.g. "
                      f"\"num_valid_tokens // {topk}\") to {rule}(...)") if topk else
                     f"pass index=\"{indexed[1]}\" and size=\"<the full row count of the output>\" (a parameter, or "
                     f"an expression of them; add one where the kernel has none), and topk=\"<the parameter holding "
                     f"the slots of one token>\" where several rows of a token are reduced together, to {rule}(...)")
        if a.tile is None and a.where in an.row_program_misses:
            # one row a program, not taken as such: why, rather than a hint about blocks of rows
            raise AnnotationError(f"cannot tell which rows of {a.tensor!r} this store writes (pointer `{a.pointer}`)",
                                  file=a.where.file, line=a.where.line, column=a.where.column,
                                  hint=an.row_program_misses[a.where])
        if a.tile is None:
            scalar = _scalar_row(an, a)
            raise AnnotationError(
                f"cannot tell which rows of {a.tensor!r} this store writes "
                f"({'descriptor' if a.descriptor else 'pointer'} `{a.pointer}`)",
                file=a.where.file, line=a.where.line, column=a.where.column,
                hint="store with a literal offsets list, `desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc)`, "
                     "to a descriptor made once by tl.make_tensor_descriptor(..., block_shape=[...])"
                if a.descriptor else
                f"it stores one row per program, at `{scalar}`: name that tile and the full row count, "
                f"{rule}(\"{a.tensor}\", tile=(\"{scalar}\", \"1\"), size=\"<the rows of the output>\")"
                if scalar is not None else
                "compute the offsets as `offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)` and "
                "index with offs_cm[:, None], or pass tile=(\"<start>\", \"<size>\")")
        if a.in_expression:
            raise AnnotationError(
                f"the store to {a.tensor!r} is inside an expression (`... if c else ...`, `c and ...`) that may "
                f"skip it, or followed on its line by a `return`, `break` or `continue`: the notify TileLink "
                f"inserts after the line would count rows the store did not write, or never run",
                file=a.where.file, line=a.where.line, column=a.where.column,
                hint="write the store as a statement of its own line, and its condition in the mask "
                     "(`mask=... & (c)`) or an `if` around it")
        effects = [(part, code(c)) for part, x in (("address", a.pointer), ("mask", a.mask)) if x
                   for c in m.findall(cst.parse_expression(x), _EFFECTS)]
        if effects:
            part, call = effects[0]
            raise AnnotationError(
                f"the {part} of the store to {a.tensor!r} calls `{call}`, which has an effect: the notify TileLink "
                f"inserts reads the store's address and mask again, and would run it twice",
                file=a.where.file, line=a.where.line, column=a.where.column,
                hint="make that call in a statement of its own before the store and store through its result")
        if not a.anchor_is_access and not a.swept and a.where in an.sweep_misses:
            raise _sweep_refused(a, *an.sweep_misses[a.where])
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
        if not spec.linear_epilogue:
            _epilogue_branches(an, a, rule, refused)
        else:  # the flag vouches for the epilogue, not for how the K loop sums its terms
            _check_accumulators(an, a, rule)
        _check_k_masks(an, a, rule)
        if a.mask is not None and not t.dynamic:
            _check_mask_by_position(an, a, rule)
        if a.branch is not None and not _stored_on_every_side(an, spec, a):
            report.append(ReportEntry(an.name, rule, "note",
                                      f"the store at line {a.where.line} is in a branch of the `if` at line "
                                      f"{a.branch.line}: a tile that takes no storing branch leaves its rows "
                                      f"unnotified, and the reduction's wait for them times out naming them", a.where))
        if opts.via == "copy_engine" and spec.topk:
            report.append(ReportEntry(an.name, rule, "note",
                                      f"no notify after the store at line {a.where.line}: with topk= on the copy "
                                      "engine the top-k reduce runs behind this kernel on its stream (a rank's "
                                      "tokens are spread over every expert, so no channel is complete before the "
                                      "last tile)", a.where))
            continue
        if a.swept:
            insertions += _swept(an, a, t, spec, _store_variable("tlk_swept", a, stores))
            report.append(ReportEntry(an.name, rule, "applied",
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
            report.append(ReportEntry(an.name, rule, "applied",
                                      f"the tile loop at line {a.loop.line} notifies four tiles at a time (one barrier "
                                      "and fence per four tiles; a tile's adds at most three tiles late)", a.loop))
        if a.descriptor:
            insertions.append(Insertion(a.anchor, "after", _descriptor_notify(an, a, t, spec, pending)))
            what = ("producer_tile_notify_rows_grouped (it waits for the bulk store)" if grouped
                    else "bulk_store_wait + producer_tile_notify")
            report.append(ReportEntry(an.name, rule, "applied",
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
            stored = _stored_per_element(a, by_address=_by_address(a, t))
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
        report.append(ReportEntry(an.name, rule, "applied",
                                  f"{what} after the store at line {a.where.line} "
                                  f"({describe_rows(t)})", a.where))
    guards: list[tuple[str, str]] = []
    if refused:
        more, notes, guards = _refuse_in_branches(an, refused, rule)
        insertions, report = more + insertions, notes + report
    first = stores[0]
    tile = first.tile
    assert tile is not None
    size_param = spec.size or tile.size_param
    if tile.dynamic and spec.size is None:
        raise AnnotationError(
            f"{rule} with index={spec.index!r} needs the full row count of the reduced result",
            file=first.where.file, line=first.where.line, column=first.where.column,
            hint="pass size=\"<parameter or expression>\", e.g. size=\"num_valid_tokens // top_k\"")
    if size_param is None:
        raise AnnotationError(
            f"cannot find the parameter holding the full size of dim 0 of {first.tensor!r}",
            file=first.where.file, line=first.where.line, column=first.where.column,
            hint=f"mask the store with `{tile.offsets or 'offs'}[:, None] < M`, or pass size=\"M\"")
    rotations: tuple[tuple[str, str, str, str, int, bool], ...] = ()
    shift = f"(((tlk_rank + 1) % tlk_world) * tlk_rows_per_rank) // ({tile.size})"
    if tile.dynamic:
        report.append(ReportEntry(an.name, rule, "note", f"dynamic mapping through {spec.index}"
                                  + (f", top-k reduction (topk={spec.topk})" if spec.topk else "")
                                  + ("" if opts.via == "copy_engine" and spec.topk
                                     else ": each tile notifies the channels of the rows it stored")))
    else:
        more, entry, rotations = remap_order(an, first, rule, opts.order, shift)
        insertions += more
        report.append(entry)
    return insertions, report, size_param, tuple(guards), rotations


def _program_axes(an: KernelAnalysis, sources: list[str]) -> set[int]:
    """The grid axes whose ``tl.program_id`` the source expressions read, directly or through the values assigned
    to the names they read."""
    axes: set[int] = set()
    seen: set[str] = set()
    todo = list(sources)
    reading = position_helpers(an.helpers)
    while todo:
        node = cst.parse_expression(todo.pop())
        # -1: an axis TileLink cannot read (`tl.program_id(AXIS)`, a helper that reads the position itself)
        axes |= {-1 if axis == ANY_AXIS else int(axis) for axis in position_reads(node, reading)}
        for name in names_in(node) - seen:
            seen.add(name)
            todo += an.values.get(name, ()) + an.updates.get(name, ())
    return axes


def split_steps(an: KernelAnalysis) -> tuple[tuple[str, int, int, str], ...]:
    """What the split-K loops' steps ask of the launch's grid (``ReduceScatterLaunch.split_steps``), as
    :func:`_check_step_blocks` read them while the stores were checked."""
    return tuple(sorted(set(an.__dict__.get("_split_steps", ()))))


def split_k_note(an: KernelAnalysis, found: tuple[list[int], str] | None, rule: str) -> list[ReportEntry]:
    """The report's note on a split-K write-back (:func:`split_k`'s axes and test), none without one."""
    if found is None:
        return []
    addressed, when = found
    on = f" on the launches where {when} (the others store)" if when else ""
    return [ReportEntry(an.name, rule, "note", f"split-K write-back (tl.atomic_add){on}: the partial sums start at "
                                               f"zero each call and each element is added once per program along "
                                               f"the grid axes other than {', '.join(map(str, addressed))}")]


def _sides_of(an: KernelAnalysis, at: Where) -> tuple[BranchSide, ...]:
    """The `if` sides around the statement at ``at`` (an access's, whose position may be inside its line), outermost
    first."""
    found = an.branch_sides.get(at)
    if found is None:
        found = next((v for w, v in an.branch_sides.items() if w.line == at.line), ())
    return found


def _stored_on_every_side(an: KernelAnalysis, spec, a) -> bool:
    """Whether the `if` the store ``a`` is in (its ``branch``) is decided at compile time and stores the tensor on
    each of its sides (`if SPLIT_K == 1: tl.store(...)` / `else: tl.atomic_add(...)`): every launch takes a storing
    side."""
    sides = _sides_of(an, a.where)
    stores = [x for t in spec.tensors for x in an.accesses_of(t, "store")]
    # under that `if` alone: one inside it under another `if` (`if EVEN_K: tl.store(...)`) may store nothing
    alone = [x for x in (_sides_of(an, st.where) for st in stores) if len(x) == 1
             and x[0].where == sides[0].where] if len(sides) == 1 else []
    return bool(alone) and sides[0].static and {x[0].body for x in alone} == {True, False}


def split_k(an: KernelAnalysis, spec) -> tuple[list[int], str] | None:
    """For a split-K write-back (``tl.atomic_add(c_ptrs, acc, mask=...)``: the programs along the split axis add
    into the same tile): the grid axes its address tells programs apart by, and the test in the constexpr
    parameters of the launches that add ("" for every launch). Every other axis of the grid holds the K splits:
    each element is added once per program along them, which the launcher counts from the grid (the product of the
    grid's other axes) for the channels' targets. A kernel that stores on some launches and adds on others chooses
    by a compile-time `if` (`if SPLIT_K == 1: tl.store(...)` / `else: tl.atomic_add(...)`, as triton.ops.matmul
    does): each launch writes one way, which the launcher tells from the test. ``None`` without an atomic_add."""
    stores = [a for t in spec.tensors for a in an.accesses_of(t, "store")]
    atomics = [a for a in stores if a.atomic]
    if not atomics:
        return None
    a = atomics[0]

    def refuse(acc, message: str, hint: str) -> AnnotationError:
        return AnnotationError(message, file=acc.where.file, line=acc.where.line, column=acc.where.column, hint=hint)

    plain = [s for s in stores if not s.atomic]
    when, chooser = "", None
    if plain:
        # a compile-time `if` with every plain store on one side and every add on the other
        def on(side: BranchSide, acc, body: bool) -> bool:  # the access is on that side (`body`) of `side`'s if
            return any(x.where == side.where and x.body == body for x in _sides_of(an, acc.where))

        chooser = next((side for side in _sides_of(an, a.where) if side.static
                        and all(on(side, acc, side.body) for acc in atomics)
                        and all(on(side, st, not side.body) for st in plain)), None)
        if chooser is None:
            raise refuse(plain[0], f"the kernel stores to {a.tensor!r} here and adds to it with tl.atomic_add at "
                                   f"line {a.where.line}: the channels count the adds of a split-K write-back, which "
                                   f"a plain store would not match",
                         "write every tile of the tensor one way: all with tl.atomic_add (split-K) or all with "
                         "tl.store, or choose between the two by a compile-time test (`if SPLIT_K == 1: tl.store("
                         "...)` / `else: tl.atomic_add(...)`, SPLIT_K a tl.constexpr parameter)")
        when = _launch_test(an, chooser)
    if getattr(spec, "index", None) or getattr(spec, "topk", None) or a.tile is None or a.tile.dynamic:
        raise refuse(a, f"the tl.atomic_add into {a.tensor!r} writes rows from an index: TileLink follows an "
                        f"atomic_add only as a split-K GEMM's write-back of whole tiles",
                     "store with tl.store (the reduce-scatter sums the ranks' partial results)")
    for acc in atomics:
        # the adds on the one side of the compile-time `if` that chooses them, under no other `if`: every program of
        # a launch that takes that side adds its tile (a launch that takes no adding or storing side would leave the
        # channels waiting)
        if acc.loop is not None or acc.swept or (acc.branch is not None and _sides_of(an, acc.where) != (
                (chooser,) if plain else ())):
            raise refuse(acc, f"the tl.atomic_add into {acc.tensor!r} is in a loop or a branch: the reduction counts "
                              f"one add per element from each program along the split axis, which it cannot tell "
                              f"here", "add each program's tile once, as a statement of the kernel's body after its "
                                      "K loop, or on one side of an `if` decided at compile time whose other side "
                                      "stores it (`if SPLIT_K == 1: tl.store(...)` / `else: tl.atomic_add(...)`)")
    addressed = [_program_axes(an, [acc.pointer]) for acc in atomics]
    if len({frozenset(x) for x in addressed}) > 1 or -1 in addressed[0] or not addressed[0]:
        raise refuse(a, f"the tl.atomic_add stores into {a.tensor!r} take their rows and columns from different "
                        f"grid axes, from none, or from an axis TileLink cannot read (`tl.program_id(AXIS)`, a helper "
                        f"that reads the program id itself)", "take every tile's address from the same "
                                                              "tl.program_id axes, with literal axes, in the kernel")
    read = _program_axes(an, [v for values in an.values.values() for v in values])
    if not read - addressed[0]:
        axes = ", ".join(str(x) for x in sorted(addressed[0])) or "none"
        raise refuse(a, f"the tl.atomic_add into {a.tensor!r} has no K split that TileLink can count: its address "
                        f"depends on every grid axis the kernel reads (axes {axes}), and the adds to an element are "
                        f"counted as the programs along the grid's other axes",
                     "take the split index from a grid axis of its own that the address does not use (`pid_k = "
                     "tl.program_id(1)`, grid (tiles, SPLIT_K)), or store with tl.store")
    # every program along the split axes must add its tile: one that skips it (a split with no K left) leaves its
    # channels short of the adds they count, and the consumers wait for them. The sums start at zero, so a split
    # with nothing to multiply adds its zero tile and the result is the same.
    every = ("let every program along the split axes reach the tl.atomic_add and add its tile (a split with no K "
             "left adds its zeros); skip only whole tiles, by the axes of their address")
    first = min(atomics, key=lambda acc: (acc.where.line, acc.where.column))
    for where, tests in an.returns:
        if (where.line, where.column) < (first.where.line, first.where.column) and (
                _program_axes(an, list(tests)) - set(addressed[0])):
            raise AnnotationError(
                f"the kernel returns here on a condition that reads its split index, before its tl.atomic_add into "
                f"{a.tensor!r} at line {first.where.line}: the channels count one add per element from every "
                f"program along the split axes, and would wait for the adds this one skips",
                file=where.file, line=where.line, column=where.column, hint=every)
    for acc in atomics:
        if acc.mask is not None and _program_axes(an, [acc.mask]) - set(addressed[0]):
            raise refuse(acc, f"the mask of the tl.atomic_add into {acc.tensor!r} reads the split index: the "
                              f"channels count one add per element from every program along the split axes, and "
                              f"would wait for the adds it skips", every)
    return sorted(addressed[0]), when


def rewrite(an: KernelAnalysis, spec: ReduceScatterSpec, options: Options) -> RewritePlan:
    """Plan the producer-side rewrite of ``an`` for ``spec``."""
    opts = options.resolved(**DEFAULTS)
    insertions, report, size_param, refused, rotations, first_rank = notify_stores(an, spec, opts)
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
    found = split_k(an, spec)
    check_sliced_reads(an, spec)
    report += split_k_note(an, found, RULE)
    launch = ReduceScatterLaunch(tensors=spec.tensors, dim=spec.dim, size_param=size_param, index=spec.index,
                                 topk=spec.topk, via=opts.via, mode=opts.mode, order=opts.order,
                                 comm_block=opts.comm_block, comm_sms=opts.comm_sms,
                                 channels_per_rank=opts.channels_per_rank,
                                 # a split-K write-back: the grid axes its address reads (the others are the splits)
                                 atomic_axes=None if found is None else tuple(found[0]),
                                 atomic_when="" if found is None else found[1], refused=refused,
                                 stored_tiles=stored_tiles(an, spec), sums_dtypes=sums_dtypes(an, spec),
                                 first_rank_only=first_rank, rotations=rotations, split_steps=split_steps(an),
                                 row_multiples=whole_steps(an))
    if opts.via == "sm" and opts.mode == "push" and spec.topk:
        raise AnnotationError("reduce_scatter with topk= reduces by pulling", file=an.file, line=an.where.line,
                              column=an.where.column, hint="drop mode='push' for the MoE reduction")
    if opts.via == "copy_engine":  # with top-k, the slots are summed before the copy engine moves them
        partners = ("rs_topk_reduce", "rs_reduce_received") if spec.topk else ("rs_reduce_received",)
    else:
        partners = ("rs_ring_consumer",) if opts.mode == "push" else ("rs_pull_consumer",)
    return RewritePlan(an.name, RULE, spec, opts, CHANNEL_PARAMS, tuple(insertions), partners, launch, tuple(report))
