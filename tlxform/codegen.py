"""Code generation: from rewrite plans to one ordinary, readable Triton module.

The generated module holds, in order: a header (source file, specs, source hash), the user's
imports, the definitions the kernels use (helper ``@triton.jit`` functions, constants), each
rewritten kernel, the partner kernels of the rules, and ``TILELINK_PLAN``: per kernel, its launch plan
(``LaunchPlan.as_dict``), the parameters the rewrite added and the partner kernels, to read.
It is deterministic: the same source and specs give the same text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pprint
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

import tilelink
from tilelink.analysis import Where, analyse, find_kernel, is_triton_jit, names_in, parse_source, reading_int_types
from tilelink.branches import AlikeBranches, alike_branches, anchored_outside
from tilelink.errors import AnnotationError
from tilelink.expanded import as_written, expanded_offsets, said_as_written, written_column
from tilelink.inline import inline_helpers
from tilelink.plan import Insertion, Report, ReportEntry, RewritePlan
from tilelink.rules import rule_of
from tilelink.spec import Options, Spec


@dataclass(frozen=True)
class Request:
    """One annotated kernel: its specs and options, and where the annotation is."""

    kernel: str
    specs: tuple[Spec, ...]
    options: Options
    line: int | None = None


@dataclass(frozen=True)
class GeneratedModule:
    """The output of code generation for one source file."""

    source_file: str
    source_hash: str
    text: str
    report: Report
    plans: tuple[RewritePlan, ...]
    originals: dict[str, str]  # kernel -> original source of the function
    rewritten: dict[str, str]  # kernel -> generated source of the function


def plan_kernel(module: cst.Module, file: str, request: Request, names_at=None) -> RewritePlan:
    """Analyse one kernel of the parsed ``module`` and ask its rule for a plan (``names_at``: the names an inlined
    helper's copy renamed, by line, for ``tile=``)."""
    if len(request.specs) != 1:
        raise AnnotationError(
            f"kernel {request.kernel!r} has {len(request.specs)} specs; this version rewrites one spec "
            f"per kernel", file=file, line=request.line,
            hint="gather several tensors together with all_gather((\"k_ptr\", \"v_ptr\")), or split the "
                 "kernel")
    spec = request.specs[0]
    rule = rule_of(spec.kind)
    tensors = {t: (spec.dim, spec.tile, spec.size, spec.index) for t in spec.tensors}
    an = analyse(module, file, request.kernel, tensors, names_at, read_only=spec.kind if rule.read_only else None)
    for key in ("index", "topk"):  # names the launch and the inserted code read as the kernel's arguments
        name = getattr(spec, key, None)
        if name is not None and name not in an.params:
            raise AnnotationError(
                f"{key}={name!r} names no parameter of {request.kernel!r}: each call's "
                f"{'index' if key == 'index' else 'count of slots per token'} is read from the argument it names",
                file=file, line=request.line, hint=(
                    f"name one of its parameters ({', '.join(an.params)})" + (
                        ", or leave topk= out where each token has one row" if key == "topk" else "")))
    # the count of slots a token has is an int: a pointer the kernel loads through is the wrong parameter (each
    # call would be refused, its address read as a count)
    topk = getattr(spec, "topk", None)
    if topk is not None and topk in _addressed(find_kernel(module, request.kernel), an):
        raise AnnotationError(f"topk={topk!r} of {request.kernel!r} is a pointer the kernel loads through: "
                              f"topk= names the int parameter holding the count of slots of one token",
                              file=file, line=request.line,
                              hint="pass topk= the int parameter (vLLM's `top_k`), or leave topk= out where each "
                                   "token has one row")
    with reading_int_types(an.int_types):
        plan = rule.rewrite_module().rewrite(an, spec, request.options)
    # the row facts the launch checks at each call with more than one rank, from the analysis the rule read
    plan = dataclasses.replace(plan, launch=dataclasses.replace(
        plan.launch, row_scales=tuple(sorted({(t, f, at.line) for t, f, at in an.row_scales})),
        row_shifts=tuple((t, terms, at.line) for t, terms, at in an.row_shifts),
        row_signs=tuple(dict.fromkeys((name, at.line) for name, at in an.row_signs)),
        row_steps=tuple(sorted({(t, f, v, at.line) for t, f, v, at in an.row_steps})),
        row_starts=tuple(dict.fromkeys((v, at.line) for v, at in an.row_starts)),
        row_bounds=tuple(sorted({(t, terms, s, at.line) for t, terms, s, at in an.row_bounds})),
        # the rule's own (a reduction's loop of whole blocks: each rank's K a whole number of its steps) kept
        row_multiples=tuple(dict.fromkeys(plan.launch.row_multiples + tuple(
            (f, d, test, at.line) for f, d, test, at in an.row_multiples))),
        column_ends=tuple(dict.fromkeys((v, b, s, test, at.line) for v, b, s, test, at in an.column_ends))))
    notes = tuple(ReportEntry(
        an.name, plan.rule, "note", f"the loop at line {at.line} runs without warp specialisation: its partitions "
        "would run different code, while TileLink's waits and notifies synchronise every thread of the program "
        "(software pipelining stays)", at) for at in an.warp_specialized)
    return dataclasses.replace(plan, report=plan.report + notes) if notes else plan


def _addressed(fn: cst.FunctionDef | None, an) -> set[str]:
    """The kernel's parameters a `tl.load` or `tl.store` address starts from: the first term of the sum the address
    is, through locals bound once (`ptrs = idx_ptr + offs`, then `tl.load(ptrs)`). An int added after it (`ptr + top_k`)
    is not one, nor is a constexpr parameter."""
    found: set[str] = set()
    if fn is None:
        return found

    def base(node: cst.BaseExpression, depth: int) -> None:
        while True:
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
                node = node.left
            elif isinstance(node, cst.Subscript):  # `ptrs[:, None]`
                node = node.value
            else:
                break
        if not isinstance(node, cst.Name):
            return
        if node.value in an.params:
            if node.value not in an.constexpr_params:
                found.add(node.value)
        elif depth < 8 and len(an.values.get(node.value, ())) == 1 and node.value not in an.rebound:
            base(cst.parse_expression(an.values[node.value][0]), depth + 1)

    for call in m.findall(fn.body, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("load") | m.Name(
            "store")))):
        pointer = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "pointer"),
                       call.args[0].value if call.args and call.args[0].keyword is None else None)
        if pointer is not None:
            base(pointer, 0)
    return found


def _planned(inlined, module: cst.Module, view: cst.Module, expanded: dict[str, str], file: str,
             request: Request) -> RewritePlan:
    """The plan of ``request`` made on ``view`` (``module`` with the offsets ``expanded`` read as vectors), its
    insertions as they read in ``module`` (``expanded.as_written``), noted in its report; made on ``module`` instead
    where that refuses (whose refusal is then the view's, which read further) or inserts code that reads those offsets
    as the vectors. ``inlined``: the positions' way back to the user's file."""
    def on(m_: cst.Module) -> RewritePlan:
        return (dataclasses.replace(inlined, module=m_) if m_ is not inlined.module else inlined).planned(
            plan_kernel, file, request)

    if not expanded:
        return on(module)
    try:
        plan = on(view)
    except AnnotationError as refused:
        try:
            return on(module)
        except AnnotationError:  # the view reads further: its reason is the one that stands, said of the kernel
            column = written_column(view, refused.line, refused.column, expanded) if inlined.origins is None else None
            raise AnnotationError(said_as_written(refused.reason, expanded), file=refused.file, line=refused.line,
                                  column=column, hint=said_as_written(refused.hint, expanded)) from None
    written = [as_written(ins.lines, expanded) for ins in plan.insertions]
    if any(lines is None for lines in written):
        return on(module)
    names = ", ".join(f"`{n}` (`{axis}`)" for n, axis in sorted(expanded.items()))
    note = ReportEntry(plan.kernel, plan.rule, "note", f"the offsets {names}, broadcast where bound (`tl.arange(0, "
                       f"B)[:, None]`), read as the vector and that subscript at each use")
    insertions = tuple(dataclasses.replace(ins, lines=lines) for ins, lines in zip(plan.insertions, written,
                                                                                   strict=True))
    return dataclasses.replace(plan, insertions=insertions, report=plan.report + (note,))


def _alike_checked(plan: RewritePlan, alike: AlikeBranches, inlined, file: str) -> RewritePlan:
    """``plan``, made on the module that reads each ``if`` of ``alike`` as one binding, for the module the user wrote:
    refused where it inserts inside such an ``if`` (its code would go into one side only), else with a note per
    ``if`` read so, and the parameters a dropped cast took as ints in its launch plan (``int_params``: each call with
    peers refuses a float there)."""
    insertions, inside = anchored_outside(alike, plan.insertions)
    if inside:
        _ins, region = inside[0]
        raise inlined.user_error(AnnotationError(
            f"TileLink would insert its code between the statements of a side of the `if {region.test}` at line "
            f"{region.first}, whose sides bind the same values (up to casts to int64) and which it read as that one "
            f"binding: the code would be on one side only",
            file=file, line=region.first, column=region.column,
            hint="write what the sides share once, outside the `if`, and keep only the casts under it "
                 "(`r = tl.program_id(0)`, then `if WIDE: r = r.to(tl.int64)`), or write one side"))
    notes = tuple(ReportEntry(plan.kernel, plan.rule, "note", f"the `if {r.test}` at line "
                              f"{inlined.user_line(r.first)} binds the same values on both sides (up to casts to "
                              f"int64): read as one binding, both sides kept", Where(file, inlined.user_line(r.first),
                                                                                    r.column))
                  for r in alike.regions)
    ints = tuple(dict.fromkeys((name, inlined.user_line(r.first)) for r in alike.regions for name in r.ints))
    launch = dataclasses.replace(plan.launch, int_params=plan.launch.int_params + ints) if ints else plan.launch
    # code moved out of an `if` is reported where it goes: before or after the whole `if`, not at the side's line
    moved = {(inlined.user_line(was.anchor.line), was.position): region for was, now in zip(
        plan.insertions, insertions, strict=True) if now.anchor.line != was.anchor.line
        for region in alike.regions if region.first == now.anchor.line}
    report = tuple(_said_of_the_if(entry, moved, inlined, file) for entry in plan.report)
    return dataclasses.replace(plan, insertions=insertions, report=report + notes, launch=launch)


def _said_of_the_if(entry: ReportEntry, moved: dict, inlined, file: str) -> ReportEntry:
    """``entry`` of code inserted before or after line L, said of the ``if`` the code moved before or after."""
    for (line, position), region in moved.items():
        said = f"{position} line {line}"
        if entry.where is not None and entry.where.line == line and said in entry.message:
            first = inlined.user_line(region.first)
            message = entry.message.replace(said, f"{position} the `if {region.test}` at line {first}")
            return dataclasses.replace(entry, message=message, where=Where(file, first, region.column))
    return entry


def source_hash(source: str, requests: list[Request]) -> str:
    h = hashlib.sha256()
    h.update(source.encode())
    for r in requests:
        h.update(repr((r.kernel, [s.describe() for s in r.specs], r.options)).encode())
    h.update(tilelink.__version__.encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------- kernel rewriting
class _Rewriter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, kernel: str, plan: RewritePlan):
        super().__init__()
        self.kernel, self.plan = kernel, plan
        self.before: dict[tuple[int, int], list[cst.BaseStatement]] = {}
        self.after: dict[tuple[int, int], list[cst.BaseStatement]] = {}
        # comment lines inserted alone before a statement: they lead the first statement put there
        self.notes: dict[tuple[int, int], list[cst.EmptyLine]] = {}
        for ins in plan.insertions:
            key = (ins.anchor.line, ins.anchor.column)
            if ins.position == "before" and all(line.lstrip().startswith("#") for line in ins.lines):
                self.notes.setdefault(key, []).extend(
                    cst.EmptyLine(indent=True, comment=cst.Comment(line.strip())) for line in ins.lines)
                continue
            target = self.before if ins.position == "before" else self.after
            target.setdefault(key, []).extend(_statements(ins))
        self.inside = 0
        self.used: set[tuple[int, int]] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if node.name.value == self.kernel:
            self.inside += 1
        return True

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if original.name.value != self.kernel:
            return updated
        self.inside -= 1
        params = list(updated.params.params)
        existing = {p.name.value for p in params}
        clash = existing & set(self.plan.extra_params)
        if clash:
            raise AnnotationError(f"kernel {self.kernel!r} already has parameters named {sorted(clash)}",
                                  hint="rename them: TileLink reserves the tlk_ prefix")
        first_default = next((i for i, p in enumerate(params) if p.default is not None), len(params))
        indent = " " * (len("def ") + len(self.kernel) + 1)
        for p in params:  # a signature with a parameter a line: the new ones go under the kernel's own
            after = p.comma.whitespace_after if isinstance(p.comma, cst.Comma) else None
            if isinstance(after, cst.ParenthesizedWhitespace):
                indent = after.last_line.value
                break
        new = [cst.Param(cst.Name(p)) for p in self.plan.extra_params]

        def break_after(param: cst.Param, comment: str | None = None) -> cst.Param:
            # the parameter's comma ends its line (with ``comment``); the next one starts under the first
            trailing = (cst.TrailingWhitespace() if comment is None else
                        cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment)))
            return param.with_changes(comma=cst.Comma(whitespace_after=cst.ParenthesizedWhitespace(
                first_line=trailing, indent=False, last_line=cst.SimpleWhitespace(indent))))

        for i in range(4, len(new) - 1, 5):  # five channel parameters a line
            new[i] = break_after(new[i])
        if first_default > 0:  # the channel parameters start on a line of their own
            last = params[first_default - 1]
            if not isinstance(last.comma, cst.Comma) and isinstance(last.whitespace_after_param,
                                                                     cst.ParenthesizedWhitespace):
                # the last parameter's own comment (no comma before it): it moves behind the comma we add
                last = last.with_changes(comma=cst.Comma(whitespace_after=last.whitespace_after_param),
                                         whitespace_after_param=cst.SimpleWhitespace(""))
            kept = last.comma.whitespace_after if isinstance(last.comma, cst.Comma) else None
            if isinstance(kept, cst.ParenthesizedWhitespace) and kept.first_line.comment is not None:
                # the user's comment stays on its line; ours goes on a line of its own under it
                ours = cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(indent),
                                     comment=cst.Comment("# added by TileLink:"))
                params[first_default - 1] = last.with_changes(comma=last.comma.with_changes(
                    whitespace_after=kept.with_changes(empty_lines=[*kept.empty_lines, ours], indent=False,
                                                       last_line=cst.SimpleWhitespace(indent))))
            else:
                params[first_default - 1] = break_after(last, "# added by TileLink:")
        if first_default < len(params):  # the kernel's own defaulted parameters go on a line of their own
            new[-1] = break_after(new[-1])
        params = params[:first_default] + new + params[first_default:]
        decorators = [_jit_decorator(d, self.plan.extra_params) if is_triton_jit(d) else d
                      for d in updated.decorators if not _is_overlap(d)]
        return updated.with_changes(params=updated.params.with_changes(params=params), decorators=decorators)

    def _splice(self, original_body, updated_body):
        out: list[cst.BaseStatement] = []
        for orig, upd in zip(original_body, updated_body, strict=True):
            pos = self.get_metadata(PositionProvider, orig).start
            key = (pos.line, pos.column + 1)
            if key in self.notes:
                self.used.add(key)
                upd = upd.with_changes(leading_lines=[*upd.leading_lines, *self.notes[key]])
            if key in self.before:
                stmts = self.before[key]
                # keep the user's comments above their statement, ours go between
                out.extend(stmts[:1] and [stmts[0].with_changes(leading_lines=list(upd.leading_lines)
                                                                + list(stmts[0].leading_lines))])
                out.extend(stmts[1:])
                upd = upd.with_changes(leading_lines=[])
                self.used.add(key)
            out.append(upd)
            if key in self.after:
                out.extend(self.after[key])
                self.used.add(key)
        return out

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if self.inside and m.matches(original.func, m.Attribute(value=m.Name("tl"), attr=m.Name("range"))):
            args = [a for a in updated.args if not (a.keyword is not None and a.keyword.value == "warp_specialize")]
            if len(args) != len(updated.args):  # see plan_kernel: the rewritten loop is not warp-specialised
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                return updated.with_changes(args=args)
        return updated

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock):
        if not self.inside:
            return updated
        return updated.with_changes(body=self._splice(original.body, updated.body))

    def leave_SimpleStatementSuite(self, original: cst.SimpleStatementSuite, updated: cst.SimpleStatementSuite):
        # a line of its own cannot go inside `if ACT: acc = f(acc)`: a suite with an insertion becomes an
        # indented block of one statement a line
        if not self.inside or not any(self._key(s) in self.before or self._key(s) in self.after
                                      or self._key(s) in self.notes for s in original.body):
            return updated
        lines = [cst.SimpleStatementLine([s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]) for s in updated.body]
        body = []
        for orig, line in zip(original.body, lines, strict=True):
            key = self._key(orig)
            line = line.with_changes(leading_lines=self.notes.get(key, []))
            body += self.before.get(key, []) + [line] + self.after.get(key, [])
            if key in self.before or key in self.after or key in self.notes:
                self.used.add(key)
        return cst.IndentedBlock(body=body, header=updated.trailing_whitespace)

    def _key(self, node: cst.CSTNode) -> tuple[int, int]:
        pos = self.get_metadata(PositionProvider, node).start
        return pos.line, pos.column + 1


def _statements(ins: Insertion) -> list[cst.BaseStatement]:
    # a leading statement makes the comment lines belong to the first inserted statement
    text = "pass\n" + "\n".join(ins.lines) + "\n"
    return list(cst.parse_module(text).body)[1:]


def _is_overlap(d: cst.Decorator) -> bool:
    node = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
    return m.matches(node, m.Attribute(attr=m.Name("overlap")) | m.Name("overlap"))


def _jit_decorator(d: cst.Decorator, extra: tuple[str, ...]) -> cst.Decorator:
    """``@triton.jit`` -> ``@triton.jit(do_not_specialize=[...])``: the channel scalars change
    between calls (the epoch) and must not trigger a recompilation while another kernel spins. A
    ``do_not_specialize`` the kernel already had is kept: its entries come first (a literal list or tuple
    is extended; any other expression is unpacked into the new list)."""
    names = [p for p in extra if p not in ("tlk_barriers", "tlk_diag")]
    quoted = [f'"{n}"' for n in names]
    theirs: list[str] = []
    if isinstance(d.decorator, cst.Call):
        for a in d.decorator.args:
            if a.keyword and a.keyword.value == "do_not_specialize":
                if isinstance(a.value, (cst.List, cst.Tuple)):
                    theirs = [cst.Module([]).code_for_node(e.value) for e in a.value.elements]
                else:
                    theirs = [f"*{cst.Module([]).code_for_node(a.value)}"]
    entries = theirs + [q for q in quoted if q not in theirs]
    rows = [", ".join(entries[i:i + 4]) for i in range(0, len(entries), 4)]
    value = cst.parse_expression("[\n    " + ",\n    ".join(rows) + ",\n]")
    arg = cst.Arg(value=value, keyword=cst.Name("do_not_specialize"),
                  equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                        whitespace_after=cst.SimpleWhitespace("")))
    if isinstance(d.decorator, cst.Call):
        args = [a for a in d.decorator.args if not (a.keyword and a.keyword.value == "do_not_specialize")]
        return d.with_changes(decorator=d.decorator.with_changes(args=[*args, arg]))
    return d.with_changes(decorator=cst.Call(func=d.decorator, args=[arg]))


# ----------------------------------------------------------------------------- module assembly
def _top_level_definitions(module: cst.Module) -> dict[str, cst.CSTNode]:
    defs: dict[str, cst.CSTNode] = {}
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            defs[stmt.name.value] = stmt
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Assign, cst.AnnAssign)):
                    targets = ([t.target for t in small.targets] if isinstance(small, cst.Assign)
                               else [small.target])
                    for t in targets:
                        if isinstance(t, cst.Name):
                            defs[t.value] = stmt
    return defs


def _imports(module: cst.Module) -> list[cst.CSTNode]:
    return [s for s in module.body if isinstance(s, cst.SimpleStatementLine)
            and all(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
            and not any(isinstance(x, cst.ImportFrom) and isinstance(x.module, cst.Name)
                        and x.module.value == "__future__" for x in s.body)]


def _code(module: cst.Module, node: cst.CSTNode) -> str:
    return module.code_for_node(node).strip("\n")


def generate(source: str, file: str, requests: list[Request]) -> GeneratedModule:
    """Rewrite every requested kernel of ``source`` and assemble the generated module."""
    if not requests:
        raise AnnotationError("no @tilelink.overlap kernels in this file", file=file, line=None,
                              hint="annotate a @triton.jit kernel with @tilelink.overlap(tilelink.all_gather(...))")
    module = parse_source(source, file)
    plans: list[RewritePlan] = []
    originals: dict[str, str] = {}
    rewritten: dict[str, str] = {}
    partners: dict[tuple[str, str], str] = {}  # (rule, name) -> partner kernel's source, in first-use order
    used_names: set[str] = set()
    for req in requests:
        # helpers that receive an annotated tensor are inlined: the analysis and the rewrite see their accesses
        inlined = inline_helpers(module, file, req.kernel, [t for s in req.specs for t in s.tensors])
        # an `if` whose sides bind the same values is read as that one binding, offsets broadcast where bound as the
        # vector and its subscript at each use; the module written keeps what the user wrote
        alike = alike_branches(inlined.module, req.kernel)
        view, expanded = expanded_offsets(alike.module, req.kernel)
        plan = _planned(inlined, alike.module, view, expanded, file, req)
        if alike.regions:
            plan = _alike_checked(plan, alike, inlined, file)
        launch = plan.launch  # the row facts at the user's lines (an inlined helper's, inside the helper)
        plan = dataclasses.replace(plan, launch=dataclasses.replace(
            launch, row_scales=tuple(sorted({(t, f, inlined.user_line(line)) for t, f, line in launch.row_scales})),
            row_shifts=tuple((t, terms, inlined.user_line(line)) for t, terms, line in launch.row_shifts),
            row_signs=tuple(dict.fromkeys((name, inlined.user_line(line)) for name, line in launch.row_signs)),
            row_steps=tuple(sorted({(t, f, v, inlined.user_line(line)) for t, f, v, line in launch.row_steps})),
            row_starts=tuple(dict.fromkeys((v, inlined.user_line(line)) for v, line in launch.row_starts)),
            row_bounds=tuple(sorted({(t, terms, s, inlined.user_line(line))
                                     for t, terms, s, line in launch.row_bounds})),
            row_multiples=tuple(dict.fromkeys((f, d, test, inlined.user_line(line))
                                              for f, d, test, line in launch.row_multiples)),
            column_ends=tuple(dict.fromkeys((v, b, s, test, inlined.user_line(line))
                                            for v, b, s, test, line in launch.column_ends)),
            rotations=tuple(dict.fromkeys((*e[:4], inlined.user_line(e[4]), *e[5:]) for e in launch.rotations)),
            **({"stored_tiles": tuple(dict.fromkeys((*e[:5], inlined.user_line(e[5]), *e[6:])
                                                    for e in launch.stored_tiles))}
               if hasattr(launch, "stored_tiles") else {})))
        plans.append(plan)
        rewriter = _Rewriter(req.kernel, plan)
        new_module = MetadataWrapper(inlined.module, unsafe_skip_copy=True).visit(rewriter)
        missing = {(i.anchor.line, i.anchor.column) for i in plan.insertions} - rewriter.used
        if missing:  # a rule asked for an anchor that is not a statement: a bug, not a user error
            raise AssertionError(f"internal: insertion anchors not found in {req.kernel}: {sorted(missing)}")
        new_fn = find_kernel(new_module, req.kernel)
        originals[req.kernel] = _code(module, find_kernel(module, req.kernel))
        rewritten[req.kernel] = _code(new_module, new_fn)
        used_names |= names_in(new_fn)
        for name in plan.partner_kernels:
            if (plan.rule, name) not in partners:  # read from the rule's file: importing it would load torch
                partners[(plan.rule, name)] = rule_of(plan.rule).kernel_source(name)
    # definitions the kernels rely on, transitively, in source order
    defs = _top_level_definitions(module)
    annotated = {r.kernel for r in requests}
    needed: set[str] = set()
    frontier = [n for n in used_names if n in defs and n not in annotated]
    while frontier:
        name = frontier.pop()
        if name in needed:
            continue
        needed.add(name)
        frontier.extend(n for n in names_in(defs[name]) if n in defs and n not in needed and n not in annotated)
    needed_nodes = {id(defs[n]) for n in needed}
    support = [_code(module, stmt) for stmt in module.body if id(stmt) in needed_nodes]
    imports = [_code(module, s) for s in _imports(module)]
    for line in ("import triton", "import triton.language as tl", "import tilelink.language as tll",
                 "import tilelink.mapping as tlm"):
        if line not in imports:
            imports.append(line)
    partner_sources = list(partners.values())
    digest = source_hash(source, requests)
    plan_meta = {p.kernel: {**p.launch.as_dict(), "extra_params": list(p.extra_params),
                            "partner_kernels": list(p.partner_kernels)} for p in plans}
    header = [
        f"# Generated by TileLink {tilelink.__version__} from {file} -- do not edit.",
        f"# Regenerate with: tlxform build {file}",
        f"# source sha256: {digest}",
    ]
    for req, plan in zip(requests, plans, strict=True):
        chosen = ", ".join(f"{k}={v!r}" for k, v in vars(plan.options).items() if v is not None)
        header.append(f"# kernel {req.kernel}: {', '.join(s.describe() for s in req.specs)}; {chosen}")
    parts = ["\n".join(header), '"""Overlapped kernels generated by TileLink (see the header)."""',
             "\n".join(imports)]
    if support:
        parts.append("\n\n\n".join(support))
    parts.append("\n\n\n".join(rewritten.values()))
    if partner_sources:
        parts.append("# " + "-" * 76 + "\n# partner kernels of the rules\n\n\n" + "\n\n\n".join(partner_sources))
    parts.append("TILELINK_PLAN = " + pprint.pformat(plan_meta, width=100, sort_dicts=True))
    text = "\n\n\n".join(parts) + "\n"
    cst.parse_module(text)  # the generated module must at least parse
    report = Report(tuple(entry for plan in plans for entry in plan.report))
    return GeneratedModule(file, digest, text, report, tuple(plans), originals, rewritten)
