"""Proof that the loads of a gathered tensor stay inside the rows ``tile=(lo, len)`` names.

``tile=`` places the wait of an all-gather for rows ``[lo, lo + len)`` and nothing more: a load under that wait that
can read another row reads it before it has arrived. Where the rows of a load are not its own offsets vector (which
the analysis then compares with ``tile=`` directly), this module bounds them from the kernel's source and refuses the
load when the bound does not fall inside the tile.

Expressions are read as sums of products of integer constants and atoms (names and the sub-expressions it does not
open, such as ``tl.minimum(...)`` or ``x % n``); a name the kernel binds once is replaced by its value, the same way on
every side, so ``kv_hi - kv_lo`` and a descriptor's ``shape=[kv_hi - kv_lo, ...]`` compare equal. Every atom is taken
as non-negative (program ids, sizes, strides, row starts): a difference is proven non-negative when each of its
coefficients is. The parameters a proof read are returned, and the launch refuses a call that passes one of them a
negative int. The rows of

- a pointer load are ``S + tl.arange(0, B)`` along the vector indexed ``[:, None]`` (or the only vector of a 1-D
  load), from every term of the address scaled by that vector's stride; a term that is a multiple of ``size=`` (the
  head of a flat ``(Z * H * S, D)`` matrix along S) picks another slab and is left out. Its lowest row is ``S`` (a
  loop variable of ``range(a, b, step)`` at its ``a``); its end is ``S + B``, or the bound of a mask conjunct
  ``vector < U`` moved by the difference between the masked vector and the rows;
- a descriptor made in the kernel, ``tl.make_tensor_descriptor(base, shape, strides, block_shape)``, along the axis
  whose stride scales the base's row terms: ``shift + ([o, o + block) & [0, shape))`` (a tensor-memory read past the
  shape reads zeros), with ``shift`` the base's row terms and ``o`` the load's offset along that axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from tilelink.errors import AnnotationError

if TYPE_CHECKING:
    from tilelink.analysis import Access, _Analyzer

Poly = dict[tuple[str, ...], int]

_ROWS = "__tilelink_rows__"
_COLS = "__tilelink_cols__"
_ARANGE = "arange:"


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


def _bare(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def _add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + sign * v
        if out[k] == 0:
            del out[k]
    return out


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ka, va in a.items():
        for kb, vb in b.items():
            k = tuple(sorted(ka + kb))
            out[k] = out.get(k, 0) + va * vb
            if out[k] == 0:
                del out[k]
    return out


def show(p: Poly) -> str:
    """A readable form of ``p``: ``kv_lo + KV_CHUNK``."""
    if not p:
        return "0"
    parts = []
    for k, v in sorted(p.items(), key=lambda kv: (len(kv[0]) == 0, kv[0])):
        atoms = " * ".join(k)
        if not atoms:
            term = str(abs(v))
        else:
            term = atoms if abs(v) == 1 else f"{abs(v)} * {atoms}"
        parts.append(("- " if v < 0 else "+ ") + term)
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def _grouped(atom: str) -> str:
    """``atom`` as an operand of ``*``, ``+`` and ``-``: in parentheses unless it is a name, an attribute, a
    subscript, a call or a number (``BLOCK_N if not SUB else BLOCK_N // 2`` or ``BLOCK_N // 2`` would otherwise
    bind to its neighbours)."""
    try:
        node = cst.parse_expression(atom)
    except cst.ParserSyntaxError:
        return f"({atom})"
    if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.Integer)) or getattr(node, "lpar", ()):
        return atom
    return f"({atom})"


def code(p: Poly) -> str:
    """``p`` as Triton source that evaluates to it (each compound atom in parentheses), for generated code such as
    a ``tl.static_assert``; :func:`show` writes the same terms for a message."""
    return show({tuple(_grouped(a) for a in k): v for k, v in p.items()})


class _Rows:
    """Reads the expressions of one kernel as :data:`Poly` s."""

    def __init__(self, an: _Analyzer, display: bool = False) -> None:
        self.an = an
        # for messages: only the names of row vectors are written out, so that the rows read as the kernel says them
        self.display = display
        self.blocks: dict[str, Poly] = {}  # each `arange:B` atom read, and its B
        # every name read in an atom (`S`, and the `S` of `tl.minimum(s_lo + CHUNK, S)`): the proof takes each as
        # non-negative, which the launch checks of the int arguments among them
        self.names: set[str] = set()
        # every atom read (a name, or a sub-expression not opened: `x % n`, `tl.minimum(...)`, `tl.load(...)`)
        self.atoms: set[str] = set()

    def expand(self, node: cst.BaseExpression, depth: int = 0) -> cst.BaseExpression:
        """``node`` with each name bound once by the kernel (not a parameter, loop variable or rebound) replaced by its
        value, and ``x[:, None]`` / ``x[None, :]`` marked as the rows / columns of a 2-D block."""
        an = self.an
        display = self.display

        class _T(cst.CSTTransformer):
            def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
                kinds = [isinstance(el.slice, cst.Slice) for el in updated.slice]
                if len(kinds) >= 2 and kinds.count(True) == 1 and all(
                        s or m.matches(el.slice, m.Index(value=m.Name("None")))
                        for s, el in zip(kinds, updated.slice, strict=True)):
                    mark = _ROWS if kinds[0] else _COLS
                    return cst.Call(func=cst.Name(mark), args=[cst.Arg(updated.value)])
                return updated

            def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
                return original  # `tl.arange`, `x.dtype`: the attribute's base is not a value to replace

            def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
                name = original.value
                defs = an.assignments.get(name, [])
                if depth < 8 and len(defs) == 1 and name not in an.rebound and name not in an.params \
                        and len(an.bindings.get(name, [])) <= 1 and not _is_descriptor(defs[0][1]) and (
                            not display or m.findall(defs[0][1], m.Attribute(attr=m.Name("arange")))):
                    inner = _Rows(an, display).expand(defs[0][1], depth + 1)
                    return inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) \
                        if hasattr(inner, "lpar") else inner
                return updated

        return node.visit(_T())  # type: ignore[return-value]

    def poly(self, node: cst.BaseExpression) -> Poly:
        """``node`` (already expanded) as a sum of products; ``tl.arange(0, B)`` is the atom ``arange:B``."""
        node = _bare(node)
        if isinstance(node, cst.Integer):
            value = int(node.evaluated_value)
            return {(): value} if value else {}
        if isinstance(node, cst.Name):
            self.names.add(node.value)
            self.atoms.add(node.value)
            return {(node.value,): 1}
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            return {k: -v for k, v in self.poly(node.expression).items()}
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, cst.Add):
                return _add(self.poly(node.left), self.poly(node.right))
            if isinstance(node.operator, cst.Subtract):
                return _add(self.poly(node.left), self.poly(node.right), -1)
            if isinstance(node.operator, cst.Multiply):
                return _mul(self.poly(node.left), self.poly(node.right))
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Name) and node.func.value in (_ROWS, _COLS):
                inner = self.poly(node.args[0].value)
                if node.func.value == _ROWS:
                    return inner
                return {tuple(sorted(k + (_COLS,))): v for k, v in inner.items()}
            if m.matches(node.func, m.Attribute(value=m.Name("tl"), attr=m.Name("arange"))) and len(node.args) == 2:
                lo, hi = (self.poly(a.value) for a in node.args)
                size = _add(hi, lo, -1)
                self.blocks[_ARANGE + show(size)] = size
                return _add(lo, {(_ARANGE + show(size),): 1})
            if m.matches(node.func, m.Attribute(value=m.Name("tl"), attr=m.Name("multiple_of")
                                                | m.Name("max_contiguous"))) and node.args:
                return self.poly(node.args[0].value)
            if _widening(node):  # `(off_hz // H).to(tl.int64)`: the same value (a narrowing cast may change it)
                return self.poly(_widened(node))
        self.names |= {n.value for n in m.findall(node, m.Name()) if n.value not in ("tl", "triton")}
        self.atoms.add(_code(node))
        return {(_code(node),): 1}

    def read(self, node: cst.BaseExpression) -> Poly:
        return self.poly(self.expand(node))


def _widening(node: cst.Call) -> bool:
    return _widened(node) is not None


def _widened(node: cst.BaseExpression) -> cst.BaseExpression | None:
    from tilelink.analysis import widened_value

    return widened_value(node)


def _is_descriptor(value: cst.BaseExpression) -> bool:
    return m.matches(value, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("make_tensor_descriptor"))))


def _nonnegative(p: Poly) -> bool:
    return all(v >= 0 for v in p.values())


def _divide(p: Poly, by: tuple[str, ...]) -> tuple[Poly, Poly]:
    """``p`` split into the terms divisible by the monomial ``by`` (divided by it) and the others."""
    inside: Poly = {}
    rest: Poly = {}
    for k, v in p.items():
        left = list(k)
        try:
            for atom in by:
                left.remove(atom)
        except ValueError:
            rest[k] = v
            continue
        inside[tuple(left)] = v
    return inside, rest


class _Ranges:
    """The ``for v in range(a, b[, step])`` loops around an access: ``v`` lies in ``[a, b)``."""

    def __init__(self, an: _Analyzer, rows: _Rows, at: object) -> None:
        from tilelink.analysis import _contains, _range_args

        self.bounds: dict[str, tuple[Poly, Poly]] = {}
        # each loop's step, where it is one positive parameter or int literal: the values its variable takes are
        # `a + j * step`, which bounds the last of them by more than `b` alone (`_stepped_end`)
        self.steps: dict[str, Poly] = {}
        for loop in m.findall(an.fn.body, m.For(target=m.Name())):
            read = _range_args(loop)
            if read is None or not _contains(an, loop, at) or len(an.bindings.get(loop.target.value, [])) != 1:
                continue
            lo, hi = read[0], read[1]
            step = rows.read(read[2])
            if not _nonnegative(step):
                continue  # a loop that counts down starts at its highest value
            self.bounds[loop.target.value] = (rows.read(lo), rows.read(hi))
            (atoms, factor), = step.items() if len(step) == 1 else ((None, 0),)
            if atoms == () and factor > 0 or atoms is not None and len(atoms) == 1 and factor == 1 \
                    and atoms[0] in passed_params(an):
                self.steps[loop.target.value] = step

    def lowest(self, p: Poly) -> Poly:
        """``p`` at the lowest values of its loop variables (those with a positive coefficient, alone in a term)."""
        out: Poly = {}
        for k, v in p.items():
            if len(k) == 1 and k[0] in self.bounds and v > 0:
                out = _add(out, {kk: vv * v for kk, vv in self.bounds[k[0]][0].items()})
            else:
                out = _add(out, {k: v})
        return out


def passed_params(an: _Analyzer) -> set[str]:
    """The parameters the launch reads as the kernel uses them: bound nowhere in the kernel, or only widened
    (``stride_xb = stride_xb.to(tl.int64)``; a narrowing cast, `d.to(tl.int8)`, may change the value)."""
    from tilelink.analysis import _passed

    return {p for p in an.params if _passed(an, cst.Name(p))}


def _minimum_atom(atom: str) -> list[cst.BaseExpression] | None:
    """The arguments of ``tl.minimum(x, y)`` (or ``min(x, y)``) where ``atom`` is one, else ``None``."""
    try:
        node = cst.parse_expression(atom)
    except cst.ParserSyntaxError:
        return None
    if isinstance(node, cst.Call) and len(node.args) == 2 \
            and all(a.keyword is None and a.star == "" for a in node.args) \
            and m.matches(node.func, m.Attribute(value=m.Name("tl"), attr=m.Name("minimum")) | m.Name("min")):
        return [a.value for a in node.args]
    return None


def _at_most(rows: _Rows, small: Poly, large: Poly) -> bool:
    """``small <= large`` for every non-negative value of the atoms: the difference is non-negative, or is once a
    minimum it subtracts, ``tl.minimum(x, y)``, is replaced by ``x`` or ``y`` (both at least the minimum), up to two
    of them (``kv_hi = tl.minimum(kv_lo + KV_CHUNK, kv_end)`` is at most ``kv_lo + KV_CHUNK``)."""
    todo = [_add(large, small, -1)]
    for _ in range(3):
        if any(_nonnegative(d) for d in todo):
            return True
        more = []
        for d in todo:
            for k, v in d.items():
                args = _minimum_atom(k[0]) if len(k) == 1 and v < 0 else None
                for arg in args or ():
                    more.append(_add({kk: vv for kk, vv in d.items() if kk != k}, {kk: vv * v for kk, vv in
                                                                                   rows.poly(arg).items()}))
        todo = more
    return False


def _uppers(rows: _Rows, p: Poly) -> list[Poly]:
    """``p`` and the values at least as large with a minimum it adds, ``tl.minimum(x, y)``, replaced by ``x`` or
    ``y`` (two levels)."""
    out = [p]
    todo = [p]
    for _ in range(2):
        more = []
        for q in todo:
            for k, v in q.items():
                args = _minimum_atom(k[0]) if len(k) == 1 and v > 0 else None
                for arg in args or ():
                    more.append(_add({kk: vv for kk, vv in q.items() if kk != k}, {kk: vv * v for kk, vv in
                                                                                   rows.poly(arg).items()}))
        out += more
        todo = more
    return out


def _multiple(an: _Analyzer, d: Poly, step: Poly) -> list[tuple[tuple[str, ...], str]] | None:
    """The facts that make ``d`` a multiple of ``step`` (a parameter or a positive int literal): for each term that is
    not one by its form, the product of its parameters must be a multiple of the step, ``(factors, divisor)`` (a sum
    of multiples is one). ``None`` where a term is not a product of parameters the launch reads as passed: a literal
    (``KV_CHUNK - 1``), a value the kernel computes."""
    (atoms, factor), = step.items()
    divisor = atoms[0] if atoms else str(factor)
    passed = passed_params(an)
    facts = []
    for k, v in d.items():
        if atoms and atoms[0] in k or not atoms and v % factor == 0:
            continue
        if not k or not all(a in passed for a in k):
            return None
        facts.append((tuple(sorted(k)), divisor))
    return facts


def _stepped_end(rows: _Rows, ranges: _Ranges, first: Poly, block: Poly, end: Poly,
                 multiples: list[tuple[tuple[str, ...], str]] | None) -> bool:
    """Whether rows ``[first, first + block)`` end by ``end`` because ``first`` moves with a loop variable ``v`` of
    ``range(a, b, step)`` (coefficient 1), ``step`` a parameter or an int literal: ``v = a + j * step < b <= B`` with
    ``B - a`` a multiple of ``step`` gives ``v <= B - step``, so the rows end by ``first - v + B - step + block``. ``B``
    is ``b`` or an upper bound of it (``tl.minimum(kv_lo + KV_CHUNK, kv_end)`` is at most ``kv_lo + KV_CHUNK``). The
    divisibility of ``B - a`` by the step holds by its form or by facts the launch checks, which are added to
    ``multiples``: ``range(kv_lo, kv_hi, BLOCK_N)`` with ``kv_hi <= kv_lo + KV_CHUNK`` needs ``KV_CHUNK % BLOCK_N ==
    0``; ``range(kv_lo + 1, ...)`` needs ``(KV_CHUNK - 1) % BLOCK_N == 0``, no fact of parameters, and is refused."""
    for v, step in ranges.steps.items():
        if first.get((v,)) != 1 or any(v in k for k in first if k != (v,)):
            continue
        a, b = ranges.bounds[v]
        for upper in _uppers(rows, b):
            facts = _multiple(rows.an, _add(upper, a, -1), step)
            if facts is None:
                continue
            last = _add(_add({k: c for k, c in first.items() if k != (v,)}, upper), step, -1)
            if _at_most(rows, _add(last, block), end):
                if multiples is not None:
                    multiples.extend(facts)
                return True
    return False


def _refuse(acc: Access, dim: int, override: tuple[str, str], reads: str, hint: str) -> AnnotationError:
    lo, size = override
    return AnnotationError(
        f"this {acc.kind} of {acc.tensor!r} reads{reads}; tile=({lo!r}, {size!r}) states rows "
        f"[{lo}, {lo} + {size}), the only rows its wait covers, so a row outside them may be read before it arrives",
        file=acc.where.file, line=acc.where.line, column=acc.where.column, hint=hint)


_POINTER_HINT = ("read the tile's rows only: offsets `start + tl.arange(0, BLOCK)` with `start` looping over "
                 "`range(lo, lo + len, BLOCK)` and the mask `offs[:, None] < lo + len`, no other row term in the "
                 "address; or name the rows this load reads in tile=")
_DESCRIPTOR_HINT = ("make the descriptor for the tile's rows, `tl.make_tensor_descriptor(base + lo * stride, "
                    "shape=[len, ...], strides=[stride, 1], block_shape=[BLOCK, ...])`, and load it at offsets in "
                    "[0, len); or, for a descriptor over more rows, load it at `start` of a loop `range(lo, hi, "
                    "BLOCK)` with `hi <= lo + len` (`tl.minimum(lo + len, ...)`) and `len` a multiple of `BLOCK`, "
                    "which each call checks; or name the rows this load reads in tile=")


def check_tile_covers(an: _Analyzer, acc: Access, dim: int, pointers: set[str], override: tuple[str, str],
                      size_param: str | None) -> tuple[tuple[str, ...], tuple[tuple[tuple[str, ...], str], ...]]:
    """Refuse ``acc`` (a load of a tensor gathered with ``tile=override``) unless its rows provably lie inside the
    tile. See the module's docstring for what is read. Returns the kernel's parameters the proof read, each taken as
    non-negative: the launch refuses a call that passes one of them a negative int (``start = s_lo + SKIP`` with
    ``SKIP=-1`` reads the row before the tile); and the divisibility facts it took, ``(factors, divisor)``: the
    product of the factors must be a multiple of the divisor (a parameter or an int literal), which the launch
    checks too (``KV_CHUNK % BLOCK_N == 0`` for blocks of ``BLOCK_N`` rows stepping through a chunk)."""
    if acc.kind != "load":
        # a store's notify counts the rows tile= names as written: its own rows must be them, not merely inside them
        if _store_rows_are_tile(an, acc, pointers, override):
            return (), ()
        raise AnnotationError(
            f"tile=({override[0]!r}, {override[1]!r}) names the rows the notify after this store to {acc.tensor!r} "
            f"announces, but TileLink cannot read the rows the store writes as those rows (an offsets vector, or "
            f"the address itself): a store of other rows would complete a channel whose rows are not written",
            file=acc.where.file, line=acc.where.line, column=acc.where.column,
            hint="bind the rows to a name, `offs_m = start + tl.arange(0, BLOCK_M)`, and index the store with "
                 "`offs_m[:, None]`: TileLink then reads the tile from them (tile= may be left out)")
    rows = _Rows(an)
    multiples: list[tuple[tuple[str, ...], str]] = []
    lo = rows.read(cst.parse_expression(override[0]))
    end = _add(lo, rows.read(cst.parse_expression(override[1])))
    ranges = _Ranges(an, rows, acc.where)
    # each expression is read twice: with every name bound once written out, for the proof, and with only the row
    # vectors written out, for the message
    said = []
    for reader, proof in ((rows, True), (_Rows(an, display=True), False)):
        facts = multiples if proof else None
        if acc.descriptor:
            said.append(_descriptor_rows(an, acc, dim, reader, ranges, lo, end, size_param, proof, facts))
        else:
            said.append(_pointer_rows(an, acc, pointers, dim, reader, ranges, lo, end, size_param, proof, facts))
        if said[0] is None:
            unsigned = _unsigned_atoms(an, rows)
            if unsigned:
                raise _refuse(acc, dim, override, f" rows from `{unsigned[0]}`, which the proof that they lie in the "
                                                  f"tile takes as non-negative, but which TileLink cannot bound below "
                                                  f"(a name bound more than once, a value loaded or chosen, a "
                                                  f"difference)", _POINTER_HINT if not acc.descriptor else
                              _DESCRIPTOR_HINT)
            return tuple(sorted(rows.names & set(an.params) - {acc.tensor})), tuple(dict.fromkeys(multiples))
    why, reads = said
    assert why is not None and reads is not None
    raise _refuse(acc, dim, override, f", along dim {dim}, rows {reads}{why}" if why.startswith(",") else
                  f", along dim {dim}, rows {why}",
                  _DESCRIPTOR_HINT if acc.descriptor else _POINTER_HINT)


def _store_rows_are_tile(an: _Analyzer, acc: Access, pointers: set[str], override: tuple[str, str]) -> bool:
    """Whether a pointer store writes exactly the rows ``tile=`` names, read from its address: one row (`tile=("row",
    "1")`, a GEMV's `y_ptr + row`) is the address's terms other than its columns, or those over a row stride; a block
    of rows is `(lo + tl.arange(0, len))` times the row stride (or alone on a 1-D tensor)."""
    if acc.descriptor:
        return False
    expr = _pointer_expression(an, acc, pointers)
    if expr is None:
        return False
    rows = _Rows(an)
    address = {k: v for k, v in rows.read(expr).items() if k != (acc.tensor,)}
    rest = {k: v for k, v in address.items() if _COLS not in k}
    lo, size = (rows.read(cst.parse_expression(x)) for x in override)
    want = lo if size == {(): 1} else _add(lo, {(_ARANGE + show(size),): 1})
    if rest == want:
        return True
    for stride in sorted({a for k in rest for a in k} & passed_params(an)):
        inside, other = _divide(rest, (stride,))
        if not other and inside == want:
            return True
    return False


def _unsigned_atoms(an: _Analyzer, rows: _Rows) -> list[str]:
    """The atoms a proof read that it cannot take as non-negative, as it does every atom (``_nonnegative_value``:
    parameters, program ids, loop variables from a non-negative start, and sums, products, `//`, `%`, bounds and casts
    of those, through locals and helpers): a local bound to a negative value on one path (`d = 0`, then `d = -2`),
    a value loaded (`tl.load(d_ptr)`) or chosen (`tl.where(c, -2, 0)`), a difference: rows shifted by it may start
    before the tile."""
    from tilelink.analysis import _nonnegative_value

    found, passed = [], passed_params(an)
    for atom in sorted(rows.atoms):
        if atom.startswith(_ARANGE) or atom in passed:
            continue
        try:
            node = cst.parse_expression(atom)
        except (cst.ParserSyntaxError, SyntaxError):
            node = None
        if node is None or _nonnegative_value(an, _unmarked(node)) is None:
            found.append(atom)
    return found


def _unmarked(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` with the row and column marks of :meth:`_Rows.expand` taken off (`__tilelink_rows__(x)` is `x`)."""
    class _T(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            if isinstance(updated.func, cst.Name) and updated.func.value in (_ROWS, _COLS) and updated.args:
                return updated.args[0].value
            return updated

    return node.visit(_T())  # type: ignore[return-value]


def _pointer_expression(an: _Analyzer, acc: Access, pointers: set[str]) -> cst.BaseExpression | None:
    """The load's address with its pointer aliases written out; ``None`` when an alias is bound more than once."""
    class _T(cst.CSTTransformer):
        failed = False

        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            name = original.value
            if name in pointers and name != acc.tensor:
                defs = an.assignments.get(name, [])
                if len(defs) != 1 or name in an.rebound:
                    _T.failed = True
                    return updated
                return defs[0][1].visit(self).with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return updated

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
            return original

    out = cst.parse_expression(acc.pointer).visit(_T())
    return None if _T.failed else out  # type: ignore[return-value]


def inner_terms(an: _Analyzer, acc: Access,
                pointers: set[str]) -> tuple[list[tuple], set[tuple[tuple[str, ...], str]]]:
    """The terms of a pointer access whose rows lie along an inner dim that the rows' stride does not scale, for the
    launch to check (``KernelAnalysis.row_shifts`` and ``row_steps``): ``x_ptr + D`` on a contiguous ``(B, S, D)``
    tensor gathered along S moves the rows by one. Returns the terms the launch reads (int literals and parameters) as
    one sum of ``(subtracted, factors)``, and the parameter factors of each term that multiplies a value the kernel
    computes (``b * stride_xb``, ``b = tl.program_id(1)``), each with that value in source (``tl.program_id(1)``,
    ``-(...)`` where the term is subtracted; the launch bounds it from the grid). Left out: terms along the rows'
    stride (the rows, checked against ``tile=``), the terms of a vector indexed ``[None, :]`` (the columns, whose ends
    ``analysis._inner_columns`` adds where no mask bounds them, or the rows themselves where they are the last dim),
    rows of stride 1 (their start and other terms are not told apart), terms of a loop variable or a name bound more
    than once, and an address TileLink cannot follow (its pointer bound more than once). A computed term no parameter
    scales (``x_ptr + b``) cannot be attributed to a dim: refused."""
    expr = _pointer_expression(an, acc, pointers)
    if expr is None or an.bindings.get(acc.tensor):
        return [], set()  # its aliases or the pointer itself bound more than once: the advance check's
    rows = _Rows(an)
    address = rows.read(expr)
    vectors = {k for k in address if any(a.startswith(_ARANGE) for a in k) and _COLS not in k}
    strides = {tuple(a for a in k if not a.startswith(_ARANGE)) for k in vectors}
    if len(strides) != 1 or not next(iter(strides)):
        return [], set()  # no single row vector scaled by a stride: the rows' own checks refuse it
    (stride,) = strides
    _, rest = _divide(address, stride)
    return _outside_terms(an, acc, rest)


def descriptor_inner_terms(an: _Analyzer, acc: Access) -> tuple[list[tuple], set[tuple[tuple[str, ...], str]],
                                                                  set[tuple[str, ...]]]:
    """:func:`inner_terms` of a descriptor the kernel makes, ``tl.make_tensor_descriptor(base, shape, strides, ...)``,
    for rows along an inner dim: the terms of ``base`` that the rows' stride (the ``strides`` entry that scales terms of
    the base) does not scale, and the last element it reads along each axis after the rows', ``(shape[j] - 1) *
    strides[j]``. ``x_ptr + b * stride_xb + s_lo * stride_xs + D`` on a contiguous ``(B, S, D)`` tensor gathered along
    S reads the next row of S, and so does ``shape=[n, D + COL]`` with ``strides=[stride_xs, 1]``. Refused at the
    access: a shape or stride entry after the rows' that the launch cannot read. A term of the base that multiplies a
    value the kernel computes by parameters gives those parameters as a step (``KernelAnalysis.row_steps``). The third
    value is the rows' stride as factors (``KernelAnalysis.row_scales``): the launch checks that it is the gathered
    buffer's, where a stride of the shard's or of another layout would read other rows than those the wait covers."""
    from tilelink.analysis import _arg, _factors, _is_tl_call, _refuse, _terms, code

    defs = an.assignments.get(acc.pointer, [])
    make = defs[0][1] if len(defs) == 1 else None
    if not isinstance(make, cst.Call) or not _is_tl_call(make, "make_tensor_descriptor"):
        return [], set(), set()
    base, shape, strides = _arg(make, 0, "base"), _arg(make, 1, "shape"), _arg(make, 2, "strides")
    if base is None or not isinstance(shape, (cst.List, cst.Tuple)) or not isinstance(strides, (cst.List, cst.Tuple)) \
            or len(shape.elements) != len(strides.elements):
        return [], set(), set()
    address = _Rows(an).read(base)
    entries = [_Rows(an).read(e.value) for e in strides.elements]
    axes = [i for i, e in enumerate(entries) if len(e) == 1 and next(iter(e)) and _divide(address, next(iter(e)))[0]]
    dim = an.tensors[acc.tensor][0]
    if not axes and m.matches(base, m.Name(acc.tensor)) and dim < len(entries):
        # made from the tensor itself: its axes are the tensor's dims, the rows' the annotated one, whose offset the
        # tile reads (a (B, S, D) tensor gathered along S: `shape=[B, S, D], strides=[stride_xb, stride_xs, 1]`)
        axes = [dim]
    elif not axes:
        # a descriptor over every row (`tl.make_tensor_descriptor(k_base, shape=[N_CTX, D], ...)`): its base holds no
        # row term, and its rows' axis is the only one of a stride other than 1, as the tile= proof reads it
        axes = [i for i, e in enumerate(entries) if len(e) == 1 and next(iter(e)) and e != {(): 1}]
    if len(axes) != 1:
        return [], set(), set()  # no single axis whose stride scales the base's rows: the rows' own checks judge it
    axis = axes[0]
    ((atoms, coefficient),) = entries[axis].items()
    params = passed_params(an)
    if coefficient <= 0 or any(a not in params for a in atoms):
        raise _refuse(acc, f"the descriptor `{acc.pointer}` of {acc.tensor!r} steps its rows by "
                           f"`{code(strides.elements[axis].value)}`, which TileLink cannot read at the launch: it "
                           f"cannot check that the rows the {acc.kind} at line {acc.where.line} reads are the rows of "
                           f"the gathered buffer its wait covers",
                      "give the rows' stride as a parameter the kernel passes on as it is, or a product of parameters "
                      "and literals (`strides=[stride_xs, 1]`)")
    scale = tuple(atoms) + ((str(coefficient),) if coefficient != 1 else ())
    _, rest = _divide(address, next(iter(entries[axis])))
    # a computed term times parameters (`b * stride_xb`) is a step the launch checks, as a pointer's: a step of the
    # dims before the rows, or, in a sequence-major layout (the attention kernel's (1, 1, S, B * H * D),
    # `off_z * stride_kz`), a block of columns of the row that holds the descriptor's whole read
    shift, steps = _outside_terms(an, acc, rest)
    steps |= _descriptor_outer_steps(an, acc, shape, strides, axis)
    extent: list[tuple[bool, tuple[str, ...]]] = []
    for size, stride in zip(shape.elements[axis + 1:], strides.elements[axis + 1:], strict=True):
        found = [] if m.findall(stride.value, m.Call() | m.Subscript()) else _factors(an, stride.value, "\0")
        step = tuple(found) if found else None
        for term, negative in _terms(size.value):
            if isinstance(term, cst.UnaryOperation) and isinstance(term.operator, cst.Minus):
                term, negative = term.expression, not negative
            factors = None if m.findall(term, m.Call() | m.Subscript()) else _factors(an, term, "\0")
            if step is None or factors is None:
                raise _refuse(acc, f"the descriptor `{acc.pointer}` of {acc.tensor!r} reads `{code(size.value)}` "
                                   f"elements of stride `{code(stride.value)}` after its rows, which TileLink cannot "
                                   f"read at the launch: it cannot check that the {acc.kind} at line "
                                   f"{acc.where.line} stays within the rows its wait covers",
                              "give the descriptor's shape and strides after the rows as parameters, literals or "
                              "products of them (`shape=[n, D], strides=[stride_xs, 1]`)")
            extent.append((negative, tuple(factors) + step))
        extent.append((True, step))  # the last element along the axis is at (size - 1) * stride
    if extent:
        # its first element and its last, each within the row: the extent past a negative base term (`x_ptr + ... -
        # 2` read over a row of D) would hide where the read starts, in the row before
        shift = [tuple(shift[0]) + tuple(extent), tuple(shift[0])] if shift else [tuple(extent)]
    return shift, steps, {scale}


def _descriptor_outer_steps(an: _Analyzer, acc: Access, shape, strides, axis: int
                            ) -> set[tuple[tuple[str, ...], str]]:
    """The steps a descriptor's axes before the rows' take (``KernelAnalysis.row_steps``): the access's index along
    such an axis (`b` of `desc.load([b, start, 0])` on `shape=[B, S, D], strides=[stride_xb, stride_xs, 1]`) times
    the axis' stride, which the launch checks is a whole step of the dims before the rows in the gathered buffer (a
    shard's `stride_xb` steps over S_r rows of the buffer's S: other rows than the wait covers). Whatever the index
    (a program id, a loop's variable, a loaded value), the descriptor's own shape bounds it (a block past the shape
    reads zeros, not memory), so the launch need not bound it from the grid: the step's value is 0 for that check. An
    axis of size 1 is never stepped along; a stride TileLink cannot read there is refused."""
    from tilelink.analysis import _factors, _refuse, code

    steps: set[tuple[tuple[str, ...], str]] = set()
    for j in range(axis):
        if m.matches(shape.elements[j].value, m.Integer("1")):
            continue
        stride = strides.elements[j].value
        factors = None if m.findall(stride, m.Call() | m.Subscript()) else _factors(an, stride, "\0")
        if factors is None:
            raise _refuse(acc, f"the descriptor `{acc.pointer}` of {acc.tensor!r} steps along its axis {j}, before "
                               f"the rows, by `{code(stride)}`, which TileLink cannot read at the launch: it cannot "
                               f"check that the {acc.kind} at line {acc.where.line} reads the rows of the gathered "
                               f"buffer its wait covers",
                          "give that axis' stride as a parameter or a product of parameters and literals "
                          "(`strides=[stride_xb, stride_xs, 1]`), and pass the full tensor's stride")
        steps.add((tuple(sorted(factors)), "0"))
    return steps


def _outside_terms(an: _Analyzer, acc: Access, rest: Poly) -> tuple[list[tuple], set[tuple[tuple[str, ...], str]]]:
    """The terms ``rest`` of an address that the rows' stride does not scale, as :func:`inner_terms` returns them."""
    from tilelink.analysis import _computed, _varies, program_value

    params = passed_params(an)
    shift: list[tuple[bool, tuple[str, ...]]] = []
    steps: set[tuple[tuple[str, ...], str]] = set()
    for k, v in rest.items():
        if acc.tensor in k or _COLS in k or any(a.startswith(_ARANGE) for a in k):
            continue  # the pointer, and a vector indexed `[None, :]`
        atoms = list(k)
        known = [a for a in atoms if a in params]
        others = [a for a in atoms if a not in params]
        factors = tuple(known) + ((str(abs(v)),) if abs(v) != 1 else ())
        if not others:
            shift.append((v < 0, factors or ("1",)))
            continue
        parsed = [cst.parse_expression(a) for a in others]
        if any(_varies(an, p) for p in parsed) or not all(_computed(an, p) for p in parsed):
            return [], set()  # a value of each step of a loop: the advance and sweep checks judge it
        if not known:
            dim = an.tensors[acc.tensor][0]
            term = show({k: v})
            from tilelink.analysis import _refuse as refuse

            raise refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds `{term}` to "
                              f"{acc.tensor!r}, a value the kernel computes that no stride parameter scales: "
                              f"TileLink cannot tell along which dim it moves, so it cannot check that the rows "
                              f"along dim {dim} stay those its {'wait' if acc.kind == 'load' else 'notify'} covers",
                         f"scale it by the stride of the dim it steps along, a parameter (`{term} * stride_xb` for "
                         f"the first dim of a (B, S, D) tensor), or add it to the rows' offsets vector along dim "
                         f"{dim}")
        # with the value the factors multiply, its sign included, in source over program ids and parameters: the
        # launch bounds it from the grid where the step is no whole step of the dims before the rows
        value = " * ".join(f"({program_value(an, a)})" for a in sorted(others))
        steps.add((tuple(sorted(factors)), f"-{value}" if v < 0 else value))
    return ([tuple(shift)] if shift else []), steps


def _bound_again(an: _Analyzer, acc: Access, pointers: set[str]) -> str:
    """Which alias of the load's address is bound more than once, and where (the reason no ``tile=`` proof reads
    it): an address advanced in place (``a_ptrs += BLOCK_K * stride_ak``) is not one expression to bound."""
    from tilelink.analysis import code, names_in

    todo, seen = [acc.pointer], set()
    while todo:
        for name in sorted(names_in(cst.parse_expression(todo.pop())) & pointers - seen - {acc.tensor}):
            seen.add(name)
            defs = an.assignments.get(name, [])
            lines = sorted({at.line for at, _ in an.bindings.get(name, ())})
            if len(defs) != 1 or name in an.rebound:
                return (f"`{name}` is bound more than once (line{'s' if len(lines) > 1 else ''} "
                        f"{', '.join(map(str, lines))}), and with tile= TileLink bounds the rows of an address made "
                        f"once: compute it where it is read, from the loop's variable (`ks = k * BLOCK_K + offs_k`, "
                        f"`{acc.tensor} + ... + ks[None, :] * stride`), rather than advancing it in place")
            todo.extend(code(v) for _, v in defs)
    return "its pointer is bound more than once"


def _other_slab(term: tuple[str, ...], size_param: str | None, dim: int) -> bool:
    """A row term that is a multiple of the gathered dimension's full size picks another slab of a flat view (the head
    ``off_hz * N_CTX`` of a ``(Z * H * N_CTX, D)`` matrix gathered along dim 1), not rows of this one."""
    return dim > 0 and size_param is not None and size_param in term


def _pointer_rows(an: _Analyzer, acc: Access, pointers: set[str], dim: int, rows: _Rows, ranges: _Ranges, lo: Poly,
                  end: Poly, size_param: str | None, proof: bool,
                  multiples: list[tuple[tuple[str, ...], str]] | None) -> str | None:
    """``None`` when the rows of the pointer load ``acc`` lie in ``[lo, end)``; else which rows it reads and why they
    may leave the tile. The divisibility facts the proof takes are added to ``multiples``."""
    expr = _pointer_expression(an, acc, pointers)
    if expr is None:
        return "that TileLink cannot follow: " + _bound_again(an, acc, pointers)
    address = rows.read(expr)
    vectors = {k: v for k, v in address.items() if any(a.startswith(_ARANGE) for a in k) and _COLS not in k}
    strides = set()
    blocks = set()
    for k, v in vectors.items():
        ranged = [a for a in k if a.startswith(_ARANGE)]
        if len(ranged) != 1 or v != 1:
            return f"through `{show({k: v})}`, a row vector TileLink cannot bound"
        blocks.add(ranged[0])
        strides.add(tuple(a for a in k if a != ranged[0]))
    if len(strides) != 1 or len(blocks) != 1:
        return "that TileLink cannot find: its address has no single `start + tl.arange(0, BLOCK)` vector of rows"
    (stride,), (block,) = strides, blocks
    scaled, _ = _divide(address, stride)
    shift: Poly = {}
    for k, v in scaled.items():
        if block in k or acc.tensor in k or _COLS in k or _other_slab(k, size_param, dim):
            continue
        if any(a.startswith(_ARANGE) for a in k):
            return f"moved by `{show({k: v})}`, a vector TileLink cannot bound"
        shift[k] = v
    height = rows.blocks[block]
    reads = f"[{show(shift)}, {show(shift)} + {show(height)})" if not proof else ""
    if proof and not (_nonnegative(_add(shift, lo, -1)) or _nonnegative(_add(ranges.lowest(shift), lo, -1))):
        return ", which may start before the tile"
    ends = [_add(shift, height)]
    bounds = []
    blocks = bool(m.findall(rows.expand(expr), m.Call(func=m.Name(_ROWS) | m.Name(_COLS))))
    for conjunct in _conjuncts(acc.mask):
        comparison = _row_bound(rows, conjunct, blocks)
        if comparison is None:
            continue
        masked, bound = comparison
        if {k: v for k, v in masked.items() if block in k} != {(block,): 1}:
            continue
        bounds.append(_code(conjunct))
        ends.append(_add(bound, _add(shift, {k: v for k, v in masked.items() if block not in k}, -1)))
    if proof and (any(_at_most(rows, e, end) for e in ends)
                  or _stepped_end(rows, ranges, shift, height, end, multiples)):
        return None
    if proof:
        return ", which may run past the tile's end (no mask on its rows bounds them by it)" if not bounds else \
            ", and its mask does not keep them below the tile's end"
    return reads + ("" if not bounds else ", masked by " + " and ".join(f"`{b}`" for b in bounds))


def _conjuncts(mask: str | None) -> list[cst.BaseExpression]:
    if mask is None:
        return []
    out: list[cst.BaseExpression] = []
    todo = [cst.parse_expression(mask)]
    while todo:
        node = _bare(todo.pop())
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitAnd):
            todo.extend((node.left, node.right))
        elif isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
            todo.extend((node.left, node.right))
        else:
            out.append(node)
    return out


def _row_bound(rows: _Rows, conjunct: cst.BaseExpression, blocks: bool = False) -> tuple[Poly, Poly] | None:
    """``vector < U`` (or ``vector <= U``) over the rows -> (the vector, the exclusive bound). ``blocks``: the access
    is a block of rows and columns, where only a vector made rows (``offs[:, None] < M``) bounds its rows (a 1-D
    ``offs < M`` broadcasts along the columns)."""
    if not (isinstance(conjunct, cst.Comparison) and len(conjunct.comparisons) == 1):
        return None
    op = conjunct.comparisons[0].operator
    left = rows.read(conjunct.left)
    right = rows.read(conjunct.comparisons[0].comparator)
    if any(_COLS in k for k in left) or any(any(a.startswith(_ARANGE) for a in k) for k in right):
        return None
    if blocks and not m.findall(rows.expand(conjunct.left), m.Call(func=m.Name(_ROWS))):
        return None
    if isinstance(op, cst.LessThan):
        return left, right
    if isinstance(op, cst.LessThanEqual):
        return left, _add(right, {(): 1})
    return None


def _descriptor_rows(an: _Analyzer, acc: Access, dim: int, rows: _Rows, ranges: _Ranges, lo: Poly, end: Poly,
                     size_param: str | None, proof: bool,
                     multiples: list[tuple[tuple[str, ...], str]] | None) -> str | None:
    """``None`` when the rows of the descriptor load ``acc`` lie in ``[lo, end)``; else which rows it reads and why
    they may leave the tile. The divisibility facts the proof takes are added to ``multiples``."""
    from tilelink.analysis import _arg

    defs = an.assignments.get(acc.pointer, [])
    offsets = cst.parse_expression(acc.offsets) if acc.offsets is not None else None
    if not defs:
        return None  # a host TensorDescriptor: its rows are its offsets, compared with tile= by the analysis
    make = defs[0][1]
    if len(defs) != 1 or not _is_descriptor(make) or not isinstance(offsets, (cst.List, cst.Tuple)):
        return (f"that TileLink cannot follow: `{acc.pointer}` is made more than once, or not by "
                "tl.make_tensor_descriptor")
    base, shape, strides, block = (_arg(make, i, k) for i, k in enumerate(("base", "shape", "strides",
                                                                          "block_shape")))
    lists = [x for x in (shape, strides, block) if isinstance(x, (cst.List, cst.Tuple))]
    if base is None or len(lists) != 3 or len({len(x.elements) for x in lists} | {len(offsets.elements)}) != 1:
        return (f"that TileLink cannot follow: `{acc.pointer}` has no literal shape, strides and block_shape of its "
                "offsets' rank")
    based = rows.read(base)
    stride_of = [rows.read(s.value) for s in strides.elements]  # type: ignore[union-attr]
    # the axis of the gathered rows: the one whose stride scales the base's row terms; a descriptor over the tensor
    # itself keeps the tensor's axes; else the only axis of a stride other than 1
    axes = [i for i, s in enumerate(stride_of) if s != {(): 1} and len(s) == 1 and _divide(based, next(iter(s)))[0]]
    if len(axes) != 1:
        if m.matches(base, m.Name(acc.tensor)) and dim < len(stride_of):
            axes = [dim]
        else:
            axes = [i for i, s in enumerate(stride_of) if s != {(): 1}]
    if len(axes) != 1 or len(stride_of[axes[0]]) != 1:
        return (f"from an axis of `{acc.pointer}` TileLink cannot tell: it needs one stride per axis, a unit stride "
                "on every axis but the rows'")
    axis = axes[0]
    scaled, _ = _divide(based, next(iter(stride_of[axis])))
    shift = {k: v for k, v in scaled.items() if acc.tensor not in k and not _other_slab(k, size_param, dim)}
    start = rows.read(offsets.elements[axis].value)
    height = rows.read(shape.elements[axis].value)  # type: ignore[union-attr]
    rows_in_block = rows.read(block.elements[axis].value)  # type: ignore[union-attr]
    first = _add(shift, start)
    reads = (f"[{show(first)}, {show(first)} + {show(rows_in_block)}) of the descriptor's rows [{show(shift)}, "
             f"{show(_add(shift, height))})") if not proof else ""
    if proof:
        if not (_nonnegative(_add(shift, lo, -1)) or _nonnegative(_add(first, lo, -1))
                or _nonnegative(_add(ranges.lowest(first), lo, -1))):
            return ", which may start before the tile"
        if _at_most(rows, _add(shift, height), end) or _at_most(rows, _add(first, rows_in_block), end) \
                or _stepped_end(rows, ranges, first, rows_in_block, end, multiples):
            return None
        return ", which may run past the tile's end"
    return reads
