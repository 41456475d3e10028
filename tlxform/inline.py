"""Loads and stores inside ``@triton.jit`` helpers: the helper is inlined into the kernel before the analysis.

A kernel that hands an annotated tensor (or a pointer or descriptor made from it) to a ``@triton.jit`` function of
the same file (``_attn_fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, ...)``, ``write_zeros_to_output(c_ptr, ...)``)
reads or writes it there. The call statement is replaced by the helper's body (transitively: a helper called from
an inlined body is inlined in turn), so the analysis sees every access with its tile, its loops and its branches
exactly as if the kernel had been written out, and the waits and notifies land in the kernel's own code. Each
inlined copy binds the helper's parameters as a call does: a parameter that gets a plain name and is not bound
again reads that name, a literal list (``shape=[M, K]``) and a ``tl.constexpr`` parameter's value (``(4 - STAGE)``)
are written where they are used, any other gets a local of its own, set from the argument before the body (in
the call's order when two arguments call something); the helper's own names that the kernel also uses are renamed
(``m_ij`` -> ``m_ij_2``); each ``return`` that ends the helper (its last statement, or the last of each branch of
its last ``if``) becomes the call's assignment (a call whose result is unused still evaluates a returned call,
``return tl.store(...)``). Helpers that receive no annotated tensor stay calls.

What cannot be inlined as a call would run is refused: a helper that calls itself, one defined in another module, a
tensor passed inside a tuple, a call that is not a statement of its own, a ``return`` that does not end the helper,
a helper that reads a module-level name the kernel binds too (inlined, it would read the kernel's).

Errors and report lines keep the user's file positions: :class:`Inlined` maps each line of the inlined module back
to the line of the user's file it came from, and names the helper and the call it was inlined at.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from tilelink.analysis import (
    _without_dtypes,
    find_kernel,
    is_constexpr,
    is_triton_jit,
    names_in,
    names_outside_loads,
    param_names,
)
from tilelink.errors import AnnotationError
from tilelink.node_index import find_in

#: how many calls one kernel may have inlined (a bound on helpers that call helpers)
MAX_INLINED = 64


@dataclass(frozen=True)
class Origin:
    """Where a line of the inlined module comes from in the user's file."""

    line: int
    shift: int  # the user's column = this module's column + shift
    helper: str | None = None  # the helper whose body holds the line
    call: int | None = None  # the user's line of the call the helper was inlined at
    #: the helper's names this copy of it renamed (`start_n` -> `start_n_2` in its second copy): a `tile=` naming the
    #: helper's loop variable means this copy's
    names: tuple[tuple[str, str], ...] = ()


@dataclass
class Inlined:
    """A module whose kernel has its helpers inlined, and the way back to the user's positions."""

    module: cst.Module
    file: str
    origins: list[Origin] | None = None  # None: nothing was inlined, the positions are the user's
    #: the parameters read under a name of their own (``rename_rebound``): the name -> (the parameter, its line)
    renamed: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)

    def origin(self, line: int | None) -> Origin | None:
        if self.origins is None or line is None or not 1 <= line <= len(self.origins):
            return None
        return self.origins[line - 1]

    def names_at(self, line: int | None) -> dict[str, str]:
        """The helper's names renamed in the copy that holds ``line`` (empty outside one)."""
        found = self.origin(line)
        return dict(found.names) if found is not None else {}

    def user_line(self, line: int) -> int:
        found = self.origin(line)
        return found.line if found is not None else line

    def _text(self, text: str) -> str:
        """``at line 12``, ``at lines 12, 14``, ``at line(s) 12`` in a message: the user's lines."""
        def one(match: re.Match) -> str:
            numbers = ", ".join(str(self.user_line(int(n))) for n in match.group(2).split(", "))
            return f"{match.group(1)} {numbers}"
        return re.sub(r"\b(lines?|line\(s\)) (\d+(?:, \d+)*)", one, text)

    def user_error(self, err: AnnotationError) -> AnnotationError:
        """``err`` with the user's line, column and line references; an error inside an inlined helper says so, and
        one that names a parameter's own name for its rebinding says what it is."""
        named = [f"`{alias}` is `{param}` as bound again at line {line}" for alias, (param, line) in
                 self.renamed.items() if f"`{alias}" in err.reason or alias in (err.hint or "")]
        if named and err.file == self.file:
            err = AnnotationError(f"{err.reason} ({'; '.join(named)})", file=err.file, line=err.line,
                                  column=err.column, hint=err.hint)
        if self.origins is None or err.file != self.file:
            return err
        found = self.origin(err.line)
        message = self._text(err.reason)
        if found is not None and found.helper is not None:
            message += f" (in the @triton.jit helper `{found.helper}`, called at line {found.call})"
        column = err.column + found.shift if found is not None and err.column is not None else err.column
        return AnnotationError(message, file=err.file, line=found.line if found is not None else err.line,
                               column=column, hint=self._text(err.hint) if err.hint else err.hint)

    def planned(self, planner: Callable, file: str, request) -> object:
        """``planner(module, file, request, names_at)`` on the inlined module, errors and report in the user's
        positions."""
        try:
            plan = planner(self.module, file, request, self.names_at)
        except AnnotationError as err:
            raise self.user_error(err) from None
        if self.origins is None:
            return plan
        report = tuple(dataclasses.replace(
            e, message=self._text(e.message), where=None if e.where is None else dataclasses.replace(
                e.where, line=self.user_line(e.where.line))) for e in plan.report)
        return dataclasses.replace(plan, report=report)


# ----------------------------------------------------------------------------- reading
def _helpers(module: cst.Module) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in module.body
            if isinstance(s, cst.FunctionDef) and any(is_triton_jit(d) for d in s.decorators)}


def _imported(module: cst.Module) -> set[str]:
    out: set[str] = set()
    for stmt in module.body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                out |= {(a.asname.name.value if a.asname else a.name.value) for a in small.names  # type: ignore
                        if isinstance(a.asname.name if a.asname else a.name, cst.Name)}
    return out


def _bound(node: cst.CSTNode) -> set[str]:
    """Every name ``node`` binds (``=``, ``+=``, ``:``, ``:=``, a ``for`` target)."""
    out: set[str] = set()
    for n in m.findall(node, m.Assign() | m.AugAssign() | m.AnnAssign() | m.NamedExpr() | m.For()):
        targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
        for t in targets:
            out |= names_in(t)
    return out


def _free(helper: cst.FunctionDef) -> set[str]:
    """The names ``helper`` reads from its module: neither its parameters nor its locals (its parameters' defaults
    too, which an inlined call that leaves them out writes into the kernel)."""
    params = helper.params
    own = set(param_names(helper))
    defaults = set().union(*(names_in(p.default) for p in (*params.posonly_params, *params.params)
                             if p.default is not None))
    return (names_in(helper.body) - _bound(helper.body) - own) | defaults


def _aliases(fn: cst.FunctionDef, tensors: Iterable[str]) -> set[str]:
    """The annotated tensors and every name assigned from them (pointers, descriptors), outside loads."""
    names = set(tensors)
    assigns = [(t, n.value) for n in m.findall(fn.body, m.Assign() | m.AugAssign())
               for t in ([x.target for x in n.targets] if isinstance(n, cst.Assign) else [n.target])]
    changed = True
    while changed:
        changed = False
        for target, value in assigns:
            new = names_in(target) - names
            # a value cast to a tensor's element type (`acc.to(c_ptr.dtype.element_ty)`) reads its type, not memory
            if new and names_outside_loads(_without_dtypes(value)) & names:
                names |= new
                changed = True
    return names


def _calls(fn: cst.FunctionDef, helpers: dict[str, cst.FunctionDef]) -> set[str]:
    return {c.func.value for c in m.findall(fn.body, m.Call(func=m.Name()))  # type: ignore[union-attr]
            if c.func.value in helpers}  # type: ignore[union-attr]


def _recursive(name: str, helpers: dict[str, cst.FunctionDef]) -> bool:
    seen, todo = set(), list(_calls(helpers[name], helpers))
    while todo:
        h = todo.pop()
        if h == name:
            return True
        if h not in seen:
            seen.add(h)
            todo.extend(_calls(helpers[h], helpers))
    return False


# ----------------------------------------------------------------------------- the pass
def inline_helpers(module: cst.Module, file: str, kernel: str, tensors: Iterable[str]) -> Inlined:
    """Inline into ``kernel`` every call of a same-file ``@triton.jit`` helper that receives one of ``tensors`` or
    a pointer or descriptor made from it; refuse what cannot be inlined. Returns ``module`` itself when there is
    nothing to inline."""
    tensors = tuple(tensors)
    renamed: dict[str, tuple[str, int]] = {}
    current, origins = rename_rebound(module, kernel, tensors, renamed), None
    for _ in range(MAX_INLINED + 1):
        fn = find_kernel(current, kernel)
        if fn is None:
            break
        site = _next_site(current, file, fn, tensors, origins)
        if site is None:
            break
        text, origins = _inline(current, file, fn, site, origins)
        current = cst.parse_module(text)
    else:
        raise AnnotationError(f"kernel {kernel!r} calls more than {MAX_INLINED} helpers with the annotated tensors",
                              file=file, line=None, hint="make the accesses in the kernel itself")
    return Inlined(current, file, origins, renamed)


def rename_rebound(module: cst.Module, kernel: str, tensors: tuple[str, ...],
                   renamed: dict[str, tuple[str, int]] | None = None) -> cst.Module:
    """``kernel`` with each annotated parameter that its body binds again at the top level by pointer arithmetic on
    itself (``A = A + (ram[:, None] * stride_am + rk[None, :] * stride_ak)``, as ``triton.ops.matmul`` writes its
    pointers; a descriptor made from it is the tensor's own descriptor, read as it is) read under
    a name of its own from that statement on: ``A_ptrs = A + (...)``, and ``A_ptrs`` wherever the body names ``A``
    after it. The statement runs once, before every later statement of the body, so each later ``A`` is the alias
    and each earlier one the parameter; the analysis then follows ``A_ptrs`` as any pointer alias (its advances
    included), and the rewrite hands the parameter the gathered buffer or the partial sums. A binding inside a loop
    or a branch, or one not made from the parameter, is left as written (the analysis refuses it, saying where)."""
    fn = find_kernel(module, kernel)
    if fn is None or not isinstance(fn.body, cst.IndentedBlock):
        return module
    body = list(fn.body.body)
    taken = {n.value for n in find_in(module, module, m.Name())}
    changed = False
    for tensor in tensors:
        at = next((i for i, stmt in enumerate(body) if isinstance(stmt, cst.SimpleStatementLine) and any(
            tensor in _bound(small) for small in stmt.body)), None)
        if at is None:
            continue
        stmt = body[at]
        first = stmt.body[0] if len(stmt.body) == 1 else None
        # pointer arithmetic on the parameter: a descriptor made from it (`desc_k = tl.make_tensor_descriptor(desc_k,
        # ...)`, a helper's `desc = _maybe_make_desc(desc, ...)`) is read as the tensor's own descriptor already
        if not (isinstance(first, cst.Assign) and len(first.targets) == 1
                and m.matches(first.targets[0].target, m.Name(tensor))
                and m.matches(first.value, m.BinaryOperation(operator=m.Add() | m.Subtract()))
                and tensor in {n.value for n in m.findall(first.value, m.Name())}):
            continue
        if any(tensor in _bound(other) for other in body[:at]):
            continue  # bound before, in a loop or a branch: not the parameter at this statement
        alias = _fresh(f"{tensor}_ptrs", taken, set())
        if renamed is not None:
            renamed[alias] = (tensor, MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)[
                fn.body.body[at]].start.line)
        rename = _Rename({tensor: cst.Name(alias)})
        body[at] = stmt.with_changes(body=[first.with_changes(targets=[first.targets[0].with_changes(
            target=cst.Name(alias))])])
        body[at + 1:] = [later.visit(rename) for later in body[at + 1:]]
        changed = True
    if not changed:
        return module
    new_fn = fn.with_changes(body=fn.body.with_changes(body=body))
    return cst.parse_module(module.with_changes(body=[new_fn if node is fn else node for node in module.body]).code)


@dataclass(frozen=True)
class _Site:
    call: cst.Call
    stmt: cst.SimpleStatementLine
    helper: cst.FunctionDef
    targets: cst.BaseExpression | None  # the call's assignment target, if any


def _refuse(file: str, positions, origins: list[Origin] | None, node: cst.CSTNode, message: str,
            hint: str) -> AnnotationError:
    pos = positions[node].start
    err = AnnotationError(message, file=file, line=pos.line, column=pos.column + 1, hint=hint)
    return Inlined(cst.Module(body=[]), file, origins).user_error(err) if origins is not None else err


def _next_site(module: cst.Module, file: str, fn: cst.FunctionDef, tensors: tuple[str, ...],
               origins: list[Origin] | None) -> _Site | None:
    """The first call of ``fn`` that hands an annotated tensor to a helper of this file; refusals on the way."""
    helpers, imported = _helpers(module), _imported(module)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    aliases = _aliases(fn, tensors)
    statements = {id(c): s for s in m.findall(fn.body, m.SimpleStatementLine()) for c in m.findall(s, m.Call())}
    for call in m.findall(fn.body, m.Call(func=m.Name())):
        name = call.func.value  # type: ignore[union-attr]
        used = set().union(*(names_outside_loads(a.value) for a in call.args)) & aliases if call.args else set()
        if not used:
            continue
        what = ", ".join(sorted(used))

        def refuse(message: str, hint: str, node: cst.CSTNode = call) -> AnnotationError:
            return _refuse(file, positions, origins, node, message, hint)

        if name in imported:
            raise refuse(f"{what} (from the annotated {', '.join(repr(t) for t in tensors)}) is passed to `{name}`, "
                         f"a function imported from another module: TileLink reads the loads and stores of "
                         f"@triton.jit helpers defined in the kernel's own file only",
                         f"define `{name}` in this file, or make its loads and stores in the kernel itself")
        if name not in helpers:
            continue  # not a helper: the analysis refuses the call with what to write
        helper = helpers[name]
        for arg in call.args:
            for seq in m.findall(arg.value, m.Tuple() | m.List()):
                if names_outside_loads(seq) & aliases:
                    raise refuse(f"{what} is passed to the helper `{name}` inside a tuple: TileLink follows a "
                                 f"tensor into a helper through a parameter of its own only",
                                 f"pass each pointer or descriptor to `{name}` as a parameter of its own", arg.value)
            if arg.star:
                raise refuse(f"{what} is passed to the helper `{name}` through `{arg.star}`: TileLink follows a "
                             f"tensor into a helper through a named parameter only",
                             f"pass the arguments of `{name}` one by one")
        if name == fn.name.value or _recursive(name, helpers):
            raise refuse(f"the helper `{name}`, which receives {what}, calls itself (directly or through other "
                         f"helpers): TileLink cannot follow its loads and stores",
                         f"write the recursion as a loop in `{name}`")
        params = helper.params
        if params.star_arg not in (cst.MaybeSentinel.DEFAULT, None) or params.kwonly_params or params.star_kwarg:
            raise refuse(f"the helper `{name}`, which receives {what}, takes `*` or keyword-only parameters: "
                         f"TileLink binds a helper's plain parameters only", f"give `{name}` plain parameters")
        returns = m.findall(helper.body, m.Return())
        tails = _tail_returns(helper.body.body)
        early = [r for r in returns if not any(r is t for t in tails)]
        if early:
            raise refuse(f"the helper `{name}`, which receives {what}, returns before its end: TileLink inlines a "
                         f"helper whose `return`s end it (its last statement, or the last of each branch of its last "
                         f"`if`)", f"compute the result in a variable and return it at the end of `{name}`", early[0])
        stmt = statements.get(id(call))
        small = stmt.body[0] if stmt is not None and len(stmt.body) == 1 else None
        targets = None
        if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
            targets = small.targets[0].target
        elif not (isinstance(small, cst.Expr) and small.value is call):
            raise refuse(f"the helper `{name}` receives {what} inside a larger statement: TileLink follows a helper's "
                         f"loads and stores when the call is a statement of its own",
                         f"call it on a line of its own, `result = {name}(...)`, and use `result` after it")
        if targets is not None and not _always_returns(helper.body.body):
            raise refuse(f"the helper `{name}` does not return a value on every path, but its result is assigned",
                         f"return a value at the end of `{name}` (and of each branch of its last `if`), or call it "
                         f"as a statement of its own")
        # a name the helper reads from its module (a global constant) that the kernel binds too would read the
        # kernel's value once the body is inlined into the kernel's scope
        captured = sorted(_free(helper) & (_bound(fn.body) | {p.name.value for p in fn.params.params}))
        if captured:
            read = next(iter(m.findall(helper.body, m.Name(captured[0])) or m.findall(helper.params,
                                                                                       m.Name(captured[0]))))
            raise refuse(f"the helper `{name}`, which receives {what}, reads the module-level `{captured[0]}`, which "
                         f"kernel {fn.name.value!r} also binds: inlined into the kernel, it would read the kernel's "
                         f"`{captured[0]}`", f"rename the kernel's `{captured[0]}`, or pass the value to `{name}` as "
                         f"a parameter", read)
        return _Site(call, stmt, helper, targets)  # type: ignore[arg-type]
    return None


class _Rename(cst.CSTTransformer):
    """Rename plain names (not attribute names, nor keywords of a call)."""

    def __init__(self, names: dict[str, cst.BaseExpression]):
        super().__init__()
        self.names = names

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.names.get(original.value, updated)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)


def _inline(module: cst.Module, file: str, fn: cst.FunctionDef, site: _Site,
            origins: list[Origin] | None) -> tuple[str, list[Origin]]:
    """The module's text with ``site``'s call statement replaced by the helper's body, and the new line origins."""
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = module.code.splitlines(keepends=True)
    if origins is None:
        origins = [Origin(i + 1, 0) for i in range(len(lines))]
    helper, call, name = site.helper, site.call, site.helper.name.value
    start, end = positions[site.stmt].start, positions[site.stmt].end
    indent = lines[start.line - 1][:start.column]
    call_origin = origins[start.line - 1]

    # the parameters' arguments
    params = list(helper.params.posonly_params) + list(helper.params.params)
    bound: dict[str, cst.BaseExpression] = {}
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) > len(params):
        raise _refuse(file, positions, origins, call, f"`{name}` takes {len(params)} parameters, the call passes "
                      f"{len(positional)}", f"pass the parameters of `{name}`")
    for p, a in zip(params, positional, strict=False):
        bound[p.name.value] = a.value
    for a in call.args:
        if a.keyword is not None:
            if a.keyword.value not in {p.name.value for p in params}:
                raise _refuse(file, positions, origins, call, f"the call of `{name}` passes `{a.keyword.value}`, "
                              f"which is not a parameter of `{name}`", f"pass the parameters of `{name}`")
            bound[a.keyword.value] = a.value
    for p in params:
        if p.name.value not in bound:
            if p.default is None:
                raise _refuse(file, positions, origins, call, f"the call of `{name}` does not pass `{p.name.value}`",
                              f"pass `{p.name.value}` to `{name}`")
            bound[p.name.value] = p.default

    body = list(helper.body.body)
    if body and isinstance(body[0], cst.SimpleStatementLine) and m.matches(
            body[0], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])):
        body = body[1:]  # the docstring
    rebound = _bound(cst.IndentedBlock(body=body)) if body else set()
    local_names = rebound | {p.name.value for p in params}
    # the module-level names any helper reads stay free too: a local named so would be read by a helper inlined later
    taken = names_in(fn) | {p.name.value for p in fn.params.params} | set(_helpers(module)) | (
        names_in(helper) - local_names) | set().union(*map(_free, _helpers(module).values()))
    targets = names_in(site.targets) if site.targets is not None else set()
    renames: dict[str, cst.BaseExpression] = {}
    prelude: list[str] = []
    arg_names = [code_of(v) for v in bound.values()]
    for p in params:
        pname, value = p.name.value, bound[p.name.value]
        plain = isinstance(value, cst.Name) and arg_names.count(value.value) == 1
        # a parameter read as the caller's name: one the helper does not bind again, or one whose caller's name the
        # call's result replaces anyway (`acc, l_i = inner(acc, l_i, ...)`)
        if plain and (pname not in rebound or value.value in targets):  # type: ignore[union-attr]
            renames[pname] = cst.Name(value.value)  # type: ignore[union-attr]
        elif isinstance(value, (cst.List, cst.Tuple)) and pname not in rebound and not m.findall(value, m.Call()):
            # a literal list (`shape=[M, K]`, `block_shape=[BLOCK_M, BLOCK_K]`) is written where it is used: the
            # analysis reads a descriptor's shape from the list itself
            renames[pname] = value.with_changes(lpar=[], rpar=[]) if isinstance(value, cst.List) else value
        elif is_constexpr(p) and pname not in rebound:
            # a compile-time value (`4 - STAGE`, `i + 1`, `tl.cdiv(D, 2)`: a call of constexprs has no effect to run
            # once) is written where it is used, in parentheses: a constexpr local set before the body would be
            # defined again on each unrolled step of a tl.static_range loop, which Triton refuses
            renames[pname] = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    # the locals in the parameters' order, or in the call's (positional, then keywords as written, then defaults)
    # when two arguments call something: their calls (an atomic, a load after it) run in the order the call ran them
    by_name = {p.name.value: p for p in params}
    calling = [n for n in bound if n not in renames and m.findall(bound[n], m.Call())]
    for pname in list(bound) if len(calling) > 1 else list(by_name):
        p = by_name[pname]
        if pname in renames:
            continue
        local = _fresh(pname, taken, local_names)
        renames[pname] = cst.Name(local)
        prelude.append(f"{local}{': tl.constexpr' if is_constexpr(p) else ''} = {code_of(bound[pname])}")
    # the helper's own constexpr locals (`HALF: tl.constexpr = W // 2`), set once at its top level, are written where
    # they are used too, for the same reason: in an unrolled loop the inlined definition would run on every step
    folded: set[int] = set()
    for stmt in body:
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if (isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None
                and "constexpr" in code_of(small.annotation.annotation) and small.target.value not in renames
                and _bindings(body, small.target.value) == 1
                # written at a later use, a name it reads must hold the same value there (`W = W * 4` after
                # `HALF: tl.constexpr = W // 2` would change it): a parameter the helper never binds, or a local it
                # binds once
                and all(_bindings(body, n) <= (0 if n in {p.name.value for p in params} else 1)
                        for n in names_in(small.value) & rebound)):
            value = small.value.visit(_Rename(renames))
            renames[small.target.value] = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            folded.add(id(stmt))
    for n in sorted(rebound - set(renames)):
        local = _fresh(n, taken, local_names)
        if local != n:
            renames[n] = cst.Name(local)

    copy_names = tuple(sorted((k, v.value) for k, v in renames.items() if isinstance(v, cst.Name) and v.value != k))
    # the body, renamed; its final `return` becomes the call's assignment
    out_lines: list[str] = []
    out_origins: list[Origin] = []
    call_line = call_origin.line
    context = dict(helper=name, call=call_line)
    out_lines.append(f"{indent}# {name}(...), inlined\n")
    out_origins.append(dataclasses.replace(call_origin, **context))
    for text in prelude:
        out_lines.append(f"{indent}{text}\n")
        out_origins.append(dataclasses.replace(call_origin, **context))
    for stmt in body:
        if id(stmt) in folded:
            continue
        # the statement's own lines (and the comment lines above it), moved to column 0 as a whole so that its
        # continuation lines keep their alignment, renamed, then placed at the call's indentation
        spos = positions[stmt]
        first = spos.start.line - len(stmt.leading_lines)
        column = spos.start.column
        source = "".join(_dedent(line, column) for line in lines[first - 1:spos.end.line])
        parsed = cst.parse_module(source)  # the comment lines above the statement are its header
        node = parsed.body[0].visit(_Rename(renames))
        extra: dict[int, int] = {}  # line in `source` -> column change: `return x` became `target = x`
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Return):
            value = node.body[0].value  # type: ignore[union-attr]
            if value is None or _unused(value, site.targets) or (
                    site.targets is not None and _same(value, site.targets)):
                continue  # a bare call's names, or `acc, l_i = acc, l_i`: nothing to evaluate or assign
        if m.findall(node, m.Return()):
            located = MetadataWrapper(parsed.with_changes(body=[node]), unsafe_skip_copy=True)
            returns = _Returns(site.targets, located.resolve(PositionProvider))
            node = located.module.body[0].visit(returns)
            extra = returns.moved
        rendered = parsed.with_changes(body=[node]).code.splitlines(keepends=True)
        for i, text in enumerate(rendered):
            src_origin = origins[min(first + i, len(origins)) - 1]
            out_lines.append(indent + text if text.strip() else text)
            shift = src_origin.shift + column - len(indent) + extra.get(i + 1, 0)
            out_origins.append(Origin(src_origin.line, shift, name, call_line, copy_names))
    new_lines = lines[:start.line - 1] + out_lines + lines[end.line:]
    new_origins = origins[:start.line - 1] + out_origins + origins[end.line:]
    return "".join(new_lines), new_origins


def _bindings(body, name: str) -> int:
    """How many statements of ``body`` bind ``name``."""
    return sum(name in _bound(n) for n in m.findall(cst.IndentedBlock(body=body), m.Assign() | m.AugAssign()
                                                      | m.AnnAssign() | m.NamedExpr() | m.For()))


def _tail_returns(body) -> list[cst.Return]:
    """The ``return``s that end a block: its last statement, or the last of each branch of its last ``if``."""
    last = body[-1] if body else None
    if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Return):
        return [last.body[-1]]
    out: list[cst.Return] = []
    while isinstance(last, cst.If):
        out += _tail_returns(last.body.body)
        orelse = last.orelse
        if isinstance(orelse, cst.Else):
            out += _tail_returns(orelse.body.body)
        last = orelse if isinstance(orelse, cst.If) else None
    return out


def _always_returns(body) -> bool:
    """Whether every path through the block ends in a ``return``."""
    last = body[-1] if body else None
    if isinstance(last, cst.SimpleStatementLine):
        return isinstance(last.body[-1], cst.Return)
    if not isinstance(last, cst.If):
        return False
    if not _always_returns(last.body.body):
        return False
    orelse = last.orelse
    if isinstance(orelse, cst.Else):
        return _always_returns(orelse.body.body)
    return isinstance(orelse, cst.If) and _always_returns([orelse])


def _unused(value: cst.BaseExpression, targets: cst.BaseExpression | None) -> bool:
    """Whether a bare call's ``return value`` can be dropped: it calls nothing (a call may store or add)."""
    return targets is None and not m.findall(value, m.Call())


def _same(value: cst.BaseExpression, targets: cst.BaseExpression) -> bool:
    return code_of(value).replace(" ", "").strip("()") == code_of(targets).replace(" ", "").strip("()")


class _Returns(cst.CSTTransformer):
    """Each ``return x`` of an inlined body becomes the call's ``target = x`` (for a bare call ``x`` itself when it
    calls something, else ``pass``; ``pass`` when ``x`` is the targets themselves); ``moved`` maps its line to the
    column change."""

    def __init__(self, targets: cst.BaseExpression | None, positions):
        super().__init__()
        self.targets, self.positions, self.moved = targets, positions, {}

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        if not isinstance(original.body[-1], cst.Return):
            return updated
        value = updated.body[-1].value  # type: ignore[union-attr]
        if value is None or _unused(value, self.targets) or (self.targets is not None and _same(value, self.targets)):
            last: cst.BaseSmallStatement = cst.Pass()
        elif self.targets is None:  # a bare call still evaluates what it returns (`return tl.store(...)`)
            last = cst.Expr(value=value)
            line = self.positions[original.body[-1]].start.line
            self.moved[line] = len("return ")
        else:
            last = cst.Assign(targets=[cst.AssignTarget(self.targets)], value=value)
            line = self.positions[original.body[-1]].start.line
            self.moved[line] = len("return ") - len(f"{code_of(self.targets)} = ")
        return updated.with_changes(body=[*updated.body[:-1], last])


def _dedent(line: str, column: int) -> str:
    """``line`` with up to ``column`` leading spaces removed."""
    stripped = line.lstrip(" ")
    return line[min(column, len(line) - len(stripped)):]


def _fresh(name: str, taken: set[str], local_names: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``, ... : a name neither the kernel nor the helper uses yet; a helper's
    ``tlk_`` name becomes ``user_tlk_...`` (the rewrite's inserted names start with ``tlk_``, and one the kernel
    sets at its start is read long after)."""
    base = f"user_{name}" if name.startswith("tlk_") else name
    out, k = base, 2
    while out in taken or (out != name and out in local_names):
        out, k = f"{base}_{k}", k + 1
    taken.add(out)
    return out


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()
