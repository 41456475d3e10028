"""Searching one syntax tree many times: a single walk, then each search reads a slice of it.

The analysis asks the same kernel's tree hundreds of questions (``m.findall(fn.body, m.For(target=m.Name(n)))`` for
each name a bound reads, ...). ``libcst.matchers.findall`` walks the whole subtree each time, which made the
analysis of a kernel seconds long. :class:`NodeIndex` walks the tree once, in the order ``findall`` visits it, and
keeps each node's place and each node kind's places; a search of a subtree is then the places of the kinds the
matcher can match inside that subtree's span, each tested with ``m.matches``: the same nodes in the same order.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m


def _kinds(matcher) -> tuple[str, ...] | None:
    """The node class names ``matcher`` can match (a node matcher's own; each option's for ``a | b``), or ``None``
    where it may match any kind (``m.MatchIfTrue``, ``m.DoNotCare()``, an ``m.AllOf``, ...)."""
    if isinstance(matcher, m.OneOf):
        kinds: list[str] = []
        for option in matcher.options:
            inner = _kinds(option)
            if inner is None:
                return None
            kinds.extend(inner)
        return tuple(kinds)
    name = type(matcher).__name__
    if type(matcher).__module__.startswith("libcst.matchers") and isinstance(getattr(cst, name, None), type) and \
            issubclass(getattr(cst, name), cst.CSTNode):
        return (name,)  # a node matcher matches nodes of its own class only
    return None


class NodeIndex:
    """Every node of ``tree`` in ``findall``'s order, each subtree's span of it, and each node class's places."""

    def __init__(self, tree: cst.CSTNode) -> None:
        self.nodes: list[cst.CSTNode] = []
        self.spans: dict[int, tuple[int, int]] = {}  # id(node) -> [first, last + 1) of its subtree
        self.places: dict[str, list[int]] = {}  # class name -> ascending places
        self.shared: set[int] = set()  # nodes met twice (one object at two places): searched the slow way
        index = self

        class _Walk(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                if id(node) in index.spans:
                    index.shared.add(id(node))
                index.spans[id(node)] = (len(index.nodes), -1)
                index.places.setdefault(type(node).__name__, []).append(len(index.nodes))
                index.nodes.append(node)
                return True

            def on_leave(self, original_node: cst.CSTNode) -> None:
                first = index.spans[id(original_node)][0]
                index.spans[id(original_node)] = (first, len(index.nodes))

        tree.visit(_Walk())

    def findall(self, root: cst.CSTNode, matcher) -> Sequence[cst.CSTNode]:
        """``m.findall(root, matcher)``, from the index where ``root`` is a node of the indexed tree."""
        span = self.spans.get(id(root))
        if span is None or id(root) in self.shared or self.nodes[span[0]] is not root:
            return m.findall(root, matcher)
        kinds = _kinds(matcher)
        if kinds is None:  # any kind (and a bare `m.MatchIfTrue`, which `m.matches` refuses but `findall` takes)
            return m.findall(root, matcher)
        first, end = span
        candidates: list[int] = []
        for kind in dict.fromkeys(kinds):
            places = self.places.get(kind, [])
            candidates.extend(places[bisect.bisect_left(places, first):bisect.bisect_left(places, end)])
        if len(kinds) > 1:
            candidates.sort()
        return [self.nodes[i] for i in candidates if m.matches(self.nodes[i], matcher)]


#: the indexes of the trees searched last (a file's module, read for each of its kernels), newest last
_RECENT: list[tuple[cst.CSTNode, NodeIndex]] = []


def index_of(tree: cst.CSTNode) -> NodeIndex:
    """The index of ``tree``, walked once for the few trees searched last: each kernel of a file searches the same
    module (its imports, its helpers, its top-level names)."""
    for kept, index in _RECENT:
        if kept is tree:
            return index
    index = NodeIndex(tree)
    _RECENT.append((tree, index))
    del _RECENT[:-8]
    return index


def find_in(tree: cst.CSTNode, root: cst.CSTNode, matcher) -> Sequence[cst.CSTNode]:
    """``m.findall(root, matcher)`` for ``root`` a node of ``tree`` (``tree`` itself included), from its index."""
    return index_of(tree).findall(root, matcher)
