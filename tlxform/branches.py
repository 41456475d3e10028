"""Branches that bind the same values: an ``if`` read as the one binding both of its sides make.

Kernels over large tensors often write their index arithmetic twice, once in 64-bit ints and once in 32-bit, and
pick one with a ``tl.constexpr`` (unsloth's ``LONG_INDEXING``)::

    if LONG_INDEXING:
        offsets = block_idx.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE).to(tl.int64)
        n_elements = tl.cast(n_elements, tl.int64)
    else:
        offsets = block_idx * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)

Both sides bind ``offsets`` to the same values: a cast to a 64-bit int keeps an int's value, as the analysis reads
such a cast everywhere (:func:`tilelink.analysis.widened_value`), and ``n_elements = tl.cast(n_elements, tl.int64)``
leaves ``n_elements`` as it was. :func:`alike_branches` finds such ``if`` statements in a kernel and gives the
analysis a module in which each is replaced by its 64-bit side (the one with the more casts, a name cast to itself
left out), on that side's lines (each other line of the ``if`` becomes a ``pass``): the rows the inserted code
computes from it are then as wide as the kernel's where they must be, and every line and column outside the ``if``
stays where it was, so the plan's insertions anchor in the module the user wrote, which is what is rewritten and
emitted (the kernel keeps both sides). The analysis then reads one binding where it read two and refused.

An ``if`` is read so only where nothing of it can differ between its sides:

- its test has no call (a test that loads or calls would be an access the analysis no longer sees);
- each side is plain statements (no nested block), and the two are the same code once every cast to a 64-bit int
  of an int value is dropped and a name bound to itself is left out (``if LONG: n = tl.cast(n, tl.int64)`` with no
  ``else`` is an ``if`` of nothing), the ``if`` having a line for each statement of the side read;
- a dropped cast is of an int value the analysis can see to be one: a program id, an ``arange``, an int literal, a
  ``range`` loop's index, a parameter, ``tl.cdiv`` of those, or arithmetic of those (a loaded
  value or an accumulator cast to ``int64`` truncates a float: that ``if`` is left as it is). A parameter taken so
  goes into the launch plan's ``int_params``: each call with peers refuses a float passed there, naming the ``if``;
- each side is assignments and expressions, one a line (no ``return``, ``break`` or ``continue``, no ``;``), and
  the two compare equal as syntax (``ast``), the dropped casts' operands kept whole: ``tl.cast(pid + 1, tl.int64) * B``
  is ``(pid + 1) * B``.

The side read stands on the last lines of the ``if``: code the rewrite inserts before one of its statements goes
before the ``if``, after one of them after the ``if`` (a tile index bound on both sides, which the tile order rotates
where it is bound), where it reads and binds nothing the statements it moves past bind or read. Code that cannot
move so would be on one side only: the build is refused, naming the ``if`` (:func:`anchored_outside`).
"""

from __future__ import annotations

import ast
import dataclasses
import textwrap
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from tilelink.analysis import code, find_kernel, is_constexpr, param_names, widened_value

__all__ = ["AlikeBranches", "alike_branches", "anchored_outside"]


@dataclass(frozen=True)
class Region:
    """An ``if`` read as one binding: its lines and its test, in the user's module."""

    first: int
    last: int
    column: int  # 1-based, as Where's
    test: str
    #: the lines of the side the analysis reads, at the end of the ``if``'s lines (the last ends it), and their code
    read: tuple[int, ...] = ()
    code: tuple[str, ...] = ()
    #: the parameters a dropped cast took as ints (the launch plan's ``int_params``)
    ints: tuple[str, ...] = ()


@dataclass(frozen=True)
class AlikeBranches:
    """The module the analysis reads (``module`` itself where the kernel has no such ``if``) and the ``if``
    statements it reads as one binding."""

    module: cst.Module
    regions: tuple[Region, ...]


_INT_CALLS = ("program_id", "num_programs", "arange", "cdiv")
_ARANGE_CALL = m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("arange")))
#: the calls of those that give a scalar
SCALAR_CALLS = ("program_id", "num_programs", "cdiv")


def int_sources(fn: cst.FunctionDef, calls: tuple[str, ...] = _INT_CALLS) -> set[str]:
    """The kernel's names whose every binding is an int the analysis can see to be one (:func:`is_int`, with the
    ``tl`` functions ``calls``): its parameters, ``range`` loop indices, and names assigned only such values. With
    :data:`SCALAR_CALLS`, the scalar ones (no ``arange``)."""
    params = set(param_names(fn))
    values: dict[str, list[cst.BaseExpression | None]] = {}
    for node in m.findall(fn.body, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For() | m.NamedExpr()):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                if isinstance(t.target, cst.Name):
                    values.setdefault(t.target.value, []).append(node.value)
                else:  # a tuple target: its values are not read here
                    for name in m.findall(t.target, m.Name()):
                        values.setdefault(name.value, []).append(None)
        elif isinstance(node, cst.For):
            is_range = m.matches(node.iter, m.Call(func=m.Name("range") | m.Attribute(value=m.Name("tl"),
                                                                                       attr=m.Name("range"))))
            for name in m.findall(node.target, m.Name()):
                values.setdefault(name.value, []).append(cst.Integer("0") if is_range else None)
        elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
            values.setdefault(node.target.value, []).append(
                node.value if isinstance(node.operator, (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign,
                                                         cst.FloorDivideAssign, cst.ModuloAssign)) else None)
        else:
            target = node.target
            if isinstance(target, cst.Name):
                values.setdefault(target.value, []).append(getattr(node, "value", None))
    # a parameter is taken as an int, which each call with peers checks where a dropped cast relies on it
    # (`Region.ints`, the launch plan's `int_params`)
    known = set(params) - set(values)  # one bound again is read through its bindings
    changed = True
    while changed:
        changed = False
        for name, vals in values.items():
            if name in known:
                continue
            own = known | ({name} if name in params else set())
            if all(v is not None and is_int(v, own | {name}, calls) for v in vals):
                known.add(name)
                changed = True
    return known


def is_int(value: cst.BaseExpression, ints: set[str], calls: tuple[str, ...] = _INT_CALLS) -> bool:
    """Whether ``value`` is an int by its form: an int literal, a name of ``ints``, a call of ``tl`` among ``calls`` (a
    program id, an ``arange``, ``tl.cdiv``), a cast to a 64-bit int of one, or ``+ - * // %`` and unary minus of
    them."""
    if isinstance(value, cst.Integer):
        return True
    if isinstance(value, cst.Name):
        return value.value in ints
    if isinstance(value, cst.BinaryOperation):
        return isinstance(value.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Modulo)) \
            and is_int(value.left, ints, calls) and is_int(value.right, ints, calls)
    if isinstance(value, cst.UnaryOperation):
        return isinstance(value.operator, cst.Minus) and is_int(value.expression, ints, calls)
    if isinstance(value, cst.Call):
        inner = widened_value(value)
        if inner is not None:
            return is_int(inner, ints, calls)
        func = value.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.attr.value in calls):
            return False
        if func.attr.value in ("program_id", "num_programs"):  # `tl.`'s, or a language extension's (`tle.`)
            return True
        # `tl.cdiv(a, b)` is an int (a scalar) where `a` and `b` are; `tl.arange`'s bounds are ints
        return func.value.value == "tl" and all(is_int(a.value, ints, calls) for a in value.args)
    return False


class _Narrowed(cst.CSTTransformer):
    """Drop every cast to a 64-bit int of an int (:func:`is_int`), counting them; ``failed`` once a cast of
    anything else is seen (a value it may change)."""

    def __init__(self, ints: set[str], relies) -> None:
        super().__init__()
        self.ints, self.relies, self.failed, self.casts, self.params = ints, relies, False, 0, set()

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        inner = widened_value(updated)
        if inner is None:
            return updated
        if not is_int(inner, self.ints):
            self.failed = True
            return updated
        self.casts += 1
        self.params |= self.relies(inner)
        if isinstance(inner, (cst.Name, cst.Integer, cst.Call, cst.Attribute, cst.Subscript)):
            return inner.with_changes(lpar=[], rpar=[])
        # `tl.cast(pid + 1, tl.int64) * B` is `(pid + 1) * B`, not `pid + 1 * B`
        return inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


@dataclass(frozen=True)
class _Side:
    """One side of an ``if``: each statement's line and code as written (self-bindings left out), the same without
    its casts (what the two sides must agree on), and how many casts it has."""

    lines: tuple[tuple[int, str], ...]
    plain: tuple[str, ...]
    casts: int
    params: frozenset[str] = frozenset()  # the parameters a dropped cast took as ints


def _side(block: cst.BaseSuite, ints: set[str], relies, positions) -> _Side | None:
    """A side's statements (:class:`_Side`); ``None`` where it is not plain statements (assignments and expressions,
    one a line: a `return`, `break` or `continue` would end what the code moved past it runs for), holds a cast of a
    value that may change, or a statement of more than one line. The sides are compared as syntax (their ``ast``),
    not as text."""
    if not isinstance(block, cst.IndentedBlock):
        return None
    lines, plain, casts, params = [], [], 0, set()
    for line in block.body:
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return None
        small = line.body[0].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        if isinstance(small, cst.Pass):
            continue
        if not isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Expr)):
            return None
        narrowed = _Narrowed(ints, relies)
        stripped = small.visit(narrowed)
        if narrowed.failed:
            return None
        params |= narrowed.params
        if isinstance(stripped, cst.Assign) and len(stripped.targets) == 1 \
                and isinstance(stripped.targets[0].target, cst.Name) \
                and m.matches(stripped.value, m.Name(stripped.targets[0].target.value)):
            continue  # `n = tl.cast(n, tl.int64)`: `n` as it was
        written = code(small)
        if "\n" in written:
            return None
        casts += narrowed.casts
        lines.append((positions[line].start.line, written))
        plain.append(ast.dump(ast.parse(code(stripped))))
    return _Side(tuple(lines), tuple(plain), casts, frozenset(params))


def alike_branches(module: cst.Module, kernel: str) -> AlikeBranches:
    """The module the analysis of ``kernel`` reads: each ``if`` of it whose sides bind the same values (the module's
    docstring) replaced by its side with the more casts to int64 (the 64-bit one: the code TileLink inserts after it
    then computes rows as wide as the kernel does where it must), on that side's lines."""
    fn = find_kernel(module, kernel)
    ifs = m.findall(fn.body, m.If()) if fn is not None else []
    if not ifs:  # most kernels: nothing to read, nor its positions to resolve
        return AlikeBranches(module, ())
    ints = int_sources(fn)
    # the parameters a call's check reads the type of: not a constexpr an `arange` reads (Triton requires an int)
    sized = {n.value for call in m.findall(fn.body, _ARANGE_CALL) for n in m.findall(call, m.Name())}
    params = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)
              if not (p.name.value in sized and is_constexpr(p))}
    bindings: dict[str, list[cst.BaseExpression]] = {}
    for node in m.findall(fn.body, m.Assign()):
        for t in node.targets:
            if isinstance(t.target, cst.Name):
                bindings.setdefault(t.target.value, []).append(node.value)

    def relies(value: cst.BaseExpression) -> set[str]:
        """The parameters ``value`` is an int through (its names', transitively)."""
        out, seen, todo = set(), set(), [n.value for n in m.findall(value, m.Name())]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in params:
                out.add(name)
            for v in bindings.get(name, ()):
                todo.extend(n.value for n in m.findall(v, m.Name()))
        return out

    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = module.code.split("\n")
    replaced: dict[int, str] = {}  # 0-based line -> its text in the analysed module
    regions = []
    elifs = {id(node.orelse) for node in ifs if isinstance(node.orelse, cst.If)}
    for node in ifs:
        if id(node) in elifs or isinstance(node.orelse, cst.If) or m.findall(node.test, m.Call() | m.NamedExpr()):
            continue
        body = _side(node.body, ints, relies, positions)
        other = _side(node.orelse.body, ints, relies, positions) if isinstance(node.orelse, cst.Else) else _Side(
            (), (), 0)
        if body is None or other is None or body.plain != other.plain:
            continue
        start, end = positions[node].start, positions[node].end
        indent = lines[start.line - 1][:start.column]  # the `if`'s own (tabs stay tabs)
        # the side's statements on the last lines of the `if`: code inserted before the first of them goes before
        # the `if`, after the last of them after the `if` (anchored_outside)
        chosen = [text for _, text in (body if body.casts > other.casts else other).lines]
        if len(chosen) > end.line - start.line or indent.strip():
            continue
        read = tuple(range(end.line - len(chosen) + 1, end.line + 1))
        for line in range(start.line, end.line + 1):
            replaced[line - 1] = indent + (chosen[line - read[0]] if line in read else "pass")
        regions.append(Region(start.line, end.line, start.column + 1, code(node.test), read, tuple(chosen),
                              tuple(sorted(body.params | other.params))))
    if not regions:
        return AlikeBranches(module, ())
    text = "\n".join(replaced.get(i, line) for i, line in enumerate(lines))
    return AlikeBranches(cst.parse_module(text), tuple(regions))


def _names(code: str) -> tuple[set[str], set[str]]:
    """The names the statements ``code`` bind and those they read."""
    module = cst.parse_module(code)
    bound = {n.value for node in m.findall(module, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.NamedExpr()
                                           | m.For()) for n in m.findall(node.target, m.Name())}
    return bound, {n.value for n in m.findall(module, m.Name())} - bound | {
        n.value for node in m.findall(module, m.AugAssign()) for n in m.findall(node.target, m.Name())}


def _moves_past(lines: tuple[str, ...], statements: tuple[str, ...]) -> bool:
    """Whether the inserted ``lines`` may run on the other side of ``statements`` (the side's statements between
    where the analysis put them and the ``if``'s end or start): neither binds a name the other reads or binds."""
    try:
        ins_bound, ins_read = _names(textwrap.dedent("\n".join(lines)) + "\n")
    except cst.ParserSyntaxError:
        return False
    for statement in statements:
        bound, read = _names(statement + "\n")
        if ins_bound & (bound | read) or ins_read & bound:
            return False
    return True


def anchored_outside(alike: AlikeBranches, insertions) -> tuple[tuple, list]:
    """The plan's ``insertions`` anchored in the module the user wrote: one before a statement the analysis read of
    an ``if`` goes before the ``if``, one after such a statement after the ``if``, where it may run on the other
    side of the side's statements between (:func:`_moves_past`; the code then runs where it ran in the module read,
    on either side); and those that cannot, each with its ``if``."""
    kept, inside = [], []
    for ins in insertions:
        region = next((r for r in alike.regions if r.first <= ins.anchor.line <= r.last), None)
        if region is None:
            kept.append(ins)
            continue
        j = region.read.index(ins.anchor.line) if ins.anchor.line in region.read else None
        between = None if j is None or ins.anchor.column != region.column else (
            region.code[:j] if ins.position == "before" else region.code[j + 1:])
        if between is not None and _moves_past(ins.lines, between):
            kept.append(dataclasses.replace(ins, anchor=dataclasses.replace(ins.anchor, line=region.first)))
        else:
            inside.append((ins, region))
    return tuple(kept), inside
