"""Source snippets shared by the rules: the channel parameters and the tile-order remap.

Every inserted name starts with ``tlk_`` so that a reader can tell TileLink's code from theirs.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
import libcst.matchers as m

from tilelink.analysis import (
    Access,
    KernelAnalysis,
    Tile,
    Where,
    axes_meet,
    call_position,
    code,
    names_in,
    parse_offsets,
    position_helpers,
    position_reads,
)
from tilelink.plan import Insertion, ReportEntry

#: parameters added to every rewritten kernel: the channel (paper's BlockChannel), flattened.
CHANNEL_PARAMS = (
    "tlk_barriers",  # int64* : this rank's barrier words, one per channel
    "tlk_epoch",  # int   : calls made on this context so far (barrier targets scale with it)
    "tlk_rank",
    "tlk_world",
    "tlk_rows",  # size of the communicated dimension (M)
    "tlk_rows_per_rank",
    "tlk_rows_per_channel",
    "tlk_channels_per_rank",
    "tlk_diag",  # int64* : wait diagnostics (first timeout wins)
    "tlk_budget",  # int64 : wait budget in nanoseconds
)

MAPPING_ARGS = "tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank"


def constant_height(an: KernelAnalysis, tile: Tile) -> bool:
    """Whether the tile's height is a compile-time constant: a literal, a ``tl.constexpr`` parameter, or the
    block height of a descriptor made on the host (``a_desc.block_shape[0]``, part of the kernel's type)."""
    size = tile.size
    return size in an.constexpr_params or size.isdigit() or (
        size.endswith("]") and size.split(".block_shape[")[0] in an.params)


def _operand(expr: str, right: bool) -> str:
    """``expr`` as an operand of ``+``: as it is when it binds at least as tightly (a name, a call, a
    product; a sum on the left), else in parentheses (``BM // 2 if HALF else BM`` must not swallow the
    addition)."""
    node = cst.parse_expression(expr)
    tight = (cst.Name, cst.Integer, cst.Attribute, cst.Call, cst.Subscript)
    if isinstance(node, tight) or (isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, (cst.Multiply, cst.FloorDivide, cst.Modulo)
            + (() if right else (cst.Add, cst.Subtract)))):
        return expr
    return f"({expr})"


def plus(left: str, right: str) -> str:
    """``left + right`` in source, each side parenthesised only where it must be."""
    return f"{_operand(left, False)} + {_operand(right, True)}"


def tile_end(tile: Tile) -> str:
    """``start + size`` of the tile, in source."""
    return plus(tile.start, tile.size)


def tile_rows(tile: Tile) -> str:
    """``start + tl.arange(0, size)``: the tile's row indices, in source."""
    return f"{_operand(tile.start, False)} + tl.arange(0, {tile.size})"


def describe_rows(tile: Tile) -> str:
    """The rows a tile touches, as a report says them."""
    if tile.dynamic:
        return f"rows {tile.start}, from the index"
    return f"tile rows {tile.start} .. +{tile.size}"


def channels_of_tile(tile: Tile) -> str:
    """``tlk_first, tlk_count = ...`` for the channels holding the tile's rows."""
    return (f"tlk_first, tlk_count = tlm.tl_channels_of_rows(\n"
            f"    {tile.start}, {tile_end(tile)},\n    {MAPPING_ARGS})")


def channels_of_row_vector(rows: str) -> tuple[str, str]:
    """``tlk_src`` = the rows (a vector, from a run-time index) and ``tlk_channel`` = each row's channel,
    ``-1`` for rows outside ``[0, tlk_rows)`` (padding): the dynamic mapping's two lines."""
    return (f"tlk_src = {rows}",
            "tlk_channel = tl.where((tlk_src >= 0) & (tlk_src < tlk_rows), tlm.tl_channel_of_row(tlk_src, "
            "tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank), -1)")


def _pid_times_size(an, tile) -> bool:
    """Whether the tile's start is exactly ``pid * SIZE`` (either order) with SIZE its height, or the pid itself for a
    tile of one row."""
    import libcst as cst

    from tilelink.analysis import code, widened_value

    try:
        start, size = cst.parse_expression(tile.start), code(cst.parse_expression(tile.size))
    except cst.ParserSyntaxError:
        return False
    if isinstance(start, cst.Name) and start.value == tile.pid and size == "1":
        return True  # one row a program, the program's id itself (`row = tl.program_id(0)`): `row * 1`
    if isinstance(start, cst.Name):  # `row = pid * SIZE`, assigned once: the analysis followed it to find the pid
        values = an.values.get(start.value, ())
        if len(values) != 1:
            return False
        start = cst.parse_expression(values[0])
    if not (isinstance(start, cst.BinaryOperation) and isinstance(start.operator, cst.Multiply)):
        return False
    # `pid.to(tl.int64) * SIZE`: the cast keeps the pid's value
    return {code(widened_value(side) or side) for side in (start.left, start.right)} == {tile.pid, size}


def remap_order(an: KernelAnalysis, access: Access, rule: str, order: str,
                shift: str) -> tuple[list[Insertion], ReportEntry, tuple[tuple[str, str, str, str, int, bool], ...]]:
    """Rotate the tile index so that tiles are visited in ``order`` (paper §3.1, tile order).

    ``shift`` is the tile index, in source, that should come first. Applies to tiles of the form
    ``pid * SIZE`` whose ``pid`` variable is assigned in the kernel; otherwise says why not. Returns the insertions,
    the report's entry, and what each call checks of the rotation (``LaunchPlan.rotations``).
    """
    inserts, entry = _remap_order(an, access, rule, order, shift)
    tile = access.tile
    if not inserts or tile is None or tile.pid is None:
        return inserts, entry, ()
    if any("tl.num_programs(" in line for ins in inserts for line in ins.lines):
        return inserts, entry, ()  # the program id itself, rotated among the programs the grid launches
    # a value made from the program id (`pid // num_pid_n`, a grouped ordering): at each of the program's other
    # coordinates (`pid_n`, the other axes), the grid must give it every tile or none
    tiles = f"tl.cdiv({tile.size_param}, {tile.size})"
    chain, headers = _made_from(an, tile.pid), _loop_ranges(an)
    carriers = _other_coordinates(an, tile.pid)
    # the rotation stands on each call's check where a coordinate of the check, no exact pair of the index's, is all
    # that keeps it from reading the position apart from the index: a call whose grid the check cannot read is refused
    required = _program_id_bypass(an, tile.pid) is not None
    # every `%` / `//` the kernel computes apart from the index's own values
    computed = {_canonical(op) for text in [v for n, vs in an.values.items() if n not in chain for v in vs]
                + [text for text, _ in an.effects] + [a.pointer for a in an.accesses]
                for op in m.findall(cst.parse_expression(text), m.BinaryOperation(operator=m.Modulo()
                                                                                  | m.FloorDivide()))}
    facts = []

    for value, at in zip(an.values.get(tile.pid, ()), an.assignments.get(tile.pid, ()), strict=False):
        written = _written_element(an, tile.pid, value, at)
        count = an.written_out(tiles, at) if an.written_out is not None else None
        sides = [side for side in an.branch_sides.get(at, ()) if side.static]
        # the other coordinates' values a launch that compiles this binding may compile too (not those of the other
        # side of a compile-time `if` around it)
        others = [_written_element(an, n, v, w) for n in sorted(carriers)
                  for v, w in zip(an.values.get(n, ()), an.assignments.get(n, ()), strict=False)
                  if not any(o.where == side.where and o.body != side.body
                             for o in an.branch_sides.get(w, ()) for side in sides)]
        if written is None or count is None:
            # an index TileLink cannot write out (a helper's return, `pid_m, pid_n = swizzle(tl.program_id(0), ...)`)
            # cannot be checked at the call: rotated, a grid that does not cover every tile (a persistent loop on
            # fewer programs than its step) would compute other tiles than the kernel; its own order is kept
            return [], ReportEntry(
                an.name, rule, "not applied",
                f"order={order!r} not applied: {tile.pid} (line {at.line}) is computed in a way TileLink cannot write "
                f"out over program ids and the arguments, so no call could check that its grid gives every tile; "
                f"tiles keep the kernel's own order", access.where), ()
        # a coordinate it cannot write out is left out of the grouping: a grid that gives the index every tile or none
        # at each value of every coordinate does so at each value of fewer of them, so the coarser check refuses no
        # launch the full one passes, and still catches a grid short of whole tiles
        others = [o for o in others if o is not None]
        axes = position_reads(cst.parse_expression(written))
        # the mapping's other coordinate where no scalar holds it (`(pid % num_pid_n) * BLOCK_N + tl.arange(...)`
        # written into a vector or an address): the other of each of the index's paired `%` / `//`
        pairs = _mapping_pairs(an, tile.pid, chain, headers, axes)(at)
        for name in sorted(chain):
            for v, w in zip(an.values.get(name, ()), an.assignments.get(name, ()), strict=False):
                ops = m.findall(cst.parse_expression(v), m.BinaryOperation(operator=m.Modulo() | m.FloorDivide()))
                # the other of an exact pair, and the group's column beside a place taken from the position itself
                # (`(t % W) // gs` beside `t % gs` and the group `t // W`), where the kernel computes it: one it never
                # computes (`(pid + 1) // T` beside `pid_m = (pid + 1) % T`) is no coordinate of its tiles
                found = [_swapped(op) for op in ops if _canonical(op) in pairs] + [
                    cst.BinaryOperation(cst.BinaryOperation(op.left, cst.Modulo(), g.right), cst.FloorDivide(),
                                        op.right)
                    for op in ops if isinstance(op.operator, cst.Modulo) for g in ops
                    if isinstance(g.operator, cst.FloorDivide) and _canonical(g.left) == _canonical(op.left)
                    and _canonical(cst.BinaryOperation(cst.BinaryOperation(op.left, cst.Modulo(), g.right),
                                                       cst.Modulo(), op.right)) in pairs]
                for other in found:
                    if _canonical(other) not in computed:
                        continue
                    pair = an.written_out(code(other), w) if an.written_out is not None else None
                    if pair is not None:  # one it cannot write out is left out, as above
                        others.append(pair)
        others += [f"tl.program_id({axis})" for axis in ("0", "1", "2") if axis not in axes]
        test = " and ".join(f"({side.test})" if side.body else f"not ({side.test})" for side in sides)
        facts.append((written, count, " ; ".join(dict.fromkeys(others)), test, at.line, required))
    return inserts, entry, tuple(dict.fromkeys(facts))


def _written_element(an: KernelAnalysis, name: str, value: str, at) -> str | None:
    """``name``'s ``value`` bound at ``at`` written out over program ids and the arguments; the element the name
    takes where the statement unpacks a tuple (`pid_m, pid_n = _compute_pid(tile_id, ...)`, the helper's `return
    pid_m, pid_n` written out)."""
    found = an.written_out(value, at) if an.written_out is not None else None
    targets = an.unpacked.get(at)
    if found is None or targets is None:
        return found
    element = cst.parse_expression(found)
    if targets.count(name) != 1 or not isinstance(element, cst.Tuple) or len(element.elements) != len(targets):
        return None
    return code(element.elements[targets.index(name)].value)


def _other_coordinates(an: KernelAnalysis, pid: str) -> set[str]:
    """The program's other coordinates beside the rotated index ``pid``: scalars made from the position, not from
    ``pid`` nor from what ``pid`` is made from (`pid_n`; not `rn`, a vector of it, nor `b`, data loaded at it). The
    rotation's check at each call groups the grid by their values (:func:`remap_order`)."""
    chain, position = _made_from(an, pid), _positions(an)
    after = {pid}
    reads = {v: names_in(cst.parse_expression(v)) for vs in an.values.values() for v in vs}
    while more := {n for n in set(an.values) - after if any(reads[v] & after for v in an.values.get(n, ()))}:
        after |= more
    return {n for n in position - chain - after if not any(
        m.findall(cst.parse_expression(v), m.Call(func=m.Attribute(attr=m.Name("arange") | m.Name("load"))))
        for x in {n} | _depends_on(an, an.values.get(n, ())) for v in an.values.get(x, ())) and all(
        (w := _written_element(an, n, v, at)) is not None and _evaluable(w)
        for v, at in zip(an.values.get(n, ()), an.assignments.get(n, ()), strict=False))}


#: what each call's check evaluates (``tlxform.overlapped._evaluate``): ints and names, `+ - * // %`, a negation, and
#: Triton's integer functions of them
_EVALUATED_CALLS = {"program_id", "num_programs", "cdiv", "minimum", "maximum", "min", "max", "range"}


def _evaluable(source: str) -> bool:
    """Whether each call's check can evaluate ``source`` (a value written out over program ids and the arguments): a
    scalar of ints, names, ``+``, ``-``, ``*``, ``//``, ``%`` and ``tl.program_id`` / ``tl.cdiv`` / ``min`` and the
    like; not a tensor (``tl.zeros``), a comparison, ``&``, ``>>`` or ``tl.where``, which it cannot read."""
    import ast

    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name not in _EVALUATED_CALLS:
                return False
        elif isinstance(node, ast.BinOp):
            if not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)):
                return False
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub):
                return False
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                return False
        elif not isinstance(node, (ast.Expression, ast.Name, ast.Attribute, ast.keyword, ast.Load, ast.operator,
                                   ast.unaryop)):
            return False
    return True


def _positions(an: KernelAnalysis, reading: frozenset[str] | None = None) -> set[str]:
    """Every name whose value reads the program's position, directly or through other names; ``reading``: the helpers
    taken to read it themselves (default: the kernel's, :func:`position_helpers`)."""
    reading = position_helpers(an.helpers) if reading is None else reading
    headers = _loop_ranges(an)
    read: dict[str, tuple[bool, set[str]]] = {}  # each value's text: (reads the position itself, names it reads)
    for text in {v for n in set(an.values) | set(headers) for v in an.values.get(n, ()) + headers.get(n, ())}:
        node = cst.parse_expression(text)
        read[text] = (bool(position_reads(node, reading)), names_in(node))
    position: set[str] = set()
    while more := {n for n in (set(an.values) | set(headers)) - position if any(
            read[v][0] or read[v][1] & position for v in an.values.get(n, ()) + headers.get(n, ()))}:
        position |= more
    return position


def _checked_coordinates(an: KernelAnalysis, tile) -> frozenset[str]:
    """The other coordinates (:func:`_other_coordinates`) that each call's check of the rotation writes out and groups
    the grid by: every value of each of them, and every value of the rotated index and its tile count, can be
    written at the launch (none where one of those cannot); each reads the position only inside `%` and `//` (a part
    of it, as a column of tiles is); and the index neither holds the position whole nor any of their `%` / `//`.
    Such a coordinate need not be the exact other half of a `%` / `//` that the index holds (triton.ops' grouped
    ordering takes `pid % group_size` for the row and `(pid % width) // group_size` for the column): wherever it
    does not partner the index one tile each, the check finds a coordinate at which the index misses a tile, and
    refuses the call. One that holds the position whole (`blk = tl.program_id(0)`, `row = tl.program_id(0) << 3`)
    is the program's own tile, which the check would refuse on every grid of more than one tile: the rotation is not
    applied there (:func:`_program_id_bypass`)."""
    if an.written_out is None or tile.size_param is None:
        return frozenset()
    pid, tiles = tile.pid, f"tl.cdiv({tile.size_param}, {tile.size})"
    for value, at in zip(an.values.get(pid, ()), an.assignments.get(pid, ()), strict=False):
        if an.written_out(value, at) is None or an.written_out(tiles, at) is None:
            return frozenset()
    position, reading, chain, headers = _positions(an), position_helpers(an.helpers), _made_from(an, pid), \
        _loop_ranges(an)
    axes = {"0", "1", "2"}

    def split(node: cst.BaseExpression) -> bool:  # a part of the position (`x // 1` is all of it)
        return m.matches(node, m.BinaryOperation(operator=m.Modulo() | m.FloorDivide())) and not m.matches(
            node, m.BinaryOperation(operator=m.FloorDivide(), right=m.Integer("1")))

    # the index must hold a part of the position too: one that holds it whole (`pid_m = pid`, on any side of a
    # branch) leaves no other coordinate; nor may it hold a coordinate's own `%` / `//`, nor read a name bound twice
    chain_values = {n: [cst.parse_expression(v) for v in an.values.get(n, ()) + headers.get(n, ())] for n in chain}
    whole: set[str] = set()
    while more := {n for n, nodes in chain_values.items() if n not in whole and any(
            _reads_position(e, axes, whole, split, reading) for e in nodes)}:
        whole |= more
    if pid in whole:
        return frozenset()
    held = {_canonical(op) for nodes in chain_values.values() for e in nodes for op in m.findall(e, m.BinaryOperation(
        operator=m.Modulo() | m.FloorDivide()))}

    def other(name: str) -> bool:
        values, wheres = an.values.get(name, ()), an.assignments.get(name, ())
        if len(values) != len(wheres):
            return False
        for value in values:
            node = cst.parse_expression(value)
            ops = m.findall(node, m.BinaryOperation(operator=m.Modulo() | m.FloorDivide()))
            # (each value is written out and evaluable: `_other_coordinates` keeps no other)
            if _reads_position(node, axes, position, split, reading) or any(
                    _canonical(op) in held or any(len(an.bindings.get(x, ())) > 1 for x in names_in(op) - {"tl"})
                    for op in ops):
                return False
        return True

    return frozenset(n for n in _other_coordinates(an, pid) if other(n))


def _remap_order(an: KernelAnalysis, access: Access, rule: str, order: str,
                 shift: str) -> tuple[list[Insertion], ReportEntry]:
    tile = access.tile
    assert tile is not None
    if order == "mesh":
        return [], ReportEntry(an.name, rule, "note", "order='mesh': tiles keep the kernel's own order")
    if tile.pid is None or tile.size_param is None:
        why = ("the tile start is not `pid * SIZE` with an assigned pid variable" if tile.pid is None
               else "the size of the dimension is unknown (pass size=...)")
        return [], ReportEntry(an.name, rule, "not applied",
                               f"order={order!r} not applied: {why}; tiles keep the kernel's own order",
                               access.where)
    if not _pid_times_size(an, tile):
        # `pid * STEP` with STEP not the tile height: the rotation counts cdiv(size, height) tiles, which would
        # send pid past the grid (or skip tiles)
        return [], ReportEntry(an.name, rule, "not applied",
                               f"order={order!r} not applied: the tile start {tile.start} does not step by the tile "
                               f"height {tile.size}; tiles keep the kernel's own order", access.where)
    assigned = an.assignments.get(tile.pid, ())
    lines = ", ".join(str(w.line) for w in assigned)
    if tile.pid in an.rebound or tile.pid in _depends_on(an, an.values.get(tile.pid, ())):
        # a pid variable computed afresh each time (a persistent kernel recomputing pid_m for its
        # epilogue, a second loop over the last wave's tiles) is rotated after every assignment; one that
        # is also updated from itself (directly, through another variable, by `+=` or as a `for` target)
        # cannot be: its rotated value would be rotated again, and tiles would be stored at other tiles' rows
        return [], ReportEntry(an.name, rule, "not applied",
                               f"order={order!r} not applied: {tile.pid} (assigned at line(s) {lines}) is also "
                               f"updated from its own value; tiles keep the kernel's own order", access.where)
    # every access whose tile start reads the pid must be a `pid * SIZE` tile of the same size: one rotation
    # of `cdiv(size_param, SIZE)` tiles cannot serve tiles of another height or another form
    uses = [a for a in an.accesses if a.tile is not None and not a.tile.dynamic
            and tile.pid in _depends_on(an, (a.tile.start,))]
    forms = {(a.tile.pid, a.tile.size, a.tile.size_param) for a in uses}
    if len(forms) > 1:
        where = ", ".join(sorted({f"line {a.where.line}: rows {a.tile.start} .. +{a.tile.size}" for a in uses}))
        return [], ReportEntry(an.name, rule, "not applied",
                               f"order={order!r} not applied: {tile.pid} indexes tiles of different sizes or forms "
                               f"({where}); tiles keep the kernel's own order", access.where)
    bypass = _program_id_bypass(an, tile.pid, _checked_coordinates(an, tile))
    if bypass is not None:
        unread = _unread_helpers(an, tile.pid)
        said = (f" ({tile.pid} is unpacked from {', '.join(f'`{h}`' for h in unread)}, which TileLink cannot read: it "
                f"reads the `@triton.jit` helpers of the kernel's own file, and those the file imports by name from a "
                f"module it finds on the import path, so it cannot tell that the values unpacked with {tile.pid} are "
                f"the mapping's other coordinate; define the helper in the kernel's file)") if unread else ""
        return [], ReportEntry(an.name, rule, "not applied",
                               f"order={order!r} not applied: {bypass}, not through {tile.pid}: the rotation of "
                               f"{tile.pid} would move the tile's rows but not that; tiles keep the kernel's own "
                               f"order{said}", access.where)
    # the rotation goes after the line that binds the index: a statement after the binding on that line (`row =
    # tl.program_id(0); y_ptrs = y_ptr + row`) would read the index before it is rotated, the rest after
    joined = next((w for w in assigned for other in [
        *(b for name, binds in an.bindings.items() if name != tile.pid for b, _ in binds),
        *(a.where for a in an.accesses)] if other.line == w.line and other.column > w.column), None)
    if joined is not None:
        return [], ReportEntry(an.name, rule, "not applied",
                               f"order={order!r} not applied: {tile.pid} is bound at line {joined.line} before other "
                               f"statements of that line, which the rotation, inserted after the line, would not "
                               f"reach; tiles keep the kernel's own order (write them on lines of their own)",
                               access.where)
    before = [w for w in assigned if w.line <= tile.defined_at.line]
    if not before:
        return [], ReportEntry(an.name, rule, "not applied",
                               f"order={order!r} not applied: no assignment of {tile.pid} before its use",
                               access.where)
    args = [tile.pid, tile.size_param if tile.size == "1" else f"tl.cdiv({tile.size_param}, {tile.size})", shift]
    values = an.values.get(tile.pid, ())
    axes = position_reads(cst.parse_expression(values[0])) if len(values) == 1 else set()
    if len(axes) == 1 and m.matches(cst.parse_expression(values[0]), m.Call(func=m.Attribute(
            value=m.Name("tl"), attr=m.Name("program_id")))):
        # the program id itself: a grid shorter than the tiles rotates among the programs it launches, so that it
        # computes the tiles the kernel as written computes (the programs themselves where they count the tiles)
        programs = f"tl.num_programs({axes.pop()})"
        args[1] = programs if args[1] == programs else f"tl.minimum({args[1]}, {programs})"
    joined = ", ".join(args)
    line = f"{tile.pid} = tlm.tl_remap_tile(\n    " + (
        joined if len(joined) < 100 else f"{args[0]}, {args[1]},\n    {args[2]}") + ")"
    inserts = [Insertion(w, "after", (f"# tilelink: visit tiles in {order} order ({rule})", line)) for w in assigned]
    return inserts, ReportEntry(an.name, rule, "applied",
                                f"tile order {order}: {tile.pid} rotated after line{'s' if len(assigned) > 1 else ''} "
                                f"{lines}", assigned[0])


def _program_id_bypass(an: KernelAnalysis, pid: str, checked: frozenset[str] = frozenset()) -> str | None:
    """What reads the program's position other than through ``pid`` (the variable the rotation rotates), said for
    the report; ``None`` when nothing does. The rotation gives a program another tile: a row index, an offsets
    vector's start or an address computed from ``tl.program_id`` itself, or from any variable made from it other
    than ``pid`` (``o = tl.program_id(0) * BLOCK + ...``; ``blk = tl.program_id(0)`` then ``blk * BLOCK``; ``row =
    tl.program_id(0) << 4``; ``tl.store(out_ptr + pid, ...)`` with ``pid_m = pid``; through any number of copies),
    would still name the program's own tile, and the program would write one tile's values at another's rows.

    Every variable whose value reads the program id of the rotated axis, directly or through other variables, is
    such a position, with two exceptions, the tile mapping's other coordinate, which pairs with the rotated ``pid``
    as before, one tile each: a value that reads the position only inside ``a % b`` or ``a // b`` where the values
    ``pid`` is made from hold the other of the two (``pid_n = pid % num_pid_n`` beside ``pid_m = pid // num_pid_n``;
    ``pid_n = (pid % num_pid_in_group) // group_size_m`` of a grouped ordering), a variable unpacked with ``pid``
    from the same call of a helper (``pid_m, pid_n = tile_coordinates(tl.program_id(0), ...)``), and a coordinate of
    ``checked``, which each call's check of the rotation groups the grid by (:func:`_checked_coordinates`)."""
    chain = _made_from(an, pid)
    headers = _loop_ranges(an)
    reading = position_helpers(an.helpers)  # helpers that read the position themselves: any axis
    axes = {axis for name in chain for v in an.values.get(name, ()) + headers.get(name, ())
            for axis in position_reads(cst.parse_expression(v), reading)}
    if not axes:
        return None
    pairs_at = _mapping_pairs(an, pid, chain, headers, axes)
    siblings = _unpacked_with(an, pid)
    # to a fixed point: a chain of copies is as long as the kernel makes it (`r0 = tl.program_id(0) * B; r1 = r0`)
    ids: set[str] = set()
    while True:
        more = set()
        for name in set(an.values) | set(headers):
            if name == pid or name in ids or name in siblings or name in checked:
                continue
            values = an.values.get(name, ()) + headers.get(name, ())
            if name in chain:  # what pid is made from: a position wherever else it is read (`pid` of `pid_m = pid`)
                if any(_reads_position(cst.parse_expression(v), axes, ids, None, reading) for v in values):
                    more.add(name)
                continue
            # each value where it is bound (a loop's range: anywhere), with the pairs of the values of pid it may see
            wheres = an.assignments.get(name, ())
            at = [wheres[i] if len(wheres) == len(an.values.get(name, ())) and i < len(wheres) else None
                  for i in range(len(values))]
            if any(_reads_position(cst.parse_expression(v), axes, ids, _paired(pairs_at(w)), reading)
                   for v, w in zip(values, at, strict=True)):
                more.add(name)
        if not more:
            break
        ids |= more
    for name, values in an.values.items():
        if name in chain:
            continue
        for v in values:
            parsed = parse_offsets(cst.parse_expression(v))
            start = cst.parse_expression(parsed[0]) if parsed is not None else None
            if start is not None and (axes_meet(position_reads(start, reading), axes) or names_in(start) & ids):
                return f"the offsets `{name} = {v}` start from the program id"
    for text, where in an.effects:
        node = cst.parse_expression(text)
        if isinstance(node, cst.NamedExpr) and names_in(node.target) & chain:
            continue  # a loop over the rotated variable's tiles (`for tile_id in tl.range(start_pid, ...)`)
        if axes_meet(position_reads(node, reading), axes) or names_in(node) & ids:
            return f"line {where.line} reads the program id (`{text}`)"
    # a value other values read, or a call's (`old = tl.atomic_add(count_ptr + blk, 1)`); a copy nothing reads
    # (`blk = tl.program_id(0)` left unused) moves nothing
    read = {n for vs in an.values.values() for v in vs for n in names_in(cst.parse_expression(v))}
    for name, values in an.values.items():
        if name in ids and name not in chain and (name in read or any(
                m.findall(cst.parse_expression(v), m.Call(func=~m.Attribute(attr=m.Name("program_id"))))
                for v in values)):
            return f"`{name} = {values[0]}` reads the program id"
    return None


def _mapping_pairs(an: KernelAnalysis, pid: str, chain: set[str], headers: dict[str, tuple[str, ...]],
                   axes: set[str]) -> Callable[[Where | None], set[str]]:
    """The ``a % b`` / ``a // b`` operations of the values ``pid`` is made from whose other (``a // b`` / ``a % b``) is
    the tile mapping's other coordinate: the part of the position ``pid`` does not hold. Compared by their nodes, so
    ``pid`` must hold none of that part: ``pid`` reads the position only inside ``%`` / ``//`` (a value that reads it
    whole, ``pid_m = pid + (pid // 2) * 0``, holds every part), the other itself is not one of its values (``pid_m =
    pid // 2 * 2 + pid % 2`` holds ``pid % 2``), every read of the position in its values lies inside the operation or
    inside ``r // c`` where ``a`` is ``r % c`` (the group of a grouped ordering; ``pid // 1`` beside ``pid // 2``
    holds ``pid % 2``), and each name in the operation holds one value, bound at most once (``w = 1; pid_m = p // w;
    w = 2; col = p % w`` prints alike but divides by another).

    Returned as the pairs a value bound at a position may read: a pair must hold for every value of ``pid`` that
    value may see (``if C: pid_m = pid`` / ``else: pid_m = pid // 2``, then ``col = pid % 2``: the first holds the
    parity too, so no pair), and one value of ``pid`` is the only one a position sees when it is bound in a block that
    holds the position, before it, and ``pid`` is bound nowhere else from there to the block's end (a persistent
    kernel's second loop, ``pid_m, pid_n = tile_coordinates(num_tiles - tail + piece // SPLIT, ...)``, holds another
    part than its first). A position not known (a loop's range) sees every value."""
    found: list[tuple[Where | None, set[str]]] = []
    values = an.values.get(pid, ())
    wheres = an.assignments.get(pid, ()) if len(an.assignments.get(pid, ())) == len(values) else ()
    for i, value in enumerate(values + headers.get(pid, ())):
        made, todo = {}, [(pid, (value,))]
        while todo:
            name, vs = todo.pop()
            made[name] = vs
            for v in vs:
                for read in names_in(cst.parse_expression(v)) & chain - set(made):
                    todo.append((read, an.values.get(read, ()) + headers.get(read, ())))
        found.append((wheres[i] if i < len(wheres) else None, _value_pairs(an.bindings, pid, made, axes)))
    common = set.intersection(*(pairs for _, pairs in found)) if found else set()
    bound = [(b.line, b.column) for b, _ in an.bindings.get(pid, ())]

    def pairs_at(where: Where | None) -> set[str]:
        if where is None:
            return common
        here = (where.line, where.column)
        for w, pairs in found:
            block = an.blocks.get(w) if w is not None else None
            if block is None:
                continue
            mine, end = (w.line, w.column), (block[1].line, block[1].column)
            if (block[0].line, block[0].column) <= here <= end and mine < here and not any(
                    b != mine and mine < b <= end for b in bound):
                return pairs
        return common

    return pairs_at


def _value_pairs(bindings: dict[str, tuple], pid: str, values: dict[str, tuple[str, ...]], axes: set[str]) -> set[str]:
    """:func:`_mapping_pairs` for one value of ``pid``, ``values`` the values of the names it is made from, ``bindings``
    where each name is bound."""
    parsed = {name: [cst.parse_expression(v) for v in vs] for name, vs in values.items()}
    split = m.BinaryOperation(operator=m.Modulo() | m.FloorDivide())

    # the names holding the position whole: a read of it outside any `%` / `//`, to a fixed point
    carriers: set[str] = set()
    while True:
        more = {name for name, nodes in parsed.items() if name not in carriers and any(
            _reads_position(n, axes, carriers, lambda e: m.matches(e, split)) for n in nodes)}
        if not more:
            break
        carriers |= more
    if pid in carriers:
        return set()
    made = [n for name, nodes in parsed.items() if name not in carriers for n in nodes]
    ops = [op for n in made for op in m.findall(n, split)]
    held = {_canonical(op) for op in ops}
    pairs: set[str] = set()
    for op in ops:
        if not all(len(bindings.get(n, ())) <= 1 for n in names_in(op) - {"tl"}):
            continue
        if _canonical(_swapped(op)) in held:
            continue
        mine = _canonical(op)
        numerator = _canonical(op.left)

        def inside(e: cst.BaseExpression, mine=mine, numerator=numerator) -> bool:
            if not m.matches(e, split):
                return False
            if _canonical(e) == mine:
                return True
            # `r // c` beside a numerator `r % c`: the group, which holds none of the group's inner part
            return isinstance(e.operator, cst.FloorDivide) and _canonical(_swapped(e)) == numerator

        if not any(_reads_position(n, axes, carriers, inside) for n in made):
            pairs.add(mine)
            continue
        if not isinstance(op.operator, cst.Modulo):
            continue
        # the group's place taken from the position itself (`t % gs` beside the group `t // W`, as triton.ops and
        # Triton's persistent tutorial write it) rather than from the place in the group (`(t % W) % gs`): the
        # column `(t % W) // gs` is its other all the same, as the group, `t % gs` and `(t % W) // gs` give `t` back
        # (`t % gs` is the place in the group shifted by the group's first `t`, within the group); `t // gs`, the
        # exact other of `t % gs`, is not, as it is no column of the group
        groups = [e for n in made for e in m.findall(n, m.BinaryOperation(operator=m.FloorDivide()))
                  if _canonical(e.left) == numerator and _canonical(e) != _canonical(_swapped(op))]

        def grouped(e: cst.BaseExpression, mine=mine, groups=groups) -> bool:
            return m.matches(e, split) and (_canonical(e) == mine or any(_canonical(e) == _canonical(g)
                                                                         for g in groups))

        if groups and not any(_reads_position(n, axes, carriers, grouped) for n in made):
            pairs |= {_canonical(cst.BinaryOperation(cst.BinaryOperation(op.left, cst.Modulo(), g.right), cst.Modulo(),
                                                     op.right)) for g in groups}
    return pairs


def _loop_ranges(an: KernelAnalysis) -> dict[str, tuple[str, ...]]:
    """Each ``for`` target -> the ranges it loops over, in source: what its values are made from."""
    ranges: dict[str, tuple[str, ...]] = {}
    for text, _ in an.effects:
        node = cst.parse_expression(text)
        if isinstance(node, cst.NamedExpr) and isinstance(node.target, cst.Name):
            ranges[node.target.value] = ranges.get(node.target.value, ()) + (code(node.value),)
    return ranges


def _made_from(an: KernelAnalysis, pid: str) -> set[str]:
    """``pid`` and every variable its values read, directly or in turn, loop targets' ranges included (a
    persistent kernel's ``tile_id`` is made from ``start_pid = tl.program_id(0)``)."""
    headers = _loop_ranges(an)
    chain, todo = {pid}, [pid]
    while todo:
        name = todo.pop()
        for v in an.values.get(name, ()) + headers.get(name, ()):
            for read in names_in(cst.parse_expression(v)) - chain:
                chain.add(read)
                todo.append(read)
    return chain


def _unpacked_with(an: KernelAnalysis, pid: str) -> set[str]:
    """The variables every assignment of ``pid`` also assigns, from a call of a helper (``pid_m, pid_n =
    tile_coordinates(...)``): the other coordinates of the same mapping. A tuple of values (``pid, blk =
    tl.program_id(0), tl.program_id(0)``) is not one: each side may repeat the position."""
    where, values = an.assignments.get(pid, ()), an.values.get(pid, ())
    if not where or len(where) != len(values) or not all(
            m.matches(cst.parse_expression(v), m.Call(func=m.Name())) for v in values):
        return set()
    siblings = {name for name in an.values if name != pid and an.assignments.get(name, ()) == where
                and an.values[name] == values}
    return {name for name in siblings if all(_helper_pairs(an, pid, name, v) for v in values)}


def _unread_helpers(an: KernelAnalysis, pid: str) -> list[str]:
    """The helpers ``pid`` is unpacked from (``pid_m, pid_n = tile_of(...)``) whose source TileLink has not read."""
    calls = [cst.parse_expression(v) for w, v in zip(an.assignments.get(pid, ()), an.values.get(pid, ()), strict=False)
             if w in an.unpacked]
    return sorted({c.func.value for c in calls if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
                   and c.func.value not in an.helpers})


def _helper_pairs(an: KernelAnalysis, pid: str, other: str, value: str) -> bool:
    """The helper of the kernel's file that ``value`` calls returns ``pid`` and ``other`` as a tile mapping's two
    coordinates: each returned value written out through the helper's locals bound once, the parameters given the
    position (an argument reading ``tl.program_id`` or a variable made from it) read by ``other`` only inside a ``%``
    / ``//`` that pairs with one ``pid``'s value holds, as :func:`_mapping_pairs` reads a kernel's own pair (``return
    p, p % 2`` is refused: the first holds the parity too). The helper is read from the kernel's file, or from the
    module's file it is imported from by name (``KernelAnalysis.helpers``); one TileLink cannot read is no pair."""
    call = cst.parse_expression(value)
    source = an.helpers.get(call.func.value)
    if source is None:
        return False
    fn = cst.parse_module(source).body[0]
    targets = next((an.unpacked[w] for w, v in zip(an.assignments.get(pid, ()), an.values.get(pid, ()), strict=False)
                    if v == value and w in an.unpacked), None)
    last = fn.body.body[-1] if fn.body.body else None
    ret = last.body[0] if isinstance(last, cst.SimpleStatementLine) and last.body else None
    # the pair is read from the helper's one return, its last statement: another return before it (`if W == 2:
    # return p, p % W`) may be the one a launch takes
    if targets is None or not isinstance(ret, cst.Return) or len(m.findall(fn.body, m.Return())) != 1 or not isinstance(
            ret.value, cst.Tuple) or len(ret.value.elements) != len(targets):
        return False
    params = [p.name.value for p in fn.params.params]
    args = [a.value for a in call.args]
    if any(a.keyword is not None or a.star for a in call.args) or len(args) > len(params):
        return False
    # the kernel's names that read a program id (any axis), directly or in turn, a loop's target through its range
    carriers = _positions(an, frozenset())
    position = {p for p, a in zip(params, args, strict=False) if position_reads(a) or names_in(a) & carriers}
    locals_: dict[str, list[cst.BaseExpression]] = {}
    counts: dict[str, int] = {}
    for node in m.findall(fn.body, m.Assign() | m.AugAssign() | m.AnnAssign() | m.NamedExpr() | m.For()):
        bound = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        for name in set().union(*(names_in(t) for t in bound)):
            counts[name] = counts.get(name, 0) + 1
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            locals_.setdefault(node.targets[0].target.value, []).append(node.value)

    class _Expand(cst.CSTTransformer):
        def __init__(self) -> None:
            self.depth = 0

        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            if counts.get(updated.value) == 1 and len(locals_.get(updated.value, ())) == 1 and self.depth < 8:
                self.depth += 1
                inner = locals_[updated.value][0].visit(self)
                self.depth -= 1
                return inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return updated

    def expand(node: cst.BaseExpression) -> cst.BaseExpression:
        return node.visit(_Expand())

    mine, theirs = (expand(ret.value.elements[targets.index(n)].value) for n in (pid, other))
    if any(counts.get(p) for p in position) or names_in(mine) & set(counts) or names_in(theirs) & set(counts):
        return False  # a position parameter bound again, or a local bound more than once: not read here
    # the position parameters as program ids of one axis, the other parameters bound never
    values = {"__pid__": (code(mine),)} | {p: ("tl.program_id(0)",) for p in position}
    pairs = _value_pairs({}, "__pid__", values, {"0"})
    return not _reads_position(theirs, {"0"}, set(position), _paired(pairs))


def _canonical(node: cst.BaseExpression) -> str:
    """``node`` in a form that ignores its parentheses and spacing, for comparing two expressions."""
    if isinstance(node, cst.BinaryOperation):
        return f"({_canonical(node.left)} {type(node.operator).__name__} {_canonical(node.right)})"
    if isinstance(node, cst.UnaryOperation):
        return f"({type(node.operator).__name__} {_canonical(node.expression)})"
    return "".join(code(node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node).split())


def _swapped(op: cst.BinaryOperation) -> cst.BinaryOperation:
    """``a % b`` as ``a // b`` and the reverse: the other coordinate of a tile mapping's pair."""
    return op.with_changes(operator=cst.FloorDivide() if isinstance(op.operator, cst.Modulo) else cst.Modulo())


def _paired(pairs: set[str]) -> Callable[[cst.BaseExpression], bool]:
    """The ``a % b`` / ``a // b`` nodes whose other (``a // b`` / ``a % b``) is one of ``pairs`` (the operations of the
    rotated variable's values): the mapping's other coordinate, not the position."""
    def paired(node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, (cst.Modulo, cst.FloorDivide)) and _canonical(_swapped(node)) in pairs
    return paired


def _reads_position(node: cst.CSTNode, axes: set[str], ids: set[str],
                    skip: Callable[[cst.BaseExpression], bool] | None = None,
                    reading: frozenset[str] = frozenset()) -> bool:
    """``node`` reads ``tl.program_id`` of one of ``axes`` or a variable of ``ids``, outside the nodes ``skip`` holds
    (:func:`_paired`: a mapping's other coordinate; :func:`_value_pairs`: the inside of a ``%`` / ``//``)."""
    if skip is not None and isinstance(node, cst.BaseExpression) and skip(node):
        return False
    if isinstance(node, cst.Call) and (axis := call_position(node, reading)) is not None:
        return axes_meet({axis}, axes) or any(_reads_position(a, axes, ids, skip, reading) for a in node.args)
    if isinstance(node, cst.Name):
        return node.value in ids
    if isinstance(node, (cst.Attribute, cst.Arg)):
        # not the attribute's name, nor the keyword of `mask=`
        return _reads_position(node.value, axes, ids, skip, reading)
    return any(_reads_position(child, axes, ids, skip, reading) for child in node.children)


def _depends_on(an: KernelAnalysis, values: tuple[str, ...]) -> set[str]:
    """Every kernel variable the source expressions ``values`` read, directly or through the values
    assigned to the variables they read."""
    seen: set[str] = set()
    todo = [n for v in values for n in names_in(cst.parse_expression(v))]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [n for v in an.values.get(name, ()) for n in names_in(cst.parse_expression(v))]
    return seen
