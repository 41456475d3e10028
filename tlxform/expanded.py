"""Offsets broadcast where they are bound: ``offset_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]``.

FlagGems writes a tile's offsets as a column (or row) of a 2-D grid at their binding (with a start or without:
``offset_m = tl.arange(0, BLOCK_M)[None, :]``), and uses the name bare::

    offset_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]
    A_ptrs = A + offset_n * stride_an + offset_m * stride_am
    tl.store(C + offset_n * stride_cn, acc[:, None], mask=offset_n < N)

The analysis reads offsets as a vector made by ``start + tl.arange(0, size)`` and the grid's axes from the subscripts
at their use (``offs_cm[:, None]``). :func:`expanded_offsets` gives it a module in which each such binding is the vector
(``offset_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)``) and each use the same subscript of it (``offset_n[:, None]``):
the same values at every use. Only the text inside the lines changes: every statement starts where it started, so the
plan's insertions anchor in the module the user wrote, which is what is rewritten. Code the rewrite inserts reads such
offsets as the module it was made on does, with their subscript (``offset_n[:, None] < N``, the count of a store's
rows): :func:`as_written` gives it back the name as bound. Where it reads one otherwise (as the vector), the plan is
made again on the module as written (which reads the kernel as before, refusing or not); so it is where the view is
refused, and a name bound more than once, or used in any way other than in arithmetic, a comparison, an index, a cast
or a load's or store's argument, is not read so.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from tilelink.analysis import find_kernel, param_names
from tilelink.branches import SCALAR_CALLS, int_sources, is_int

__all__ = ["as_written", "expanded_offsets", "said_as_written", "written_column"]

_ARANGE = m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("arange")))
#: the subscripts that make a column or a row of a 2-D grid from a vector
_AXES = {"[:, None]": (m.SubscriptElement(m.Slice(lower=None, upper=None, step=None)),
                       m.SubscriptElement(m.Index(m.Name("None")))),
         "[None, :]": (m.SubscriptElement(m.Index(m.Name("None"))),
                       m.SubscriptElement(m.Slice(lower=None, upper=None, step=None)))}
#: calls whose arguments an expanded name may be: they read its values only
_READERS = ("load", "store", "where", "multiple_of", "max_contiguous", "minimum", "maximum", "atomic_add")


def _axis(node: cst.BaseExpression) -> str | None:
    """``"[:, None]"`` or ``"[None, :]"`` where ``node`` is ``tl.arange(...)`` so subscripted."""
    if not (isinstance(node, cst.Subscript) and m.matches(node.value, _ARANGE) and len(node.slice) == 2):
        return None
    for axis, (first, second) in _AXES.items():
        if m.matches(node.slice[0], first) and m.matches(node.slice[1], second):
            return axis
    return None


def _vector(value: cst.BaseExpression, scalars: set[str]) -> tuple[cst.BaseExpression, str] | None:
    """``start + tl.arange(0, B)[:, None]`` (either order) -> (``start + tl.arange(0, B)``, ``"[:, None]"``); a bare
    ``tl.arange(0, B)[None, :]`` -> (``tl.arange(0, B)``, ``"[None, :]"``). The start must be a scalar int by its form
    (``scalars``: the kernel's names that are): a vector there (``cols[None, :] + tl.arange(0, B)[:, None]``) makes a
    grid that the vector and its subscript are not."""
    axis = _axis(value)
    if axis is not None:
        return value.value, axis
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)) or value.lpar:
        return None
    for side, other in (("left", "right"), ("right", "left")):
        axis = _axis(getattr(value, side))
        if axis is not None and is_int(getattr(value, other), scalars, SCALAR_CALLS):
            return value.with_changes(**{side: getattr(value, side).value}), axis
    return None


class _Uses(cst.CSTVisitor):
    """Where each name is read, and whether each read is one an added subscript keeps the meaning of."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names, self.bad, self.stack = names, set(), []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Name) and node.value in self.names and self.stack:
            parent = self.stack[-1]
            fine = isinstance(parent, (cst.BinaryOperation, cst.Comparison, cst.ComparisonTarget, cst.UnaryOperation,
                                       cst.BooleanOperation, cst.AssignTarget)) \
                or isinstance(parent, cst.Subscript) and parent.value is node \
                or isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "to" \
                or isinstance(parent, cst.Arg) and len(self.stack) > 1 and m.matches(
                    self.stack[-2], m.Call(func=m.Attribute(value=m.Name("tl"),
                                                            attr=m.OneOf(*(m.Name(n) for n in _READERS)))))
            if not fine:
                self.bad.add(node.value)
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


class _Expand(cst.CSTTransformer):
    """The bindings as vectors, each read of their names subscripted as the binding was."""

    def __init__(self, axes: dict[str, str], bindings: dict[int, cst.BaseExpression]) -> None:
        super().__init__()
        self.axes, self.bindings = axes, bindings
        self.targets = 0

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        self.targets += 1
        return True

    def leave_AssignTarget(self, original: cst.AssignTarget, updated: cst.AssignTarget) -> cst.AssignTarget:
        self.targets -= 1
        return updated

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if id(original) in self.bindings:
            return updated.with_changes(value=self.bindings[id(original)])
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        axis = self.axes.get(original.value)
        if axis is None or self.targets:
            return updated
        return cst.parse_expression(f"{original.value}{axis}")


def expanded_offsets(module: cst.Module, kernel: str) -> tuple[cst.Module, dict[str, str]]:
    """The module the analysis of ``kernel`` reads (the module's docstring) and the names read as vectors, each with
    the subscript it had where bound; ``module`` itself and none where the kernel has no such binding."""
    fn = find_kernel(module, kernel)
    # statements joined on a line (`a = o; b = 1`, `if c: x = o`): a longer first one would move the next one's start,
    # where an insertion may anchor
    if fn is None or not any(_axis(node) for node in m.findall(fn.body, m.Subscript())) \
            or m.findall(fn.body, m.SimpleStatementSuite()) \
            or any(len(line.body) > 1 for line in m.findall(fn.body, m.SimpleStatementLine())):
        return module, {}  # no `tl.arange(...)[:, None]` at all: nothing to read (most kernels)
    assigns = [n for n in m.findall(fn.body, m.Assign()) if len(n.targets) == 1
               and isinstance(n.targets[0].target, cst.Name)]
    bound: dict[str, int] = {}
    for node in m.findall(fn.body, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For() | m.NamedExpr()):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        for t in targets:
            for name in m.findall(t, m.Name()):
                bound[name.value] = bound.get(name.value, 0) + 1
    params = set(param_names(fn))
    scalars = int_sources(fn, SCALAR_CALLS)
    axes, vectors = {}, {}
    for node in assigns:
        name = node.targets[0].target.value
        found = _vector(node.value, scalars)
        if found is not None and bound.get(name) == 1 and name not in params:
            axes[name] = found[1]
            vectors[id(node)] = found[0]
    if not axes:
        return module, {}
    uses = _Uses(set(axes))
    fn.body.visit(uses)
    for name in uses.bad:
        axes.pop(name)
    bindings = {id(n): vectors[id(n)] for n in assigns if n.targets[0].target.value in axes}
    if not axes:
        return module, {}
    new_fn = fn.with_changes(body=fn.body.visit(_Expand(axes, bindings)))
    out = module.deep_replace(fn, new_fn)
    # every line keeps its statements' starts: the insertions anchor in the module as written
    if out.code.count("\n") != module.code.count("\n"):
        return module, {}
    return out, axes


def _subscripted(name: str, axis: str) -> str:
    """The pattern of ``name`` read with its subscript (``offset_n[:, None]``), as the view writes it."""
    return rf"\b{re.escape(name)}{re.escape(axis)}"


def as_written(lines: tuple[str, ...], axes: dict[str, str]) -> tuple[str, ...] | None:
    """Inserted ``lines`` made on the module that reads the offsets ``axes`` (name -> subscript) as vectors, for the
    module as written: each ``name[:, None]`` is the name as bound there. ``None`` where a line reads such a name
    otherwise (as the vector, which the module as written does not have)."""
    out = []
    for line in lines:
        for name, axis in axes.items():
            bare = len(re.findall(rf"\b{re.escape(name)}\b", line))
            line, subscripted = re.subn(_subscripted(name, axis), name, line)
            if bare != subscripted:
                return None
        out.append(line)
    return tuple(out)


def said_as_written(text: str | None, axes: dict[str, str]) -> str | None:
    """A message about the module read with the vectors, in the kernel as written: ``name[:, None]`` is ``name``."""
    if text is None:
        return None
    for name, axis in axes.items():
        text = re.sub(_subscripted(name, axis), name, text)
    return text


def written_column(view: cst.Module, line: int | None, column: int | None, axes: dict[str, str]) -> int | None:
    """The column in the kernel as written of ``column`` (1-based) on ``line`` of ``view``: each subscript added before
    it on the line moved it right."""
    lines = view.code.split("\n")
    if line is None or column is None or not 1 <= line <= len(lines):
        return column
    before = lines[line - 1][:column - 1]
    added = sum(len(axis) * len(re.findall(_subscripted(name, axis), before))
                for name, axis in axes.items())
    return column - added
