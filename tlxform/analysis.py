"""Analysis of a user's Triton kernel: what the rewriter needs to know before it changes anything.

Input: the module source (LibCST) and the name of an annotated kernel. Output: a frozen
:class:`KernelAnalysis` with the kernel's parameters, every load from / store to each annotated
tensor (through aliases such as ``a_ptrs = a_ptr + ...``, ``+=`` advances and tensor descriptors),
and the tile each access touches along the communicated dimension. No stage after this one looks at
the user's source again except through what is recorded here.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from tilelink.errors import AnnotationError
from tilelink.helper_sources import imported_helpers
from tilelink.node_index import find_in, index_of


# ----------------------------------------------------------------------------- small data types
@dataclass(frozen=True)
class Where:
    """A position in the user's file (1-based line and column)."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Tile:
    """A tile along the communicated dimension: rows ``[start, start + size)``.

    ``start`` and ``size`` are source expressions valid at the insertion point; ``offsets`` is the
    name of the 1-D offsets vector (``offs_am``) when the tile was inferred from one; ``size_param``
    the kernel parameter bounding the dimension (``M``) when it could be found.
    """

    start: str
    size: str
    offsets: str | None
    size_param: str | None
    pid: str | None  # the program-id variable of `start = pid * size`, for tile-order remapping
    defined_at: Where
    ndim: int = 2  # rank of the accessed tile: 1 for `ptr + offs`, 2 for `ptr + offs[:, None] ...`
    dynamic: bool = False  # rows come from a run-time index: ``start`` is the 1-D vector of source rows
    wraps: bool = False  # rows past the end wrap to the first rows (``(start + tl.arange(0, size)) % M``)


@dataclass(frozen=True)
class Access:
    """One load from or store to an annotated tensor."""

    kind: str  # "load" | "store"
    tensor: str  # the annotated parameter
    pointer: str  # source of the pointer / descriptor expression
    descriptor: bool
    where: Where
    value: str | None = None  # stored value (stores)
    mask: str | None = None  # mask= source, if any
    tile: Tile | None = None
    anchor: Where | None = None  # the statement, at the tile's block level, that holds the access
    anchor_is_access: bool = False  # the anchor statement is the access itself (a plain statement)
    earlier_aliases: tuple[str, ...] = ()  # pointer aliases assigned before the anchor, used after it
    offsets: str | None = None  # a descriptor access's offsets list (``[pid_m * BLOCK_M, pid_n * BLOCK_N]``)
    loop: Where | None = None  # the `for` statement whose body holds the anchor (a tile loop), if any
    # the anchor is a `for` loop whose body holds the access as a statement of its own, and the loop assigns
    # neither the tile's offsets nor a name of its start: the loop sweeps other dimensions (columns) of the
    # same rows
    swept: bool = False
    branch: Where | None = None  # a store anchored inside the branches of this `if` (see _through_branches)
    atomic: bool = False  # a store that adds: ``tl.atomic_add(ptrs, value, mask=...)`` (a split-K write-back)
    #: the store's line is one of plain statements, the store inside an expression of it that may skip it
    #: (`tl.store(...) if c else None`) or followed on it by a `return`
    in_expression: bool = False


@dataclass(frozen=True)
class BranchSide:
    """One side of an ``if`` around a statement; an ``elif`` is an ``if`` of its own on the ``else`` side of the one
    before it."""

    test: str  # the `if`'s test, in source
    where: Where  # the `if` (or `elif`)
    body: bool  # the side taken when the test holds; False: the `else` side
    first: Where | None  # the side's first statement; None for an `else` side that is an `elif`
    # the test is decided at compile time (constexpr parameters and locals, literals, comparisons and boolean and
    # arithmetic operators of them): Triton's code generator compiles only the side it takes, and the interpreter,
    # running plain Python, executes only that side too
    static: bool


@dataclass(frozen=True)
class KernelAnalysis:
    """Everything the rules need about one kernel."""

    name: str
    file: str
    params: tuple[str, ...]
    constexpr_params: tuple[str, ...]
    aliases: dict[str, tuple[str, ...]]  # annotated tensor -> alias variable names (incl. itself)
    accesses: tuple[Access, ...]
    where: Where
    assignments: dict[str, tuple[Where, ...]]  # variable -> statements assigning it, in order
    values: dict[str, tuple[str, ...]]  # variable -> source of each value assigned to it, in order
    # variables also bound other than by `name = value` (`+=`, a `for` target, `:=`): their values are
    # not all in `values`
    rebound: frozenset[str] = frozenset()
    # variable -> every statement that binds it (``=``, ``+=``, ``:``, ``:=``, a ``for`` target), in order: its
    # start, and for a ``for`` loop the end of the loop too (the target holds an iteration's value inside it)
    bindings: dict[str, tuple[tuple[Where, Where | None], ...]] = field(default_factory=dict)
    # the `tl.range(..., warp_specialize=...)` loops: the rewrite runs them without warp specialisation
    warp_specialized: tuple[Where, ...] = ()
    # variable -> each in-place update `x op= v`, as the source `x op (v)`
    updates: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # each `return` of the kernel, with the tests of the `if` / `while` statements around it (what decides it)
    returns: tuple[tuple[Where, tuple[str, ...]], ...] = ()
    # each pointer access's rows scale: (tensor, the factors its offsets vector is multiplied by in the address, each
    # an int literal or a parameter (none: `x_ptr + offs`), the access); the launcher checks that their product is the
    # row stride of the buffer the rewritten kernel reads or writes, since the wait or notify covers rows `offs`
    row_scales: tuple[tuple[str, tuple[str, ...], Where], ...] = ()
    # each pointer access whose other scalar terms are int literals and parameters (`x_ptr + offs[:, None] * stride_xm
    # + cols[None, :] + D`): (tensor, the terms as (subtracted, factors), the access). Their sum must stay within one
    # row (0 <= sum < the row stride), which the launcher checks: `+ D` on a (M, D) tensor reads the next row. Along an
    # inner dim, the sum may also step along the dims before the rows (by multiples of their stride), not across rows
    row_shifts: tuple[tuple[str, tuple[tuple[bool, tuple[str, ...]], ...], Where], ...] = ()
    # the source of every expression the kernel evaluates other than an assignment's value (`tl.store(y_ptr + o, x)`,
    # an `if` test, a loop's range as `(target := range)`, an in-place update's value), with where it is: what reads a
    # program id there
    effects: tuple[tuple[str, Where], ...] = ()
    # the `if` sides around each statement that binds a name (an assignment's line, an in-place update), outermost
    # first: what the epilogue check of a reduction needs to tell a branch Triton compiles only on some launches
    branch_sides: dict[Where, tuple[BranchSide, ...]] = field(default_factory=dict)
    # variable -> where each of its in-place updates is, in the order of `updates`
    update_sites: dict[str, tuple[Where, ...]] = field(default_factory=dict)
    # each parameter a `tile=` proof read, with the load it proved (`tlxform/tile_rows.py`): (parameter, the load). The
    # proof takes every name as non-negative, so the launcher refuses a call that passes one of them a negative int
    row_signs: tuple[tuple[str, Where], ...] = ()
    # each pointer access whose rows lie along an inner dim and whose address adds a value the kernel computes times
    # factors the launch reads (`b * stride_xb`, `b = tl.program_id(1)`): (tensor, the factors, the value in source
    # over program ids and parameters, `-(...)` where subtracted, the access). Their product must be a multiple of the
    # gathered buffer's stride of the dim before the rows (the full size along the rows times a row's elements), which
    # the launcher checks; else the term moves the rows along the annotated dim. In a sequence-major buffer (its dims
    # before the rows all of size 1) the launcher bounds the value from the grid instead
    row_steps: tuple[tuple[str, tuple[str, ...], str, Where], ...] = ()
    # each column vector that starts at a program's position whose sign its form does not tell (`(pid_n - 1) *
    # BLOCK_N`, a grouped `pid_n` divided by a group size the kernel computes): (the position in source over program
    # ids and parameters, the access). Masked from above only, such columns start in the row before where the
    # position is negative: the launcher bounds it from the grid and refuses a call where it can be
    row_starts: tuple[tuple[str, Where], ...] = ()
    # each pointer advanced in a loop in the matmul form (`_check_advance_in_loop`), whose mask bounds the columns by
    # `X - k * F`: (tensor, X's terms as (subtracted, factors), the column stride parameter the advance steps by, the
    # access). The columns [0, X) must lie in one row (X times the column stride at most the row stride), which the
    # launcher checks: `offs_k[None, :] < D + BLOCK_D - k * BLOCK_D` reads the next row
    row_bounds: tuple[tuple[str, tuple[tuple[bool, tuple[str, ...]], ...], str, Where], ...] = ()
    # each divisibility fact a `tile=` proof took (`tlxform/tile_rows.py`): (the factors of the dividend, parameters,
    # the divisor, a parameter or an int literal, the compile-time test under which the load runs, "" when it always
    # may, the load). Blocks of `BLOCK_N` rows stepping from a chunk's first row stay in the chunk only when
    # `KV_CHUNK % BLOCK_N == 0`: the launcher checks the fact on each call that takes the test
    row_multiples: tuple[tuple[tuple[str, ...], str, str, Where], ...] = ()
    # each unmasked walk of whole blocks whose columns start past 0 (`rk = pid_z * BLOCK_K + tl.arange(0, BLOCK_K)`,
    # stepping by `BLOCK_K * SPLIT_K`): (the start in source over program ids and parameters, the block's factors,
    # the step's factors, the compile-time test under which the load runs, "" when it always may, the load). The
    # launch checks `start + block <= step` over the grid
    column_ends: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str, Where], ...] = ()
    # each top-level @triton.jit function of the kernel's file other than the kernel, and each one the file imports by
    # name from a module TileLink finds (`tilelink/helper_sources.py`) -> its source: what a helper the kernel calls
    # computes (the tile-order rotation reads a tile mapping's helper)
    helpers: dict[str, str] = field(default_factory=dict)
    # the kernel's locals bound once to a 32- or 64-bit int type (`INDEX_DTYPE: tl.constexpr = tl.int32`): what the
    # rules read a cast of a `tl.arange` to as the same values, within :func:`reading_int_types`
    int_types: frozenset[str] = frozenset()
    # each statement that unpacks a value into a flat tuple of names (`pid_m, pid_n = tile_of(...)`) -> the names, in
    # order: which of a helper's returned values each one gets
    unpacked: dict[Where, tuple[str, ...]] = field(default_factory=dict)
    # each statement -> the first and last position of the innermost block that holds it (the kernel's body, a loop's
    # or a branch's): a statement there runs before every later one of that block on the same pass (the tile-order
    # rotation reads which value of a variable a later statement sees)
    blocks: dict[Where, tuple[Where, Where]] = field(default_factory=dict)
    # ``written_out(source, at)``: the kernel's expression ``source`` written out at ``at`` over program ids, the
    # arguments as passed and literals (a loop's target as ``tl.range(a, b, step)``), for the launch to evaluate over
    # the grid; ``None`` where it reads anything else (:func:`launch_value`)
    written_out: Callable[[str, Where], str | None] | None = field(default=None, compare=False, repr=False)
    # ``launch_test(at)``: the test, over the kernel's parameters, that a launch compiles the statement at ``at``
    # (the compile-time `if` sides around it, its constexpr locals written out; "" where every launch does)
    launch_test: Callable[[Where], str] | None = field(default=None, compare=False, repr=False)
    # each `while` loop: where it starts and ends (a store inside one runs as often as the loop does, which TileLink
    # cannot count)
    while_loops: tuple[tuple[Where, Where], ...] = ()
    # the body's first statement after the docstring: what runs once per program before anything else (a value
    # fixed for the launch that every wait needs is read there once)
    body_first: Where | None = None
    # each name bound more than once that a store's address or mask reads, at that store: the assignment that reaches
    # it where every read of the name the address rests on follows it (``_reaching_every_read``), as (its value in
    # source, where it is): `rn` made again after the K loop, for the output's columns
    reaching_at_stores: dict[tuple[str, Where], tuple[str, Where]] = field(default_factory=dict)
    # each parameter a `@triton.heuristics` decorator computes at the launch -> (the decorator, the arguments its
    # function reads by name, ``None`` where TileLink cannot tell which: a function it does not see, or `args` read
    # otherwise than as `args['K']`). A parameter not in a dict literal is keyed ``"*"``: any constexpr may be one.
    # A value computed from the rank's own K slice is the rank's own (a reduction's epilogue must not read it)
    computed: dict[str, tuple[Where, frozenset[str] | None]] = field(default_factory=dict)
    # each load read as one row a program's (`row * stride` beside a columns vector) that TileLink refused -> why
    row_program_misses: dict[Where, str] = field(default_factory=dict)
    # each store directly in the body of a loop that keeps its rows, whose iterations TileLink cannot tell store other
    # columns than each other -> (the loop, why: "exits", a step may leave before its store; "same", the loop does not
    # move the columns; "columns", they move otherwise than by whole blocks of their own, bound once before the store)
    sweep_misses: dict[Where, tuple[Where, str]] = field(default_factory=dict)
    # each store read as one row a program (`y_ptr + row * stride + cols`): (the columns vector, the bound its mask
    # puts on them in source): its tile is that row, the columns the mask lets through the elements it writes of it
    row_columns: dict[Where, tuple[str, str]] = field(default_factory=dict)

    def accesses_of(self, tensor: str, kind: str) -> list[Access]:
        return [a for a in self.accesses if a.tensor == tensor and a.kind == kind]

    def index_behind(self, access: Access) -> tuple[str, str] | None:
        """``(name, parameter)`` when the address of ``access`` depends on a name whose value is loaded from a
        parameter (``offs_token = tl.load(sorted_token_ids_ptr + ...)``): its rows come from a run-time index."""
        todo, seen = [access.pointer], set()
        while todo:
            for name in names_in(cst.parse_expression(todo.pop())):
                if name in seen:
                    continue
                seen.add(name)
                for value in self.values.get(name, ()):
                    parsed = cst.parse_expression(value)
                    if _is_tl_call(parsed, "load"):
                        pointer = _arg(parsed, 0, "pointer")  # type: ignore[arg-type]
                        source = sorted(names_in(pointer) & (set(self.params) - set(self.constexpr_params)),
                                        key=lambda n: (not n.endswith("_ptr"), n)) if pointer is not None else []
                        if source:
                            return name, source[0]
                    else:
                        todo.append(value)
        return None

    def descriptor_box(self, access: Access) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None:
        """For a descriptor access ``desc.store([o0, o1], v)`` whose descriptor is made once by
        ``tl.make_tensor_descriptor(ptr, shape=[s0, s1], strides=..., block_shape=[b0, b1])``: the sources
        ``((o0, o1), (b0, b1), (s0, s1))``; ``None`` when any of them is not a literal list."""
        made = self.values.get(access.pointer, ())
        if not access.descriptor or access.offsets is None:
            return None
        if not made and access.pointer == access.tensor:  # a descriptor made on the host: its box is read from it
            offsets = cst.parse_expression(access.offsets)
            if not isinstance(offsets, (cst.List, cst.Tuple)):
                return None
            dims = range(len(offsets.elements))
            return (tuple(code(el.value) for el in offsets.elements),
                    tuple(f"{access.pointer}.block_shape[{i}]" for i in dims),
                    tuple(f"{access.pointer}.shape[{i}]" for i in dims))
        if len(made) != 1:
            return None
        call, offsets = cst.parse_expression(made[0]), cst.parse_expression(access.offsets)
        if not _is_tl_call(call, "make_tensor_descriptor"):
            return None
        parts = (offsets, _arg(call, 3, "block_shape"), _arg(call, 1, "shape"))  # type: ignore[arg-type]
        if not all(isinstance(p, (cst.List, cst.Tuple)) for p in parts):
            return None
        lists = tuple(tuple(code(el.value) for el in p.elements) for p in parts)  # type: ignore[union-attr]
        return lists if len({len(x) for x in lists}) == 1 else None


# ----------------------------------------------------------------------------- helpers
def param_names(fn: cst.FunctionDef) -> list[str]:
    """The names of ``fn``'s parameters, positional-only and keyword-only ones included."""
    return [p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)]


def is_constexpr(param: cst.Param) -> bool:
    """Whether ``param`` is annotated ``tl.constexpr``."""
    return param.annotation is not None and "constexpr" in code(param.annotation.annotation)


def code(node: cst.CSTNode) -> str:
    """Source text of a node (without surrounding whitespace). An expression written over several lines inside the
    brackets of what holds it (a call's argument, `mask=a &\n    b`) is put in parentheses of its own: TileLink parses
    the text of an expression again, and without them it is not one."""
    text = cst.Module(body=[]).code_for_node(node).strip()
    if "\n" in text and isinstance(node, cst.BaseExpression):
        try:
            cst.parse_expression(text)
        except cst.ParserSyntaxError:
            return f"({text})"
    return text


def _names(node: cst.CSTNode, *, skip_loads: bool) -> set[str]:
    """The names :func:`names_in` finds (with ``skip_loads``, none inside a ``.load(...)`` call). Walks the node's
    fields directly: libcst's visitors cost most of a rewrite's time on these small, frequent reads."""
    found: set[str] = set()
    stack: list[cst.CSTNode] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            found.add(n.value)
        elif isinstance(n, (cst.Attribute, cst.Arg)):
            stack.append(n.value)  # not an attribute's name, nor the keyword of `mask=m`: neither is a reference
        elif not (skip_loads and isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                  and n.func.attr.value == "load"):
            _push_children(n, stack)
    return found


def nodes_of(node: cst.CSTNode, kinds: type | tuple[type, ...]) -> list[cst.CSTNode]:
    """Every node of the classes ``kinds`` in ``node`` (``node`` included), in no particular order: the set
    ``m.findall(node, m.Call())`` finds, read without libcst's visitors."""
    found: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, kinds):
            found.append(n)
        _push_children(n, stack)
    return found


def _push_children(node: cst.CSTNode, stack: list[cst.CSTNode]) -> None:
    """Appends the nodes ``node``'s fields hold (whitespace left out) to ``stack``."""
    for name in _fields_of(type(node)):
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            stack.append(value)
        elif isinstance(value, (tuple, list)):
            stack.extend(v for v in value if isinstance(v, cst.CSTNode))


@functools.cache
def _fields_of(kind: type) -> tuple[str, ...]:
    """The dataclass fields of a libcst node type, less whitespace (which holds no names)."""
    return tuple(f.name for f in dataclasses.fields(kind) if "whitespace" not in f.name)


def names_in(node: cst.CSTNode) -> set[str]:
    """Every plain name referenced in ``node`` (attribute bases included, attribute names not)."""
    return _names(node, skip_loads=False)


#: the axis :func:`position_reads` gives a program id whose axis it does not read (any axis)
ANY_AXIS = "*"


def position_reads(node: cst.CSTNode, reading: frozenset[str] = frozenset()) -> set[str]:
    """The grid axes, each an int literal in source, that the program-id reads in ``node`` name: `tl.program_id(0)`
    and every other spelling of it (`triton.language.program_id(axis=0)`) give their axis; one whose axis is not an
    int literal (`tl.program_id(AXIS)`) and a call of a helper of ``reading`` (:func:`position_helpers`: those that
    read the program's position themselves, at any depth) give :data:`ANY_AXIS`: the rewrite cannot tell which axis
    they read."""
    return {axis for call in nodes_of(node, cst.Call) if (axis := call_position(call, reading)) is not None}


def call_position(call: cst.Call, reading: frozenset[str] = frozenset()) -> str | None:
    """The axis the call ``call`` itself reads the program id of (:func:`position_reads`; ``reading``: the helpers
    that read the position), ``None`` where it is not such a read."""
    func = call.func
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    if name == "program_id":
        axis = _arg(call, 0, "axis")
        return str(int(axis.value)) if isinstance(axis, cst.Integer) else ANY_AXIS
    if isinstance(func, cst.Name) and name in reading or isinstance(func, cst.Attribute) and code(func) in reading:
        return ANY_AXIS  # a helper that reads the position itself (`block_start(...)`, `helpers.block_start(...)`)
    return None


def axes_meet(found: set[str], axes: set[str]) -> bool:
    """Whether program-id reads of the axes ``found`` may read one of ``axes`` (:data:`ANY_AXIS` meets every axis)."""
    return bool(found & axes) or bool(found and axes and ANY_AXIS in found | axes)


def position_helpers(helpers: dict[str, str]) -> frozenset[str]:
    """The helpers that read the program's position themselves: a program id, a function TileLink does not read (not
    Triton's, not a builtin, not a helper it found: it may read the position too), or a call of such a helper."""
    return helpers_that(helpers, lambda name, source, called: "program_id" in called or any(
        "." not in c and c not in _BUILTINS and c not in helpers and f"{name.rpartition('.')[0]}.{c}" not in helpers
        for c in called))


def helpers_that(helpers: dict[str, str], does: Callable[[str, str, frozenset[str]], bool]) -> frozenset[str]:
    """The helpers (name -> source) that do something themselves, ``does(name, source, what it calls)``, or call a
    helper that does, at any depth. A module's function calls its module's others by their own names (`_here()` in
    `helpers.block_start`)."""
    def resolved(name: str, called: frozenset[str]) -> set[str]:
        module = name.rpartition(".")[0]
        return set(called) | {f"{module}.{c}" for c in called if module}

    calls = {n: resolved(n, _called(src)) for n, src in helpers.items()}
    found = {n for n, src in helpers.items() if does(n, src, _called(src))}
    while more := {n for n, called in calls.items() if n not in found and called & found}:
        found |= more
    return frozenset(found)


#: functions a helper may call that are not helpers (Python's builtins a Triton function may use)
_BUILTINS = frozenset({"min", "max", "range", "len", "int", "float", "bool", "abs", "isinstance", "print",
                       "static_range", "tuple", "list", "zip", "enumerate"})


@functools.lru_cache(maxsize=256)
def _called(source: str) -> frozenset[str]:
    """What the function ``source`` calls, by name (``program_id`` for ``tl.program_id``, ``helpers.block_start`` for
    a module's function); its comments and strings are not calls."""
    try:
        parsed = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return frozenset({"program_id"})  # not read: taken as reading anything
    found: set[str] = set()
    for call in m.findall(parsed, m.Call()):
        func = call.func
        if isinstance(func, cst.Attribute):
            found.add(code(func))
            if func.attr.value == "program_id":
                found.add("program_id")
        elif isinstance(func, cst.Name):
            found.add(func.value)
    return frozenset(found)


def names_outside_loads(node: cst.CSTNode) -> set[str]:
    """Names referenced in ``node`` except inside ``tl.load(...)`` / ``x.load(...)`` calls."""
    return _names(node, skip_loads=True)


def expanded(node: cst.BaseExpression, axis: int) -> str | None:
    """``name[:, None]`` (axis 0) or ``name[None, :]`` (axis 1) -> ``name``: a 1-D vector made 2-D."""
    if not (isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and len(node.slice) == 2):
        return None
    kinds = [isinstance(el.slice, cst.Slice) for el in node.slice]
    other = node.slice[1 - axis].slice
    if kinds[axis] and not kinds[1 - axis] and code(other) == "None":
        return node.value.value
    return None


def _indexes_columns(node: cst.Subscript) -> bool:
    """``x[None, :]`` (also ``x[None, None, :]``): a vector indexed as the columns of a block, one slice past the first
    index."""
    kinds = [isinstance(el.slice, cst.Slice) for el in node.slice]
    return len(kinds) >= 2 and kinds.count(True) == 1 and not kinds[0]


def parse_source(source: str, file: str) -> cst.Module:
    """Parse a user's file; a syntax error becomes an :class:`AnnotationError` at its position."""
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise AnnotationError(f"cannot parse: {exc.message}", file=file, line=exc.raw_line,
                              column=exc.raw_column + 1, hint="fix the syntax error") from None


def is_triton_jit(decorator: cst.Decorator) -> bool:
    d = decorator.decorator
    if isinstance(d, cst.Call):
        d = d.func
    return m.matches(d, m.Attribute(value=m.Name("triton"), attr=m.Name("jit")) | m.Name("jit"))


def _is_triton_wrapper(decorator: cst.Decorator, name: str) -> bool:
    """``decorator`` is ``@triton.<name>(...)`` (``heuristics``, ``autotune``), under any module path
    (``@triton.runtime.heuristics``), or the bare ``@<name>(...)``."""
    d = decorator.decorator
    if isinstance(d, cst.Call):
        d = d.func
    return m.matches(d, m.Attribute(attr=m.Name(name)) | m.Name(name))


#: what of an argument a heuristic may read and still be told by its key alone: its type, not its shape or strides
#: (a tensor's shape along K is the rank's own slice's)
_KEYED_ATTRIBUTES = frozenset({"dtype", "element_size", "is_cuda", "device"})


def _heuristic_reads(value: cst.BaseExpression) -> frozenset[str] | None:
    """The arguments a heuristic's function reads: ``lambda args: args['K'] > 20`` reads ``K``. ``None`` where that
    cannot be read from the source: not a lambda, its dict read otherwise than by a literal key, or a tensor's
    shape or strides read from it (``args['b_ptr'].shape[0]``)."""
    if not isinstance(value, cst.Lambda) or len(value.params.params) != 1 or value.params.star_arg not in (
            None, cst.MaybeSentinel.DEFAULT) or value.params.star_kwarg is not None:
        return None
    arg = value.params.params[0].name.value
    reads: set[str] = set()
    uses = [n for n in m.findall(value.body, m.Name(arg))]
    keyed = m.Subscript(value=m.Name(arg)) | m.Call(func=m.Attribute(value=m.Name(arg), attr=m.Name("get")))
    found = m.findall(value.body, keyed)
    for node in found:
        first = node.slice[0].slice if isinstance(node, cst.Subscript) else node.args[0] if node.args else None
        key = first.value if isinstance(first, (cst.Index, cst.Arg)) else None
        if not isinstance(key, cst.SimpleString) or (isinstance(node, cst.Subscript) and len(node.slice) != 1):
            return None
        reads.add(key.evaluated_value)
    if any(not isinstance(x.attr, cst.Name) or x.attr.value not in _KEYED_ATTRIBUTES
           for x in m.findall(value.body, m.Attribute(value=keyed))):
        return None
    # handed to a function (`len(args['b_ptr'])`, `getattr(args['b_ptr'], 'shape')`): what it reads is not told
    if any(m.matches(a.value, keyed) for call in m.findall(value.body, m.Call()) for a in call.args):
        return None
    return frozenset(reads) if len(found) == len(uses) else None


def _heuristics_dict(module: cst.Module | None, node: cst.BaseExpression) -> cst.Dict | None:
    """The dict literal a `@triton.heuristics` takes: written there, or bound once at the module's top level to a
    name it passes (``HEURISTICS = {...}``, :func:`_bound_once`)."""
    if isinstance(node, cst.Dict):
        return node
    value = _bound_once(module, node.value) if isinstance(node, cst.Name) else None
    return value if isinstance(value, cst.Dict) else None


def _bound_once(module: cst.Module | None, name: str) -> cst.BaseExpression | None:
    """The value bound once at the module's top level to ``name``, used nowhere else but in decorators (``@NAME``, or
    an argument of one): no other binding, import, alias or change in place, which could make the value at the
    launch another than the one written. ``None`` otherwise."""
    if module is None:
        return None
    named = m.Name(name)
    found = [small.value for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine)
             for small in stmt.body if isinstance(small, cst.Assign) and len(small.targets) == 1
             and m.matches(small.targets[0].target, named)]
    decorated = [d for stmt in module.body if isinstance(stmt, cst.FunctionDef) for d in stmt.decorators
                 if m.matches(d.decorator, named) or (isinstance(d.decorator, cst.Call) and any(
                     m.matches(a.value, named) for a in d.decorator.args))]
    # or handed to a heuristics decorator bound to a name (`EVEN_K = triton.heuristics(HEURISTICS)`)
    wrapped = [small for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine) for small in stmt.body
               if isinstance(small, cst.Assign) and m.matches(small.value, m.Call(
                   func=m.Attribute(attr=m.Name("heuristics")) | m.Name("heuristics")))
               and any(m.matches(a.value, named) for a in small.value.args)]
    uses = len(find_in(module, module, named))
    return found[0] if len(found) == 1 and uses == 1 + len(decorated) + len(wrapped) else None


def _names_heuristics(module: cst.Module | None, name: str, aliases: set[str]) -> bool:
    """Whether the module binds ``name`` at its top level to a call of `triton.heuristics` (under any path or
    imported name)."""
    def heuristics(value: cst.BaseExpression) -> bool:
        func = value.func if isinstance(value, cst.Call) else None
        return isinstance(func, cst.Attribute) and func.attr.value == "heuristics" or isinstance(
            func, cst.Name) and func.value in {"heuristics", *aliases}

    return module is not None and any(
        isinstance(small, cst.Assign) and heuristics(small.value) and any(
            m.matches(t.target, m.Name(name)) for t in small.targets)
        for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine) for small in stmt.body)


def _imported_as(module: cst.Module | None, name: str) -> set[str]:
    """The names a module binds to triton's ``name`` by import (``from triton import heuristics as H``)."""
    if module is None:
        return set()
    return {(alias.asname.name.value if alias.asname is not None else alias.name.value)
            for imp in find_in(module, module, m.ImportFrom()) if imp.module is not None
            and code(imp.module).split(".")[0] == "triton" and not isinstance(imp.names, cst.ImportStar)
            for alias in imp.names if m.matches(alias.name, m.Name(name)) and (
                alias.asname is None or isinstance(alias.asname.name, cst.Name))}


def _computed_params(an, fn: cst.FunctionDef, module: cst.Module | None = None
                     ) -> dict[str, tuple[Where, frozenset[str] | None]]:
    """:attr:`KernelAnalysis.computed`: the parameters each ``@triton.heuristics`` above ``fn`` computes."""
    found: dict[str, tuple[Where, frozenset[str] | None]] = {}
    aliases = _imported_as(module, "heuristics") - {"heuristics"}
    autotune = _imported_as(module, "autotune") | {"autotune"}
    below = False  # between @tilelink.overlap and @triton.jit: a wrapper there runs at each rank's launch
    for d in fn.decorators:
        at = an.where(d)
        call = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
        if m.matches(call, m.Attribute(attr=m.Name("overlap")) | m.Name("overlap")):
            below = True
            continue
        if is_triton_jit(d):
            below = False  # under it, what it wraps is the Python function, not the launch
            continue
        # `BIGK = triton.heuristics({...})`, then `@BIGK` (read once: each look walks the whole module)
        named = _bound_once(module, d.decorator.value) if isinstance(d.decorator, cst.Name) else None
        if below and not (isinstance(call, cst.Name) and call.value in autotune or _is_triton_wrapper(d, "autotune")
                          or _is_triton_wrapper(d, "heuristics") or isinstance(call, cst.Name) and call.value in aliases
                          or isinstance(named, cst.Call)
                          and _is_triton_wrapper(cst.Decorator(decorator=named), "heuristics")):
            # a wrapper TileLink does not read (`@libentry()`, a heuristics bound in another module or by a
            # function): it may compute any argument at the launch, from the rank's own K too
            found["*" + code(d.decorator)] = (at, None)
            continue
        if isinstance(d.decorator, cst.Name):
            if isinstance(named, cst.Call):
                d = d.with_changes(decorator=named)
            elif named is None and _names_heuristics(module, d.decorator.value, aliases):
                found["*"] = (at, None)  # bound to heuristics more than once, or changed: which is not known
                continue
        call = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
        if not (_is_triton_wrapper(d, "heuristics") or (isinstance(call, cst.Name) and call.value in aliases)) or \
                not isinstance(d.decorator, cst.Call):
            continue
        arg = next((a.value for a in d.decorator.args if a.keyword is None or a.keyword.value == "values"), None)
        values = _heuristics_dict(module, arg) if arg is not None else None
        if values is None or not all(isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
                                     for e in values.elements):
            found["*"] = (at, None)
            continue
        for e in values.elements:
            found[e.key.evaluated_value] = (at, _heuristic_reads(e.value))
    return found


def _is_tl_call(node: cst.CSTNode, name: str) -> bool:
    return m.matches(node, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name(name))))


def _passed(an: _Analyzer, node: cst.BaseExpression) -> bool:
    """``node`` is a parameter the kernel leaves as passed (never bound again, or only to its own 64-bit widening,
    `stride = stride.to(tl.int64)`, which keeps the value): the launch reads its value."""
    if not isinstance(node, cst.Name) or node.value not in an.params:
        return False
    binds, made = an.bindings.get(node.value, ()), an.assignments.get(node.value, [])
    return node.value not in an.rebound and len(binds) == len(made) and all(
        m.matches(widened_value(v), m.Name(node.value)) for _, v in made)


def _arg(call: cst.Call, position: int, keyword: str) -> cst.BaseExpression | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == keyword:
            return a.value
    positional = [a for a in call.args if a.keyword is None]
    return positional[position].value if position < len(positional) else None


#: the kernel's local names of a 32- or 64-bit int type, bound once (`INDEX_DTYPE : tl.constexpr = tl.int32`),
#: while :func:`analyse` reads it
_INT_TYPES: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("int_types", default=frozenset())
_WIDE_INTS = m.Attribute(value=m.Name("tl"), attr=m.Name("int32") | m.Name("int64") | m.Name("uint32")
                         | m.Name("uint64"))


@contextlib.contextmanager
def reading_int_types(types: frozenset[str]) -> Iterator[None]:
    """Read a cast of a `tl.arange` or a program id to one of the local int types ``types`` as the same values
    (:func:`widened_value`), as :func:`analyse` does for the kernel it reads: the rules reading its analysis too."""
    token = _INT_TYPES.set(types)
    try:
        yield
    finally:
        _INT_TYPES.reset(token)


def _arange_size(node: cst.BaseExpression) -> str | None:
    """``tl.arange(0, B)`` -> ``"B"`` (also cast to a 32- or 64-bit int, ``tl.arange(0, B).to(tl.int64)`` or Inductor's
    ``.to(INDEX_DTYPE)``: values below the block's size, which each such type holds)."""
    node = widened_value(node) or node
    if _is_tl_call(node, "arange") and len(node.args) == 2:  # type: ignore[attr-defined]
        lo, hi = node.args  # type: ignore[attr-defined]
        if m.matches(lo.value, m.Integer("0")):
            return code(hi.value)
    return None


_INT64 = m.Attribute(value=m.Name("tl"), attr=m.Name("int64"))


def widened_value(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """``x`` of ``x.to(tl.int64)`` or ``tl.cast(x, tl.int64)``: a cast that keeps every value of an int32 vector (row
    offsets made 64-bit so that their products with strides do not wrap, as kernels over large tensors write them);
    also ``tl.arange(...)`` or ``tl.program_id(...)`` cast to any 32- or 64-bit int (torch Inductor's
    ``.to(INDEX_DTYPE)``, a local bound once to one): their values are below 2**31. ``None`` for any other expression
    (a narrowing cast, `d.to(tl.int8)`, may change the value)."""
    if not isinstance(value, cst.Call) or any(a.star for a in value.args):
        return None
    inner = target = None
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "to" and len(value.args) == 1 \
            and (value.args[0].keyword is None or value.args[0].keyword.value == "dtype"):
        inner, target = value.func.value, value.args[0].value
    elif m.matches(value.func, m.Attribute(value=m.Name("tl"), attr=m.Name("cast"))) and len(value.args) == 2 \
            and value.args[0].keyword is None and (value.args[1].keyword is None or value.args[1].keyword.value
                                                   == "dtype"):
        inner, target = value.args[0].value, value.args[1].value
    if inner is None or target is None:
        return None
    if m.matches(target, _INT64):
        return inner
    small = m.matches(_bare(inner), m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("arange")
                                                            | m.Name("program_id"))))
    if small and (m.matches(target, _WIDE_INTS) or isinstance(target, cst.Name) and target.value in _INT_TYPES.get()):
        return inner
    return None


def _is_widening(value: cst.BaseExpression) -> bool:
    """A cast to a 64-bit int, which keeps the value (:func:`widened_value`)."""
    return widened_value(value) is not None


def parse_offsets(value: cst.BaseExpression, resolve=None, wraps: bool = True,
                  alone: bool = False) -> tuple[str, str] | None:
    """Recognise ``start + tl.arange(0, size)`` (either order, optionally ``(...) % bound``, inside
    ``tl.multiple_of`` / ``tl.max_contiguous``, widened).

    Returns ``(start, size)`` source strings or ``None``. With ``wraps=False`` a vector taken modulo a bound is not
    one (its lanes may wrap onto each other's columns); with ``alone=True`` ``tl.arange(0, size)`` itself is one, from
    ``"0"``.
    """
    while True:
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Modulo):
            if not wraps:
                return None
            value = value.left  # rows that wrap (`% M`) past the end, never stored
        elif (_is_tl_call(value, "multiple_of") or _is_tl_call(value, "max_contiguous")) and value.args:
            value = value.args[0].value  # a compiler hint: the same values
        elif _is_widening(value):
            value = widened_value(value)  # type: ignore[assignment]  # `(...).to(tl.int64)`: the same values
        elif isinstance(value, cst.Name) and resolve is not None and resolve(value.value) is not None:
            value = resolve(value.value)  # `rm = pid_m * BLOCK_M + tl.arange(...)`, then `tl.multiple_of(rm % M, ..)`
            resolve = None
        elif isinstance(value, cst.BinaryOperation) or not value.lpar:
            break
        else:
            value = value.with_changes(lpar=[], rpar=[])
    if alone and (size := _arange_size(value)) is not None:
        return "0", size
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
        for a, b in ((value.left, value.right), (value.right, value.left)):
            size = _arange_size(b)
            if size is not None:
                return code(a), size
    return None


# ----------------------------------------------------------------------------- statement walk
@dataclass(frozen=True)
class StmtRef:
    """A statement and the chain of blocks that contain it (outermost first)."""

    node: cst.CSTNode  # a SimpleStatementLine or a compound statement
    blocks: tuple[cst.BaseSuite, ...]  # enclosing suites, the kernel body first


def walk_statements(body: cst.BaseSuite, blocks: tuple[cst.BaseSuite, ...] = ()) -> Iterator[StmtRef]:
    """Every statement in document order, with its enclosing suites."""
    blocks = blocks + (body,)
    for stmt in getattr(body, "body", ()):
        yield StmtRef(stmt, blocks)
        if isinstance(stmt, cst.BaseCompoundStatement):
            for suite in _suites(stmt):
                yield from walk_statements(suite, blocks)


def _suites(stmt: cst.BaseCompoundStatement) -> list[cst.BaseSuite]:
    suites = [stmt.body]
    orelse = getattr(stmt, "orelse", None)
    while orelse is not None:
        suites.append(orelse.body)
        orelse = getattr(orelse, "orelse", None) if isinstance(orelse, cst.If) else None
    return suites


def small_statements(ref: StmtRef) -> list[cst.BaseSmallStatement]:
    """The small statements of ``ref``: those of a line, or the statement itself when it is one of a one-line
    suite (``if ACTIVATION == "gelu": acc = gelu(acc)``), which walk_statements yields one at a time."""
    if isinstance(ref.node, cst.BaseSmallStatement):
        return [ref.node]
    return list(ref.node.body) if isinstance(ref.node, cst.SimpleStatementLine) else []


def header_expressions(ref: StmtRef) -> list[cst.CSTNode]:
    """Expressions evaluated by a compound statement's header (loop iterable, if test)."""
    n = ref.node
    if isinstance(n, cst.For):
        return [n.iter]
    if isinstance(n, (cst.If, cst.While)):
        return [n.test]
    return []


class _Renamed(cst.CSTTransformer):
    """Each read of the name ``old`` made a read of ``new`` (an attribute's own name, `x.dtype`'s `dtype`, is left)."""

    def __init__(self, old: str, new: str) -> None:
        super().__init__()
        self.old, self.new = old, new

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return updated.with_changes(value=self.new) if original.value == self.old else updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return updated.with_changes(attr=original.attr)


class _Inlined(cst.CSTTransformer):
    """Each read of the name ``name`` replaced by ``value`` in parentheses (an attribute's own name and a keyword
    argument's name are left)."""

    def __init__(self, name: str, value: cst.BaseExpression) -> None:
        super().__init__()
        self.name, self.value = name, value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.value if original.value == self.name else updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)


# ----------------------------------------------------------------------------- the analysis
class _Analyzer:
    def __init__(self, module: cst.Module, wrapper: MetadataWrapper, fn: cst.FunctionDef, file: str,
                 tensors: dict[str, tuple[int, tuple[str, str] | None, str | None]]):
        self.module, self.fn, self.file, self.tensors = module, fn, file, tensors
        # the parameters each proven `tile=` load's rows read, taken as non-negative (`KernelAnalysis.row_signs`)
        self.row_signs: list[tuple[str, Where]] = []
        # the blocks of columns indexed out of an expression (`(k * BLOCK_K + offs_k)[None, :]`) -> the name the
        # row checks read them by (`_name_columns`)
        self.inline_columns: dict[str, str] = {}
        # the `@triton.jit` helpers the kernel's file imports by name, read once where a value calls one
        self.imported: dict[str, str] | None = None
        self.int_constants: dict[str, cst.Integer] | None = None  # read once (_int_constants)
        self.named_helpers: dict[str, tuple[cst.FunctionDef | None, bool]] = {}  # read once each (_named_helper)
        # the column starts at a program's position whose sign the launch bounds from the grid
        # (`KernelAnalysis.row_starts`)
        self.row_starts: list[tuple[str, Where]] = []
        # the column bounds of the pointers advanced in a loop (`KernelAnalysis.row_bounds`)
        self.row_bounds: list[tuple[str, tuple[tuple[bool, tuple[str, ...]], ...], str, Where]] = []
        # the divisibility facts the `tile=` proofs took, with their loads (`KernelAnalysis.row_multiples`)
        self.row_multiples: list[tuple[tuple[str, ...], str, Where]] = []
        # where the columns of each unmasked walk of whole blocks start (`KernelAnalysis.column_ends`)
        self.column_ends: list[tuple[str, tuple[str, ...], tuple[str, ...], Where]] = []
        # the loads of one row a program (`_row_of_program`) -> (the row stride parameter, the columns' bound terms)
        self.row_programs: dict[Where, tuple[str, tuple[tuple[bool, tuple[str, ...]], ...], str]] = {}
        #: stores of one element a program at its id (`tl.store(y_ptr + row, y)`): their rows are one element apart
        self.scalar_rows: set[Where] = set()
        self.row_program_misses: dict[Where, str] = {}  # `KernelAnalysis.row_program_misses`
        self.sweep_misses: dict[Where, tuple[Where, str]] = {}  # `KernelAnalysis.sweep_misses`
        self.positions = wrapper.resolve(PositionProvider)
        self.index = index_of(module)  # the searches below, and the analysis's hundreds more, read this one walk
        self.params = tuple(p.name.value for p in fn.params.params)
        self.constexpr = tuple(p.name.value for p in fn.params.params if is_constexpr(p))
        self.statements = list(walk_statements(fn.body))
        self.assignments: dict[str, list[tuple[StmtRef, cst.BaseExpression]]] = {}
        for ref in self.statements:
            for small in small_statements(ref):
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        if isinstance(t.target, cst.Name):
                            self.assignments.setdefault(t.target.value, []).append((ref, small.value))
                        elif isinstance(t.target, (cst.Tuple, cst.List)):  # nested ones too: `a, (p, q) = ...`
                            elements = _elementwise(t.target, small.value)
                            for name in names_in(t.target):
                                value = elements.get(name, small.value)
                                self.assignments.setdefault(name, []).append((ref, value))
                elif isinstance(small, cst.AnnAssign) and small.value is not None and isinstance(small.target,
                                                                                                 cst.Name):
                    # Triton runs `p: tl.tensor = x_ptr + offs` as an assignment: an alias like any other
                    self.assignments.setdefault(small.target.value, []).append((ref, small.value))
            # so does a named expression (`(p := x_ptr + offs)`), in a statement or a loop's or branch's header
            for node in [*small_statements(ref), *header_expressions(ref)]:
                for named in self.findall(node, m.NamedExpr(target=m.Name())):
                    self.assignments.setdefault(named.target.value, []).append((ref, named.value))
        self.rebound = {node.target.value for node in self.findall(
            fn.body, m.AugAssign(target=m.Name()) | m.AnnAssign(target=m.Name()) | m.NamedExpr(target=m.Name()))}
        for loop in self.findall(fn.body, m.For()):
            self.rebound |= names_in(loop.target)
        withs = self.findall(fn.body, m.WithItem(asname=m.AsName()))
        for item in withs:  # `with ... as x` binds x too
            self.rebound |= names_in(item.asname.name)
        self.bindings: dict[str, list[tuple[Where, Where | None]]] = {}
        for node in self.findall(fn.body, m.Assign() | m.AugAssign() | m.AnnAssign() | m.NamedExpr() | m.For()) + withs:
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [
                node.asname.name if isinstance(node, cst.WithItem) else node.target]
            end = self.positions[node].end if isinstance(node, cst.For) else None
            span = (self.where(node), Where(self.file, end.line, end.column + 1) if end else None)
            for name in set().union(*(names_in(t) for t in targets)):
                self.bindings.setdefault(name, []).append(span)
        for spans in self.bindings.values():
            spans.sort(key=lambda b: (b[0].line, b[0].column))
        # the names bound on both sides of an `if` to one value, read as bound once at the `if`: their two values
        self.twins: dict[str, tuple[cst.BaseExpression, cst.BaseExpression]] = {}
        # the values of the bindings that widen a name in place (`rn = rn.to(tl.int64)`), left out of its bindings
        self.widened: dict[str, list[cst.BaseExpression]] = {}
        self._fold_constructions(fn)

    def _fold_constructions(self, fn: cst.FunctionDef) -> None:
        """A name bound at the kernel's top level to another name, and bound again there to itself plus offsets before
        anything else reads it (torch Inductor's `A = arg_A`, then `A = A + (ram[:, None] * stride_am + ...)`), is read
        as bound once, to the second value with the first written in: straight-line code, so the first value is read
        nowhere else. The pointer is made in two steps, not advanced: its rows are the second step's offsets."""
        top = [ref for ref in self.statements if ref.blocks == (fn.body,)]
        order = {id(ref.node): i for i, ref in enumerate(top)}
        for name, defs in list(self.assignments.items()):
            if len(defs) < 2 or name in self.params:
                continue
            (first, value), (second, again) = defs[0], defs[1]
            if id(first.node) not in order or id(second.node) not in order or first.node is second.node:
                continue
            plain = all(len(small_statements(r)) == 1 and isinstance(small_statements(r)[0], cst.Assign)
                        and len(small_statements(r)[0].targets) == 1
                        and m.matches(small_statements(r)[0].targets[0].target, m.Name(name)) for r in (first, second))
            between = top[order[id(first.node)] + 1:order[id(second.node)]]
            # only a pointer's two steps: a name, then offsets added to it (a value rebound otherwise, a clamp of rows
            # or a tile index taken again, keeps its two bindings, which the checks read as such)
            step = _bare(again)
            if not isinstance(value, cst.Name) or value.value == name or _step_of(step, name) is None or isinstance(
                    step, cst.BinaryOperation) and isinstance(step.operator, cst.Subtract):
                continue
            if not plain or any(name in names_in(ref.node) for ref in between) or len(
                    self.bindings.get(name, [])) < 2:
                continue
            self.assignments[name] = [(second, again.visit(_Renamed(name, value.value))), *defs[2:]]
            self.bindings[name] = self.bindings[name][1:]
        self._fold_branch_twins()
        self._fold_widenings()
        self._fold_offset_grids()

    def _fold_offset_grids(self) -> None:
        """An offsets grid held in a local of its own and added to a pointer after it (vLLM's `offsets_a =
        stride_am * offsets_am[:, None] + stride_ak * offsets_k[None, :]`, then `a_ptrs = a_ptr + offsets_a`) is read
        as written out in that pointer's binding: the checks then see its rows and columns as they see a grid written
        in place. Only where the grid is bound once, in the same block before the binding that reads it, with no name
        it reads bound in between (so it holds, there, the value written out), and reads no memory."""
        grid = m.Subscript(slice=[m.ZeroOrMore(), m.SubscriptElement(m.Index(value=m.Name("None"))), m.ZeroOrMore()])
        for name, defs in list(self.assignments.items()):
            if len(defs) != 1 or name in self.params or name in self.rebound or len(self.bindings.get(name, ())) != 1:
                continue
            ref, value = defs[0]
            if not (len(small_statements(ref)) == 1 and isinstance(small_statements(ref)[0], cst.Assign)
                    and len(small_statements(ref)[0].targets) == 1) or not m.findall(value, grid) or m.findall(
                    value, m.Call(func=m.Attribute(attr=m.Name("load")) | m.Name("load"))):
                continue
            made, reads = self.where(ref.node), names_in(value)
            for other, uses in list(self.assignments.items()):
                if other == name:
                    continue
                for i, (use, used) in enumerate(uses):
                    at = self.where(use.node)
                    if name not in names_in(used) or not use.blocks or use.blocks[-1] is not ref.blocks[-1] or (
                            at.line, at.column) <= (made.line, made.column) or any(
                            (made.line, made.column) < (b.line, b.column) < (at.line, at.column)
                            for n in reads for b, _ in self.bindings.get(n, ())):
                        continue
                    uses[i] = (use, used.visit(_Inlined(name, value)))

    def _fold_widenings(self) -> None:
        """A local widened in place (`offs_cn = offs_cn.to(tl.int64)`, also on one side of a compile-time `if
        A_LARGE:`) keeps every value it held: the binding is left out, so that the name is read as the one binding
        that made its values."""
        for name, defs in list(self.assignments.items()):
            if name in self.params or name in self.rebound:
                continue
            widened = [(ref, v) for ref, v in defs if m.matches(widened_value(v), m.Name(name))]
            if not widened or len(widened) == len(defs):
                continue
            self.widened[name] = [v for _, v in widened]
            sites = {(self.where(ref.node).line, self.where(ref.node).column) for ref, _ in widened}
            self.assignments[name] = [d for d in defs if d not in widened]
            self.bindings[name] = [b for b in self.bindings.get(name, []) if (b[0].line, b[0].column) not in sites]

    def _fold_branch_twins(self) -> None:
        """A name bound once on each side of an ``if``/``else`` to the same value up to compiler hints (Inductor's
        `ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)` on a contiguous layout, `ram = rm % M`
        otherwise) holds that value after the ``if`` on every run: it is read as bound once, at the ``if``."""
        for name, defs in list(self.assignments.items()):
            spans = self.bindings.get(name, [])
            if len(defs) != 2 or len(spans) != 2 or name in self.rebound or name in self.params:
                continue
            (one, value), (other, twin) = defs
            if code(_unhinted(value)) != code(_unhinted(twin)) or not all(
                    len(small_statements(r)) == 1 and isinstance(small_statements(r)[0], cst.Assign)
                    for r in (one, other)):
                continue
            branch = next((ref for ref in self.statements if isinstance(ref.node, cst.If) and isinstance(
                ref.node.orelse, cst.Else) and one.blocks[-1] is ref.node.body and other.blocks[-1] is
                           ref.node.orelse.body), None)
            # each side's value reads what the `if` reached (a name bound again on one side gives it another value)
            if branch is None or any(_contains(self, branch.node, at) for read in names_in(value) | names_in(twin)
                                     for at, _ in self.bindings.get(read, [])):
                continue
            self.assignments[name] = [(branch, value)]
            self.bindings[name] = [(self.where(branch.node), None)]
            self.twins[name] = (value, twin)

    def findall(self, root: cst.CSTNode, matcher) -> Sequence[cst.CSTNode]:
        """``m.findall(root, matcher)``, from the module's one walk where ``root`` is one of its nodes."""
        return self.index.findall(root, matcher)

    def where(self, node: cst.CSTNode) -> Where:
        pos = self.positions[node].start
        return Where(self.file, pos.line, pos.column + 1)

    # -- aliases -------------------------------------------------------------------------------
    def aliases(self, tensor: str) -> tuple[set[str], set[str]]:
        """Names that hold a pointer derived from ``tensor``, and those holding a descriptor."""
        pointers, descriptors = {tensor}, set()
        changed = True
        while changed:
            changed = False
            for name, defs in self.assignments.items():
                if name in pointers and name not in descriptors and any(
                        _is_tl_call(v, "make_tensor_descriptor") for _, v in defs):
                    # a pointer rebound to its own descriptor: `desc = tl.make_tensor_descriptor(desc, ...)`
                    descriptors.add(name)
                    changed = True
                if name in pointers or name in descriptors:
                    continue
                for _, value in defs:
                    # data loaded through a pointer is not a pointer, nor is a value cast to its element type
                    # (`acc = acc.to(c_ptr.dtype.element_ty)`: a type, not memory)
                    refs = names_outside_loads(_without_dtypes(value))
                    if _is_tl_call(value, "make_tensor_descriptor") and refs & pointers:
                        descriptors.add(name)
                        changed = True
                        break
                    if refs & (pointers | descriptors):
                        (descriptors if refs & descriptors and not refs & pointers else pointers).add(name)
                        changed = True
                        break
            for node in self.findall(self.fn.body, m.AugAssign(target=m.Name())):
                # offsets the tensor is added to in place (`ptrs = offs * stride; ptrs += x_ptr`) become a pointer
                name = node.target.value
                if name not in pointers and name not in descriptors and names_outside_loads(
                        _without_dtypes(node.value)) & (pointers | descriptors):
                    pointers.add(name)
                    changed = True
        return pointers, descriptors

    # -- accesses ------------------------------------------------------------------------------
    def accesses(self, tensor: str, pointers: set[str], descriptors: set[str]) -> list[Access]:
        found: list[Access] = []
        analyzer = self

        class _V(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                f = call.func
                if _is_tl_call(call, "load") or _is_tl_call(call, "store") or _is_tl_call(call, "atomic_add"):
                    ptr = _arg(call, 0, "pointer")
                    if ptr is not None and names_in(ptr) & pointers:
                        kind = "load" if f.attr.value == "load" else "store"  # type: ignore[attr-defined]
                        atomic = f.attr.value == "atomic_add"  # type: ignore[attr-defined]
                        value = _arg(call, 1, "val" if atomic else "value") if kind == "store" else None
                        mask = _arg(call, 2 if kind == "store" else 1, "mask")
                        if not atomic:
                            # a grid of offsets in a local of its own (`offs_a = offs_m[:, None] * stride_am + ...`,
                            # `tl.load(a_ptr + offs_a)`) is read as written in the address
                            at = analyzer.where(call)
                            ptr = analyzer.indices_written_out(ptr, at, pointers | descriptors)
                            mask = analyzer.indices_written_out(mask, at, pointers | descriptors) \
                                if mask is not None else None
                        found.append(Access(kind, tensor, code(ptr), False, analyzer.where(call),
                                            code(value) if value is not None else None,
                                            code(mask) if mask is not None else None, atomic=atomic))
                elif (isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name)
                      and f.value.value in descriptors and f.attr.value in ("load", "store")):
                    offsets = _arg(call, 0, "offsets")
                    value = _arg(call, 1, "value") if f.attr.value == "store" else None
                    found.append(Access(f.attr.value, tensor, f.value.value, True, analyzer.where(call),
                                        code(value) if value is not None else None,
                                        offsets=code(offsets) if offsets is not None else None))

        self.fn.body.visit(_V())
        return found

    def indices_written_out(self, node: cst.BaseExpression, at: Where, pointers: set[str]) -> cst.BaseExpression:
        """``node`` (an access's address or mask) with each name bound once to a block of indices written in, and
        ``tl.broadcast_to(x, shape)`` read as ``x``: torch Inductor's epilogue, `idx_m = rm[:, None]`, `idx_n =
        rn[None, :]`, `mask = (idx_m < M) & (idx_n < N)`, `xindex = idx_n + N * idx_m`, `tl.store(out_ptr0 +
        tl.broadcast_to(xindex, mask.shape), acc, mask)`, is the store to `out_ptr0 + (rn[None, :] + N * rm[:,
        None])` under `(rm[:, None] < M) & (rn[None, :] < N)`; a K loop's `offs_a = rm[:, None] * stride_am + ks[None,
        :] * stride_ak`, `tl.load(a_ptr + offs_a)`, loads the grid as written. A name is written in where its one
        binding, a plain assignment in a block holding the access, reads only names not bound again before the access,
        makes no call
        but hints and broadcasts, and holds a row or column block (`x[:, None]`, `x[None, :]`): offsets vectors
        themselves (`rm = start + tl.arange(0, B)`) stay the names the tile is read from."""
        analyzer = self

        def value_of(name: str, depth: int, site: Where) -> cst.BaseExpression | None:
            """The value of ``name`` read at ``site`` (the access, or the binding whose value reads it)."""
            defs = analyzer.assignments.get(name, [])
            if depth > 4 or name in analyzer.params or name in pointers or name in analyzer.rebound or not defs:
                return None
            if len(defs) != 1 or len(analyzer.bindings.get(name, [])) != 1:
                # bound again for each operand (Inductor's `idx_m`, `idx_n` and `xindex` before each load and the
                # store): the binding every run reaching the access last made
                reach = _reaching(analyzer, name, site)
                if reach is None:
                    return None
                defs = [reach]
            ref, value = defs[0]
            if name in names_in(value):
                return None  # `acc = acc * w`: written in, it would read the new value where the access is
            smalls = small_statements(ref)
            bound_at = analyzer.where(ref.node)
            # `name = value`, or an unpacking of elements (`a, b = x, y`); one of anything else binds the name to
            # a part of the whole right-hand side, not to it
            if len(smalls) != 1 or not isinstance(smalls[0], cst.Assign) or (value is smalls[0].value and not all(
                    m.matches(t.target, m.Name(name)) for t in smalls[0].targets)) or (
                    bound_at.line, bound_at.column) >= (site.line, site.column) or not (
                    ref.blocks[-1] is analyzer.fn.body or _contains(analyzer, ref.blocks[-1], site)):
                return None
            if any(not (m.matches(c, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("broadcast_to")
                                                             | m.Name("multiple_of") | m.Name("max_contiguous")))))
                   for c in m.findall(value, m.Call())):
                return None
            # read where it is bound, and at the access alike (the names it reads are then read at its binding: a
            # name bound again, `ka = (rm[:, None] < M) & ka[None, :]`, reads the binding before)
            for read in names_in(value):
                if any((bound_at.line, bound_at.column) < (b.line, b.column) < (at.line, at.column)
                       for b, _ in analyzer.bindings.get(read, [])):
                    return None
            written = write(value, depth + 1, bound_at)
            blocks = m.findall(written, m.Subscript(slice=[m.ZeroOrMore(), m.SubscriptElement(
                m.Index(value=m.Name("None"))), m.ZeroOrMore()]))
            return written if blocks else None

        def grouped(value: cst.BaseExpression) -> cst.BaseExpression:
            """``value`` written in place of a name: parenthesised unless it is an atom already, on one line (the
            address reads so in a message)."""
            value = _bare(cst.parse_expression(" ".join(code(value).split())))
            return value if isinstance(value, (cst.Name, cst.Subscript, cst.Call)) else value.with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

        def write(node: cst.BaseExpression, depth: int, site: Where) -> cst.BaseExpression:
            class _T(cst.CSTTransformer):
                def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
                    return grouped(updated.args[0].value) if _is_tl_call(updated, "broadcast_to") and updated.args \
                        else updated

                def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
                    return updated.with_changes(attr=original.attr)

                def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
                    value = value_of(original.value, depth, site)
                    return updated if value is None else grouped(value)

            return node.visit(_T())  # type: ignore[return-value]

        return write(node, 0, at)

    # -- tiles ---------------------------------------------------------------------------------
    def _pointer_definitions(self, expr: str, pointers: set[str]) -> list[cst.BaseExpression]:
        """The pointer expression and every alias definition it transitively rests on."""
        return [cst.parse_expression(expr), *(v for _, _, v in self._pointer_bindings(expr, pointers))]

    def _pointer_bindings(self, expr: str, pointers: set[str]) -> list[tuple[str, StmtRef, cst.BaseExpression]]:
        """Each binding of an alias in ``pointers`` that the pointer expression ``expr`` transitively rests on, as
        ``(name, statement, value)``, nearest first."""
        out: list[tuple[str, StmtRef, cst.BaseExpression]] = []
        todo = [cst.parse_expression(expr)]
        seen: set[str] = set()
        i = 0
        while i < len(todo):
            for name in names_in(todo[i]) & pointers:
                if name not in seen:
                    seen.add(name)
                    for ref, value in self.assignments.get(name, []):
                        out.append((name, ref, value))
                        todo.append(value)
            i += 1
        return out

    def _offsets_candidates(self, exprs: list[cst.BaseExpression], dim: int) -> list[str]:
        """Names indexed as the ``dim`` axis (``x[:, None]`` for dim 0 of a 2-D tile)."""
        found: list[str] = []
        indexed: list[cst.BaseExpression] = []  # expressions indexed so (`(offs % 4)[:, None]`)
        for e in exprs:
            for sub in m.findall(e, m.Subscript()):
                elements = sub.slice
                if len(elements) < 2:
                    continue
                kinds = ["slice" if isinstance(el.slice, cst.Slice) else "none"
                         if m.matches(el.slice, m.Index(value=m.Name("None"))) else "other" for el in elements]
                if kinds.count("slice") == 1 and kinds.count("other") == 0 and kinds.index("slice") == dim:
                    block = self._pointer_block(sub.value)
                    if block is not None:  # a 1-D block of pointers indexed so (`scale_ptrs[:, None]`)
                        indexed.append(block)
                    elif isinstance(sub.value, cst.Name):
                        found.append(sub.value.value)
                    else:
                        indexed.append(sub.value)
        if not found:
            # the rows indexed out of an expression of an offsets vector: that vector, which the row checks then
            # compare with what the address reads
            found = [n for value in indexed for n in sorted(names_in(value)) if self._offsets_definition(n) is not None]
        two_d = any(m.findall(e, m.Subscript(slice=[m.ZeroOrMore(), m.SubscriptElement(
            m.Index(value=m.Name("None"))), m.ZeroOrMore()])) for e in exprs)
        if not found and dim == 0 and not two_d:
            # a 1-D tile: `a_ptr + offs` with offs = start + tl.arange(0, size) (in a 2-D block, a vector indexed
            # `[None, :]` is its columns, not its rows)
            for e in exprs:
                for name in names_in(e):
                    if self._offsets_definition(name) is not None:
                        found.append(name)
        return found

    def _pointer_block(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """The value of a name bound once to a 1-D block of pointers (`scale_ptrs = scale_ptr + offs`, no axis
        indexed in it) that is not itself an offsets vector: indexing it (`scale_ptrs[:, None]`) indexes the offsets
        it adds, as `scale_ptr + offs[:, None]` does."""
        if not isinstance(node, cst.Name) or self._offsets_definition(node.value) is not None:
            return None
        values = [v for _, v in self.assignments.get(node.value, [])]
        if len(values) != 1 or node.value in self.rebound:
            return None
        value = values[0]
        terms = [t for t, _ in _terms(_bare(value))]
        if len(terms) < 2 or m.findall(value, m.Subscript() | m.Call()) or not any(
                isinstance(t, cst.Name) and t.value in self.params for t in terms) or not any(
                self._offsets_definition(n) for n in names_in(value)):
            return None  # not a parameter's pointer plus offsets (`rows = tl.load(...)` is a block of values)
        return value

    def _offsets_definition(self, name: str, at: Where | None = None) -> tuple[StmtRef, str, str] | None:
        """``name = start + tl.arange(0, size)``: the assignment that reaches ``at`` (the last one before it in a
        block that holds it), else the first such assignment of the kernel."""
        def reaching(at: Where):
            return lambda n: self._resolved(n, at)

        found = []
        for ref, value in self.assignments.get(name, []):
            parsed = parse_offsets(value, reaching(self.where(ref.node)))
            if parsed is not None:
                found.append((ref, parsed[0], parsed[1]))
        if at is not None:
            reaching = [d for d in found if self.positions[d[0].node].start.line <= at.line
                        and (d[0].blocks[-1] is self.fn.body or _contains(self, d[0].blocks[-1], at))]
            if reaching:
                return reaching[-1]
        return found[0] if found else None

    def _resolved(self, n: str, at: Where) -> cst.BaseExpression | None:
        """The value of ``n`` that an offsets vector made at ``at`` from it reads (``ram = tl.multiple_of(rm % M, B)``
        reads ``rm``): its one assignment, or, bound again (``rm`` made again after the K loop, as
        ``triton.ops.matmul`` does), the one every run reaching ``at`` last made. ``None`` when a name that value
        reads is bound between it and ``at`` (``start = pid_n * BLOCK_N`` after ``rm = start + ...``): the wait,
        written at the access from the value's start, would read the later binding."""
        defs = self.assignments.get(n, [])
        if len(defs) == 1 and n not in self.rebound:
            found = defs[0]
        else:
            found = _reaching(self, n, at)
        if found is None:
            return None
        ref, value = found
        made = self.where(ref.node)
        # a loop that holds `at` but not the value's statement runs a later binding before `at` again
        loops = [lp for lp in self.findall(self.fn.body, m.For() | m.While())
                 if _contains(self, lp, at) and not _contains(self, lp, made)]
        for name in names_in(value):
            for bound, _ in self.bindings.get(name, ()):
                if _before(made, bound) and _before(bound, at) or any(_contains(self, lp, bound) for lp in loops):
                    return None
        return value

    def _resolved_values(self, name: str, at: Where | None) -> list[cst.BaseExpression]:
        """Every value of ``name``, and the value of the vector its offsets definition reaching ``at`` is made from
        (``ram = tl.max_contiguous(tl.multiple_of(offs_am, B), B)`` with ``offs_am = (... + tl.arange(0, B)) % M``):
        where the rows wrap or are clamped, whichever name does it."""
        values = [v for _, v in self.assignments.get(name, [])]
        definition = self._offsets_definition(name, at)
        if definition is None:
            return values
        value = definition[0]
        made = next((v for ref, v in self.assignments.get(name, []) if ref is value), None)
        inner = _unhinted(made) if made is not None else None
        while isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Modulo) or (
                inner is not None and _is_widening(inner)):
            # what parse_offsets reads through: `% M`, hints, `.to(tl.int64)` (`ram = offs_am.to(tl.int64)`)
            inner = _unhinted(inner.left if isinstance(inner, cst.BinaryOperation) else widened_value(inner))
        if isinstance(inner, cst.Name) and inner.value != name:
            resolved = self._resolved(inner.value, self.where(value.node))
            if resolved is not None:
                values.append(resolved)
        return values

    def _wrap_bound(self, offsets: str) -> str | None:
        """``offs_am = (... + tl.arange(0, B)) % M`` (also inside ``tl.multiple_of``) -> ``"M"``: rows that wrap
        at M are rows of an M-row tensor."""
        for _, value in self.assignments.get(offsets, []):
            for mod in m.findall(value, m.BinaryOperation(operator=m.Modulo(), right=m.Name())):
                if mod.right.value in self.params:  # type: ignore[union-attr]
                    return mod.right.value  # type: ignore[union-attr]
                alias = self.param_alias(mod.right)  # `M = ks0`
                if alias is not None:
                    return alias
        return None

    def _size_param(self, offsets: str) -> str | None:
        """``offs_am[:, None] < M`` or ``offs_am < M`` anywhere in the kernel -> ``"M"`` (also through a name bound
        once to the block, Inductor's `idx_m = rm[:, None]` compared as `idx_m < M`)."""
        for cmp in self.findall(self.fn.body, m.Comparison()):
            if len(cmp.comparisons) != 1:
                continue
            # `offs < M`, or the same written the other way round or with `<=` (`M > offs`, `offs <= M - 1`)
            op, left, right = cmp.comparisons[0].operator, _bare(cmp.left), _bare(cmp.comparisons[0].comparator)
            if isinstance(op, (cst.GreaterThan, cst.GreaterThanEqual)):
                left, right = right, left
            if isinstance(left, cst.Name) and left.value not in self.rebound and len(
                    defs := self.assignments.get(left.value, [])) == 1 and isinstance(defs[0][1], cst.Subscript):
                left = defs[0][1]
            elif isinstance(left, cst.Name) and left.value not in self.rebound and len(defs) > 1 and (
                    reach := _reaching(self, left.value, self.where(cmp))) is not None and isinstance(
                    reach[1], cst.Subscript):
                left = reach[1]  # bound again for each operand (`idx_m = rm[:, None]` before the load's mask)
            if isinstance(left, cst.Subscript):
                left = left.value
            if not m.matches(left, m.Name(offsets)):
                continue
            if isinstance(op, (cst.LessThanEqual, cst.GreaterThanEqual)):
                # `offs <= M - 1`: the rows below M
                if not (isinstance(right, cst.BinaryOperation) and isinstance(right.operator, cst.Subtract)
                        and m.matches(right.right, m.Integer("1"))):
                    continue
                right = _bare(right.left)
            elif not isinstance(op, (cst.LessThan, cst.GreaterThan)):
                continue
            if isinstance(right, cst.Name) and right.value in self.params:
                return right.value
            alias = self.param_alias(right)
            if alias is not None:
                return alias
        return None

    def param_alias(self, node: cst.BaseExpression) -> str | None:
        """The parameter a local bound once to it holds (Inductor's `M = ks0`): neither is bound again, so the
        local holds the argument on every run. ``None`` for anything else."""
        if not isinstance(node, cst.Name) or node.value in self.params or node.value in self.rebound:
            return None
        defs = self.assignments.get(node.value, [])
        if len(defs) != 1 or len(self.bindings.get(node.value, ())) != 1:
            return None
        value = _bare(defs[0][1])
        if isinstance(value, cst.Name) and value.value in self.params and value.value not in self.assignments \
                and value.value not in self.rebound:
            return value.value
        return None

    def _launch_size(self, dim_size: cst.BaseExpression) -> str | None:
        """A descriptor's size along the rows (``shape=[M, K]``) as the launcher reads it from the call's
        arguments: a parameter, or an expression of the integer parameters, also through a local bound once
        (``y_dim = Z * H * N_CTX``, the attention tutorial's flat rows): the local is not an argument, so its
        value is written out. ``None`` when it reads anything else (then ``size=`` is asked for)."""
        if isinstance(dim_size, cst.Name) and dim_size.value not in self.params:
            defs = self.assignments.get(dim_size.value, [])
            if len(defs) != 1 or dim_size.value in self.rebound:  # `y_dim *= N_CTX` binds it again
                return None
            dim_size = defs[0][1]
        names = names_in(dim_size)
        # a parameter the kernel binds again (`H = H * 2`, `H *= 2`) holds another value than the argument the
        # launch reads
        if not names or not names <= set(self.params) - set(self.assignments) - self.rebound or m.findall(
                dim_size, m.Call()):
            return None
        return code(dim_size)

    def _pid_of(self, start: str) -> str | None:
        """``pid_m * BLOCK_M`` -> ``"pid_m"`` (a variable, not a parameter; ``pid_m.to(tl.int64) * BLOCK_M`` too: the
        cast keeps its value)."""
        try:
            e = cst.parse_expression(start)
        except cst.ParserSyntaxError:
            return None
        if isinstance(e, cst.Name) and len(self.assignments.get(e.value, [])) == 1:
            # `offs_am = pid_m * BLOCK_M` then `desc.load([offs_am, ...])`
            return self._pid_of(code(self.assignments[e.value][0][1]))
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Multiply):
            for side in (e.left, e.right):
                side = widened_value(side) or side
                if isinstance(side, cst.Name) and side.value not in self.params \
                        and side.value in self.assignments:
                    return side.value
        return None

    def _cdiv_bound(self, start: str) -> str | None:
        """``offs_am = pid_m * BLOCK_M`` with ``num_pid_m = tl.cdiv(M, BLOCK_M)`` in the kernel -> ``"M"``: the tiles
        of height ``BLOCK_M`` are counted over ``M`` rows (a kernel whose rows are never compared with a bound, such
        as a persistent GEMM on host descriptors)."""
        expr = cst.parse_expression(start)
        if isinstance(expr, cst.Name) and len(self.assignments.get(expr.value, [])) == 1:
            expr = self.assignments[expr.value][0][1]
        if not (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply)):
            return None
        heights = {code(side) for side in (expr.left, expr.right)}
        found = {code(a) for call in self.findall(self.fn.body, m.Call(func=m.Attribute(value=m.Name("tl"),
                                                                                 attr=m.Name("cdiv"))))
                 if len(call.args) == 2 and code(call.args[1].value) in heights
                 and isinstance(a := call.args[0].value, cst.Name) and a.value in self.params
                 and a.value not in self.assignments and a.value not in self.rebound}
        # a constexpr one too (the block-scaled tutorial's `M: tl.constexpr`): each call passes it as it passes the
        # others, and the launch reads it there
        return found.pop() if len(found) == 1 else None

    def _indexed_rows(self, access: Access, dim: int, pointers: set[str], index: str) -> Tile | None:
        """Dynamic mapping: the rows come from values loaded through the ``index`` parameter, e.g.
        ``offs_token = tl.load(sorted_token_ids_ptr + ...)`` then ``a_ptr + offs_token[:, None] // top_k
        * stride_am``: the source rows are ``offs_token // top_k`` (the factor of the product that holds the index).
        ``None`` (refused: "cannot tell which rows") unless the address is that one rows term, each other factor of
        its product an int literal or a parameter the kernel leaves as passed, plus column terms (a vector indexed
        along another axis, times such factors): any other term (``+ stride_am``, ``+ row0 * stride_am``) could move
        the rows off those the wait or notify covers."""
        found = _index_term(self, access, dim, pointers, index)
        if found is None:
            return None
        rows, name, _ = found
        # the wait computes its channels from these names at the access: one bound again after the pointer was made
        # from it (`rows` reused for other values) would name other rows; bound again to the same values
        # (`offs_token = offs_token.to(tl.int64)`, as vLLM's MoE kernel widens them) is the same rows
        def same_values(n: str, value: cst.BaseExpression) -> bool:
            value = _unhinted(value)
            inner = widened_value(value)
            return inner is not None and m.matches(_unhinted(inner), m.Name(n))

        at = None
        for n in names_in(cst.parse_expression(rows)):
            defs = self.assignments.get(n, [])
            again = [v for _, v in defs if not same_values(n, v)]
            if (n in self.params and self.bindings.get(n)) or len(self.bindings.get(n, ())) != len(defs):
                return None
            if n not in self.params and len(again) != 1:
                # bound once on each side of an `if` (vLLM's `if not naive_block_assignment:` loads the tokens,
                # its other side makes them from the program id): after it, the names hold one side's values on
                # every run, and the wait computes its channels from those values
                branch = _sides_binding(self, n, access)
                if branch is None:
                    lines = sorted({w.line for w, _ in self.bindings.get(n, ())})
                    said = ", ".join(str(x) for x in lines[:-1]) + f" and {lines[-1]}" if len(lines) > 1 else \
                        str(lines[0]) if lines else "?"
                    raise _refuse(access, (
                        f"the rows {f'`{rows}` ' if rows != n else ''}of the {access.kind} at line "
                        f"{access.where.line} come through `{n}`, "
                        f"bound at lines {said}: the {_waits(access)} computes its channels from the values `{n}` "
                        f"holds where it is placed, which TileLink can tell are the ones the pointer read only "
                        f"where `{n}` is bound once, or once on each side of one `if` (in no loop, not read inside "
                        f"it) before the pointer is made"), (
                        f"bind `{n}` once, or once on each side of one `if` (`if not naive_block_assignment: {n} = "
                        f"tl.load(...)` / `else: {n} = ...`), before the pointer; give other values a name of their "
                        f"own (`{n}_2 = ...`)"))
                if n == name:
                    at = self.where(branch.node)
        if at is None:
            at = self.where(self.assignments[name][0][0].node)
        return Tile(rows, "", name, None, None, at, 2, True)

    def tile(self, access: Access, dim: int, pointers: set[str], override: tuple[str, str] | None,
             size_param: str | None, index: str | None = None) -> Tile | None:
        if index is not None and override is None:
            tile = self._indexed_rows(access, dim, pointers, index)
            if tile is not None:
                return Tile(tile.start, tile.size, tile.offsets, size_param, None, tile.defined_at, 2, True)
            return None
        if override is not None:
            start, size = override
            # a pointer with no block of columns (`y_ptr + row`, a GEMV storing one scalar per program) stores one
            # element per row, as a 1-D tile does
            flat = not access.descriptor and not any(m.findall(e, m.Subscript(slice=[
                m.ZeroOrMore(), m.SubscriptElement(m.Slice()), m.ZeroOrMore()]))
                for e in self._pointer_definitions(access.pointer, pointers))
            return Tile(start, size, None, size_param, self._pid_of(start), access.where, 1 if flat else 2)
        if access.descriptor:
            offsets = cst.parse_expression(access.offsets) if access.offsets is not None else None
            desc_defs = self.assignments.get(access.pointer, [])
            if not desc_defs and access.pointer == access.tensor:
                # a descriptor made on the host (`TensorDescriptor`): its rows are its first offset, its block
                # height is the descriptor's own (a compile-time constant of the kernel), and the launcher
                # rebuilds it over the buffer the rewritten kernel reads or writes
                if not isinstance(offsets, (cst.List, cst.Tuple)) or dim >= len(offsets.elements):
                    return None
                start = code(offsets.elements[dim].value)
                return Tile(start, f"{access.tensor}.block_shape[{dim}]", None, size_param or self._cdiv_bound(start),
                            self._pid_of(start), access.where)
            if isinstance(offsets, (cst.List, cst.Tuple)) and dim < len(offsets.elements) and desc_defs:
                make = desc_defs[0][1]
                base = _arg(make, 0, "base") if isinstance(make, cst.Call) else None
                if len({code(v) for _, v in desc_defs}) > 1 or base is None or not (
                        isinstance(base, cst.Name) and base.value == access.tensor):
                    at = self.where(desc_defs[0][0].node)
                    ways = len({code(v) for _, v in desc_defs}) > 1
                    test = _test_between(self, [self.where(r.node) for r, _ in desc_defs]) if ways else None
                    shapes = [code(x) for _, v in desc_defs if isinstance(v, cst.Call) and (
                        x := _arg(v, 1, "shape")) is not None]
                    raise AnnotationError(
                        f"the descriptor `{access.pointer}` of {access.tensor!r} is made "
                        + (f"in more than one way, on the two sides of `if {test}:`"
                           + (f" (shape {' and '.join(f'`{x}`' for x in dict.fromkeys(shapes))})"
                              if len(set(shapes)) > 1 else "")
                           if test else "in more than one way" if ways else
                           f"from `{code(base) if base is not None else '?'}`, not from {access.tensor!r} itself")
                        + ": TileLink reads a descriptor's rows from its offsets only", file=at.file, line=at.line,
                        column=at.column, hint=(
                            f"annotate a kernel that makes it one way, the side of `if {test}:` your calls take: "
                            f"`{access.pointer} = tl.make_tensor_descriptor({access.tensor}, shape=..., strides=..., "
                            f"block_shape=...)`, its rows along dim {dim}" if test else
                            f"make it once from the tensor, `{access.pointer} = tl.make_tensor_descriptor("
                            f"{access.tensor}, shape=..., strides=..., block_shape=...)`, and move rows through the "
                            f"load's offsets"))
                shape = _arg(make, 3, "block_shape") if isinstance(make, cst.Call) else None
                if isinstance(shape, (cst.List, cst.Tuple)) and dim < len(shape.elements):
                    start_node = offsets.elements[dim].value
                    start = code(start_node)
                    size = code(shape.elements[dim].value)
                    sp = size_param
                    if sp is None:
                        shp = _arg(make, 1, "shape")
                        if isinstance(shp, (cst.List, cst.Tuple)) and dim < len(shp.elements):
                            sp = self._launch_size(shp.elements[dim].value)
                    return Tile(start, size, None, sp, self._pid_of(start), access.where)
            return None
        exprs = self._pointer_definitions(access.pointer, pointers)
        row = _row_of_program(self, access, dim, pointers, exprs)
        if row is not None:
            start, stride, bound, columns = row
            self.row_programs[access.where] = (stride, bound, columns)
            # the rows a loop over them counts to (`for row_idx in tl.range(row_start, n_rows, row_step)`)
            loops = self.findall(self.fn.body, m.For(target=m.Name(start)))
            ends = [_range_args(loops[0])] if len(loops) == 1 else []
            counted = code(ends[0][1]) if ends and ends[0] is not None and _passed(self, ends[0][1]) else None
            # a row that is the program's id (`row = tl.program_id(0)`, also widened) is the tile's index: the tile
            # order may rotate it, as it rotates `pid_m` of a block of rows
            made = self.assignments.get(start, [])
            # through a straight-line helper too (FlagGems' `row = tle.program_id(0)`)
            pid = _uncast(_helpers_written_out(self, made[0][1])) if len(made) == 1 else None
            own = pid is not None and m.matches(pid, m.Call(func=m.Attribute(value=m.Name("tl"),
                                                                            attr=m.Name("program_id"))))
            if own and not loops and size_param is None and counted is None:
                # nothing counts the rows (`_layer_norm_fwd_fused[(M,)]`): the programs along the row's axis do, one
                # row each, which each call reads from its grid (the launch checks every rank's shard against it)
                axis = call_position(pid)  # type: ignore[arg-type]
                counted = f"tl.num_programs({axis})" if axis in ("0", "1", "2") else None
            return Tile(start, "1", None, size_param or counted, start if own else self._pid_of(start),
                        access.where, 1)
        scalar = _scalar_store_row(self, access, dim, exprs, size_param)
        if scalar is not None:
            self.scalar_rows.add(access.where)
            return scalar
        candidates = self._offsets_candidates(exprs, dim)
        ndim = 2 if any(m.findall(e, m.Subscript(slice=[m.ZeroOrMore(), m.SubscriptElement(m.Slice()),
                                                       m.ZeroOrMore()])) for e in exprs) else 1
        for name in candidates:
            definition = self._offsets_definition(name, access.where)
            if definition is not None:
                ref, start, size = definition
                _check_start_runs_again(self, access, start, name)
                return Tile(start, size, name, size_param or self._size_param(name) or self._wrap_bound(name),
                            self._pid_of(start), self.where(ref.node), ndim,
                            wraps=any(_row_wraps(v, start) or _is_clamp(_unhinted(v))
                                      for v in self._resolved_values(name, access.where)))
        return None


def _test_between(an: _Analyzer, sites: list[Where]) -> str | None:
    """The test of a compile-time `if` whose two sides hold statements of ``sites`` (`if FP8_OUTPUT:` making a
    descriptor one way, `else:` another), in source; ``None`` when no one such `if` parts them (a test of run-time
    values takes both sides in one call)."""
    sides = _branch_sides(an)
    seen: dict[Where, set[bool]] = {}
    tests: dict[Where, str] = {}
    for site in sites:
        for side in sides.get(site, ()):
            if side.static:
                seen.setdefault(side.where, set()).add(side.body)
                tests[side.where] = side.test
    return next((tests[w] for w, taken in seen.items() if taken == {True, False}), None)


def _anchor(an: _Analyzer, acc: Access, tile: Tile | None, pointers: set[str]) -> Access:
    """Place the access in the block where its tile is known (see :class:`Access`)."""
    if tile is None:
        return acc
    chain = next((r for r in an.statements if _contains(an, r.node, acc.where) and
                  isinstance(r.node, cst.SimpleStatementLine)), None)
    if chain is None:  # the access sits in a compound statement's header (e.g. a loop bound)
        chain = next((r for r in reversed(an.statements) if _contains(an, r.node, acc.where)), None)
    if chain is None:
        return acc
    blocks = chain.blocks
    target = blocks[0]
    if tile.offsets is not None:
        ref = an._offsets_definition(tile.offsets, acc.where) or next(iter(an.assignments.get(tile.offsets, [])),
                                                                        None)
        if ref is not None and any(b is ref[0].blocks[-1] for b in blocks):
            target = ref[0].blocks[-1]
    else:
        start_names = names_in(cst.parse_expression(tile.start))
        for b in blocks:
            if any(isinstance(r.node, cst.SimpleStatementLine) and r.blocks[-1] is b and
                   any(isinstance(sm, cst.Assign) and _targets(sm) & start_names for sm in r.node.body)
                   for r in an.statements):
                target = b
    stmt = next(r for r in an.statements if r.blocks[-1] is target and _contains(an, r.node, acc.where))
    branch = None
    if acc.kind == "store" and isinstance(stmt.node, cst.If):
        # a store in a branch (`if EPILOGUE_SUBTILE:` ... `else:`) is notified in its branch, right after it
        inner = _through_branches(an, stmt, acc.where)
        if inner is not stmt:
            branch, stmt = an.where(stmt.node), inner
    stmt, moved = _settle(an, acc, tile, stmt, pointers)
    target = stmt.blocks[-1]
    where = an.where(stmt.node)
    if moved:
        tile = Tile(tile.start, tile.size, tile.offsets, tile.size_param, tile.pid, where, tile.ndim, tile.dynamic,
                    tile.wraps)
    elif tile.offsets is None and not tile.dynamic:
        # a tile given by tile=(...): it is "defined" by the last statement of its block that assigns
        # a name of its start before the access, so that the loads of one tile share one wait
        start_names = names_in(cst.parse_expression(tile.start))
        defs = [r for r in an.statements if r.blocks[-1] is target and isinstance(r.node, cst.SimpleStatementLine)
                and an.positions[r.node].start.line < where.line
                and any(isinstance(sm, cst.Assign) and _targets(sm) & start_names for sm in r.node.body)]
        defined = an.where(defs[-1].node) if defs else an.where(target) if target is not blocks[0] else an.where(
            an.fn)
        # any later binding of a start name before the access (`row += BLOCK`, one in a branch) starts another
        # tile: loads on either side of it must not share one wait
        later = [at for _, at in _bindings_inside(an, target, start_names)
                 if (defined.line, defined.column) < (at.line, at.column) < (where.line, where.column)]
        if later:
            defined = later[-1]
        tile = Tile(tile.start, tile.size, tile.offsets, tile.size_param, tile.pid, defined, tile.ndim,
                    tile.dynamic)
    used_after: set[str] = set()
    for r in an.statements:
        if an.positions[r.node].start.line >= where.line:
            for small in small_statements(r):
                used_after |= names_in(small)
            for h in header_expressions(r):
                used_after |= names_in(h)
    def assigned_before(n: str) -> bool:
        return any(an.positions[r.node].start.line < where.line for r, _ in an.assignments.get(n, []))

    if acc.descriptor:
        # a descriptor cannot carry the token: the tile's start offset along the dimension does
        # (``offs_am = offs_am + tlk_token`` feeds ``desc.load([offs_am, ...])``)
        earlier = sorted(n for n in names_in(cst.parse_expression(tile.start))
                         if n in an.assignments and n not in an.params and assigned_before(n))
    else:
        earlier = sorted(n for n in pointers if n != acc.tensor and n in used_after and assigned_before(n))
        if acc.tensor in used_after:
            earlier.insert(0, acc.tensor)
    loop = next((r for r in an.statements if isinstance(r.node, cst.For) and r.node.body is target), None)
    return Access(acc.kind, acc.tensor, acc.pointer, acc.descriptor, acc.where, acc.value, acc.mask, tile,
                  where, _own_statement(an, stmt.node, acc), tuple(earlier), acc.offsets,
                  an.where(loop.node) if loop is not None else None, _sweeps(an, stmt.node, chain, acc, tile),
                  branch, acc.atomic,
                  any(isinstance(node, (cst.SimpleStatementLine, cst.BaseSmallStatement)) and not _own_statement(
                      an, node, acc) for node in (chain.node, stmt.node)))


def _own_statement(an: _Analyzer, node: cst.CSTNode, acc: Access) -> bool:
    """Whether ``node`` is a line of plain statements, and, for a store, one of them is the store's call itself (or
    binds its value: `_ = tl.store(...)`), not a call inside an expression that may skip it (`tl.store(...) if c else
    None`, `c and tl.store(...)`), with nothing after it on the line that leaves the program or the loop's pass (`;
    return`): the store has run once the line has."""
    line = node
    if isinstance(node, cst.BaseSmallStatement):  # one of a one-line suite: the suite's statements are its line
        line = next((s for s in an.findall(an.fn.body, m.SimpleStatementSuite()) if any(x is node for x in s.body)),
                    None)
        if line is None:
            return False
    elif not isinstance(node, cst.SimpleStatementLine):
        return False
    if acc.kind != "store":
        return True
    for i, small in enumerate(line.body):
        if isinstance(node, cst.BaseSmallStatement) and small is not node:
            continue
        value = small.value if isinstance(small, (cst.Expr, cst.Assign, cst.AnnAssign)) else None
        if isinstance(value, cst.Call) and an.where(value) == acc.where:
            return not any(isinstance(later, (cst.Return, cst.Break, cst.Continue, cst.Raise))
                           for later in line.body[i + 1:])
    return False


# ----------------------------------------------------------------------------- soundness
def _refuse(acc: Access, message: str, hint: str) -> AnnotationError:
    return AnnotationError(message, file=acc.where.file, line=acc.where.line, column=acc.where.column, hint=hint)


#: calls that do more than compute a value (`tl.atomic_add(counter, 1)` takes the next tile of a work queue)
_EFFECTS = m.Call(func=m.Attribute(attr=m.MatchIfTrue(lambda n: n.value.startswith("atomic_") or n.value in (
    "store", "inline_asm_elementwise", "debug_barrier", "device_print", "device_assert"))))
#: plain-named calls whose value is all they make
_PURE_BUILTINS = frozenset({"min", "max", "abs", "int", "float", "bool", "len"})


def _check_start_runs_again(an: _Analyzer, acc: Access, start: str, offsets: str) -> None:
    """The tile's start is written again where the wait or notify is placed (the channels it covers are computed from
    it there): a start that calls something with an effect, a function TileLink does not know (a helper reached
    through another name, `queue.next_tile(q)`), or that loads memory the kernel writes (`tl.load(perm_ptr + pid)`
    with a `tl.store(perm_ptr + pid, 0)` before the wait) could give other rows the second time
    (`tl.atomic_add(counter, 1) * BLOCK_M`: the next tile's rows, not these)."""
    original = cst.parse_expression(start)
    node = _helpers_written_out(an, original)
    loads = [c for c in m.findall(node, m.Call()) if _is_tl_call(c, "load") and c.args]
    written = _written_roots(an) if loads else set()  # (read only where the start loads: this runs for every access)
    calls = [c for c in m.findall(node, m.Call()) if m.matches(c, _EFFECTS) or (
        isinstance(c.func, cst.Name) and c.func.value not in _PURE_BUILTINS) or (
        isinstance(c.func, cst.Attribute) and not m.matches(c.func, m.Attribute(value=m.Name("tl")))
        and c.func.attr.value != "to") or (c in loads and _roots(an, c.args[0].value) & written)]
    unread = [c for c in calls if not m.matches(c, _EFFECTS) and not _is_tl_call(c, "load")]
    if unread and unread[0] is calls[0]:
        # a function TileLink does not read through (a helper calling another, one its module binds twice, a method)
        raise _refuse(acc, f"the rows `{offsets}` of the {acc.kind} at line {acc.where.line} start at `{start}`, "
                           f"which calls `{code(calls[0].func)}`, a function TileLink does not read: "
                           f"TileLink computes the channels the {_waits(acc)} covers from the start where it places "
                           f"it, so the call would run again there, and a function it cannot read may give other "
                           f"rows the second time",
                      f"compute the rows from tl.program_id (or a tile loop's target) and the arguments in the "
                      f"kernel, or make `{code(calls[0].func)}` a @triton.jit helper TileLink reads: bound once in "
                      f"this file or in a module it imports, straight-line (assignments to names, then one "
                      f"`return`), reading only its parameters, `tl` and `triton`, with no atomic or store")
    if calls:
        # the user's own call where a helper's value made it (`next_row(q)`, returning `tl.atomic_add(q, 1)`)
        found = code(calls[0])
        helper = next((c for c in m.findall(original, m.Call()) if found not in code(original) and found in code(
            _helpers_written_out(an, c))), None)
        said = f"`{code(calls[0].func)}`" if helper is None else \
            f"`{code(helper.func)}`, whose value calls `{code(calls[0].func)}`"
        calls = calls if helper is None else [helper]
        raise _refuse(acc, f"the rows `{offsets}` of the {acc.kind} at line {acc.where.line} start at `{start}`, "
                           f"which calls {said}"
                           + (", reading memory the kernel also writes" if _is_tl_call(calls[0], "load") else "")
                           + f": TileLink computes the channels the {_waits(acc)} covers from the start where it "
                             f"places it, so the call would run again there and may give other rows",
                      f"bind the call's value to a name of its own first (`tile_id = {code(calls[0])}`) and compute "
                      f"the rows from that name (`{offsets} = tile_id * BLOCK_M + tl.arange(0, BLOCK_M)`)"
                      if acc.kind == "load" else
                      "compute the rows from tl.program_id (or a tile loop's target) and the arguments: the launch "
                      "checks that no two programs store the same rows, which a tile taken at run time (from a queue) "
                      "does not let it do")


def _helpers_written_out(an: _Analyzer, node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` with each call of a straight-line helper (:func:`_helper_value`: FlagGems' `tle.program_id(0)`,
    returning `tl.program_id(axis).to(tl.int64)`) replaced by what it returns, down to four levels: such a call
    computes its value from its arguments alone, and runs again to the same value."""

    class _Written(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            if m.matches(updated.func, m.Attribute(value=m.Name("tl"))) and not m.matches(
                    updated.func, m.Attribute(attr=m.Name("swizzle2d"))):
                return updated
            value = _helper_value(an, updated)
            if value is None:
                return updated
            return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if hasattr(
                value, "lpar") else value

    for _ in range(4):
        written = node.visit(_Written())
        if written.deep_equals(node):
            break
        node = written
    return node


def _roots(an: _Analyzer, node: cst.BaseExpression) -> set[str]:
    """The parameters ``node`` reads other than through a load (the pointers an address is made from), through the
    values of the locals it reads."""
    seen, todo, found = set(), list(names_outside_loads(node)), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in an.params:
            found.add(name)
        todo += [n for _, v in an.assignments.get(name, []) for n in names_outside_loads(v)]
    return found


def _written_roots(an: _Analyzer) -> set[str]:
    """The parameters the kernel writes through: the pointers of its stores and atomics, the descriptors it stores
    to."""
    found: set[str] = set()
    for call in an.findall(an.fn.body, m.Call(func=m.Attribute())):
        attr = call.func.attr.value  # type: ignore[attr-defined]
        if (attr == "store" or attr.startswith("atomic_")) and call.args:
            target = call.func.value if not m.matches(call.func, m.Attribute(value=m.Name("tl"))) \
                else call.args[0].value  # type: ignore[attr-defined]
            found |= _roots(an, target)
    return found


def _unhinted(value: cst.BaseExpression) -> cst.BaseExpression:
    while (_is_tl_call(value, "multiple_of") or _is_tl_call(value, "max_contiguous")) and value.args:
        value = value.args[0].value  # type: ignore[attr-defined]
    return value


def _row_wraps(value: cst.BaseExpression, start: str) -> list[cst.BinaryOperation]:
    """The ``%`` operations of an offsets vector's value that wrap its rows (`(pid_m * B + tl.arange(0, B)) % M`): not
    one of the tile's start ``start``, in source, which picks the tile (`(pid % num_pid_m) * B + tl.arange(0, B)`)."""
    picks = {code(mod).replace(" ", "") for mod in m.findall(cst.parse_expression(start), m.BinaryOperation(
        operator=m.Modulo()))} if start else set()
    return [mod for mod in m.findall(value, m.BinaryOperation(operator=m.Modulo()))
            if code(mod).replace(" ", "") not in picks]


def _same_rows_or_clamped(value: cst.BaseExpression, name: str) -> bool:
    """``name = tl.max_contiguous(tl.multiple_of(name, B), B)`` (the same rows, hinted) or ``name = tl.where(name <
    M, name, 0)`` (rows past the end read row 0, like a wrap): a rebinding that keeps the tile's rows."""
    value = _unhinted(value)
    if m.matches(value, m.Name(name)):
        return True
    return _is_clamp(value, name)


def _is_clamp(value: cst.BaseExpression, name: str | None = None) -> bool:
    """``tl.where(name < M, name, 0)`` (any name where ``name`` is ``None``)."""
    return _clamp_bound(value, name) is not None


def _clamp_bound(value: cst.BaseExpression, name: str | None = None) -> str | None:
    """The bound ``M`` of a clamp ``tl.where(name < M, name, 0)``, in source; ``None`` for anything else."""
    if not (_is_tl_call(value, "where") and len(value.args) == 3):  # type: ignore[attr-defined]
        return None
    cond, keep, other = (a.value for a in value.args)  # type: ignore[attr-defined]
    if not isinstance(keep, cst.Name) or name is not None and keep.value != name:
        return None
    if m.matches(other, m.Integer("0")) and m.matches(cond, m.Comparison(left=m.Name(keep.value), comparisons=[
            m.ComparisonTarget(operator=m.LessThan())])):
        return code(cond.comparisons[0].comparator)  # type: ignore[attr-defined]
    return None


def _bindings_inside(an: _Analyzer, node: cst.CSTNode, names: set[str]) -> list[tuple[str, Where]]:
    """Every binding (``=``, ``+=``, ``:=``, a ``for`` target) of ``names`` that lies inside ``node``."""
    return sorted(((n, at) for n in names for at, _ in an.bindings.get(n, ()) if _contains(an, node, at)),
                  key=lambda b: (b[1].line, b[1].column))


def _loops_holding(an: _Analyzer, node: cst.CSTNode, where: Where) -> list[cst.CSTNode]:
    """The loops inside ``node`` (``node`` included) that hold ``where``, outermost first."""
    return [n for n in m.findall(node, m.For() | m.While()) if _contains(an, n, where)]


def _describe(what: list[tuple[str, Where]]) -> str:
    return ", ".join(f"`{n}` at line {at.line}" for n, at in what)


def _through_branches(an: _Analyzer, stmt: StmtRef, where: Where) -> StmtRef:
    """The statement holding ``where`` inside the ``if`` / ``elif`` / ``else`` blocks of ``stmt``, when only
    branches (no loop) lie between; else ``stmt``."""
    # a line, or a statement of a one-line suite (`if STORE: tl.store(...)`), which the rewrite makes a block
    inner = next((r for r in an.statements if isinstance(r.node, (cst.SimpleStatementLine, cst.BaseSmallStatement))
                  and _contains(an, r.node, where)), None)
    if inner is None or not all(_is_branch_block(an, b) for b in inner.blocks[len(stmt.blocks):]):
        return stmt
    return inner


def _is_branch_block(an: _Analyzer, block: cst.BaseSuite) -> bool:
    """Whether ``block`` is the body of an ``if``, ``elif`` or ``else`` (not of a loop or a ``with``)."""
    for node in an.findall(an.fn.body, m.If() | m.Else()):
        if node.body is block:
            return True
    return False


def _settle(an: _Analyzer, acc: Access, tile: Tile, stmt: StmtRef, pointers: set[str]) -> tuple[StmtRef, bool]:
    """Make the wait (or notify) at ``stmt`` cover the rows the access touches on every execution of it, or
    refuse. The rows are fixed by the tile's start (or its offsets vector) and by the pointer the access goes
    through: a name of them bound again in a loop between ``stmt`` and the access (``offset += BLOCK_N`` in a key
    loop) moves the rows on each iteration, so the anchor goes into that loop, where the start is evaluated
    afresh on every iteration. What cannot be made so is refused with the line that moves the rows."""
    verb = "reads" if acc.kind == "load" else "writes"
    # the pointer expression and every alias definition it rests on, read by both checks
    exprs = [] if acc.descriptor else an._pointer_definitions(acc.pointer, pointers)
    if acc.where not in an.row_programs and acc.where not in an.scalar_rows:
        # one row a program, one element a program: its one advance, the row's, was read with its address
        _check_pointer_advances(an, acc, tile, pointers, exprs)
    _check_row_terms(an, acc, tile, pointers, exprs)
    moved = False
    if tile.offsets is not None and not tile.dynamic:
        # the rows are the value of the offsets vector; the wait evaluates its definition's start expression
        definition = an._offsets_definition(tile.offsets, acc.where)
        d_at = an.where(definition[0].node) if definition is not None else None
        harmless = {an.where(ref.node) for ref, value in an.assignments.get(tile.offsets, [])
                    if _same_rows_or_clamped(value, tile.offsets)}
        others = [(tile.offsets, at) for at, _ in an.bindings.get(tile.offsets, ()) if at != d_at
                  and at not in harmless and (
            (d_at is not None and (d_at.line, d_at.column) < (at.line, at.column) < (acc.where.line,
                                                                                      acc.where.column))
            or any(_contains(an, lp, at) for lp in _loops_holding(an, stmt.node, acc.where)))]
        if definition is None or not any(b is definition[0].blocks[-1] for b in stmt.blocks) or others:
            moves = _describe(others) if others else f"`{tile.offsets}`"
            raise _refuse(acc, f"cannot tell which rows of {acc.tensor!r} the {acc.kind} {verb} on every "
                               f"iteration: the row offsets {moves} are bound again between their definition "
                               f"and the {acc.kind}",
                          f"compute the row offsets once per tile, right before the {acc.kind} and in its block: "
                          f"`{tile.offsets} = start + tl.arange(0, BLOCK)`")
        start_names = names_in(cst.parse_expression(tile.start))
        between = [(n, at) for n, at in _bindings_inside(an, an.fn.body, start_names)
                   if d_at is not None and (d_at.line, d_at.column) < (at.line, at.column)
                   and _contains(an, stmt.node, at) or (d_at is not None and (d_at.line, d_at.column) < (
                       at.line, at.column) < (an.where(stmt.node).line, an.where(stmt.node).column))]
        if between:
            raise _refuse(acc, f"the start of the rows `{tile.offsets}` ({tile.start}) changes before the "
                               f"{acc.kind} ({_describe(between)}): the {'wait' if acc.kind == 'load' else 'notify'}"
                               f" cannot be computed from it",
                          f"compute `{tile.offsets}` after the last change of {', '.join(sorted(start_names))}")
        return stmt, moved
    names = names_in(cst.parse_expression(tile.start)) - set(an.params)
    while True:
        loop = next((lp for lp in _loops_holding(an, stmt.node, acc.where)
                     if _bindings_inside(an, lp, names)), None)
        if loop is None:
            break
        body = loop.body
        stmt = next(r for r in an.statements if r.blocks[-1] is body and _contains(an, r.node, acc.where))
        moved = True
    # a start name bound inside the anchor statement itself, before the access, outside any loop: the value the
    # wait computes before the statement is not the one the access uses
    early = [(n, at) for n, at in _bindings_inside(an, stmt.node, names)
             if (at.line, at.column) < (acc.where.line, acc.where.column)]
    if early and not isinstance(stmt.node, cst.SimpleStatementLine):
        raise _refuse(acc, f"the start of the rows of this {acc.kind} ({tile.start}) is changed at "
                           f"{_describe(early)}, inside the block that holds the {acc.kind}, before it",
                      f"compute the row start in the same block as the {acc.kind} and before it")
    return stmt, moved


def _terms(node: cst.BaseExpression, negative: bool = False) -> list[tuple[cst.BaseExpression, bool]]:
    """The terms of a sum (``a + (b - c)`` -> a, b, -c), each with whether it is subtracted."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract)):
        right_negative = negative != isinstance(node.operator, cst.Subtract)
        return _terms(node.left, negative) + _terms(node.right, right_negative)
    return [(node, negative)]


def _is_rows(node: cst.BaseExpression, offsets: str) -> bool:
    """``offs``, ``offs[:, None]`` (any expansion, also widened: ``offs[:, None].to(tl.int64)``), or ``offs[...] *
    stride`` with no other use of ``offs``."""
    if _is_widening(node):
        return _is_rows(widened_value(node), offsets)  # type: ignore[arg-type]
    if m.matches(node, m.Name(offsets)) or (isinstance(node, cst.Subscript) and m.matches(node.value, m.Name(offsets))
                                            and all(isinstance(e.slice, cst.Slice) or m.matches(
                                                e.slice, m.Index(value=m.Name("None"))) for e in node.slice)):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if _is_rows(a, offsets) and offsets not in names_in(b):
                return True
    return False


def _is_pointer(term: cst.BaseExpression, pointers: set[str]) -> bool:
    """An alias of the pointer, or a block of them given axes (`ptrs[:, None]`): its own value is an address term
    of its own, read as one."""
    if isinstance(term, cst.Subscript) and all(isinstance(e.slice, cst.Slice) or m.matches(
            e.slice, m.Index(value=m.Name("None"))) for e in term.slice):
        term = term.value
    return isinstance(term, cst.Name) and term.value in pointers


def _check_alias_rows_current(an: _Analyzer, acc: Access, tile: Tile, pointers: set[str]) -> None:
    """A pointer alias the access goes through that was made from the tile's offsets (`ptrs = base + offs[:, None]`,
    or a block `ptrs = base + offs` read as `ptrs[:, None]`) holds the rows those offsets had where it was made: an
    offsets binding between that alias and the access (`offs = other + tl.arange(...)`) gives the wait or notify,
    which reads the binding that reaches the access, other rows than the access touches."""
    assert tile.offsets is not None
    here = (acc.where.line, acc.where.column)
    for name, ref, value in an._pointer_bindings(acc.pointer, pointers - {acc.tensor}):
        if tile.offsets not in names_in(value):
            continue
        made = an.where(ref.node)
        again = [b for b, _ in an.bindings.get(tile.offsets, ())
                 if (made.line, made.column) < (b.line, b.column) < here]
        if again:
            raise _refuse(acc, f"the pointer `{name}` of this {acc.kind} is made from the rows `{tile.offsets}` at "
                               f"line {made.line}, and `{tile.offsets}` is bound again at line {again[0].line}, "
                               f"before the {acc.kind}: the {acc.kind} touches the rows `{tile.offsets}` had at line "
                               f"{made.line}, its {'wait' if acc.kind == 'load' else 'notify'} would cover those of "
                               f"line {again[0].line}",
                          f"make `{name}` after the last binding of `{tile.offsets}` before the {acc.kind}, or give "
                          f"the other rows a name of their own")


def _check_row_terms(an: _Analyzer, acc: Access, tile: Tile, pointers: set[str],
                     exprs: list[cst.BaseExpression]) -> None:
    """The rows a pointer access touches are exactly its tile's offsets vector: each term of the address that
    holds the vector is ``offs[:, None] * stride`` (or ``offs``), no other term moves along that stride, and no
    alias of the pointer is made from another row vector. ``(offs[:, None] + i * BLOCK) * stride``,
    ``(M - 1 - offs[:, None]) * stride`` or ``ptrs + start_n * stride_kn`` read other rows than the wait's."""
    if acc.descriptor or tile.offsets is None or tile.dynamic:
        return
    hint = (f"index the rows with the offsets vector itself, `{tile.offsets}[:, None] * stride`, and compute it for "
            f"the rows the access touches: `{tile.offsets} = start + tl.arange(0, BLOCK)`")
    _check_alias_rows_current(an, acc, tile, pointers)
    others = set(an._offsets_candidates(exprs, 0)) | set(an._offsets_candidates(exprs, 1))
    vectors = {n for n in others if an._offsets_definition(n) is not None} - {tile.offsets}
    strides: set[str] = set()
    scaled = False  # a rows term is multiplied (`offs[:, None] * stride_m`, `offs * 64`)
    rest: list[cst.BaseExpression] = []
    for e in exprs:
        for term, negative in _terms(e):
            if tile.offsets not in names_in(term):
                rest.append(term)
            elif negative or not _is_rows(term, tile.offsets):
                raise _refuse(acc, f"the {acc.kind} at line {acc.where.line} touches the rows "
                                   f"`{'-' if negative else ''}{code(term)}` of {acc.tensor!r}, which are not the "
                                   f"tile's rows `{tile.offsets}`", hint)
            else:
                strides |= names_in(term) - {tile.offsets, "None", "True", "False"}
                scaled = scaled or isinstance(term, cst.BinaryOperation)
    unit = not scaled and an.tensors[acc.tensor][0] == 0  # `x_ptr + offs`: dim 0's stride is 1, rows are elements
    for term in rest:
        if unit and not _is_pointer(term, pointers):
            # a contiguous tensor whose dim 0 has stride 1 has no other dim: every other term moves along the rows
            raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds `{code(term)}` along the "
                               f"rows of {acc.tensor!r} (indexed by `{tile.offsets}` itself, stride 1): it touches "
                               f"other rows than the tile's `{tile.offsets}`", hint)
        moved = names_in(term) & strides - pointers
        if moved and not _is_pointer(term, pointers):
            raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds `{code(term)}` along the "
                               f"rows of {acc.tensor!r} (by {', '.join(sorted(moved))}): it touches other rows than "
                               f"the tile's `{tile.offsets}`", hint)
    for name in sorted(vectors):
        if any(name in names_in(e) and tile.offsets not in names_in(e) for e in exprs):
            raise _refuse(acc, f"a pointer of this {acc.kind} is also made from the rows `{name}`, not only from the "
                               f"tile's `{tile.offsets}`", hint)
    # rows that wrap (`% M`) or are clamped (`tl.where(offs < M, offs, 0)`) read the first rows again: the wait
    # covers those only for a bound that is the tensor's size (`M_VALID < M` sends rows [M_VALID, end) to row 0)
    for value in an._resolved_values(tile.offsets, acc.where):
        bounds = [("wrap at", code(mod.right)) for mod in _row_wraps(value, tile.start)]
        clamp = _clamp_bound(_unhinted(value))
        bounds += [("are clamped to row 0 at", clamp)] if clamp is not None else []
        for what, bound in bounds:
            # a local bound once to the size (`M = ks0`) holds it
            alias = an.param_alias(cst.parse_expression(bound)) if bound.isidentifier() else None
            if tile.size_param is not None and bound != tile.size_param and alias != tile.size_param:
                raise _refuse(acc, f"the rows `{tile.offsets}` {what} `{bound}`, not at the size of {acc.tensor!r} "
                                   f"({tile.size_param}): the rows past it read the first rows, which the wait or "
                                   f"notify covers only at the size",
                              f"{what.split()[0]} the rows at {tile.size_param}, or mask them instead")


def _factors(an: _Analyzer, node: cst.BaseExpression, offsets: str, depth: int = 0) -> list[str] | None:
    """The factors of a rows term ``offs[:, None] * stride_am * 2`` other than the offsets: int literals and parameters
    (a local bound once is read through); ``None`` when one is anything else."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        left, right = _factors(an, node.left, offsets, depth), _factors(an, node.right, offsets, depth)
        return None if left is None or right is None else left + right
    if offsets in names_in(node):
        return []  # the offsets vector itself, expanded (`_is_rows` checked its form)
    if isinstance(node, cst.Integer):
        return [str(int(node.evaluated_value))]
    if isinstance(node, cst.Name) and node.value in an.params:
        # a parameter the kernel binds again holds another value than the argument the launch reads, unless the
        # binding only casts it (`stride_am = stride_am.to(tl.int64)`)
        defs = an.assignments.get(node.value, [])
        if node.value in an.rebound or len(defs) > 1 or (defs and not m.matches(widened_value(defs[0][1]),
                                                                                 m.Name(node.value))):
            return None
        return [node.value]
    if isinstance(node, cst.Name) and depth < 8 and node.value not in an.rebound:
        defs = an.assignments.get(node.value, [])
        return _factors(an, defs[0][1], offsets, depth + 1) if len(defs) == 1 else None
    if node.lpar:
        return _factors(an, node.with_changes(lpar=[], rpar=[]), offsets, depth)
    return None


_Terms = list[tuple[bool, tuple[str, ...]]]  # a sum known at the launch: (subtracted, factors) of each term


def _computed(an: _Analyzer, node: cst.BaseExpression, depth: int = 0) -> bool:
    """``node`` holds a value the kernel computes by a call (``tl.program_id(1)``, a load, ``f(D)``), directly or
    through locals bound once (``pid_n = tl.program_id(1)``)."""
    if m.findall(node, m.Call()):
        return True
    for name in names_in(node) - set(an.params) - an.rebound:
        defs = an.assignments.get(name, [])
        if depth < 8 and len(defs) == 1 and _computed(an, defs[0][1], depth + 1):
            return True
    return False


def _position(an: _Analyzer, node: cst.BaseExpression, depth: int = 0) -> bool:
    """``node`` is a program's position: computed from program ids and the arguments, with no value read from memory
    (``pid_n * BLOCK_N``, with ``pid_n = pid % tl.cdiv(N, BLOCK_N)`` or ``pid_m, pid_n = tile_of(pid, ...)``; through
    locals bound once)."""
    if m.findall(node, m.Subscript() | m.Call(func=m.Attribute(attr=m.Name("load") | m.MatchIfTrue(
            lambda n: n.value.startswith("atomic"))))):
        return False
    called = {c.func.value for c in m.findall(node, m.Call(func=m.Name()))}  # a helper of the file: `tile_of(pid)`
    # a module the file imports a helper from, called through it (FlagGems' `tle.program_id(0)`)
    called |= {c.func.value.value for c in m.findall(node, m.Call(func=m.Attribute(value=m.Name())))  # type: ignore
               if c.func.value.value not in an.assignments and f"{c.func.value.value}.{c.func.attr.value}"  # type: ignore
               in _imported(an)}
    for name in names_in(node) - set(an.params) - called - {"tl"}:
        defs = an.assignments.get(name, [])
        # (a local annotated once, `INDEX_DTYPE: tl.constexpr = tl.int32`, is bound once)
        if depth >= 8 or _bound_again(an, name) or len(defs) != 1 or not _position(an, defs[0][1], depth + 1):
            return False
    return True


def _bound_again(an: _Analyzer, name: str) -> bool:
    """``name`` is rebound in a way a plain assignment is not (a loop's target, an update in place, a named
    expression); a name annotated once (``HALF: tl.constexpr = BLOCK_D // 2``) is bound like any assignment."""
    return name in an.rebound and not (len(an.bindings.get(name, ())) == 1 and m.findall(
        an.fn.body, m.AnnAssign(target=m.Name(name))))


def _bound_twice(an: _Analyzer, node: cst.BaseExpression, depth: int = 0) -> bool:
    """``node`` reads a local bound more than once (``pid_d = pid; pid_d = pid - SHIFT``), directly or through locals
    bound once: its value is the binding that reaches the read, which :func:`_reaching` finds or nothing does."""
    for name in names_in(node) - set(an.params):
        if len(an.bindings.get(name, ())) > 1:
            return True
        defs = an.assignments.get(name, [])
        if depth < 8 and len(defs) == 1 and _bound_twice(an, defs[0][1], depth + 1):
            return True
    return False


def _varies(an: _Analyzer, node: cst.BaseExpression, depth: int = 0) -> bool:
    """``node`` reads a name that changes from one step of a loop to the next (a loop variable, a name updated in
    place or assigned inside a loop), directly or through locals bound once: the advance and sweep checks judge it."""
    loops = an.findall(an.fn.body, m.For() | m.While())
    for name in names_in(node) - set(an.params):
        defs = an.assignments.get(name, [])
        if _bound_again(an, name) or any(_contains(an, loop, where) for loop in loops for where in (
                an.where(ref.node) for ref, _ in defs)):
            return True
        if depth < 8 and len(defs) == 1 and _varies(an, defs[0][1], depth + 1):
            return True
    return False


def _waits(acc: Access) -> str:
    return "wait" if acc.kind == "load" else "notify"


def _scalar_term(an: _Analyzer, acc: Access, term: cst.BaseExpression, negative: bool,
                 offsets: str) -> tuple[bool, tuple[str, ...]] | None:
    """A scalar term of an address along dim 0 as ``(subtracted, factors)`` when the launch can read it; ``None`` when
    it cannot and the term is not computed by a call (a loop variable: not checked); refused when it is computed by a
    call (``tl.program_id(1) * D``, ``f(D)``): TileLink cannot bound it at the launch."""
    factors = None if m.findall(term, m.Call()) else _factors(an, term, offsets)
    if factors is not None:
        return negative, tuple(factors)
    if not _computed(an, term) or _varies(an, term):
        return None
    columns = (f"add that offset to a column vector and mask the vector by the row's length, which the launch "
               f"checks: `cols = {code(term)} + tl.arange(0, BLOCK_D)`, the address `... + cols[None, :]` and "
               f"`mask=... & (cols[None, :] < D)`; or pass the offset as an argument")
    sides = (term.left, term.right) if m.matches(term, m.BinaryOperation(operator=m.Multiply())) else ()
    stride = next((s for s in sides if isinstance(s, cst.Name) and s.value in an.params
                   and s.value not in an.constexpr), None)
    if stride is not None:
        # `row * stride_wn`: a program reading one row of the tensor (a GEMV's row per program), whose rows TileLink
        # reads from a vector of them
        row = code(sides[1] if stride is sides[0] else sides[0])
        columns = (f"if `{row}` is the row this program reads, read it as a tile of one row: `rows = {row} + "
                   f"tl.arange(0, 1)`, the address `{acc.tensor} + rows[:, None] * {stride.value} + ...[None, :]` and "
                   f"`mask=(rows[:, None] < <rows of {acc.tensor}>) & ...`; if it is an offset within the row, "
                   + columns)
    raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds `{code(term)}` along the rows of "
                       f"{acc.tensor!r}, a value the kernel computes (through a call or a program id), which TileLink "
                       f"cannot bound at the launch: the {acc.kind} may touch other rows than those its {_waits(acc)} "
                       f"covers", columns)


def _loop_term(an: _Analyzer, acc: Access, term: cst.BaseExpression, negative: bool,
               offsets: str) -> list[_Terms] | None:
    """A scalar term along dim 0 that a loop variable times int literals and parameters makes (``+ j``, ``+ j * 2``
    with ``for j in range(a, b[, step])`` around the access, ``a`` and ``b`` sums the launch reads, the step a literal
    or left out): the term at ``a`` and at ``b - 1`` (``b + 1`` counting down), as two ways the launch checks like any
    other. The sum is linear in the variable and every value of the loop lies between those two, so both ends within
    a row keep every step within it. ``None`` when it is not such a term (a step of unknown sign, a bound the launch
    cannot read: the advance and sweep checks judge it)."""
    parts, todo = [], [term]
    while todo:
        node = todo.pop()
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            todo += [node.right, node.left]
        else:
            parts.append(node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node)
    variables = [p for p in parts if isinstance(p, cst.Name) and p.value not in an.params and not _factors(
        an, p, offsets)]
    if len(variables) != 1:
        return None
    (var,) = variables
    factors: list[str] = []
    for part in parts:
        if part is var:
            continue
        found = None if m.findall(part, m.Call()) else _factors(an, part, offsets)
        if found is None:
            return None
        factors += found
    if len(an.bindings.get(var.value, [])) != 1:
        return None  # bound again besides its loop: its value is not the loop's
    for loop in an.findall(an.fn.body, m.For(target=m.Name(var.value))):
        read = _range_args(loop)
        if read is None or not _contains(an, loop, acc.where):
            return None
        lo, hi, step = read
        down = isinstance(step, cst.UnaryOperation) and isinstance(step.operator, cst.Minus)
        if not isinstance(step.expression if down else step, cst.Integer):  # type: ignore[attr-defined]
            return None  # a step of unknown sign: the last value may lie on either side of `b`
        ends: list[_Terms] = []
        for bound, last in ((lo, False), (hi, True)):
            # the loop stops before `b`: its last value is at most `b - 1` counting up, at least `b + 1` counting down
            terms: _Terms = [(not down, ("1",))] if last else []
            for t, neg in _terms(bound):
                if isinstance(t, cst.UnaryOperation) and isinstance(t.operator, cst.Minus):
                    t, neg = t.expression, not neg  # `range(n - 1, -1, -1)`
                found = None if m.findall(t, m.Call() | m.Subscript()) else _factors(an, t, offsets)
                if found is None:
                    return None
                if "0" not in found:
                    terms.append((neg, tuple(found)))
            ends.append([(n != negative, f + tuple(factors)) for n, f in terms])
        return ends
    return None


def _nonnegative_value(an: _Analyzer, node: cst.BaseExpression, depth: int = 0,
                       passed: frozenset[str] = frozenset()) -> set[str] | None:
    """The parameters whose signs make ``node`` non-negative: it is built from ``tl.arange(0, B)``, int literals of
    at least 0, program ids and parameters the kernel leaves as passed, by ``+``, ``*``, ``//``, ``%``, ``tl.cdiv``
    and minima (whose operands are then non-negative too), maxima (one of them) and casts, through locals each of
    whose assigned values is such. ``None`` when it is anything else (``tl.arange(0, B) - 2``, a loaded value, a loop's
    target, a local advanced with ``+=``), whose sign TileLink cannot tell. A parameter the kernel binds again by
    assignments (`stride_xs = stride_xs * 2`) is read through them, its argument (``passed`` there) non-negative; a
    straight-line helper's call (`tle.program_id(0)`, returning `tl.program_id(axis).to(tl.int64)`) through what it
    returns."""
    node = _bare(node)
    if depth > 8:
        return None
    if isinstance(node, cst.Integer):
        return set() if int(node.evaluated_value) >= 0 else None
    if isinstance(node, cst.Name):
        defs = an.assignments.get(node.value, [])
        if node.value in passed:
            return {node.value}
        if node.value in an.params:
            if not defs and node.value not in an.rebound:
                return {node.value}
            if node.value in an.rebound or len(defs) != len(an.bindings.get(node.value, ())):
                return None
            signs = {node.value}
            for _, value in defs:
                sign = _nonnegative_value(an, value, depth + 1, passed | {node.value})
                if sign is None:
                    return None
                signs |= sign
            return signs
        # a local bound more than once (`offs_k = tl.arange(0, BLOCK_K)` in a persistent kernel's body loop and
        # again in its tail, `col += BLOCK` in a loop) holds one of its values wherever it is read: non-negative when
        # each of them is, every binding an assignment of a value (also annotated) or an in-place `+=` / `*=` of one
        # (not a loop's target beside them, nor an unpacking)
        augs = an.findall(an.fn.body, m.AugAssign(target=m.Name(node.value)))
        bindings = len(an.bindings.get(node.value, ()))
        if not defs and not augs and bindings == len(an.findall(an.fn.body, m.For(target=m.Name(node.value)))):
            return _loop_target_sign(an, node.value, depth)  # bound by its loops alone
        if not defs or len(defs) + len(augs) != bindings or any(
                not isinstance(a.operator, (cst.AddAssign, cst.MultiplyAssign)) for a in augs):
            return None
        signs: set[str] = set()
        for value in [v for _, v in defs] + [a.value for a in augs]:
            # `col = col + d` adds to a value it held, as `col += d` does: non-negative where `d` is
            step = _step_of(_bare(value), node.value)
            if step is not None and not (isinstance(_bare(value), cst.BinaryOperation)
                                         and isinstance(_bare(value).operator, cst.Subtract)):
                value = step
            sign = _nonnegative_value(an, value, depth + 1, passed)
            if sign is None:
                return None
            signs |= sign
        return signs
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Multiply, cst.FloorDivide,
                                                                            cst.Modulo)):
        # (the depth counts the names and helpers read through: an expression's own nesting ends by itself)
        left, right = (_nonnegative_value(an, node.left, depth, passed),
                       _nonnegative_value(an, node.right, depth, passed))
        return None if left is None or right is None else left | right
    if isinstance(node, cst.Call):
        if m.matches(node.func, m.Attribute(value=m.Name("tl"), attr=m.Name("program_id") | m.Name("num_programs"))):
            return set()
        if m.matches(node.func, m.Attribute(value=m.Name("tl"), attr=m.Name("arange"))) and len(node.args) == 2 \
                and m.matches(node.args[0].value, m.Integer("0")):
            return set()
        if m.matches(node.func, m.Attribute(attr=m.Name("to")) | m.Attribute(value=m.Name("tl"),
                                                                                  attr=m.Name("cast"))):
            # a cast to a 64-bit int keeps the value (`tl.int8` wraps, an unsigned one turns a
            # negative value into a large one)
            inner = widened_value(node)
            return None if inner is None else _nonnegative_value(an, inner, depth, passed)
        args = [a.value for a in node.args if a.keyword is None and not a.star]
        if len(args) == 2 == len(node.args) and m.matches(node.func, m.Attribute(
                value=m.Name("tl") | m.Name("triton"), attr=m.Name("cdiv")) | m.Attribute(
                value=m.Name("tl"), attr=m.Name("minimum") | m.Name("maximum")) | m.Name("min") | m.Name("max")):
            signs = [_nonnegative_value(an, a, depth, passed) for a in args]
            if m.matches(node.func, m.Attribute(attr=m.Name("maximum")) | m.Name("max")):
                known = [s for s in signs if s is not None]  # at least the one of them that is non-negative
                return min(known, key=len) if known else None
            return None if None in signs else signs[0] | signs[1]
        if m.matches(node.func, m.Attribute(value=m.Name("tl"), attr=m.Name("multiple_of") | m.Name(
                "max_contiguous"))) and node.args:
            return _nonnegative_value(an, node.args[0].value, depth, passed)
        returned = _helper_value(an, node)
        if returned is not None:
            return _nonnegative_value(an, returned, depth + 1, passed)
    return None


#: the keywords of a `tl.range` loop that leave the values its target takes as they are
_LOOP_KEYWORDS = ("num_stages", "flatten", "loop_unroll_factor", "warp_specialize", "disallow_acc_multi_buffer",
                  "disable_licm")


def _range_args(loop: cst.For) -> tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression] | None:
    """``(start, stop, step)`` of a ``for`` loop over ``range`` / ``tl.range`` / ``tl.static_range`` (``step=`` as a
    keyword too); ``None`` for any other loop, a starred argument or another keyword."""
    it = loop.iter
    if not (isinstance(it, cst.Call) and (m.matches(it.func, m.Name("range")) or m.matches(
            it.func, m.Attribute(value=m.Name("tl"), attr=m.Name("range") | m.Name("static_range"))))):
        return None
    args = [a.value for a in it.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in it.args if a.keyword is not None}
    if any(a.star for a in it.args) or set(keywords) - {"start", "end", "step", *_LOOP_KEYWORDS}:
        return None
    if keywords and isinstance(it.func, cst.Name):
        return None  # compiled Triton reads the builtin `range`'s arguments by position only: `step=4` is dropped
    if "step" in keywords:
        if len(args) > 2:
            return None
        args = args + [keywords["step"]] if len(args) == 2 else None
    if not args or not 1 <= len(args) <= 3 or {"start", "end"} & set(keywords):
        return None
    start, stop = (args[0], args[1]) if len(args) >= 2 else (cst.Integer("0"), args[0])
    return start, stop, args[2] if len(args) == 3 else cst.Integer("1")


def _loop_target_sign(an: _Analyzer, name: str, depth: int) -> set[str] | None:
    """The parameters whose signs make the target of ``for name in range(a, b[, step])`` loops (``tl.range``,
    ``tl.static_range``; one or several loops binding the same name, as the layer-norm tutorial's three `for off in
    range(0, N, BLOCK_SIZE)`) non-negative: those of each ``a`` and ``step``, counting up from a non-negative start.
    ``None`` for any other loop, or a start or step whose sign TileLink cannot tell."""
    loops = an.findall(an.fn.body, m.For(target=m.Name(name)))
    signs: set[str] = set()
    for loop in loops:
        found = _range_args(loop)
        if found is None:
            return None
        for part in (found[0], found[2]):
            sign = _nonnegative_value(an, part, depth + 1)
            if sign is None:
                return None
            signs |= sign
    return signs if loops else None


class _ValueNames(cst.CSTTransformer):
    """A transformer of the names an expression reads as values (``leave_Name``): not an attribute's name (``tl``'s
    ``cdiv``, though its base is a value: ``(off_hz // HEADS).to(...)``) nor a keyword (``axis=``)."""

    def again(self) -> _ValueNames:
        """A transformer like this one, for an attribute's base."""
        raise NotImplementedError

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # its name is no value: only its base is transformed, below

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return updated.with_changes(value=original.value.visit(self.again()))

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)  # `axis=`: a keyword, not a value


def program_value(an: _Analyzer, source: str, loops: bool = False, at: Where | None = None) -> str:
    """``source`` (an expression of the kernel) with each local bound once written out as its value, down to program
    ids, parameters and literals (``off_z`` -> ``(tl.program_id(1) // HEADS).to(tl.int64)``), for the launch to bound
    from the grid; a name bound more than once, or in a loop, stays as it is (the launch then cannot bound it). With
    ``loops``, a local bound once in a loop is written out too, and the target of a ``for`` loop over ``range`` /
    ``tl.range`` becomes ``tl.range(a, b, step)``, which the launch reads as any value of that loop (``tile_id`` of
    ``for tile_id in tl.range(start_pid, num_tiles, NUM_SMS)``); read at ``at``, a local bound more than once is
    written out as the assignment that reaches ``at`` (:func:`_reaching`), a counter advanced in step with a loop as
    that loop's target (:func:`_counter_target`)."""

    class _Expand(_ValueNames):
        def __init__(self, depth: int, at: Where | None) -> None:
            super().__init__()
            self.depth = depth
            self.at = at  # where the expression is read: a name bound more than once takes the value that reaches it

        def again(self) -> _Expand:
            return _Expand(self.depth, self.at)

        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            defs = an.assignments.get(original.value, [])
            if loops and not defs and self.depth < 16 and original.value not in an.params:
                found = _loop_range(an, original.value, self.at)
                return updated if found is None else found[0].visit(_Expand(self.depth + 1, found[1]))
            if self.depth >= 16 or original.value in an.params:
                return updated
            if _bound_again(an, original.value) or len(defs) != 1 or len(an.bindings.get(original.value, [])) > 1:
                if not loops or self.at is None:
                    return updated
                # `tile_id_c += NUM_SMS` in step with its loop's target, or the one assignment that reaches the read
                # (`pid_m, pid_n = ...` bound again for the store after the loads)
                target = _counter_target(an, original.value, self.at)
                if target is not None:
                    inner = target.visit(_Expand(self.depth + 1, self.at))
                    return inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if hasattr(
                        inner, "lpar") else inner
                reach = _reaching(an, original.value, self.at)
                if reach is None:
                    return updated
                defs = [reach]
            elif not loops and _varies(an, original):
                return updated
            if loops and self.at is not None and any(
                    any(lp.body is b for b in defs[0][0].blocks) and not _contains(an, lp.body, self.at)
                    for lp in an.findall(an.fn.body, m.For() | m.While())):
                return updated  # bound in a loop, read after it: its last step's value, not any step's
            slot = _unpacked_slot(defs[0][0], defs[0][1], original.value)
            if slot is None and any(
                    isinstance(small, cst.Assign) and small.value is defs[0][1] and any(isinstance(
                        t.target, (cst.Tuple, cst.List)) and original.value in names_in(t.target)
                        for t in small.targets) for small in small_statements(defs[0][0])):
                return updated  # an unpacking TileLink cannot place the name in (`p, p = a, b`, a starred target)
            inner = defs[0][1].visit(_Expand(self.depth + 1, an.where(defs[0][0].node)))
            if slot is not None:
                # `pid_m, pid_n = tile_of(pid, N, BLOCK_N)`: the element the name takes, where the value is a tuple
                # (the helper's `return pid // n, pid % n` written out); else the launch cannot bound it
                elements = _bare(inner).elements if isinstance(_bare(inner), cst.Tuple) else None
                if elements is None or len(elements) <= slot:
                    return updated
                inner = elements[slot].value
            return inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if hasattr(inner, "lpar") \
                else inner

        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            value = _helper_value(an, updated)
            return updated if value is None else value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    try:
        return code(cst.parse_expression(source).visit(_Expand(0, at)))
    except cst.ParserSyntaxError:
        return source


def launch_value(an: _Analyzer, source: str, at: Where) -> str | None:
    """``source`` written out at ``at`` (:func:`program_value`, loops read as their ranges) where what is left reads
    only program ids, the arguments as the kernel uses them, literals and ``tl`` / ``triton`` calls, for the launch to
    evaluate over the grid; ``None`` where it reads a value from memory or a name it cannot write out."""
    from tilelink.tile_rows import passed_params

    written = program_value(an, source, loops=True, at=at)
    try:
        parsed = cst.parse_expression(written)
    except cst.ParserSyntaxError:
        return None
    if _value_names(parsed) - passed_params(an) - {"tl", "triton"} or m.findall(
            parsed, m.Subscript() | m.Call(func=m.Attribute(attr=m.Name("load") | m.MatchIfTrue(
                lambda n: n.value.startswith("atomic"))))):
        return None
    return written


def _loop_range(an: _Analyzer, name: str, at: Where | None = None) -> tuple[cst.Call, Where] | None:
    """``tl.range(a, b, step, loop=L)`` (``L`` the loop's line) for the target ``name`` of the one ``for`` loop over
    ``range(a, b[, step])`` (also ``tl.range``, ``tl.static_range``) that binds it, and binds nothing else, with where
    the loop reads its bounds; read at ``at``, of the loop whose body holds ``at`` (where several loops bind the name,
    nothing else binding it inside that loop: two tile loops on the two sides of an ``if``). ``None`` for any other
    name or place (read after the loop, the target holds its last value only)."""
    found = an.findall(an.fn.body, m.For(target=m.Name(name)))
    if an.findall(an.fn.body, m.AugAssign(target=m.Name(name)) | m.NamedExpr(target=m.Name(name))):
        return None
    if len(found) > 1 and at is not None:
        holding = [lp for lp in found if _contains(an, lp.body, at)]
        loop = holding[-1] if holding else None  # the innermost
        if loop is None or any(_contains(an, loop, w) and w != an.where(loop)
                               for w, _ in an.bindings.get(name, ())):
            return None
        found = [loop]
    elif len(found) != 1 or len(an.bindings.get(name, ())) != 1:
        return None
    elif at is not None and not _contains(an, found[0].body, at):
        return None  # read after the loop: its last value, not any of the range
    read = _range_args(found[0])
    if read is None:
        return None
    start, stop, step = read
    # `loop=` names the loop (its line): two loops over equal ranges are two loops (nested ones step apart)
    line = cst.Arg(cst.Integer(str(an.where(found[0]).line)), keyword=cst.Name("loop"),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))
    return cst.Call(func=cst.Attribute(value=cst.Name("tl"), attr=cst.Name("range")),
                    args=[cst.Arg(start), cst.Arg(stop), cst.Arg(step), line]), an.where(found[0])


def _before(a: Where, b: Where) -> bool:
    return (a.line, a.column) < (b.line, b.column)


def _end(an: _Analyzer, node: cst.CSTNode) -> Where:
    end = an.positions[node].end
    return Where(an.file, end.line, end.column + 1)


def _reaching(an: _Analyzer, name: str, at: Where) -> tuple[StmtRef, cst.BaseExpression] | None:
    """The assignment of ``name`` that every run reaching ``at`` last made: a statement ``name = value`` (or a tuple
    unpacking) of a block that holds ``at``, before it, with no other binding of the name after it and within the
    statement of that block that holds ``at`` (a loop there runs its later bindings before ``at`` again). ``None``
    where no assignment is such (one in a branch, a loop's target, an update in place in between)."""
    best = None
    for ref, value in an.assignments.get(name, []):
        block = ref.blocks[-1] if ref.blocks else an.fn.body
        if not _before(_end(an, ref.node), at) or not (block is an.fn.body or _contains(an, block, at)):
            continue
        if not any(isinstance(small, cst.Assign) and any(name in names_in(t.target) for t in small.targets)
                   or isinstance(small, cst.AnnAssign) and m.matches(small.target, m.Name(name))
                   for small in small_statements(ref)):
            # a named expression: it may sit where it does not run (`c and (x := v)`); the value itself may be
            # written out already (an offsets grid folded into it)
            continue
        if best is None or _before(an.where(best[0].node), an.where(ref.node)):
            best = (ref, value)
    if best is None:
        return None
    ref = best[0]
    block = ref.blocks[-1] if ref.blocks else an.fn.body
    holder = next((st for st in getattr(block, "body", ()) if _contains(an, st, at)), None)
    if holder is None:
        return None
    start, stop, until = an.where(ref.node), _end(an, ref.node), _end(an, holder)
    spans = [where for where, _ in an.bindings.get(name, [])]
    inside = [w for w in spans if not _before(w, start) and not _before(stop, w)]
    loops = [n for n in (holder, *m.findall(holder, m.For() | m.While())) if isinstance(n, (cst.For, cst.While))]

    def reaches(w: Where) -> bool:
        # a binding after the assignment and up to the read, or after the read in a loop around both (it runs before
        # the read on the loop's next pass); not the read's own statement binding it afterwards (`p = p % n`)
        return _before(w, at) or any(_contains(an, loop, at) and _contains(an, loop, w) for loop in loops)

    if len(inside) != 1 or any(_before(stop, w) and not _before(until, w) and reaches(w) for w in spans):
        return None
    return best


def _bound_in_a_loop(an: _Analyzer, name: str) -> bool:
    """Some binding of ``name`` (an assignment, ``+=``, ``:=``, a loop's target) lies in a ``for`` or ``while`` loop:
    its value may move from one step to the next."""
    loops = an.findall(an.fn.body, m.For() | m.While())
    return any(_contains(an, loop, at) for at, _ in an.bindings.get(name, []) for loop in loops)


def _reaching_every_read(an: _Analyzer, name: str, acc: Access) -> tuple[StmtRef, cst.BaseExpression] | None:
    """The assignment of ``name`` that reaches ``acc`` (:func:`_reaching`) where every read of the name before the
    access that may flow into it comes after it too: a pointer built from the name before it was bound again reads
    another binding. A read in the value of an assignment to a name the access's address and mask do not rest on
    (``rbn = rn % N`` for another operand's pointer, before ``rn`` is made again for the output's) reads the name for
    something else, and is left out."""
    at = acc.where
    reach = _reaching(an, name, at)
    if reach is None:
        return None
    used, todo = set(), [acc.pointer] + ([acc.mask] if acc.mask else [])
    while todo:
        for n in names_in(cst.parse_expression(todo.pop())) - used:
            used.add(n)
            todo.extend(code(v) for _, v in an.assignments.get(n, []))
    elsewhere: set[int] = set()
    for n, defs in an.assignments.items():
        if n in used:
            continue
        for ref, value in defs:
            # the value of a plain assignment to a name the access does not rest on (a tuple unpacking or a named
            # expression may bind others too: its reads stay)
            # (a named expression inside the value binds a name of its own, which the address may rest on)
            if not m.findall(value, m.NamedExpr()) and any(
                    isinstance(small, cst.Assign) and small.value is value and len(small.targets) == 1
                    and m.matches(small.targets[0].target, m.Name(n)) for small in small_statements(ref)):
                elsewhere |= {id(x) for x in m.findall(value, m.Name(name))} | (
                    {id(value)} if m.matches(value, m.Name(name)) else set())
        if n in an.twins:  # bound on both sides of an `if` (`rbn = rn % N` in each): each side reads it so
            elsewhere |= {id(x) for value in an.twins[n] for x in m.findall(value, m.Name(name))} | {
                id(value) for value in an.twins[n] if m.matches(value, m.Name(name))}
    # a widening of the name in place (`rn = rn.to(tl.int64)`) reads it to make the same values again
    elsewhere |= {id(x) for value in an.widened.get(name, []) for x in m.findall(value, m.Name(name))}
    start, targets = an.where(reach[0].node), _target_names(an, name)
    for node in an.findall(an.fn.body, m.Name(name)):
        if id(node) in targets or id(node) in elsewhere:
            continue
        where = an.where(node)
        if _before(where, at) and _before(where, start):
            return None
    return reach


def _reaching_at_stores(an: _Analyzer, accesses: list[Access],
                        aliases: dict[str, tuple[str, ...]]) -> dict[tuple[str, Where], tuple[str, Where]]:
    """``KernelAnalysis.reaching_at_stores``: for each pointer store, the names bound more than once that its address
    or mask reads through plain assignments, each with the assignment :func:`_reaching_every_read` finds."""
    found: dict[tuple[str, Where], tuple[str, Where]] = {}
    for acc in accesses:
        if acc.kind != "store" or acc.descriptor:
            continue
        pointers = set(aliases.get(acc.tensor, ()))
        names: set[str] = set()
        for e in an._pointer_definitions(acc.pointer, pointers):
            names |= names_in(e)
        if acc.mask:
            names |= names_in(cst.parse_expression(acc.mask))
        for name in sorted(names - pointers):
            if len(an.bindings.get(name, ())) < 2:
                continue
            reach = _reaching_every_read(an, name, acc)
            if reach is not None:
                found[(name, acc.where)] = (code(reach[1]), an.where(reach[0].node))
    return found


def _target_names(an: _Analyzer, name: str) -> set[int]:
    """The ``Name`` nodes that bind ``name`` (assignment, loop and ``with`` targets), not reads of it."""
    found: set[int] = set()
    for node in an.findall(an.fn.body, m.Assign() | m.AnnAssign() | m.For() | m.NamedExpr() | m.WithItem()):
        if isinstance(node, cst.Assign):
            roots = [t.target for t in node.targets]
        elif isinstance(node, cst.WithItem):
            roots = [node.asname.name] if node.asname is not None else []
        else:
            roots = [node.target]
        for root in roots:
            found |= {id(n) for n in m.findall(root, m.Name(name))} | ({id(root)} if m.matches(root, m.Name(name))
                                                                         else set())
    return found


def _counter_target(an: _Analyzer, name: str, at: Where) -> cst.BaseExpression | None:
    """The value ``name`` holds at ``at`` where it counts the steps of a loop ``for t in range(a, b, s)``: ``name =
    init`` before the loop in its block, ``name += d`` a statement of the loop's body (before ``at``, or after it: the
    count of the steps before this one), the one binding of the name in the kernel besides that assignment, ``at``
    in the loop's body, no ``continue`` or ``break`` in it: ``init + ((t - a) // s + 1) * d`` (``+ 0`` with the update
    after ``at``), and the target ``t`` itself where ``init = a - s`` and ``d`` is ``s`` (the tutorials' ``tile_id_c``
    of a persistent matmul, which finds the output's tile again after the loads). ``None`` for any other name or
    place."""
    bindings = an.bindings.get(name, [])
    defs = an.assignments.get(name, [])
    augs = an.findall(an.fn.body, m.AugAssign(target=m.Name(name)))
    if len(bindings) != 2 or len(defs) != 1 or len(augs) != 1 or not isinstance(augs[0].operator, cst.AddAssign):
        return None
    (init_ref, init), update = defs[0], augs[0]
    if not any(isinstance(small, cst.Assign) and small.value is init and len(small.targets) == 1 and isinstance(
            small.targets[0].target, cst.Name) for small in small_statements(init_ref)):
        return None
    update_ref = next((r for r in an.statements if update in small_statements(r)), None)
    if update_ref is None or not update_ref.blocks:
        return None
    loop = next((lp for lp in an.findall(an.fn.body, m.For()) if lp.body is update_ref.blocks[-1]), None)
    read = _range_args(loop) if loop is not None else None
    if read is None or not isinstance(loop.target, cst.Name) or len(an.bindings.get(loop.target.value, [])) != 1:
        return None
    if m.findall(loop.body, m.Continue() | m.Break()) or not _contains(an, loop.body, at):
        return None
    before = _before(_end(an, update_ref.node), at)
    if not before and not _before(at, an.where(update_ref.node)):
        return None  # read inside the update's own statement
    block = init_ref.blocks[-1] if init_ref.blocks else an.fn.body
    if loop not in getattr(block, "body", ()) or not _before(_end(an, init_ref.node), an.where(loop)):
        return None
    start, _, step = read
    # the same names at the assignment, at the loop and at each update: parameters left as passed, or locals assigned
    # once before it
    from tilelink.tile_rows import passed_params

    passed = passed_params(an)
    for n in (names_in(init) | names_in(start) | names_in(step) | names_in(update.value)) - {"tl", "triton"}:
        if n in an.params and n not in passed or n not in an.params and (
                len(an.bindings.get(n, [])) != 1 or _reaching(an, n, an.where(init_ref.node)) is None):
            return None
    first, begin, stride = _poly(_bare(init)), _poly(_bare(start)), _poly(_bare(step))
    if before and code(_bare(update.value)) == code(_bare(step)) and None not in (first, begin, stride):
        total = dict(first)
        for k, v in stride.items():
            total[k] = total.get(k, 0) + v
        if {k: v for k, v in total.items() if v} == begin:
            return cst.Name(loop.target.value)
    steps = f"(({loop.target.value}) - ({code(start)})) // ({code(step)})" + (" + 1" if before else "")
    return cst.parse_expression(f"({code(init)}) + ({steps}) * ({code(update.value)})")


def _elementwise(target: cst.Tuple | cst.List, value: cst.BaseExpression) -> dict[str, cst.BaseExpression]:
    """``a_ptrs, b_ptrs = (a_ptr + ..., b_ptr + ...)``: each name of a flat tuple of names with the element of a
    tuple of as many values that it takes, as if bound by an assignment of its own (`a_ptrs, b_ptrs = a_ptrs + da,
    b_ptrs + db` too). Empty for any other unpacking, and where an element reads another name the statement binds
    (`a, b = b, a` takes the values from before it)."""
    value = _bare(value)
    names = [e.value.value if isinstance(e.value, cst.Name) else None for e in target.elements]
    if not isinstance(value, (cst.Tuple, cst.List)) or None in names or len(set(names)) != len(names) or len(
            names) != len(value.elements) or any(isinstance(e, cst.StarredElement) for e in
                                                 (*target.elements, *value.elements)):
        return {}
    if any(names_in(e.value) & (set(names) - {n}) for n, e in zip(names, value.elements, strict=True)):
        return {}
    return {n: e.value for n, e in zip(names, value.elements, strict=True)}  # type: ignore[misc]


def _unpacked_slot(ref: StmtRef, value: cst.BaseExpression, name: str) -> int | None:
    """Where ``name`` stands in the flat tuple a statement unpacks ``value`` into (``pid_m, pid_n = ...``: 1 for
    ``pid_n``); ``None`` where the statement assigns ``value`` to the name itself (or unpacks into nested targets)."""
    for small in small_statements(ref):
        if isinstance(small, cst.Assign) and small.value is value:
            for t in small.targets:
                if isinstance(t.target, (cst.Tuple, cst.List)):
                    names = [e.value.value if isinstance(e.value, cst.Name) else None for e in t.target.elements]
                    if names.count(name) != 1 or any(isinstance(e, cst.StarredElement) for e in t.target.elements):
                        return None  # `p, p = a, b` binds the last; after a starred target the slots shift
                    return names.index(name)
    return None


def _helper_value(an: _Analyzer, call: cst.Call) -> cst.BaseExpression | None:
    """What a ``@triton.jit`` helper of the kernel's file (or one it imports by name) returns for ``call``, written out
    over its arguments, where its body is straight-line: assignments to names, then one ``return`` (``def tile_of(pid,
    N, BLOCK_N): n = tl.cdiv(N, BLOCK_N); return pid // n, pid % n``), and it reads no name but its parameters, its
    locals, ``tl`` and ``triton`` (a global of its module is not the kernel's name of that spelling). ``None`` for any
    other helper or call, and for a name the file binds more than once (the last binding is the one that runs)."""
    if any(a.star for a in call.args):
        return None
    if m.matches(call.func, m.Attribute(value=m.Name("tl"), attr=m.Name("swizzle2d"))):
        fn = _triton_helper("swizzle2d")
        return None if fn is None else _returned_value(fn, call)
    if m.matches(call.func, m.Attribute(value=m.Name())) and call.func.value.value not in an.assignments:  # type: ignore
        # a helper of a module the file imports, called through it (`tle.program_id(0)`)
        fn = _defined(_imported(an).get(f"{call.func.value.value}.{call.func.attr.value}"))  # type: ignore
        return None if fn is None else _returned_value(fn, call)
    if not isinstance(call.func, cst.Name):
        return None
    fn, imported = _named_helper(an, call.func.value)
    if fn is None:
        return None
    return _returned_value(fn, call) if imported else _returned_value(fn, call, _int_constants(an))


def _named_helper(an: _Analyzer, name: str) -> tuple[cst.FunctionDef | None, bool]:
    """The ``@triton.jit`` function a call of the plain name ``name`` runs (:func:`_helper_value`), and whether the
    file imports it; ``(None, False)`` where it is not one TileLink can read. Found once per name."""
    if name not in an.named_helpers:
        an.named_helpers[name] = _find_named_helper(an, name)
    return an.named_helpers[name]


def _find_named_helper(an: _Analyzer, name: str) -> tuple[cst.FunctionDef | None, bool]:
    bound = [f for f in an.module.body if isinstance(f, (cst.FunctionDef, cst.ClassDef)) and f.name.value == name]
    bound += [small for line in an.module.body if isinstance(line, cst.SimpleStatementLine) for small in line.body
              if name in _top_level_names(small)]
    # bound anywhere else in the module too (`try: from lib import f` / `except ImportError: def f(...)`, a
    # definition under `if`): the one that runs is not known here
    anywhere = len(an.findall(an.module, m.FunctionDef(name=m.Name(name)) | m.ClassDef(name=m.Name(name)))) + sum(
        name in _top_level_names(small) for small in an.findall(
            an.module, m.Import() | m.ImportFrom() | m.Assign() | m.AnnAssign() | m.AugAssign()))
    if anywhere != 1:
        return None, False
    place = next((i for i, stmt in enumerate(an.module.body) if stmt is bound[0] or (
        isinstance(stmt, cst.SimpleStatementLine) and any(small is bound[0] for small in stmt.body))),
        len(an.module.body)) if bound else len(an.module.body)
    if any(an.findall(stmt, m.ImportFrom(names=m.ImportStar())) for stmt in an.module.body[place:]):
        return None, False  # a star import after it may bind the name again
    fn = bound[0] if len(bound) == 1 and isinstance(bound[0], cst.FunctionDef) and any(
        is_triton_jit(d) for d in bound[0].decorators) else None
    if fn is None and len(bound) == 1 and isinstance(bound[0], (cst.Import, cst.ImportFrom)):
        # one the file imports by name (`from tilelink.ops.gemm_kernels import tile_coordinates`)
        return _defined(_imported(an).get(name)), True
    return fn, False


def _int_constants(an: _Analyzer) -> dict[str, cst.Integer]:
    """The file's names bound once, at its top level, to an int literal (`GROUP = 4`), and nowhere else: Triton
    reads such a global as that constant where a helper of the file uses it. Read once per kernel."""
    if an.int_constants is not None:
        return an.int_constants
    found: dict[str, cst.Integer] = {}
    for line in an.module.body:
        if isinstance(line, cst.SimpleStatementLine):
            for small in line.body:
                if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(
                        small.targets[0].target, cst.Name) and isinstance(small.value, cst.Integer):
                    found[small.targets[0].target.value] = small.value
    from tilelink.helper_sources import module_bindings

    starred = any(m.findall(stmt, m.ImportFrom(names=m.ImportStar())) for stmt in an.module.body)
    bound = {} if starred else module_bindings(an.module)
    an.int_constants = {n: v for n, v in found.items() if bound.get(n) == 1}
    return an.int_constants


def _defined(source: str | None) -> cst.FunctionDef | None:
    """The one function a helper's source defines; ``None`` for no source or anything else."""
    found = cst.parse_module(source).body if source is not None else ()
    return found[0] if len(found) == 1 and isinstance(found[0], cst.FunctionDef) else None


def _imported(an: _Analyzer) -> dict[str, str]:
    """The ``@triton.jit`` helpers the kernel's file imports (:func:`imported_helpers`), read once."""
    if an.imported is None:
        an.imported = imported_helpers(an.module, an.file, is_triton_jit)
    return an.imported


def _triton_helper(name: str) -> cst.FunctionDef | None:
    """Triton's own ``@triton.jit`` helper ``name`` of ``triton.language.standard`` (``tl.swizzle2d``), as the
    installed Triton defines it, its ``core.minimum`` read as ``tl.minimum``; ``None`` where it has no such source."""
    try:
        import inspect

        import triton.language.standard as standard

        helper = getattr(standard, name, None)
        source = getattr(helper, "src", None)  # a JITFunction's; in the interpreter, the function it wraps
        if not isinstance(source, str) and callable(getattr(helper, "fn", None)):
            source = inspect.getsource(helper.fn)
        found = cst.parse_module(textwrap.dedent(source)).body if isinstance(source, str) else ()
    except (ImportError, OSError, TypeError, cst.ParserSyntaxError):
        return None
    if found and isinstance(found[0], cst.FunctionDef):
        found = [found[0].with_changes(decorators=[])]  # the interpreter's source keeps `@jit`
    if len(found) != 1 or not isinstance(found[0], cst.FunctionDef):
        return None

    class _Core(cst.CSTTransformer):
        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
            return updated.with_changes(value=cst.Name("tl")) if m.matches(updated.value, m.Name("core")) else updated

    return found[0].visit(_Core())


def _returned_value(fn: cst.FunctionDef, call: cst.Call,
                    constants: dict[str, cst.Integer] | None = None) -> cst.BaseExpression | None:
    """What the straight-line helper ``fn`` returns for ``call``, written out over its arguments (see
    :func:`_helper_value`); ``constants``: the int globals of its module it may read (:func:`_int_constants`)."""
    if fn.params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or fn.params.kwonly_params \
            or fn.params.star_kwarg is not None or fn.params.posonly_params \
            or not isinstance(fn.body, cst.IndentedBlock):
        return None
    params = [p.name.value for p in fn.params.params]
    given: dict[str, cst.BaseExpression] = {}
    for k, a in enumerate(call.args):
        key = a.keyword.value if a.keyword is not None else (params[k] if k < len(params) else None)
        if key not in params or key in given:
            return None
        given[key] = a.value
    for p in fn.params.params:
        if p.name.value not in given:
            if not isinstance(p.default, cst.Integer):
                return None  # no default, or one that reads a name of the helper's module
            given[p.name.value] = p.default
    env = {n: v.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if hasattr(v, "lpar") else v
           for n, v in given.items()}
    known = set(params) | {"tl", "triton"} | {"min", "max"}  # Triton reads the builtins as tl.minimum, tl.maximum
    for name, value in (constants or {}).items():
        if name not in params and name not in env:
            env[name], known = value, known | {name}

    class _Put(_ValueNames):
        def again(self) -> _Put:
            return _Put()

        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            return env.get(original.value, updated)

    if m.findall(fn.body, _EFFECTS):
        return None  # its effect would be left out of what it returns (`t = tl.atomic_add(q, 1)`, then `return ...`)
    for statement in fn.body.body:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        small = statement.body[0]
        if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
            continue  # the docstring
        last = statement is fn.body.body[-1]
        value = small.value if isinstance(small, (cst.Assign, cst.Return)) else None
        if value is None or not _value_names(value) <= known:
            return None  # a global of the helper's module, or a statement of another kind
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target,
                                                                                    cst.Name) and not last:
            written = value.visit(_Put())
            env[small.targets[0].target.value] = written.with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if hasattr(written, "lpar") else written
            known.add(small.targets[0].target.value)
            continue
        if isinstance(small, cst.Return) and last:
            return value.visit(_Put())
        return None
    return None


def _top_level_names(small: cst.BaseSmallStatement) -> set[str]:
    """The names a statement of a module's top level binds (an assignment's targets, an import's names)."""
    if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
        return {(a.asname.name if a.asname is not None else a.name).value if isinstance(
            (a.asname.name if a.asname is not None else a.name), cst.Name) else code(a.name).split(".")[0]
            for a in small.names}
    if isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        return {n for t in targets for n in names_in(t)}
    return set()


def _value_names(node: cst.BaseExpression) -> set[str]:
    """The names an expression reads as values: not an attribute's name (``tl``'s ``cdiv``) nor a keyword (``axis=``),
    nor a builtin minimum or maximum."""
    found: set[str] = set()

    class _Read(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

    node.visit(_Read())
    return found - {"min", "max"}


def _is_vector(an: _Analyzer, node: cst.BaseExpression, depth: int = 0) -> bool:
    """``node`` holds a vector: a ``tl.arange``, or a local made from one."""
    if m.findall(node, m.Call(func=m.Attribute(attr=m.Name("arange")) | m.Name("arange"))):
        return True
    return depth < 8 and any(_is_vector(an, v, depth + 1) for n in names_in(node) - set(an.params)
                             for _, v in an.assignments.get(n, []))


def _vector_start(an: _Analyzer, acc: Access, name: str, offsets: str,
                  depth: int = 0) -> tuple[_Terms, bool] | None:
    """The first element of a column vector bound once as ``start + tl.arange(0, B)`` (also through another vector,
    ``cols = other_cols + D``): the terms of its start the launch can read, and whether the rest of it is a program's
    position (``pid_n * BLOCK_N``: not negative, bounded by the access's mask). ``None`` when the vector is bound more
    than once in a way that moves it from one step of a loop to the next (the advance and sweep checks judge it);
    refused when it is bound more than once otherwise (``if``/``else`` each binding it), or made from something
    TileLink cannot read (a vector loaded, a start computed other than from program ids)."""
    defs = an.assignments.get(name, [])
    if len(defs) != 1 or name in an.rebound:
        moves = _bound_in_a_loop(an, name)
        reach = _reaching_every_read(an, name, acc) if depth == 0 and not moves else None
        if reach is not None:
            defs = [reach]  # the one binding every read of it up to the access sees
        elif depth == 0 and not moves:
            raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} are bound more than "
                               f"once outside any loop (or by `+=` or `:=`): TileLink cannot tell which binding "
                               f"reaches the {acc.kind}, so it cannot check where they start along the rows of "
                               f"{acc.tensor!r}; a negative start reads the end of the row before, which its "
                               f"{_waits(acc)} does not cover",
                          f"bind `{name}` once, before the {acc.kind} (`{name} = start + tl.arange(0, BLOCK_D)`), "
                          f"and compute its start in locals bound before it")
        else:
            return None
    hint = ("build the columns as `cols = start + tl.arange(0, BLOCK_D)`, the start a literal, a parameter or a "
            "multiple of a program id, and mask them by the row's length (`cols[None, :] < D`)")
    terms = _terms(_uncast(defs[0][1]))  # `(pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)`: its terms
    start: _Terms = []
    position = vectors = 0
    for term, negative in terms:
        term = _uncast(term)  # `offs_d.to(tl.int64)`: the same columns
        if m.matches(term, m.Call(func=m.Attribute(attr=m.Name("arange")) | m.Name("arange"),
                                  args=[m.Arg(value=m.Integer("0")), m.ZeroOrMore()])) and not negative:
            vectors += 1
        elif isinstance(term, cst.Name) and term.value not in an.params and _is_vector(an, term) and not negative \
                and depth < 8:
            inner = _vector_start(an, acc, term.value, offsets, depth + 1)
            if inner is None and _varies(an, term):
                return None  # the columns of each step: the sweep check judges them
            if inner is None:
                raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} are made from the "
                                   f"vector `{term.value}`, which is bound more than once: TileLink cannot read where "
                                   f"they start along the rows of {acc.tensor!r}", hint)
            start += inner[0]
            position += inner[1]
            vectors += 1
        elif _is_vector(an, term) or m.findall(term, m.Subscript()):
            raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} add the vector "
                               f"`{code(term)}`, which TileLink cannot read: it cannot check that they stay within the "
                               f"rows of {acc.tensor!r} that the {_waits(acc)} covers", hint)
        elif (found := None if m.findall(term, m.Call()) else _factors(an, term, offsets)) is not None:
            start.append((negative, tuple(found)))
        elif _varies(an, term) or _bound_twice(an, term):
            # the columns of each step of a loop (`cols = k * BLOCK_K + tl.arange(...)`): the loop's target counts up
            # from a non-negative start, or the columns may start in the row before; a position TileLink cannot read
            # as non-negative (the grouped `pid_n` of a persistent loop's `tile_id`) is written out with each loop's
            # target as the range it runs over, for each call to bound from its grid
            signs = None if negative else _nonnegative_value(an, term)
            written = None
            if signs is None and not negative:
                written = launch_value(an, code(term), an.where(defs[0][0].node))
            if written is not None:
                an.row_starts.append((written, acc.where))
            elif signs is None and _varies(an, term):
                raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} start at "
                                   f"`{'-' if negative else ''}{code(term)}`, which changes from one step of a loop to "
                                   f"the next and whose sign TileLink cannot tell: a negative start reads the row "
                                   f"before, which its {_waits(acc)} does not cover",
                              "start them from the target of a `for j in range(a, b, step)` loop (also `tl.range`) "
                              "with `a` and `step` non-negative (literals, parameters, program ids, `+`, `*`, `//`, "
                              "`%`), times non-negative factors")
            elif signs is None:
                raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} start at "
                                   f"`{'-' if negative else ''}{code(term)}`, which reads a local bound more than "
                                   f"once: TileLink cannot tell which binding reaches the {acc.kind} (one under an "
                                   f"`if`, or an unpacking it cannot place the name in), so it cannot tell the start's "
                                   f"sign; a negative start reads the row before, which its {_waits(acc)} does not "
                                   f"cover",
                              "bind the position once, or bind it last in a block that holds the access, with no "
                              "other binding of it in between")
            if signs is not None:
                an.row_signs.extend((n, acc.where) for n in sorted(signs))
            position += 1
        elif not negative and _position(an, term):
            written = program_value(an, code(term))
            try:
                parsed = cst.parse_expression(written)
            except cst.ParserSyntaxError:
                parsed = None
            signs = None if parsed is None else _nonnegative_value(an, parsed)
            if signs is not None:
                an.row_signs.extend((n, acc.where) for n in sorted(signs))
            else:
                # a position TileLink cannot read as non-negative from its form (`(pid - 5) * BLOCK_N`, or the
                # grouped `pid_n = (pid % group) // group_size_m` with `group_size_m = min(num_pid_m - first, G)`):
                # its least value over the call's grid must be (`KernelAnalysis.row_starts`), else the columns start
                # in the row before, which the wait or notify does not cover. Every name left in it must be a
                # parameter the launch reads as the kernel uses it
                from tilelink.tile_rows import passed_params

                unread = sorted(_value_names(parsed) - passed_params(an) - {"tl", "triton"}) if parsed is not None \
                    else [written]
                if unread:
                    said = ", ".join(f"`{n}`" for n in unread)
                    raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} start at "
                                       f"`{code(term)}`, whose sign TileLink cannot tell from its form and cannot "
                                       f"write out over program ids and arguments for the launch to bound: it reads "
                                       f"{said} (a local bound more than once, a parameter the kernel binds again, "
                                       f"or a helper that is not one `return` after assignments of its parameters "
                                       f"and locals)", "compute the position from tl.program_id and the arguments as "
                                       "passed, in locals bound once or a straight-line @triton.jit helper")
                an.row_starts.append((written, acc.where))
            position += 1
        elif _computed(an, term):
            raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} start at "
                               f"`{code(term)}`, a value the kernel computes, which TileLink cannot bound at the "
                               f"launch along the rows of {acc.tensor!r}", hint)
        else:
            return None  # a loop variable: the columns of each step, bounded by the mask
    return (start, position > 0) if vectors else None


def _name_columns(an: _Analyzer, acc: Access, term: cst.BaseExpression, register: bool = True) -> cst.BaseExpression:
    """``term`` with each block of columns indexed out of an expression (``(k * BLOCK_K + offs_k)[None, :]``, as the
    matmul tutorials write it) indexed through a name bound to that expression where the access is, as if the kernel
    had written ``cols = k * BLOCK_K + offs_k`` and ``cols[None, :]``: the checks of named columns then read where
    they start and end (and the mask that bounds them, given the same expression). ``register=False`` only names
    the expressions already named (a mask's)."""

    class _Named(cst.CSTTransformer):
        def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
            if isinstance(updated.value, cst.Name) or not _indexes_columns(updated):
                return updated  # a named vector, or not a block's columns
            value = _bare(updated.value)
            key = code(value)
            name = an.inline_columns.get(key)
            if name is None and register:
                k = len(an.inline_columns)
                while f"_tilelink_columns_{k}" in an.assignments or f"_tilelink_columns_{k}" in an.bindings or \
                        f"_tilelink_columns_{k}" in an.params or f"_tilelink_columns_{k}" in names_in(an.fn):
                    k += 1
                name = an.inline_columns[key] = f"_tilelink_columns_{k}"
                an.assignments[name] = [(_statement_of(an, acc), value)]
            return updated if name is None else updated.with_changes(value=cst.Name(name))

    return term.visit(_Named())  # type: ignore[return-value]


def _statement_of(an: _Analyzer, acc: Access) -> StmtRef:
    """The innermost statement of the kernel that holds the access."""
    found = an.statements[0]
    for ref in an.statements:
        pos = an.positions[ref.node]
        if (pos.start.line, pos.start.column + 1) <= (acc.where.line, acc.where.column) and pos.end.line >= \
                acc.where.line:
            found = ref
    return found


def _unnamed_columns(an: _Analyzer, error: AnnotationError) -> AnnotationError:
    """``error`` with the names :func:`_name_columns` gave written back as the expressions they stand for."""
    if not an.inline_columns:
        return error
    names = {name: f"({key})" for key, name in an.inline_columns.items()}

    def said(text: str | None) -> str | None:
        for name, expression in names.items():
            text = text.replace(name, expression) if text is not None else None
        return text

    return AnnotationError(said(error.reason) or "", file=error.file, line=error.line, column=error.column,
                           hint=said(error.hint))


def _refuse_unread_columns(acc: Access, term: cst.BaseExpression, offsets: str, always: bool = False) -> None:
    """Refuse a term of an address that holds a column vector (``cols[None, :]``) in a form TileLink does not read as
    the vector times factors (``tl.broadcast_to(cols[None, :], ...)``, ``cols[None, :] * (s + 1)``): where its columns
    start and end is not checked, so they could reach into another row, which the wait or notify does not cover."""
    for node in m.findall(term, m.Subscript(value=m.Name())):
        if not always and (node.value.value == offsets or not _indexes_columns(node)):
            continue
        raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds `{code(term)}`, which holds "
                           f"the columns `{node.value.value}` in a form TileLink does not read: it cannot check that "
                           f"they stay within the rows of {acc.tensor!r} its {_waits(acc)} covers",
                      f"add the columns as `{node.value.value}[None, :]`, alone or times stride parameters and "
                      f"literals (`{node.value.value}[None, :] * stride_xd`), with the cast in the vector's binding "
                      f"(`{node.value.value} = (start).to(tl.int64) + tl.arange(0, BLOCK_D)`)")


def _uncast(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` without the casts to a 64-bit int around it (``offs[None, :].to(tl.int64)``, which
    keep the value), parentheses stripped."""
    node = _bare(node)
    while _is_widening(node):
        node = _bare(widened_value(node))  # type: ignore[arg-type]
    return node


def _sides_binding(an: _Analyzer, name: str, acc: Access) -> StmtRef | None:
    """The ``if`` statement whose sides bind ``name``, each side at most once and nothing else anywhere, where
    every run that reaches ``acc`` has passed it: the ``if`` in no loop, in a block that holds ``acc``, ending before
    it, and ``name`` read nowhere inside it (a pointer made there from one of two bindings of a side would read
    values the name no longer holds after it). ``None`` where the bindings are not such."""
    defs = an.assignments.get(name, [])
    if len(defs) < 2 or len(an.bindings.get(name, ())) != len(defs):
        return None
    for ref, value in defs:
        smalls = small_statements(ref)
        if len(smalls) != 1 or not m.matches(smalls[0], m.Assign(targets=[m.AssignTarget(target=m.Name(name))])) \
                or smalls[0].value is not value:
            return None
    blocks = [ref.blocks[-1] for ref, _ in defs]
    branch = next((ref for ref in an.statements if isinstance(ref.node, cst.If)
                   and all(any(b is s for s in _suites(ref.node)) for b in blocks)), None)
    if branch is None or len({id(b) for b in blocks}) != len(blocks):
        return None
    block = branch.blocks[-1]
    # every binding is in the `if`'s own sides: the `if` is in a loop where one of them is
    if _bound_in_a_loop(an, name) or not _before(_end(an, branch.node), acc.where) or not (
            block is an.fn.body or _contains(an, block, acc.where)):
        return None
    targets = {id(small.targets[0].target) for ref, _ in defs for small in small_statements(ref)}
    reads = [n for n in an.findall(branch.node, m.Name(name)) if id(n) not in targets]
    return None if reads else branch


def _index_term(an: _Analyzer, access: Access, dim: int, pointers: set[str],
                index: str) -> tuple[str, str, tuple[str, ...]] | None:
    """The rows term of an address whose rows come from a loaded index (:meth:`_Analyzer._indexed_rows`): ``(the
    rows in source, the loaded name, the other factors)``, or ``None`` where the address is not that term plus
    column terms."""
    # the index as loaded, also widened where it is loaded (`tl.load(idx_ptr + rows, ...).to(tl.int64)`: the same
    # values)
    loaded = {name for name, defs in an.assignments.items()
              if any(_is_tl_call(widened_value(v) or v, "load") and index in names_in(v) for _, v in defs)}

    def arange(node: cst.BaseExpression) -> bool:  # `tl.arange(0, B)`, also through a name bound once to it
        node = _uncast(node)
        if isinstance(node, cst.Name) and len(an.assignments.get(node.value, [])) == 1 and len(
                an.bindings.get(node.value, ())) == 1:
            node = _uncast(an.assignments[node.value][0][1])
        return _arange_size(node) is not None

    # a block of rows from a start loaded through the index (Liger's `row_offs = (row_start + m_offs).to(tl.int64)`,
    # `row_start = tl.load(tile_row_start_ptr + pid_m)`): its values are the rows, as a loaded vector's are
    for name, defs in an.assignments.items():
        value = _uncast(defs[0][1]) if len(defs) == 1 and len(an.bindings.get(name, ())) == 1 else None
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add) and any(
                isinstance(_uncast(a), cst.Name) and _uncast(a).value in loaded and arange(b)
                for a, b in ((value.left, value.right), (value.right, value.left))):
            loaded = loaded | {name}
    params = set(an.params) - set(an.assignments) - an.rebound
    found = None
    columns: list[cst.BaseExpression] = []
    scalars: list[cst.BaseExpression] = []
    for e in an._pointer_definitions(access.pointer, pointers):
        for term, negative in _terms(_bare(e)):
            term = _bare(term)
            if isinstance(term, cst.Name) and term.value in pointers | {access.tensor}:
                continue  # the tensor, or an alias the definitions write out
            subs = [x for x in m.findall(term, m.Subscript()) if len(x.slice) >= 2]
            axes = [[isinstance(el.slice, cst.Slice) for el in x.slice] for x in subs]
            if not subs and not m.findall(term, m.Subscript()):
                scalars.append(term)  # `k * BLOCK_K * stride_ak`: checked below, and bounded by the launch's walk
                continue
            if not subs or any(a.count(True) != 1 for a in axes):
                return None  # a term with no block of rows or columns: it moves the rows
            along = [x for x, a in zip(subs, axes, strict=True) if a.index(True) == dim]
            if not along:
                columns.append(term)  # a column term (its vector along another axis), checked below
                continue
            if found is not None or negative or len(subs) != 1 or not isinstance(along[0].value, cst.Name) or \
                    along[0].value.value not in loaded:
                return None
            sub = along[0]
            factors = _product_factors(term)
            holding = [f for f in factors if sub in m.findall(f, m.Subscript(value=m.Name()))]
            rest = [f for f in factors if f not in holding]
            if len(holding) != 1 or not all(isinstance(f, cst.Integer) or (isinstance(f, cst.Name) and f.value in
                                                                            params) for f in rest):
                return None
            rows = _bare(holding[0])
            if not (rows is sub or (isinstance(rows, cst.BinaryOperation) and isinstance(rows.operator, cst.FloorDivide)
                                    and _bare(rows.left) is sub and (isinstance(rows.right, cst.Integer) or (
                                        isinstance(rows.right, cst.Name) and rows.right.value in params)))):
                return None  # the index itself, or divided by a parameter (`offs_token // top_k`)
            found = (code(rows.deep_replace(sub, cst.Name(sub.value.value))) if rows is not sub else sub.value.value,
                     sub.value.value, tuple(code(f) for f in rest))
    if found is None:
        return None
    # each column term: one block of columns `cols[None, :]` (or `(k * BLOCK_K + offs_k)[None, :]`) times int
    # literals and parameters other than the rows' own factors, its values made without them and without a load: a
    # row stride in it (`(stride_am + offs_k)[None, :]`, `cols[None, :] * stride_am`) moves the rows
    def clean(node: cst.BaseExpression) -> bool:
        todo, seen = [node], set()
        while todo:
            value = todo.pop()
            if m.findall(value, m.Call(func=m.Attribute(attr=m.Name("load")))):
                return False
            for n in names_in(value) - seen:
                seen.add(n)
                looped = any(end is not None for _, end in an.bindings.get(n, ()))  # a loop's target
                if n in found[2] or (n in an.rebound and not looped):
                    return False
                todo += [v for _, v in an.assignments.get(n, ())]  # every value it is bound to
        return True

    for term in scalars:
        # a scalar term of literals, parameters other than the rows' factors and the kernel's own values (a loop's
        # step): one reading the rows' factors or a load moves the rows; the walk of the address bounds the rest
        # within the row at the launch (`_access_row_scales`)
        if any(isinstance(f, cst.Name) and f.value in found[2] for f in _product_factors(term)) or not clean(term):
            return None
    for term in columns:
        factors = _product_factors(term)
        blocks = [f for f in factors if isinstance(f, cst.Subscript)]
        others = [f for f in factors if not isinstance(f, cst.Subscript)]
        if len(blocks) != 1 or not all(isinstance(f, cst.Integer) or (isinstance(f, cst.Name) and f.value in params
                                                                      and f.value not in found[2]) for f in others):
            return None
        if not clean(_bare(blocks[0].value)):
            return None
    return found


def _product_factors(term: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The factors of a product (``cols[None, :] * stride_xd * 2``), parentheses and casts to 64-bit ints stripped, the
    last factor first; a term that is no product is its own one factor."""
    parts, todo = [], [_uncast(term)]
    while todo:
        node = _uncast(todo.pop())
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            todo += [_bare(node.left), _bare(node.right)]
        else:
            parts.append(node)
    return parts


def _column_of(an: _Analyzer, term: cst.BaseExpression, offsets: str) -> tuple[str, tuple[str, ...] | None] | None:
    """The column vector a term of an address along dim 0 adds, indexed ``[None, :]`` and bare or times factors
    (``cols[None, :] * stride_xd``): its name and those factors (``None`` where one is not an int literal or a
    parameter the launch reads); ``None`` where the term is no such vector."""
    parts = _product_factors(term)
    vectors = [p for p in parts if isinstance(p, cst.Subscript) and isinstance(p.value, cst.Name)
               and p.value.value != offsets]
    if len(vectors) != 1 or (len(parts) > 1 and not _is_vector(an, vectors[0].value)):
        return None
    scale: list[str] = []
    for part in parts:
        if part is vectors[0]:
            continue
        found = None if m.findall(part, m.Call() | m.Subscript()) else _factors(an, part, "\0")
        if found is None:
            return vectors[0].value.value, None
        scale += found
    return vectors[0].value.value, tuple(scale)


def _mask_locals(an: _Analyzer, acc: Access) -> Access:
    """``acc`` with each conjunct of its mask that is a local bound once written out as its value (``y_mask =
    (rows[:, None] < M) & (cols[None, :] < N)``, then ``mask=y_mask``), for the conjuncts to be read."""
    if acc.mask is None:
        return acc
    out, todo = [], _conjuncts(acc.mask, an.params)
    while todo and len(out) < 64:
        node, made = todo.pop(), None
        if m.matches(node, m.Subscript(value=m.Name(), slice=_AS_ROWS)
                     | m.Subscript(value=m.Name(), slice=_AS_COLUMNS)):
            # a 1-D mask local made a row or a column (`k_mask = offs_k < K`, then `k_mask[None, :]`): each of its
            # conjuncts made one alike (`offs_k[None, :] < K`), the broadcast of a conjunction being the
            # conjunction of the broadcasts
            node, made = node.value, node
        defs = an.assignments.get(node.value, []) if isinstance(node, cst.Name) else []
        # bound once: its value where it is read; bound in a loop (`c_mask = ...` beside the store of each tile) only
        # where nothing it reads can change between its binding and the access (parameters, loop targets, locals
        # bound once)
        steady = len(defs) == 1 and all(
            n in an.params or n in ("tl", "None") or len(an.bindings.get(n, ())) == 1 and (
                not _bound_again(an, n) or _loop_range(an, n) is not None) for n in names_in(defs[0][1]))
        if len(defs) == 1 and len(an.bindings.get(node.value, ())) == 1 and not _bound_again(an, node.value) and (
                not _varies(an, node) or steady):
            todo += _conjuncts(code(defs[0][1]), an.params) if made is None else [
                c for part in _conjuncts(code(defs[0][1])) for c in _conjuncts(
                    code(made.with_changes(value=part.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))),
                    an.params)]
        else:
            out.append(f"({code(_name_columns(an, acc, made or node, register=False))})")
    from dataclasses import replace

    return replace(acc, mask=" & ".join(out))


def _mask_varies(an: _Analyzer, acc: Access, name: str) -> bool:
    """Whether a conjunct of the access's mask bounds the column vector ``name`` from above by what changes from one
    step of a loop to the next: its bound does (``cols[None, :] < D - j``), or the side it is on adds what does
    (``cols[None, :] + j * F < D``). A vector that changes itself under a fixed bound (`ks[None, :] < k_end`, `ks`
    made on each step) is no such walk, nor is a conjunct that bounds it by no `<` (`ks >= 0`, `ks != K`, an `|`): the
    columns are then bounded by the mask's bound or their own end, as anywhere."""
    column = _as_column(name)
    for node in _conjuncts(acc.mask, an.params) if acc.mask is not None else ():
        if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
            continue
        op, right = node.comparisons[0].operator, node.comparisons[0].comparator
        if isinstance(op, (cst.LessThan, cst.LessThanEqual)):
            small, big = node.left, right
        elif isinstance(op, (cst.GreaterThan, cst.GreaterThanEqual)):
            small, big = right, node.left
        else:
            continue
        if name in names_in(small) and (_varies(an, big) or not m.matches(small, column) and _varies(an, small)):
            return True
    return False


def _position_params(an: _Analyzer, name: str, depth: int = 0) -> set[str]:
    """The parameters a column vector's start reads, through the locals it is made from (``pid * STEP``): a program's
    position is taken as non-negative, which a negative one of them breaks."""
    found: set[str] = set()
    for n in names_in(an.assignments[name][0][1]) if len(an.assignments.get(name, [])) == 1 and depth < 8 else ():
        if n in an.params and not an.bindings.get(n):
            found.add(n)
        elif n not in an.params and n != "tl":
            found |= _position_params(an, n, depth + 1)
    return found


#: the slices that make a 1-D vector the rows (``x[:, None]``) or the columns (``x[None, :]``) of a 2-D block
_AS_ROWS = [m.SubscriptElement(slice=m.Slice()), m.SubscriptElement(slice=m.Index(value=m.Name("None")))]
_AS_COLUMNS = [m.SubscriptElement(slice=m.Index(value=m.Name("None"))), m.SubscriptElement(slice=m.Slice())]


def _conjuncts(mask: str, scalars: frozenset[str] | set[str] = frozenset()) -> list[cst.BaseExpression]:
    """The terms of a mask joined by ``&`` / ``and`` (parentheses dropped), in no particular order; a comparison of a
    vector with a scalar (int literals and ``scalars``, the kernel's parameters) made a row or a column afterwards
    (``(cols < N)[None, :]``, as ``triton.ops.matmul`` masks) is read as the same comparison of the vector made one
    first (``cols[None, :] < N``)."""
    conjuncts, todo = [], [cst.parse_expression(mask)]
    while todo:
        node = todo.pop()
        if node.lpar:
            todo.append(node.with_changes(lpar=[], rpar=[]))
        elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitAnd) or isinstance(
                node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
            todo += [node.left, node.right]
        else:
            conjuncts.append(_broadcast_inside(node, scalars))
    return conjuncts


def _broadcast_inside(node: cst.BaseExpression, scalars: frozenset[str] | set[str]) -> cst.BaseExpression:
    """``(x < N)[None, :]`` as ``x[None, :] < N`` (and ``[:, None]`` alike), where ``x`` has no block or call in it
    and ``N`` is a scalar: int literals and ``scalars`` with ``+``, ``-``, ``*`` (the broadcast of a comparison with a
    scalar is the comparison of the broadcast); anything else as it is (``(x < y)[None, :]`` of two vectors is an
    outer comparison, not a bound of ``x``)."""
    if not m.matches(node, m.Subscript(value=m.Comparison(), slice=_AS_ROWS)
                     | m.Subscript(value=m.Comparison(), slice=_AS_COLUMNS)):
        return node
    comparison = node.value.with_changes(lpar=[], rpar=[])
    if len(comparison.comparisons) != 1:
        return node
    left, right, op = comparison.left, comparison.comparisons[0].comparator, comparison.comparisons[0].operator
    if m.findall(left, m.Subscript() | m.Call()) or not _scalar(right, scalars):
        # the scalar first (`k_mask = K > ks`, then `k_mask[None, :]`): the same comparison turned round
        turned = {cst.GreaterThan: cst.LessThan, cst.GreaterThanEqual: cst.LessThanEqual, cst.LessThan:
                  cst.GreaterThan, cst.LessThanEqual: cst.GreaterThanEqual, cst.Equal: cst.Equal,
                  cst.NotEqual: cst.NotEqual}.get(type(op))
        if turned is None or m.findall(right, m.Subscript() | m.Call()) or not _scalar(left, scalars):
            return node
        left, right, op = right, left, turned()
    whole = left if isinstance(left, cst.Name) or left.lpar else left.with_changes(
        lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Comparison(left=cst.Subscript(value=whole, slice=node.slice),
                          comparisons=[cst.ComparisonTarget(operator=op, comparator=right)])


def _scalar(node: cst.BaseExpression, scalars: frozenset[str] | set[str]) -> bool:
    """``node`` is int literals and names of ``scalars`` joined by ``+``, ``-`` and ``*``."""
    node = node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node
    if isinstance(node, cst.Integer):
        return True
    if isinstance(node, cst.Name):
        return node.value in scalars
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract, cst.Multiply)):
        return _scalar(node.left, scalars) and _scalar(node.right, scalars)
    return False


def _vector_last(an: _Analyzer, name: str, offsets: str, depth: int = 0) -> _Terms | None:
    """The last element of a column vector bound once as ``start + tl.arange(0, B)`` past its first
    (:func:`_vector_start`): ``B - 1`` for each ``tl.arange`` in it, through the vectors it adds; ``None`` where an
    end is not a literal, a parameter or a product of them."""
    defs = an.assignments.get(name, [])
    if len(defs) != 1 or name in an.rebound or depth >= 8:
        return None
    out: _Terms = []
    for term, negative in _terms(defs[0][1]):
        term = _uncast(term)
        if isinstance(term, cst.Call) and m.matches(term.func, m.Attribute(attr=m.Name("arange")) | m.Name("arange")):
            end = term.args[1].value if len(term.args) == 2 else None
            found = None if end is None or m.findall(end, m.Call() | m.Subscript()) else _factors(an, end, offsets)
            if found is None or negative:
                return None
            out += [(False, tuple(found)), (True, ("1",))]
        elif isinstance(term, cst.Name) and term.value not in an.params and _is_vector(an, term):
            inner = _vector_last(an, term.value, offsets, depth + 1)
            if inner is None or negative:
                return None
            out += inner
    return out


def _as_column(name: str):
    """A matcher of the column vector ``name`` in a mask: the vector itself (a 1-D mask broadcasts along the columns)
    or made a column (``name[None, :]``); not made a row (``name[:, None]`` bounds no column)."""
    return m.Name(name) | m.Subscript(value=m.Name(name), slice=_AS_COLUMNS)


def _masked(acc: Access, name: str) -> bool:
    """Whether a conjunct of the access's mask bounds the column vector ``name`` from above (``cols[None, :] < X``,
    ``X > cols``), whatever ``X`` is."""
    column = _as_column(name)
    for node in _conjuncts(acc.mask) if acc.mask is not None else ():
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            op, right = node.comparisons[0].operator, node.comparisons[0].comparator
            if m.matches(node.left, column) and isinstance(op, (cst.LessThan, cst.LessThanEqual)) or m.matches(
                    right, column) and isinstance(op, (cst.GreaterThan, cst.GreaterThanEqual)):
                return True
    return False


def _mask_bound(an: _Analyzer, acc: Access, name: str, offsets: str) -> _Terms | None:
    """The largest value of the column vector ``name`` the access's mask lets through, as terms the launch reads:
    ``D - 1`` for a conjunct ``cols[None, :] < D`` (``cols <= D``: ``D``); ``None`` when the mask bounds it by none."""
    if acc.mask is None:
        return None
    column = _as_column(name)
    for node in _conjuncts(acc.mask):
        if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
            continue
        op, right = node.comparisons[0].operator, node.comparisons[0].comparator
        if m.matches(node.left, column) and isinstance(op, (cst.LessThan, cst.LessThanEqual)):
            bound, below = right, isinstance(op, cst.LessThan)
        elif m.matches(right, column) and isinstance(op, (cst.GreaterThan, cst.GreaterThanEqual)):
            bound, below = node.left, isinstance(op, cst.GreaterThan)
        else:
            continue
        if offsets in names_in(bound) or name in names_in(bound) or _is_vector(an, bound):
            continue  # a vector, also through a local, not a bound the launch reads (`cols[None, :] < rows`)
        terms: _Terms = []
        for term, negative in _terms(bound):
            factors = None if m.findall(term, m.Call() | m.Subscript()) else _factors(an, term, offsets)
            if factors is None:
                break
            terms.append((negative, tuple(factors)))
        else:
            return terms + ([(True, ("1",))] if below else [])
    return None


def _related_bound(an: _Analyzer, acc: Access, name: str) -> _Terms | None:
    """The largest value of the column vector ``name``, bound once as ``start + other`` (``offs_k = ki * BLOCK_K +
    tl.arange(0, BLOCK_K)`` through ``offs_k_for_mask = tl.arange(0, BLOCK_K)``), that a mask conjunct on the other
    vector lets through (``offs_k_for_mask[None, :] < K - ki * BLOCK_K``, as the persistent-matmul tutorial masks
    its K columns): ``start`` plus that bound, where the sum is a sum of products of parameters the launch reads and
    int literals (``K - 1``); ``None`` otherwise."""
    from tilelink.tile_rows import _Rows, passed_params

    defs = an.assignments.get(name, [])
    if len(defs) != 1 or _bound_again(an, name) or acc.mask is None:
        return None
    terms = _terms(defs[0][1])
    others = [t for t, negative in terms if not negative and _is_vector(an, t)]
    if len(others) != 1:
        return None
    start = [(t, negative) for t, negative in terms if t is not others[0]]
    # widened (`tl.arange(0, BLOCK_K).to(tl.int64)`, vLLM's offsets for large tensors): the same values
    others = [_bare(widened_value(_bare(others[0])) or others[0])]
    if any(_is_vector(an, t) or m.findall(t, m.Subscript()) for t, _ in start):
        return None

    def same(node: cst.BaseExpression) -> bool:
        """``node`` (a conjunct's vector, `[None, :]` dropped) is the other vector: the same name, or a name bound
        once to the same `tl.arange` (``offs_k_for_mask = tl.arange(0, BLOCK_K)``)."""
        if isinstance(node, cst.Subscript):  # made a column (`[None, :]`); made a row, it bounds no column
            if not isinstance(node.value, cst.Name) or not m.matches(node, _as_column(node.value.value)):
                return False
            node = node.value
        if not isinstance(node, cst.Name):
            return False
        if isinstance(others[0], cst.Name) and node.value == others[0].value:
            return True
        found = an.assignments.get(node.value, [])
        return len(found) == 1 and not _bound_again(an, node.value) and code(_bare(found[0][1])) == code(
            _bare(others[0])) and m.matches(_bare(others[0]), m.Call(func=m.Attribute(
                value=m.Name("tl"), attr=m.Name("arange")), args=[m.Arg(value=m.Integer() | m.Name()),
                                                                   m.Arg(value=m.Integer() | m.Name())]))

    for node in _conjuncts(acc.mask):
        if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and same(node.left)
                and isinstance(node.comparisons[0].operator, (cst.LessThan, cst.LessThanEqual))):
            continue
        rows = _Rows(an)
        total = rows.read(node.comparisons[0].comparator)
        for t, negative in start:
            for k, v in rows.read(t).items():
                total[k] = total.get(k, 0) + (-v if negative else v)
        passed = passed_params(an)
        out: _Terms = []
        for k, v in total.items():
            if v and not all(a in passed for a in k):
                return None  # a loop's variable left over, or a value the kernel computes
            if v:
                out.append((v < 0, tuple(k) + ((str(abs(v)),) if abs(v) != 1 or not k else ())))
        return out + ([(True, ("1",))] if isinstance(node.comparisons[0].operator, cst.LessThan) else [])
    return None


def _advanced(an: _Analyzer, acc: Access, offsets: str) -> list[tuple[bool, tuple[str, ...]]] | None:
    """The scalar terms the kernel adds to the annotated pointer itself (``x_ptr += D``, ``x_ptr = x_ptr + D``), as
    ``(subtracted, factors)``: ``[]`` when it never binds it; ``None`` when they are not one sum known at the launch
    (bound more than once or in a loop, or a term that is not a literal or a parameter); a term the kernel computes
    (``x_ptr += tl.program_id(1) * D``) is refused (``_scalar_term``)."""
    tensor = acc.tensor
    if not an.bindings.get(tensor):
        return []
    nodes = an.findall(an.fn.body, m.AugAssign(target=m.Name(tensor)) | m.Assign(
        targets=[m.AssignTarget(target=m.Name(tensor))]))
    if len(an.bindings[tensor]) != 1 or len(nodes) != 1:
        return None
    node = nodes[0]
    if any(any(n is node for n in m.findall(loop.body, m.AugAssign() | m.Assign()))
           for loop in an.findall(an.fn.body, m.For() | m.While())):
        return None
    if isinstance(node, cst.AugAssign):
        if not isinstance(node.operator, (cst.AddAssign, cst.SubtractAssign)):
            return None
        terms = [(t, neg != isinstance(node.operator, cst.SubtractAssign)) for t, neg in _terms(node.value)]
    else:
        terms = [(t, neg) for t, neg in _terms(node.value) if not m.matches(t, m.Name(tensor))]
        if len(terms) != len(_terms(node.value)) - 1:
            return None  # not the pointer plus terms
    out: list[tuple[bool, tuple[str, ...]]] = []
    for term, negative in terms:
        found = None if m.findall(term, m.Subscript()) or offsets in names_in(term) else _scalar_term(
            an, acc, term, negative, offsets)
        if found is None:
            return None
        out.append(found)
    return out


def _descriptor_row_facts(an: _Analyzer, acc: Access) -> tuple[set[tuple[str, ...]], list[tuple],
                                                                    set[tuple[str, ...]]]:
    """The row facts of a descriptor the kernel makes from a tensor gathered or reduced along dim 0,
    ``tl.make_tensor_descriptor(x_ptr, shape=[M, D], strides=[stride_m, stride_d], ...)``: its rows are its first
    offset, ``stride_m`` elements apart (a row scale: the launch checks it is the buffer's row), and every element it
    reads along the other dims, up to ``(D - 1) * stride_d``, must stay within the row (a row shift): a shape wider
    than the row (``shape=[M, D + COL]`` with ``strides=[D, 1]``, read at column ``COL``) reads the next row, which
    the wait does not cover. Past its shape a descriptor reads zeros, so the offsets along the other dims need no
    bound. A descriptor the kernel makes from a host one, or whose shape or strides TileLink cannot read at the
    launch, is refused at the access."""
    defs = an.assignments.get(acc.pointer, [])
    make = defs[0][1] if len(defs) == 1 else None
    if not isinstance(make, cst.Call) or not _is_tl_call(make, "make_tensor_descriptor"):
        return set(), [], set()  # a host descriptor: the launcher rebuilds it over the buffer
    shape, strides = _arg(make, 1, "shape"), _arg(make, 2, "strides")
    hint = ("give the descriptor's shape and strides as parameters, literals or products of them, the rows' stride "
            "first and the row's length after it (`shape=[M, D], strides=[stride_m, 1]`)")

    def factors(node: cst.BaseExpression) -> tuple[str, ...]:
        found = None if m.findall(node, m.Call() | m.Subscript()) else _factors(an, node, "\0")
        if found is None:
            raise _refuse(acc, f"the descriptor `{acc.pointer}` of {acc.tensor!r} has `{code(node)}` in its shape or "
                               f"strides, which TileLink cannot read at the launch: it cannot check that the "
                               f"{acc.kind} at line {acc.where.line} stays within the rows its {_waits(acc)} covers",
                          hint)
        return tuple(found)

    if not isinstance(shape, (cst.List, cst.Tuple)) or not isinstance(strides, (cst.List, cst.Tuple)) or len(
            shape.elements) != len(strides.elements) or not shape.elements:
        raise _refuse(acc, f"the descriptor `{acc.pointer}` of {acc.tensor!r} is made without a literal list of its "
                           f"shape and strides, one entry each per dim: TileLink cannot check that the {acc.kind} at "
                           f"line {acc.where.line} stays within the rows its {_waits(acc)} covers", hint)
    scale = factors(strides.elements[0].value)
    terms: _Terms = []
    for size, stride in zip(shape.elements[1:], strides.elements[1:], strict=True):
        step = factors(stride.value)
        for term, negative in _terms(size.value):
            if isinstance(term, cst.UnaryOperation) and isinstance(term.operator, cst.Minus):
                term, negative = term.expression, not negative
            terms.append((negative, factors(term) + step))
        terms.append((True, step))  # the last element along the dim is at (size - 1) * stride
    return {scale}, [tuple(terms)] if terms else [], set()


def _row_scales(an: _Analyzer, acc: Access, pointers: set[str]) -> tuple[set[tuple[str, ...]], list[tuple],
                                                                         set[tuple[tuple[str, ...], str]]]:
    """:func:`_access_row_scales`, its refusals naming columns indexed out of an expression by that expression. The
    names :func:`_name_columns` gives such columns hold for this access only."""
    an.inline_columns = {}
    try:
        return _access_row_scales(an, acc, pointers)
    except AnnotationError as error:
        raise _unnamed_columns(an, error) from None
    finally:
        for name in an.inline_columns.values():
            an.assignments.pop(name, None)
        an.inline_columns = {}


def _access_row_scales(an: _Analyzer, acc: Access, pointers: set[str]) -> tuple[set[tuple[str, ...]], list[tuple],
                                                                                set[tuple[tuple[str, ...], str]]]:
    """The scales of the rows of a pointer access (see ``KernelAnalysis.row_scales``), and its scalar terms along dim 0
    (``KernelAnalysis.row_shifts``): one sum for each way its aliases are bound (``if C: base = x_ptr + D`` / ``else:
    base = x_ptr``), none when they are not known (a loop variable, an alias advanced in place: checked as an advance).
    The rows term must appear once along any chain of aliases (``a_ptrs = a_ptr + offs[:, None] * s`` then ``a_ptrs +
    offs[:, None] * s`` touch rows ``2 * offs``), and its factors must be readable at the launch; else the access is
    refused, and so is a scalar term the kernel computes (``tl.program_id(1) * D``, see ``_scalar_term``). Rows along
    an inner dim (``dim >= 1``) have their scalar terms read the same way, and a term the kernel computes times
    factors the launch reads (``b * stride_xb``) gives those factors, the third value (``KernelAnalysis.row_steps``;
    see ``tile_rows.inner_terms``)."""
    tile = acc.tile
    along = an.tensors[acc.tensor][0] == 0  # the terms of the address along dim 0 are the rows'
    steps: set[tuple[tuple[str, ...], str]] = set()
    shifts: list[tuple] = []
    if not along and not acc.descriptor and tile is not None and not tile.dynamic:
        from tilelink.tile_rows import inner_terms

        shifts, steps = inner_terms(an, acc, pointers)
        shifts = _inner_columns(an, acc, pointers, shifts)
    if acc.descriptor and along and tile is not None and not tile.dynamic:
        return _descriptor_row_facts(an, acc)
    if acc.descriptor and not along and tile is not None and not tile.dynamic:
        from tilelink.tile_rows import descriptor_inner_terms

        shifts, steps, scales = descriptor_inner_terms(an, acc)
        return scales, shifts, steps
    indexed: tuple[str, str, tuple[str, ...]] | None = None
    if tile is not None and tile.dynamic and not acc.descriptor:
        # rows from an index: its term's other factors are the rows' scale, which the launch compares with the row
        # stride of the buffer it passes (`offs_token[:, None] * stride_am * 2` reads other rows than it waits for);
        # along dim 0 its columns are read below as a tile's are (unmasked, `offs_k[None, :]` past the row's end reads
        # the next row, which the wait does not cover)
        dim, _, _, index = an.tensors[acc.tensor]
        indexed = _index_term(an, acc, dim, pointers, index) if index is not None else None
        if indexed is None or not along:
            return ({indexed[2]} if indexed is not None and indexed[2] else set()), shifts, steps
    elif acc.descriptor or tile is None or tile.offsets is None or tile.dynamic:
        return set(), shifts, steps
    offsets = indexed[1] if indexed is not None else tile.offsets
    # the pointer itself advanced before the access (`x_ptr += D`) moves it along the rows too
    first = _advanced(an, acc, offsets) if along else None
    hint = (f"index the rows once, with the offsets vector times the row stride parameter (`{offsets}[:, None] * "
            f"stride_m`) or a literal (`{offsets} * 64`), in one alias of the pointer")
    scales: set[tuple[str, ...]] = {indexed[2]} if indexed is not None and indexed[2] else set()

    def plus(ways: list[_Terms] | None, more: list[_Terms] | None) -> list[_Terms] | None:
        """Each way of ``ways`` with each of ``more`` added."""
        if ways is None or more is None:
            return None
        out = [a + b for a in ways for b in more]
        if len(out) > 64:
            raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} is bound in more than 64 ways "
                               f"along its aliases: TileLink checks each way's terms along the rows of {acc.tensor!r}",
                          "bind the pointer's aliases once, and choose the offsets in a local instead")
        return out

    def walk(expr: cst.BaseExpression, seen: frozenset[str], site: Where) -> tuple[int, list[_Terms] | None]:
        """The rows terms of ``expr`` and its ways, ``expr`` read at ``site`` (the access, or the binding of the
        alias whose value it is)."""
        n = 0
        ways: list[_Terms] | None = [[]]
        for term, negative in _terms(expr):
            term = _name_columns(an, acc, term)
            if offsets in names_in(term) and indexed is not None:
                n += 1  # the index's rows term, read by `_index_term`
            elif offsets in names_in(term):
                factors = _factors(an, term, offsets)
                if factors is None:
                    again = sorted(n for n in names_in(term) if n in an.params and (n in an.assignments or
                                                                                     n in an.rebound))
                    said = (f" ({', '.join(f'`{n}`' for n in again)} is bound again in the kernel: the launch would "
                            f"read the argument, not the kernel's value)") if again else ""
                    raise _refuse(acc, f"the rows `{offsets}` of the {acc.kind} at line {acc.where.line} are "
                                       f"scaled by `{code(term)}`, which TileLink cannot check against the row stride "
                                       f"of {acc.tensor!r} at the launch{said}", hint)
                scales.add(tuple(sorted(factors)))
                n += 1
            elif not along or _is_pointer(term, pointers):
                continue  # an alias: its own terms, below; along an inner dim, `inner_terms` reads them
            elif (column := _column_of(an, term, offsets)) is not None:
                # a column vector (`cols[None, :]`, `cols = D + tl.arange(0, BLOCK_D)`), also times factors the launch
                # reads (`cols[None, :] * stride_xd`): its first element is along dim 0 too, and starts past the row
                # when its scalar terms do; its last is the one its mask lets through (`cols[None, :] < 2 * D` on
                # rows of D reads the next row), or, unmasked, its start plus the ends of its `tl.arange`s. A start
                # at a program's position (`pid_n * BLOCK_N`) is bounded by the access's mask, which must bound the
                # vector by the row; the parameters of that position are taken as non-negative (`row_signs`)
                vector, scale = column
                if scale is None:  # times a factor the launch cannot read (`cols[None, :] * (D // D)`)
                    _refuse_unread_columns(acc, term, offsets, always=True)
                found = _vector_start(an, acc, vector, offsets) if scale is not None else None
                if found is None and scale is not None:
                    _check_carried_columns(an, acc, pointers, vector, scale, offsets)
                if found is None or ways is None:
                    ways = None
                    continue
                start, position = found
                low = [(negative != sub, f + scale) for sub, f in start]
                if position:
                    an.row_signs.extend((n, acc.where) for n in sorted(_position_params(an, vector)))
                masks = _mask_locals(an, acc)
                bound = _mask_bound(an, masks, vector, offsets) if _masked(masks, vector) else _related_bound(
                    an, masks, vector)
                last = None if bound is not None or position else _vector_last(an, vector, offsets)
                if bound is None and _mask_varies(an, masks, vector):
                    # bounded by what is left of the row on each step of a loop (`cols[None, :] < D - j` beside
                    # `+ j`): the loop's terms are checked at both ends, the columns from their start, and `D`
                    # against the row (`row_bounds`), where the address moves the columns by the step the mask
                    # takes off; otherwise by the vector's own end, as unmasked
                    if _walked_bound(an, acc, pointers, vector, scale, offsets) or _advanced_in_place(
                            an, acc, pointers):
                        # (a pointer advanced in place has its walk checked as an advance, `row_bounds` too; a mask
                        # that changes otherwise, `ks[None, :] < k_end` with `k_end` bound in the loop, bounds
                        # nothing the launch reads: the columns' own end does, where the launch reads it)
                        ways = None if position else plus(ways, [low])
                        continue
                    last = None if position else _vector_last(an, vector, offsets)
                    if last is None:
                        raise _refuse(acc, f"the columns `{vector}` of the {acc.kind} at line {acc.where.line} are "
                                           f"bounded by a mask that changes from one step of a loop to the next, "
                                           f"which TileLink cannot read as what is left of the row, and their end "
                                           f"is not known either: it cannot check that they stay within the rows "
                                           f"of {acc.tensor!r} its {_waits(acc)} covers",
                                      f"bound the columns by what is left of the row as the address moves them (`"
                                      f"{vector}[None, :] < D - j * BLOCK_D` beside `+ j * BLOCK_D`, D a parameter), "
                                      f"or by the row's length (`{vector}[None, :] < D`)")
                    ways = plus(ways, [low, low + [(negative != sub, f + scale) for sub, f in last]])
                    continue
                if bound is not None:
                    high = [(negative != sub, f + scale) for sub, f in bound]
                elif last is not None:
                    high = low + [(negative != sub, f + scale) for sub, f in last]
                elif position and any(w == acc.where for *_, w in an.column_ends):
                    # an unmasked walk of whole blocks from a program's position (`pid_z * BLOCK_K + tl.arange(0,
                    # BLOCK_K)`, `_whole_blocks`): the launch checks where its columns start and end over the grid
                    ways = None
                    continue
                else:
                    how = "are bounded by a mask TileLink cannot read at the launch" if _masked(masks, vector) else \
                        "are not bounded by the mask"
                    raise _refuse(acc, f"the columns `{vector}` of the {acc.kind} at line {acc.where.line} {how}, and "
                                       f"their end is not known either: it cannot check that they stay within the "
                                       f"rows of {acc.tensor!r} its {_waits(acc)} covers",
                                  f"mask the columns by the row's length, a parameter or a product of parameters "
                                  f"and literals (`{vector}[None, :] < D`), which each call compares with the row")
                ways = plus(ways, [low, high])  # the first element the program can have, and the last it reads
            elif not m.findall(term, m.Subscript()) and _is_vector(an, term):
                # a block of columns made other than by `[None, :]` (`tl.expand_dims(offs_d, 0)`)
                raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds `{code(term)}`, a "
                                   f"vector TileLink does not read as the columns of a block: it cannot check that it "
                                   f"stays within the rows of {acc.tensor!r} its {_waits(acc)} covers",
                              "bind the columns once (`cols = start + tl.arange(0, BLOCK_D)`), add them as "
                              "`cols[None, :]` (times stride parameters and literals), and mask them by the row's "
                              "length (`cols[None, :] < D`)")
            elif not m.findall(term, m.Subscript()):
                if _varies(an, term) and _column_step(an, acc, pointers, term, negative, offsets):
                    continue  # `k * BLOCK_K * stride_ak` beside the columns it moves: 0 on the first step
                # a loop variable's term: checked at the loop's first and last values
                ends = _loop_term(an, acc, term, negative, offsets) if _varies(an, term) else None
                spanned = launch_value(an, code(term), site) if ends is None and along and _varies(
                    an, term) and acc.kind == "load" else None
                if spanned is not None and "tl.range(" in spanned:
                    # a term a loop's variable moves through locals, `//` or calls (`offs_ks * stride_as_k`, `offs_ks
                    # = k * BLOCK_K // group_k`): written out with the loop read as its range, which each call bounds
                    # over the loop and the grid, one term of its own (`_check_span`); written out where it is read
                    # (an alias's binding: a local bound again after it, `ks = ks // 1000`, is not what the pointer
                    # took). Loads only: a store's notify counts what each step stores, and two steps that store the
                    # same elements (`j // 2`) would complete a channel early
                    ways = plus(ways, [[(negative, (f"({spanned})",))]])
                    continue
                if ends is None and _varies(an, term):
                    # what it adds over the loop is not bounded: a `while` counter (`j += 1`), a loop of a step of
                    # unknown sign or of bounds the kernel computes moves the address into the next rows
                    raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds `{code(term)}` "
                                       f"along the rows of {acc.tensor!r}, which changes from one step of a loop to "
                                       f"the next by an amount TileLink cannot bound: the {acc.kind} may touch other "
                                       f"rows than those its {_waits(acc)} covers",
                                  "take the term from a `for j in range(a, b)` loop (bounds of literals and "
                                  "parameters, a literal step), which the launch checks at both ends; or add it to a "
                                  "column vector masked by the row's length (`cols = j * BLOCK_D + tl.arange(0, "
                                  "BLOCK_D)`, `mask=... & (cols[None, :] < D)`); or, in a loop counting from 0 by 1, "
                                  "mask the column vector the term moves by what is left of the row (`+ j * BLOCK_D * "
                                  "stride_d` beside `cols[None, :] * stride_d`, `mask=... & (cols[None, :] < D - j * "
                                  "BLOCK_D)`)")
                found_term = None if ends is not None else _scalar_term(an, acc, term, negative, offsets)
                if ends is None and found_term is None and not _varies(an, term) and not names_in(term) & (
                        pointers | {acc.tensor}):
                    # a fixed offset the launch cannot read (`(K // 2) * stride_ak`): unchecked, it may carry the
                    # columns beside it into the next rows
                    raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds `{code(term)}` "
                                       f"along the rows of {acc.tensor!r}, an offset TileLink cannot read at the "
                                       f"launch (a product of parameters and literals is what it reads): it cannot "
                                       f"check that the columns beside it stay within the rows its {_waits(acc)} "
                                       f"covers",
                                  f"add the offset to the column vector and mask the vector by the row's length "
                                  f"(`cols = {code(term).split(' * ')[0]} + ...`, `mask=... & (cols[None, :] < K)`), "
                                  f"or pass it as an argument")
                ways = plus(ways, ends) if ends is not None else None if found_term is None else plus(
                    ways, [[found_term]])
            else:
                _refuse_unread_columns(acc, term, offsets)
        for name in sorted(names_in(expr) & pointers - seen - {acc.tensor}):
            defs = [v for _, v in an.assignments.get(name, [])]
            if not defs:
                continue
            found = [walk(v, seen | {name}, an.where(ref.node)) for ref, v in an.assignments.get(name, [])]
            n += max(k for k, _ in found)
            moved = [an.where(ref.node) for ref, v in an.assignments.get(name, []) if name in names_in(v)] + [
                an.where(node) for node in an.findall(an.fn.body, m.AugAssign(target=m.Name(name)))]
            loops = an.findall(an.fn.body, m.For() | m.While())
            if along and moved and not any(_contains(an, lp, w) for lp in loops for w in moved):
                # advanced once, with no loop: the advance's terms are not read, and along the columns (`x_ptrs += D
                # * stride_xd`) they start the columns a mask bounds from the row's first column further along
                raise _refuse(acc, f"`{name}`, the pointer of the {acc.kind} at line {acc.where.line}, is advanced in "
                                   f"place at line {min(w.line for w in moved)}, outside any loop: TileLink cannot "
                                   f"check the rows of {acc.tensor!r} it touches after the advance",
                              f"write the whole address in one binding (`{name} = {acc.tensor} + {offsets}[:, None] * "
                              f"stride_m + cols[None, :] * stride_d + D * stride_d`, the columns' start in the vector "
                              f"if the mask bounds them: `cols = D + tl.arange(0, BLOCK_D)`), which the launch checks")
            if name in an.rebound or any(name in names_in(v) for v in defs) or any(w is None for _, w in found):
                ways = None  # advanced in place: its steps are checked to move along another dimension
            elif ways is not None:
                # an alias bound more than once, each binding a value of its own (`if C: base = x_ptr + D` / `else:
                # base = x_ptr`): every way is checked
                ways = plus(ways, [w for _, each in found for w in each])
        return n, ways

    count, ways = walk(cst.parse_expression(acc.pointer), frozenset(), acc.where)
    if count > 1:
        raise _refuse(acc, f"the address of the {acc.kind} at line {acc.where.line} adds the rows `{offsets}` of "
                           f"{acc.tensor!r} more than once (through its aliases): it touches other rows than the "
                           f"tile's", hint)
    ways = plus([first] if first is not None else None, ways)
    if along:
        shifts = [tuple(w) for w in ways or [] if w]
    return scales, shifts, steps


def _inner_columns(an: _Analyzer, acc: Access, pointers: set[str], shifts: list[tuple]) -> list[tuple]:
    """``shifts`` (the terms of an access along an inner dim that the launch checks, ``tile_rows.inner_terms``) with
    the first and the last element of each column vector no mask bounds from above, as along dim 0: ``offs_d =
    tl.arange(0, BLOCK_D)`` read as ``offs_d[None, :]`` (or times strides, ``offs_d[None, :] * stride_xd``) reaches
    ``BLOCK_D - 1`` elements past the row's start, the next row of the gathered dim when the row is shorter. One way
    for each end, each checked within the row. A vector whose ends TileLink cannot read (bound more than once, a start
    the kernel computes) is refused at the access."""
    from tilelink.tile_rows import _pointer_expression

    expr = _pointer_expression(an, acc, pointers)
    if expr is None or an.bindings.get(acc.tensor):
        return shifts  # an address the inner terms do not read either: the advance check's
    # the rows are the vector indexed `[:, None]` (as `inner_terms` reads them); the columns, those indexed `[None, :]`
    rows = {n.value.value for n in m.findall(expr, m.Subscript(value=m.Name(), slice=_AS_ROWS))}
    if len(rows) != 1:
        return shifts
    (offsets,) = rows
    column = m.Subscript(value=m.Name(), slice=_AS_COLUMNS)
    base = tuple(shifts[0]) if shifts else ()
    masks = _mask_locals(an, acc)
    ends: list[_Terms] = []
    for term, negative in _terms(_bare(expr)):
        term = _name_columns(an, acc, term)
        parts = _product_factors(term)
        vectors = [p for p in parts if m.matches(p, column) and p.value.value != offsets and _is_vector(an, p.value)]
        if len(vectors) != 1:
            _refuse_unread_columns(acc, term, offsets)
            continue  # no column vector
        name = vectors[0].value.value
        # a vector its mask bounds reads up to that bound: `cols[None, :] < 2 * D` on rows of D reads the next row
        bound = _mask_bound(an, masks, name, "\0") if _masked(masks, name) else None
        scale: list[str] = []
        for part in parts:
            found = None if part is vectors[0] or m.findall(part, m.Call() | m.Subscript()) else _factors(
                an, part, "\0")
            if part is not vectors[0] and found is None:
                break
            scale += found or []
        else:
            hint = (f"mask the columns by the row's length (`{name}[None, :] < D`), or build them as `{name} = start + "
                    f"tl.arange(0, BLOCK_D)` with `start` a literal or a parameter, which the launch checks")
            found = _vector_start(an, acc, name, offsets)
            if bound is not None and not negative:
                # the last element the mask lets through, and the first (the other terms alone where the vector
                # starts at 0 or at a program's position: a negative one hides behind the columns' extent)
                ends.append([(sub, f + tuple(scale)) for sub, f in bound])
                ends.append([(sub, f + tuple(scale)) for sub, f in found[0]] if found is not None else [])
                continue
            if _masked(masks, name):
                raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} are bounded by a "
                                   f"mask TileLink cannot read at the launch: it cannot check that they stay within "
                                   f"the rows of {acc.tensor!r} its {_waits(acc)} covers",
                              f"mask the columns by the row's length, a parameter or a product of parameters and "
                              f"literals (`{name}[None, :] < D`), which each call compares with the row")
            last = _vector_last(an, name, offsets) if found is not None and not found[1] else None
            if found is None or last is None or negative:
                raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} are read with "
                                   f"no mask bounding them, from a start or to an end TileLink cannot read: it cannot "
                                   f"check that they stay within the rows of {acc.tensor!r} its {_waits(acc)} covers",
                              hint)
            first = [(sub, f + tuple(scale)) for sub, f in found[0]]
            ends.append(first + [(sub, f + tuple(scale)) for sub, f in last])
            ends.append(first)  # also where the vector starts at 0: the other terms alone, each end within the row
            continue
        raise _refuse(acc, f"the columns `{name}` of the {acc.kind} at line {acc.where.line} are scaled by a factor "
                           f"TileLink cannot read at the launch, with no mask bounding them: it cannot check that "
                           f"they stay within the rows of {acc.tensor!r} its {_waits(acc)} covers",
                      f"mask the columns by the row's length (`{name}[None, :] < D`), or scale them by a stride "
                      f"parameter")
    if not ends:
        return shifts
    return list(dict.fromkeys(base + tuple(way) for way in ends if base + tuple(way)))


def _row_strides(an: _Analyzer, exprs: list[cst.BaseExpression], tile: Tile) -> set[str] | None:
    """The stride names the tile's row offsets are multiplied by in the pointer's definitions (``offs_am[:, None]
    * stride_am`` -> ``{"stride_am"}``); ``None`` when the rows are not scaled by a named stride."""
    if tile.offsets is None:
        return None
    found: set[str] = set()
    plain = False
    for e in exprs:
        for mul in m.findall(e, m.BinaryOperation(operator=m.Multiply())):
            for side, other in ((mul.left, mul.right), (mul.right, mul.left)):
                if tile.offsets in names_in(side) and tile.offsets not in names_in(other):
                    found |= names_in(other) & set(an.params)
        if tile.offsets in names_in(e) and not found:
            plain = True
    return None if plain or not found else found


def _check_pointer_advances(an: _Analyzer, acc: Access, tile: Tile, pointers: set[str],
                            exprs: list[cst.BaseExpression]) -> None:
    """A pointer the access goes through that is advanced (``a_ptrs += BLOCK_K * stride_ak``, ``p = p + d``)
    must move along other dimensions than the rows: an advance by the row stride, or by a step TileLink cannot
    place (no stride parameter in it), moves the rows the tile inference saw, and is refused."""
    if acc.descriptor:
        return
    involved = set().union(*(names_in(e) for e in exprs)) & pointers
    rows = _row_strides(an, exprs, tile)
    for name in sorted(involved):
        for ref, value in an.assignments.get(name, []):
            if name not in names_in(value):
                continue
            step = _step_of(value, name)
            _judge_step(an, acc, tile, name, step, rows, an.where(ref.node))
            # `p = p - d` moves back as `p -= d` does
            _check_advance_in_loop(an, acc, tile, name, step, exprs, an.where(ref.node),
                                   isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Subtract),
                                   pointers)
        for node in an.findall(an.fn.body, m.AugAssign(target=m.Name(name))):
            step = node.value if isinstance(node.operator, (cst.AddAssign, cst.SubtractAssign)) else None
            _judge_step(an, acc, tile, name, step, rows, an.where(node))
            _check_advance_in_loop(an, acc, tile, name, step, exprs, an.where(node),
                                   isinstance(node.operator, cst.SubtractAssign), pointers)


def _check_advance_in_loop(an: _Analyzer, acc: Access, tile: Tile, name: str, step: cst.BaseExpression,
                           exprs: list[cst.BaseExpression], at: Where, backwards: bool = False,
                           pointers: set[str] | None = None) -> None:
    """A pointer advanced inside a loop moves by its step on every iteration, so what it adds over the loop grows
    with the trip count: along another dimension it leaves the row (and reads or writes the next rows, which the
    wait or notify does not cover) unless the access's mask bounds the columns on every step. Accepted: the matmul
    form, the step a stride parameter that scales a column vector of the address times factors ``F``
    (``a_ptrs += BLOCK_K * stride_ak``), the access in the same loop before the advance, that loop counting ``k``
    up from 0 by 1, and a mask conjunct ``offs_k[None, :] < X - k * F`` (also through a local bound once in that
    loop before the access, ``k_remaining = K - k * BLOCK_K``): the columns touched on step ``k`` are ``offs_k + k *
    F``, below ``X``. ``X`` is a sum of products of int literals and parameters the kernel leaves as passed, which
    each call compares with the row (``KernelAnalysis.row_bounds``: ``X`` times the column stride at most the row
    stride); anything else is refused. ``F`` are parameters the kernel does not bind and int literals, the same on
    every iteration; the pointer is advanced once in the loop, forward; and a loop around that loop binds the pointer
    afresh before it (a persistent matmul's ``a_ptrs = ...`` for each tile), so each pass starts at the row's first
    column again.
    Anything else advanced in a loop (a step no column vector's stride scales, ``x_ptrs += step``; a step back,
    ``x_ptrs -= BLOCK_K * stride_ak``; two advances; a factor the kernel binds; no such mask; an access after the
    loop; an outer loop that does not bind the pointer afresh; a ``while`` loop) is refused: TileLink cannot bound
    the rows it touches."""
    loops = [lp for lp in an.findall(an.fn.body, m.For() | m.While()) if _contains(an, lp, at)]
    if not loops:
        return  # advanced once: its terms are the row shift check's
    loop = min(loops, key=lambda lp: (an.positions[lp].end.line - an.positions[lp].start.line,
                                      an.positions[lp].end.column - an.positions[lp].start.column))
    hint = ("advance the pointer only along another dimension, by that dimension's stride times the block "
            "(`a_ptrs += BLOCK_K * stride_ak`), inside the loop that holds the access and after it, with the loop "
            "counting from 0 (`for k in range(0, tl.cdiv(K, BLOCK_K))`) and the columns masked on each step "
            "(`mask=... & (offs_k[None, :] < K - k * BLOCK_K)`); or compute the address from the loop variable "
            "(`x_ptr + ... + j * step` for `j in range(a, b)`), which the launch checks at both ends of the loop")
    what = (f"`{name}` is {'moved back' if backwards else 'advanced'} by `{code(step)}` at line {at.line}, inside the "
            f"loop at line {an.where(loop).line}: over the loop it moves")

    def refuse(why: str, fix: str = hint) -> AnnotationError:
        return _refuse(acc, f"{what} {why}, so the {acc.kind} at line {acc.where.line} may touch rows of "
                            f"{acc.tensor!r} its {_waits(acc)} does not cover", fix)

    # every in-place advance of the pointer: two in one loop move it by both steps on each iteration, which a mask
    # for one step does not bound
    sites = [an.where(ref.node) for ref, value in an.assignments.get(name, []) if name in names_in(value)] + [
        an.where(node) for node in an.findall(an.fn.body, m.AugAssign(target=m.Name(name)))]
    inside = sorted({s.line for s in sites if _contains(an, loop, s)})
    if len(inside) > 1:
        raise refuse(f"once for each of its advances in that loop (lines {', '.join(map(str, inside))}) on every "
                     f"iteration, while the mask bounds the columns of one step",
                     f"advance `{name}` once in the loop, by the whole step of an iteration (`a_ptrs += 2 * BLOCK_K * "
                     f"stride_ak`), and mask the columns by that step (`offs_k[None, :] < K - k * 2 * BLOCK_K`)")
    factors: list[cst.BaseExpression] = []
    todo = [step]
    while todo:
        node = todo.pop()
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            todo += [node.left, node.right]
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            backwards = not backwards  # `x_ptrs += -BLOCK_K * stride_ak` moves back as `-=` does
            todo.append(node.expression)
        else:
            factors.append(node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node)
    columns: dict[str, str] = {}  # stride parameter -> the column vector it scales in the address
    scaled: dict[str, str] = {}  # stride parameter -> a term that scales a column vector by more than it
    for e in exprs:
        for term, negative in _terms(_bare(e)):
            vector, stride_of = _column_term(an, term, tile.offsets)
            if vector is not None and stride_of is not None and not negative:
                columns[stride_of] = vector
            elif vector is not None:
                # `cols[None, :] * stride_xd * 2` reads the columns 2 * cols, which a mask on `cols` does not bound
                for n in sorted(names_in(term) & set(an.params)):
                    scaled.setdefault(n, code(term) if not negative else f"-{code(term)}")
    strides = [f for f in factors if isinstance(f, cst.Name) and f.value in columns | scaled]
    if len(strides) == 1 and strides[0].value in scaled:
        term = scaled[strides[0].value]
        raise refuse(f"along `{strides[0].value}` once more on every iteration, and the address reads the columns "
                     f"`{term}`, not a column vector times that stride alone: the mask bounds the vector, not the "
                     f"columns the address reads",
                     f"make the columns one vector times the column stride (`cols[None, :] * {strides[0].value}`, "
                     f"`cols = tl.arange(0, BLOCK_D)`), advance by the block times that stride, and mask that vector "
                     f"by what is left of the row (`cols[None, :] < K - k * BLOCK_D`)")
    if len(strides) != 1:
        raise refuse("by a step TileLink cannot place on a column vector of the address (it needs one stride "
                     "parameter that scales a column vector, times the block)")
    stride = strides[0].value
    if backwards:
        # the first step back already reads before the row's first column: the end of the row before
        forward = " * ".join(sorted(code(f) for f in factors if f is not strides[0])) or "1"
        raise refuse(f"back along `{stride}` on every iteration, before the first column of the row",
                     f"walk the columns forward from the row's start (`{name} += {forward} * {stride}` with the mask "
                     f"`{columns[stride]}[None, :] < K - k * {forward}`), or compute the address from the loop "
                     f"variable (`x_ptr + ... + k * {forward} * {stride}` for `k in range(n - 1, -1, -1)`), which the "
                     f"launch checks at both ends of the loop")
    for f in factors:
        if f is not strides[0] and not isinstance(f, cst.Integer) and not _passed(an, f):
            # a local may change from one iteration to the next (`s = k % 2`), or be negative
            raise refuse(f"by `{code(f)}` times `{stride}` on every iteration, a factor that is not a parameter "
                         f"the kernel leaves as passed nor an int literal: TileLink cannot tell that it is the same, "
                         f"and not negative, on every step")
    rest = sorted(code(f) for f in factors if f is not strides[0])
    whole_step = list(rest)  # what the pointer moves by along the row on each step, in columns
    if not _contains(an, loop, acc.where) or (acc.where.line, acc.where.column) > (at.line, at.column):
        raise refuse("once more on every iteration, and the access is not in that loop before the advance")
    around = [lp for lp in loops if lp is not loop]
    if around:
        # a loop around the loop runs it again from where the last pass left the pointer, unless it binds the
        # pointer afresh first: in a block of its own that holds the inner loop (so on every pass), before it
        outer = min(around, key=lambda lp: (an.positions[lp].end.line - an.positions[lp].start.line,
                                            an.positions[lp].end.column - an.positions[lp].start.column))
        start = an.where(loop)
        if not any(name not in names_in(value) and ref.node is not outer and _contains(an, outer, an.where(ref.node))
                   and ref.blocks and _contains(an, ref.blocks[-1], start)
                   and (an.where(ref.node).line, an.where(ref.node).column) < (start.line, start.column)
                   for ref, value in an.assignments.get(name, [])):
            raise refuse(f"once more on every iteration, and the loop at line {an.where(outer).line} around it runs "
                         f"that loop again without binding `{name}` afresh before it: each pass starts where the last "
                         f"one left the pointer",
                         f"bind `{name}` afresh in the loop at line {an.where(outer).line}, before the loop at line "
                         f"{start.line} (`a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * "
                         f"stride_ak`, as a persistent matmul does for each tile)")
    read = _range_args(loop) if isinstance(loop, cst.For) else None
    per_value = _step_factors(an, read[2]) if read is not None else None
    # counting down from X to 0 by the advance's own factors (triton.ops.matmul before Triton 2.2: `for k in range(K,
    # 0, -BLOCK_K * SPLIT_K)`, masking `rk[None, :] < k`): on its i-th step `k` is what is left of the row, `X - i * F`
    down = None
    if read is not None and per_value is None and m.matches(read[1], m.Integer("0")):
        parts = _product_factors(read[2])  # `-BLOCK_K * SPLIT_K` is `(-BLOCK_K) * SPLIT_K`
        negated = [p for p in parts if m.matches(p, m.UnaryOperation(operator=m.Minus()))]
        found = [_step_factors(an, p.expression if any(p is n for n in negated) else p) for p in parts]
        if len(negated) == 1 and None not in found and sorted(f for fs in found for f in fs) == rest:  # type: ignore
            down = read[0]
    if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name) or read is None or (
            not m.matches(read[0], m.Integer("0")) or per_value is None) and down is None:
        raise refuse("once more on every iteration of a loop that does not count up from 0 by a literal or a "
                     "parameter, nor down to 0 by the advance's own step")
    per_value = per_value if down is None else []
    k = loop.target.value
    # the loop's variable goes up by `S` a step while the pointer moves by `F`: the mask takes off `k * F / S`
    # (`range(0, K, BLOCK_K)` beside `+= BLOCK_K * stride_ak` masks `offs_k[None, :] < K - k`)
    for factor in per_value:
        if factor not in rest:
            raise refuse(f"by `{code(step)}` on every iteration of a loop whose variable goes up by `{code(read[2])}`, "
                         f"which does not divide the step: TileLink cannot tell which columns the mask bounds")
        rest = sorted(rest[:rest.index(factor)] + rest[rest.index(factor) + 1:])
    step_signs = {f for f in per_value if not f.isdigit()}  # the loop's step, taken as positive
    if any(b != an.where(loop) and _contains(an, loop, b) for b, _ in an.bindings.get(k, [])):
        raise refuse(f"once more on every iteration, and the loop variable `{k}` is bound again in the loop")
    vector = columns[stride]
    # the mask bounds the columns from the row's first column: the pointer must start there (its binding adds only the
    # rows and `vector` times `stride`, through its aliases) and move only by this advance. `+ D` or `+ 2 *
    # stride_xd` in the binding, or `x_ptrs += D * stride_xd` before the loop, starts it further along the row, and
    # the last steps read the next row
    fix = (f"bind `{name}` to the row's first column (`{name} = {acc.tensor} + offs_m[:, None] * stride_m + "
           f"{vector}[None, :] * {stride}`) and advance it only in the loop at line {an.where(loop).line}; start the "
           f"columns further along through the vector itself (`{vector} = start + tl.arange(0, BLOCK_K)`) and mask "
           f"them by the row (`{vector}[None, :] < K - {k} * {' * '.join(rest) or '1'}`)")
    # the access's own address adds nothing past the pointer either (`tl.load(a_ptrs + D * stride_ak, ...)`); and
    # the column term is added once along the pointer's bindings (`rk[None, :] * stride_ak` twice reads `2 * rk`)
    added = 0
    for term, negative in _terms(_bare(cst.parse_expression(acc.pointer))):
        if isinstance(term, cst.Name) and term.value in (pointers or {acc.tensor}) | {name}:
            continue
        if not negative and _column_term(an, term, tile.offsets) == (vector, stride):
            added += 1
            continue
        if tile.offsets is not None and tile.offsets in names_in(term):
            continue
        raise refuse(f"along `{stride}` once more on every iteration, and the {acc.kind} at line {acc.where.line} "
                     f"adds `{'-' if negative else ''}{code(term)}` to it: the mask bounds the columns from the row's "
                     f"first column, and the last steps read the next row", fix)
    chain, todo_aliases = {name, acc.tensor}, [name]
    while todo_aliases:
        alias = todo_aliases.pop()
        most = 0  # the column terms of the binding of `alias` that adds the most of them
        for ref, value in an.assignments.get(alias, []):
            if alias in names_in(value):
                continue
            here = 0
            for term, negative in _terms(_bare(value)):
                if isinstance(term, cst.Name) and term.value in (pointers or {acc.tensor}):
                    if term.value not in chain and len(chain) < 16:
                        chain.add(term.value)
                        todo_aliases.append(term.value)
                    continue
                if not negative and _column_term(an, term, tile.offsets) == (vector, stride):
                    here += 1
                    continue  # the columns the mask bounds
                if tile.offsets is not None and tile.offsets in names_in(term):
                    continue  # the rows (the row scale check's)
                raise refuse(f"along `{stride}` once more on every iteration from where `{alias}` is bound at line "
                             f"{an.where(ref.node).line}, which adds `{'-' if negative else ''}{code(term)}` to the "
                             f"row's first column: the mask bounds the columns from the row's first column, and the "
                             f"last steps read the next row", fix)
            most = max(most, here)
        added += most
    if added > 1:
        raise refuse(f"along `{stride}` once more on every iteration, and its address adds the columns `{vector}[None, "
                     f":] * {stride}` {added} times: it reads `{added} * {vector}`, past the columns the mask or the "
                     f"steps bound, and the last steps read the next row", fix)
    for alias in sorted(chain):
        moved = [an.where(ref.node) for ref, value in an.assignments.get(alias, []) if alias in names_in(value)] + [
            an.where(node) for node in an.findall(an.fn.body, m.AugAssign(target=m.Name(alias)))]
        outside = sorted({w.line for w in moved if not _contains(an, loop, w)})
        if outside:
            raise refuse(f"along `{stride}` once more on every iteration, and `{alias}` is moved outside that loop "
                         f"too (line {', '.join(map(str, outside))}): the mask bounds the columns from the row's first "
                         f"column, and the last steps read the next row", fix)
    # the mask must bound the columns the address was made from: `cols` bound again between the two (`cols = cols -
    # BLOCK_K` before the loop or in it) lets other columns by
    start = an.where(loop)
    made = [an.where(ref.node) for defs in an.assignments.values() for ref, v in defs
            if any(v is e for e in exprs) and vector in names_in(v)
            and (an.where(ref.node).line, an.where(ref.node).column) < (start.line, start.column)]
    first = min(((w.line, w.column) for w in made), default=None)
    beside = _advanced_beside(an, acc, loop, vector, whole_step) if down is None else None
    early = set() if beside is None else {id(v) for defs in an.assignments.values() for ref, v in defs
                                          if (an.where(ref.node).line, an.where(ref.node).column)
                                          < (start.line, start.column)}
    if beside is not None and (not made or any(vector in names_in(e) and id(e) not in early for e in exprs)):
        # the vector moves with the pointer only where the address took it once, before the loop: read again by the
        # access or by an alias bound in the loop, it adds its step a second time on every iteration
        beside = None
    for b, _ in an.bindings.get(vector, []):
        if b == beside:
            continue
        if (b != start and _contains(an, loop, b)) or first is not None and first < (b.line, b.column) < (
                start.line, start.column):
            raise refuse(f"along `{stride}` once more on every iteration, and the columns `{vector}` its mask bounds "
                         f"are bound again at line {b.line}, after the address was made from them: the mask does not "
                         f"bound the columns the address reads",
                         f"bind `{vector}` once before the pointer is made from it, and not again before the loop or "
                         f"in it, so that the mask (`{vector}[None, :] < K - {k} * {' * '.join(rest) or '1'}`) bounds "
                         f"the columns the address reads; or advance it with the pointer, once in the loop's body "
                         f"after the {acc.kind} and by the same step along the row (`{vector} += "
                         f"{' * '.join(whole_step) or '1'}`), and mask it by the row (`{vector}[None, :] < K`)")

    # the mask bounds the columns from above only: a vector that may hold a negative column (`tl.arange(0, BLOCK_K) -
    # 2`) reads the end of the row before, which no wait or notify of these rows covers. The parameters its sign
    # rests on, and those of the step's factors (a negative `BLOCK_K` walks back), are checked at each call
    signs = _nonnegative_value(an, cst.Name(vector))
    if signs is None:
        raise refuse(f"along `{stride}` once more on every iteration, and its columns `{vector}` may start before the "
                     f"row's first column (TileLink reads them as non-negative only when made of `tl.arange(0, B)`, "
                     f"int literals of at least 0, program ids and parameters by `+`, `*`, `//` and `%`): the mask "
                     f"bounds them from above only, and a negative column reads the row before",
                     f"start the columns at 0 or a non-negative offset (`{vector} = start + tl.arange(0, BLOCK_K)`, "
                     f"`start` a parameter, a literal or a program's position), not below it")
    signs |= {code(f) for f in factors if f is not strides[0] and isinstance(f, cst.Name)} | step_signs

    found, unread = _left_of_row(an, acc, loop, k, vector, rest, down, beside is not None)
    if found is not None:
        an.row_bounds.append((acc.tensor, found, stride, acc.where))
        an.row_signs.extend((n, acc.where) for n in sorted(signs))
        return
    whole = _whole_blocks(an, loop, read, vector, rest, per_value, down) if unread is None else None
    if whole is not None:  # no mask, whole blocks where the launch says so: checked at each call that compiles it
        total, step_of, start_at, block = whole
        an.row_bounds.append((acc.tensor, ((False, total),), stride, acc.where))
        an.row_multiples.append((total, " * ".join(step_of), acc.where))
        if start_at is not None or block != step_of:
            an.column_ends.append((start_at or "0", block, step_of, acc.where))
        an.row_signs.extend((n, acc.where) for n in sorted(signs))
        return
    if unread is not None:
        raise refuse(f"along `{stride}` once more on every iteration, and the mask bounds the columns `{vector}` by "
                     f"`{unread}`, which is not a sum of products of int literals and parameters the kernel leaves "
                     f"as passed: the launch cannot check that those columns lie in one row",
                     f"bound the columns by the row's length, a parameter (`{vector}[None, :] < K - {k} * "
                     f"{' * '.join(rest) or '1'}`), which each call checks against the row of {acc.tensor!r}")
    raise refuse(f"along `{stride}` once more on every iteration, and the mask does not bound the columns "
                 f"`{vector}` by what is left of the row on each step (`{vector}[None, :] < K - {k} * "
                 f"{' * '.join(rest) or '1'}`, also through a local bound in the loop before the access, of names the "
                 f"loop does not bind; or `{vector}[None, :] < K`, made on each step, with `{vector}` advanced beside "
                 f"the pointer), nor do the loop's steps take whole blocks of the row (columns `tl.arange(0, "
                 f"BLOCK_K)` over `range(0, tl.cdiv(K, BLOCK_K))`, which each call checks for K a multiple of "
                 f"BLOCK_K)")


def _with_row_program_hint(an: _Analyzer, acc: Access, error: AnnotationError) -> AnnotationError:
    """``error`` refusing a load whose address reads one row a program but was not taken as such
    (:func:`_row_of_program`), with that reason added to its hint: the other readings' refusals speak of blocks of
    rows, which is not what the kernel wrote."""
    why = an.row_program_misses.get(acc.where)
    if why is None or why in (error.hint or ""):
        return error
    # the other readings took the columns for a block of rows (`cols` "indexed by itself"): their reason and hint
    # speak of rows the kernel does not have, so the refusal says which rows it could not tell, and why
    verb = "reads" if acc.kind == "load" else "writes"
    return AnnotationError(f"cannot tell which rows of {acc.tensor!r} this {acc.kind} {verb} (pointer "
                           f"`{acc.pointer}`)", file=acc.where.file, line=acc.where.line, column=acc.where.column,
                           hint=why)


def _check_carried_columns(an: _Analyzer, acc: Access, pointers: set[str], vector: str, scale: tuple[str, ...],
                           offsets: str) -> None:
    """Columns ``vector`` carried from step to step of a loop (``offs_k += BLOCK_K``) that the address reads afresh
    on each step (``a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak``), where no alias of the pointer
    is advanced in a loop (whose advance check reads them): only a conjunct of the mask made at the access from the
    vector's value there bounds them (``offs_k[None, :] < K``, ``K`` what the launch reads), and they must not be
    negative; then each call checks ``K`` against the row (``row_bounds``). A mask made before the vector moves, or
    none, lets the last steps read the next row: refused."""
    loops = an.findall(an.fn.body, m.For() | m.While())

    def carried(name: str) -> list[Where]:
        sites = [an.where(n) for n in an.findall(an.fn.body, m.AugAssign(target=m.Name(name)))] + [
            an.where(ref.node) for ref, value in an.assignments.get(name, []) if name in names_in(value)]
        return [w for w in sites if any(_contains(an, lp, w) for lp in loops)]

    # the vector itself, or one it is made from (`(offs_k - BLOCK_K)[None, :]`, named for this access)
    made = an.assignments.get(vector, [])
    sources = [vector] + sorted(n for n in (names_in(made[0][1]) if len(made) == 1 else ()) if n != vector)
    mover = next((n for n in sources if carried(n)), vector)
    moves = [w for n in sources for w in carried(n)]
    exprs = an._pointer_definitions(acc.pointer, pointers)
    if not moves or any(carried(n) for n in set().union(*(names_in(e) for e in exprs)) & pointers):
        return
    stride = scale[0] if len(scale) == 1 else "1" if not scale else None
    masks = _mask_locals(an, acc)
    last = _mask_bound(an, masks, vector, offsets) if stride is not None else None
    signs = _nonnegative_value(an, cst.Name(vector)) if last is not None else None
    if last is None or signs is None:
        made_of = "" if mover == vector else f", made from `{mover}`,"
        raise _refuse(acc, f"the columns `{vector}`{made_of} of the {acc.kind} at line {acc.where.line} move from step "
                           f"to step of a loop (line {', '.join(str(w.line) for w in moves)}) and the address reads "
                           f"them afresh on each step, but "
                           + ("the mask does not bound them where the access reads them" if last is None else
                              "TileLink cannot tell that they are not negative")
                           + f": its last steps may touch the next rows of {acc.tensor!r}, which its {_waits(acc)} "
                             f"does not cover",
                      f"mask the columns at the {acc.kind} by the row's length (`mask=... & ({vector}[None, :] < K)`, "
                      f"made there, after `{mover}` moves), start them at 0 or a non-negative offset, or compute "
                      f"`{mover}` from the loop's variable (`{mover} = k * BLOCK_K + tl.arange(0, BLOCK_K)`)")
    # the largest column let through is X - 1 (`< X`) or X (`<= X`): the columns are [0, X)
    bound = tuple(t for t in last if t != (True, ("1",))) if (True, ("1",)) in last else (*last, (False, ("1",)))
    an.row_bounds.append((acc.tensor, bound, stride, acc.where))  # type: ignore[arg-type]
    an.row_signs.extend((n, acc.where) for n in sorted(signs))


def _terms_source(terms: tuple[tuple[bool, tuple[str, ...]], ...]) -> str:
    """``((False, ("BLOCK", "2")), (True, ("1",)))`` -> ``"BLOCK * 2 - 1"``: a sum of products, in source."""
    text = ""
    for negative, factors in terms:
        product = " * ".join(factors)
        text = f"-{product}" if not text and negative else f"{text} {'-' if negative else '+'} {product}" if text \
            else product
    return text or "0"


def _scalar_store_row(an: _Analyzer, acc: Access, dim: int, exprs: list[cst.BaseExpression],
                      size_param: str | None) -> Tile | None:
    """A store of one element a program at its id (a matrix-vector product's `tl.store(y_ptr + row, y)`, `row =
    tl.program_id(0)`): the tile is that row, one element. Read only where

    - the address is the tensor plus the name: written in the store, through an alias bound once (`y_ptrs = y_ptr +
      row`), or the tensor advanced in place once (`y_ptr += row`, then `tl.store(y_ptr, y)`), the alias or the advance
      a statement of the kernel's body before the store; the store is a statement of the kernel's body too (no loop
      stores it twice, no branch skips it);
    - the name is bound once, to the program's id along one axis (also cast, `.to(tl.int64)`);
    - the store has no mask, and the rows are then the grid's programs along that axis, or its mask is `row < X`,
      ``X`` a parameter the kernel leaves as passed: the rows are ``X`` (``size=`` names them otherwise).

    The launch checks that the output's rows are one element apart (a 1-D output, or one column). ``None`` for any
    other form."""
    if acc.kind != "store" or acc.descriptor or acc.atomic or dim != 0:
        return None

    def top_level(where: Where) -> bool:
        """A statement of the kernel's body (not of a loop or a branch) holds ``where``."""
        return any(isinstance(r.node, cst.SimpleStatementLine) and r.blocks == (an.fn.body,)
                   and _contains(an, r.node, where) for r in an.statements)

    def top_level_before(where: Where) -> bool:
        return (where.line, where.column) < (acc.where.line, acc.where.column) and top_level(where)

    if not top_level(acc.where):
        return None

    advances = an.bindings.get(acc.tensor, ())
    if len(exprs) == 1 and not advances:
        address = _bare(exprs[0])
    elif len(exprs) == 2 and not advances and m.matches(_bare(exprs[0]), m.Name()):
        alias = _bare(exprs[0]).value  # type: ignore[attr-defined]
        made = an.assignments.get(alias, [])
        if len(made) != 1 or len(an.bindings.get(alias, ())) != 1 or alias in an.rebound or not top_level_before(
                an.where(made[0][0].node)):
            return None
        address = _bare(exprs[1])
    elif len(exprs) == 1 and m.matches(_bare(exprs[0]), m.Name(acc.tensor)) and len(advances) == 1 \
            and top_level_before(advances[0][0]):
        ref = next((r for r in an.statements if isinstance(r.node, cst.SimpleStatementLine)
                    and an.where(r.node) == advances[0][0]), None)
        small = ref.node.body[0] if ref is not None and len(ref.node.body) == 1 else None  # type: ignore[attr-defined]
        if not (isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign)
                and m.matches(small.target, m.Name(acc.tensor))):
            return None
        address = cst.BinaryOperation(cst.Name(acc.tensor), cst.Add(), small.value)
    else:
        return None
    terms = _terms(address)
    names = [t.value for t, negative in terms if isinstance(t, cst.Name) and not negative]
    if len(terms) != 2 or len(names) != 2 or acc.tensor not in names or names[0] == names[1]:
        return None
    row = names[1] if names[0] == acc.tensor else names[0]
    made = an.assignments.get(row, [])
    if len(made) != 1 or len(an.bindings.get(row, ())) != 1 or row in an.rebound:
        return None
    pid = _uncast(_helpers_written_out(an, made[0][1]))
    if not m.matches(pid, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("program_id")))):
        return None
    axis = call_position(pid)  # type: ignore[arg-type]
    if axis not in ("0", "1", "2"):
        return None
    counted = f"tl.num_programs({axis})"
    if acc.mask is not None:
        bound = _bare(cst.parse_expression(acc.mask))
        if not (isinstance(bound, cst.Comparison) and len(bound.comparisons) == 1
                and isinstance(bound.comparisons[0].operator, cst.LessThan)
                and m.matches(_bare(bound.left), m.Name(row))
                and _passed(an, limit := _bare(bound.comparisons[0].comparator))
                and limit.value not in an.constexpr):  # type: ignore[attr-defined]
            return None  # a bound other than a parameter the kernel leaves as passed, which the launch reads
        counted = limit.value  # type: ignore[attr-defined]
    return Tile(row, "1", None, size_param or counted, row, acc.where, 1)


def _row_of_program(an: _Analyzer, acc: Access, dim: int, pointers: set[str], exprs: list[cst.BaseExpression]
                    ) -> tuple[str, str, tuple[tuple[bool, tuple[str, ...]], ...], str] | None:
    """A load of one row a program (Triton's softmax and layer-norm tutorials: `row_start_ptr = input_ptr + row_idx *
    input_row_stride` then `tl.load(row_start_ptr + col_offsets, mask=col_offsets < n_cols)`, or `X += row * stride`
    then `tl.load(X + cols, mask=cols < N)`): the address is the tensor, one row term `row * S` and one vector of
    columns. ``(row, S, the columns' bound terms)`` when

    - the load is 1-D and gathers dim 0; each alias of the pointer is bound once, in a block that holds the load and
      before it, and the tensor itself is advanced in place at most once, at the kernel's top level before the load
      (`X += row * stride`);
    - ``row`` is a name bound once (an assignment of a value that calls nothing with an effect, or a loop's target),
      non-negative, and ``S`` a parameter the kernel leaves as passed: each call checks that it is the length of a
      row of the gathered buffer (``row_scales``);
    - the columns are one name, non-negative, bounded by a conjunct `cols < X` of the load's mask (written in it, or
      through a local bound once in the load's block before it, nothing it reads bound in between), ``X`` a sum of
      products of int literals and parameters the kernel leaves as passed: each call checks that ``X`` is at most a
      row (``row_bounds``).

    Then the load reads row ``row`` only, and the tile is that row. ``None`` for any other form, which the other
    readings take (or refuse)."""
    if acc.descriptor or acc.atomic or dim != 0 or any(
            m.findall(e, m.Subscript(slice=[m.ZeroOrMore(), m.SubscriptElement(m.Index(value=m.Name("None"))),
                                            m.ZeroOrMore()])) for e in exprs):
        return None
    before = (acc.where.line, acc.where.column)
    verb, waits = ("reads", "waits for") if acc.kind == "load" else ("writes", "notifies")

    def at(ref: StmtRef) -> tuple[int, int]:
        w = an.where(ref.node)
        return (w.line, w.column)

    loops = an.findall(an.fn.body, m.For() | m.While())

    def steady(names: set[str], since: tuple[int, int]) -> bool:
        """Each of ``names`` holds at the load the value it held at ``since``: no binding of it in between, nor in a
        loop that holds the load and not ``since`` (which would bind it again before the load's next step)."""
        w = Where(acc.where.file, *since)
        return not any(since < (b.line, b.column) < before or any(
            _contains(an, lp, acc.where) and not _contains(an, lp, w) and _contains(an, lp, b) for lp in loops)
            for n in names for b, _ in an.bindings.get(n, ()))

    def gathered(expand: bool) -> list[tuple[cst.BaseExpression, tuple[int, int]]] | None:
        """The address's terms, each with where it was read: the load itself, or the binding of the alias that holds
        it; with ``expand``, a local the address adds is read as its terms where it holds one product (the row's
        offset bound apart: taken only where no row product is found otherwise, so that a column vector made of a
        product, `col = pid * BLOCK_N + tl.arange(0, BLOCK_N)`, stays the columns). ``None``: not this form."""
        terms: list[tuple[cst.BaseExpression, tuple[int, int]]] = []
        todo, seen = [(cst.parse_expression(acc.pointer), before)], set()
        while todo:
            expr, site = todo.pop()
            for term, negative in _terms(_bare(expr)):
                term = _bare(term)
                if negative:
                    return None
                if expand and isinstance(term, cst.Name) and term.value not in pointers \
                        and term.value not in an.params:
                    # the row's offset bound to a local of its own (SGLang's `input_start = pid * hidden_dim`, then
                    # `activ_ptr + input_start + offsets`), or with the columns (`offs = row * stride + cols`, then
                    # `x_ptr + offs`): read as its terms, where it holds at the load
                    defs = an.assignments.get(term.value, [])
                    value = _uncast(defs[0][1]) if len(defs) == 1 else None  # also widened, `(row * stride).to(...)`
                    parts = _terms(value) if value is not None else []
                    made = [t for t, neg in parts if isinstance(_bare(t), cst.BinaryOperation) and isinstance(
                        _bare(t).operator, cst.Multiply)]
                    if len(made) == 1 and not any(neg for _, neg in parts) and len(
                            an.bindings.get(term.value, ())) == 1 and term.value not in an.rebound and (
                            len(parts) == 2 or len(parts) == 1 and not _is_vector(an, term)):
                        ref = defs[0][0]
                        if ref.blocks and _contains(an, ref.blocks[-1], acc.where) and at(ref) < site \
                                and steady({term.value}, at(ref)):
                            todo.append((value, at(ref)))
                            continue
                if not (isinstance(term, cst.Name) and term.value in pointers):
                    terms.append((term, site))
                    continue
                name = term.value
                if name in seen or len(seen) > 8:
                    return None
                seen.add(name)
                defs = an.assignments.get(name, [])
                if name == acc.tensor:
                    steps = an.findall(an.fn.body, m.AugAssign(target=m.Name(name)))
                    if defs or len(steps) > 1 or len(an.bindings.get(name, ())) != len(steps):
                        return None
                    if steps:
                        # advanced once at the top level, before whatever read the tensor on the way to the load
                        ref = next((r for r in an.statements if r.node is not None and r.blocks == (an.fn.body,)
                                    and any(sm is steps[0] for sm in small_statements(r))), None)
                        if ref is None or not isinstance(steps[0].operator, cst.AddAssign) or at(ref) >= site:
                            return None
                        todo.append((steps[0].value, at(ref)))
                    continue
                if len(defs) != 1 or len(an.bindings.get(name, ())) != 1 or name in an.rebound:
                    return None
                ref, value = defs[0]
                # bound before what reads it, in a block that holds the load: the value of this pass, not a previous one
                if not ref.blocks or not _contains(an, ref.blocks[-1], acc.where) or at(ref) >= site:
                    return None
                todo.append((value, at(ref)))
        return terms

    def products(terms) -> list[cst.BaseExpression]:
        return [t for t, _ in terms if isinstance(t, cst.BinaryOperation) and isinstance(t.operator, cst.Multiply)
                and len(_product_factors(t)) == 2]

    terms = gathered(False)
    if terms is not None and not products(terms):
        terms = gathered(True)
    if terms is None:
        return None
    rows = products(terms)
    if len(rows) != 1 or len(terms) != 2:
        return None
    factors = [_bare(f) for f in _product_factors(rows[0])]
    cols = next(t for t, _ in terms if t is not rows[0])
    # the stride: a parameter as passed, also a constexpr one (unsloth's `X_row_stride: tl.constexpr`, which each call
    # reads as it reads the others), but not the block the columns are made of (`pid * BLOCK + tl.arange(0, BLOCK)`
    # walks blocks of a flat tensor, which the other readings take)
    blocks = {n for _, v in an.assignments.get(cols.value, []) for n in names_in(v)} if isinstance(
        cols, cst.Name) else names_in(cols)
    strides = [f for f in factors if _passed(an, f) and (  # type: ignore[union-attr]
        f.value not in an.constexpr or f.value not in blocks)]  # type: ignore[union-attr]
    if not strides and isinstance(cols, cst.Name):
        # the stride through a function TileLink does not read (unsloth's `row * triton_cast(stride, tl.int64)`,
        # `triton_cast` imported from its utilities): say so, naming the spellings it reads
        called = [f for f in factors if isinstance(f, cst.Call)]
        if len(called) == 1 and any(_passed(an, x.value) for x in called[0].args):
            an.row_program_misses[acc.where] = (
                f"this {acc.kind} {verb} one row a program, beside the columns `{cols.value}`, but its row's stride is "
                f"`{code(called[0])}`, a call TileLink does not read: it reads a stride parameter as passed or widened "
                f"(`stride.to(tl.int64)`, `tl.cast(stride, tl.int64)`); write one of those")
    if len(strides) != 1:
        return None
    stride = strides[0]
    row = next(f for f in factors if f is not stride)

    def miss(why: str) -> None:
        an.row_program_misses[acc.where] = (
            f"this {acc.kind} {verb} one row a program, `{code(row)}` times `{code(stride)}`, beside the columns "
            f"`{code(cols)}`, but {why}: TileLink {waits} that one row when the row is a name bound once (the "
            f"program's id or a loop's target), the stride a parameter, and the columns one non-negative vector "
            f"masked by the row's length (`cols = tl.arange(0, BLOCK)`, `mask=cols < N`)")

    if not isinstance(row, cst.Name) or not isinstance(cols, cst.Name) or row.value in an.params:
        return miss("the row or the columns are not a name of their own")
    if _is_vector(an, row):
        return miss(f"the row `{row.value}` is a vector, not one row")
    if acc.kind == "store":
        # the notify counts the store's lanes: each must be a column of its own (`tl.arange(0, W) // 2` stores each
        # column twice, and would complete the row's channel before the rest of it is stored)
        made = an.assignments.get(cols.value, [])
        if not made or len(an.bindings.get(cols.value, ())) != len(made) or any(
                (lanes := _distinct_offsets(v)) is None or not _scalar_value(an, cst.parse_expression(lanes[0]))
                for _, v in made):
            return miss(f"the columns `{cols.value}` are not made as `start + tl.arange(0, BLOCK)` (a scalar start), "
                        f"whose lanes are columns of their own, each counted once")
    moved = [n for t, site in terms for n in sorted(names_in(t)) if not steady({n}, site)]
    if moved:
        return miss(f"`{moved[0]}` is bound again between where the address reads it and the {acc.kind}")
    # the row: bound once, to a value that gives the same row where the wait computes it again
    if len(an.bindings.get(row.value, ())) != 1 or row.value in an.rebound and not an.findall(
            an.fn.body, m.For(target=m.Name(row.value))):
        return miss(f"`{row.value}` is bound more than once")
    for _, value in an.assignments.get(row.value, []):
        _check_start_runs_again(an, acc, code(value), row.value)
    row_signs = _nonnegative_value(an, row)
    col_signs = _nonnegative_value(an, cols)
    if row_signs is None or col_signs is None:
        return miss(f"TileLink cannot tell that `{row.value if row_signs is None else cols.value}` is not negative")
    # the columns' bound: a conjunct of the mask, through locals: the binding of one in a block that holds the load,
    # the last before it (a two-pass norm binds `mask = cols < N` in each of its column loops), whose value holds at
    # the load (neither the local nor a name it reads bound again in between)
    conjuncts, pending = [], _conjuncts(acc.mask, an.params) if acc.mask is not None else []
    while pending and len(conjuncts) < 32:
        node = _bare(pending.pop())
        defs = [(ref, v) for ref, v in (an.assignments.get(node.value, []) if isinstance(node, cst.Name) else [])
                if ref.blocks and _contains(an, ref.blocks[-1], acc.where) and at(ref) < before]
        last = max(defs, key=lambda d: at(d[0]), default=None)
        if last is not None and node.value not in an.params and node.value not in an.rebound and steady(
                names_in(last[1]) | {node.value}, at(last[0])):
            pending += _conjuncts(code(last[1]), an.params)
        else:
            conjuncts.append(node)
    for node in conjuncts:
        if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1):
            continue
        # `cols < X`, `cols <= X` (X + 1), or the same written the other way round (`X > cols`, `X >= cols`)
        op, left, right = node.comparisons[0].operator, _bare(node.left), _bare(node.comparisons[0].comparator)
        if isinstance(op, (cst.GreaterThan, cst.GreaterThanEqual)):
            left, right = right, left
        if not (isinstance(op, (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual))
                and m.matches(left, m.Name(cols.value))):
            continue
        bound = []
        for term, negative in _terms(right):
            parts = [_bare(f) for f in _product_factors(_bare(term))]
            if not all(isinstance(f, cst.Integer) or _passed(an, f) for f in parts):
                bound = None
                break
            bound.append((negative, tuple(sorted(code(f) for f in parts))))
        if bound and isinstance(op, (cst.LessThanEqual, cst.GreaterThanEqual)):
            bound.append((False, ("1",)))  # the columns [0, X]: X + 1 of them
        if bound:
            an.row_signs.extend((n, acc.where) for n in sorted(row_signs | col_signs))
            return row.value, stride.value, tuple(bound), cols.value  # type: ignore[union-attr]
    return miss(f"its mask does not bound `{cols.value}` by the row's length (`{cols.value} < N`, `N` a parameter "
                f"or a sum of products of parameters and int literals)")


def _advanced_beside(an: _Analyzer, acc: Access, loop: cst.For, vector: str, step: list[str]) -> Where | None:
    """Where the column vector ``vector`` is advanced with the pointer (vLLM's `offsets_k += BLOCK_SIZE_K` beside
    `a_ptrs += BLOCK_SIZE_K * stride_ak`, masked by `offsets_k < K`): one `vector += F` in ``loop``'s own body (on every
    step, outside any branch), after the access, ``F`` the factors ``step`` the pointer moves by along the row (int
    literals and parameters the kernel leaves as passed, which the advance check read). On step ``k`` the vector is
    then its first value plus ``k * F``, the columns the pointer reads: a mask ``vector < X`` bounds them by what is
    left of the row, as ``first[None, :] < X - k * F`` does. ``None`` when the vector is bound in the loop otherwise,
    or when a step of the loop may skip the advance (``continue``, ``break``)."""
    inside = [b for b, _ in an.bindings.get(vector, []) if b != an.where(loop) and _contains(an, loop, b)]
    if len(inside) != 1 or an.findall(loop.body, m.Continue() | m.Break()):  # a step that skips the advance
        return None
    at = inside[0]
    ref = next((r for r in an.statements if isinstance(r.node, cst.SimpleStatementLine) and _contains(an, r.node, at)),
               None)
    if ref is None or not ref.blocks or ref.blocks[-1] is not loop.body or len(small_statements(ref)) != 1 or (
            at.line, at.column) < (acc.where.line, acc.where.column):
        return None
    small = small_statements(ref)[0]
    if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign) and m.matches(
            small.target, m.Name(vector)):
        moved = small.value
    elif isinstance(small, cst.Assign) and len(small.targets) == 1 and m.matches(small.targets[0].target,
                                                                                 m.Name(vector)):
        moved = _step_of(_bare(small.value), vector)
        if moved is None or isinstance(_bare(small.value), cst.BinaryOperation) and isinstance(
                _bare(small.value).operator, cst.Subtract):
            return None
    else:
        return None
    factors = [_bare(f) for f in _product_factors(_bare(moved))]
    if not all(isinstance(f, cst.Integer) or _passed(an, f) for f in factors):
        return None
    return at if sorted(code(f) for f in factors) == sorted(step) else None


def _whole_blocks(an: _Analyzer, loop: cst.For, read, vector: str, rest: list[str], per_value: list[str],
                  down: cst.BaseExpression | None = None
                  ) -> tuple[tuple[str, ...], tuple[str, ...], str | None, tuple[str, ...]] | None:
    """An access without a column mask that walks whole blocks of a row (``if EVEN_K: a = tl.load(a_ptrs)``, the
    ``EVEN_K`` side of triton.ops.matmul's form): the columns are ``S + tl.arange(0, B)`` and the loop takes
    ``tl.cdiv(X, F)`` steps of ``F`` (``range(0, tl.cdiv(K, BLOCK_K * SPLIT_K))`` with ``a_ptrs += BLOCK_K * SPLIT_K
    * stride_ak``, or ``range(0, K, BLOCK_K)`` with the pointer moved by the loop's step, or ``down``, the start
    ``X`` of a loop counting down to 0 by ``F``, ``range(K, 0, -BLOCK_K * SPLIT_K)``), so where ``F`` divides ``X``
    and ``S + B <= F`` the last step ends at column ``X`` at the latest. ``(X's factors, F's factors, S written out
    over program ids and parameters or None for 0, B's factors)``, each factor an int literal or a parameter the
    kernel leaves as passed: each call where the access is compiled checks that ``X`` is a multiple of ``F``, that
    ``X`` columns lie in one row and that ``S + B <= F`` over its grid (``KernelAnalysis.row_multiples``,
    ``row_bounds``, ``column_ends``); ``None`` for any other form."""

    def launch_name(node: cst.BaseExpression) -> str | None:
        node = _bare(node)
        return code(node) if isinstance(node, cst.Integer) or _passed(an, node) else None

    def product(node: cst.BaseExpression) -> tuple[str, ...] | None:
        parts = [launch_name(f) for f in _product_factors(_bare(node))]
        return None if any(p is None for p in parts) else tuple(sorted(parts))  # type: ignore[arg-type]

    stop = _bare(read[1])
    if down is not None:  # `range(X, 0, -F)`: as many steps as `range(0, tl.cdiv(X, F))`
        total, step = product(down), tuple(sorted(rest))
    elif per_value:  # `range(0, X, F)`: the pointer moves by the loop's step
        if rest:
            return None
        total, step = product(stop), tuple(sorted(per_value))
    else:  # `range(0, tl.cdiv(X, F))`
        if not rest or not (isinstance(stop, cst.Call) and m.matches(stop.func, m.Attribute(attr=m.Name("cdiv")))
                            and len(stop.args) == 2):
            return None
        total, step = product(stop.args[0].value), product(stop.args[1].value)
        if step != tuple(sorted(rest)):
            return None
    values = an.assignments.get(vector, [])
    if total is None or len(values) != 1 or len(an.bindings.get(vector, ())) != 1:
        return None
    made, start = _bare(values[0][1]), None
    if isinstance(made, cst.BinaryOperation) and isinstance(made.operator, cst.Add):  # `pid_z * BLOCK_K + arange`
        made, start = (made.right, made.left) if m.matches(_bare(made.right), m.Call()) else (made.left, made.right)
        made = _bare(made)
    width = _arange_size(made)
    block = product(cst.parse_expression(width)) if width is not None else None
    if block is None or len(block) != 1:
        return None
    written = None
    if start is not None:
        written = launch_value(an, code(start), an.where(values[0][0].node))
        if written is None:
            return None
    return total, step, written, block


def _step_factors(an: _Analyzer, step: cst.BaseExpression) -> list[str] | None:
    """A loop's step as factors: ``[]`` for 1, the int literals (at least 1) and parameters the kernel leaves as
    passed of a product (taken as positive: the parameters are sign facts); ``None`` for anything else."""
    factors = []
    for f in _product_factors(step):
        if isinstance(f, cst.Integer) and int(f.value) >= 1:
            if int(f.value) > 1:
                factors.append(f.value)
        elif _passed(an, f):
            factors.append(f.value)  # type: ignore[attr-defined]
        else:
            return None
    return sorted(factors)


def _column_step(an: _Analyzer, acc: Access, pointers: set[str], term: cst.BaseExpression, negative: bool,
                 offsets: str) -> bool:
    """The address made afresh on each step of the matmul's K loop (``a_ptr + ... + offs_k[None, :] * stride_ak + k *
    BLOCK_K * stride_ak`` for ``k in range(0, tl.cdiv(K, BLOCK_K))``): ``term`` is the loop variable times factors
    ``F`` (int literals, parameters the kernel leaves as passed) times the stride parameter of a column vector of the
    address (through its aliases, each bound once), the loop counts up from 0 by 1, and the mask bounds that vector
    by what is left of the row (``offs_k[None, :] < K - k * BLOCK_K``, :func:`_left_of_row`). The columns touched on
    step ``k`` are ``offs_k + k * F``, below ``X``, which each call compares with the row
    (``KernelAnalysis.row_bounds``), as for the advance in place (:func:`_check_advance_in_loop`); the term is 0 on
    the first step. Records the bound and returns True when so; False for anything else (the term's ends are then
    what the launch must read)."""
    parts = _product_factors(term)
    targets = [p for p in parts if isinstance(p, cst.Name) and p.value not in an.params]
    if negative or len(targets) != 1:
        return False
    k = targets[0].value
    loops = [lp for lp in an.findall(an.fn.body, m.For(target=m.Name(k))) if _contains(an, lp, acc.where)]
    read = _range_args(loops[0]) if len(loops) == 1 else None
    per_value = _step_factors(an, read[2]) if read is not None else None
    if read is None or not m.matches(read[0], m.Integer("0")) or per_value is None or len(
            an.bindings.get(k, ())) != 1:
        return False  # a loop of another start or a step of unknown sign, or its variable bound again
    definitions = an._pointer_definitions(acc.pointer, pointers)
    if any(len(an.bindings.get(alias, ())) != 1 for e in definitions for alias in names_in(e) & pointers
           if alias != acc.tensor):
        return False  # an alias bound more than one way, or advanced: its columns are not one vector's
    columns: dict[str, list[str]] = {}  # stride parameter ("1": none) -> the column vectors it scales in the address
    for expr in definitions:
        for t, subtracted in _terms(_bare(expr)):
            vector, stride_of = _column_term(an, t, offsets)
            if vector is not None and stride_of is None and m.matches(_bare(t), m.Subscript(value=m.Name(vector))):
                stride_of = "1"  # `cols[None, :]` as it is
            if vector is not None and stride_of is not None and not subtracted:
                columns.setdefault(stride_of, []).append(vector)
    strides = [p for p in parts if isinstance(p, cst.Name) and len(columns.get(p.value, ())) == 1]
    if not strides and len(columns.get("1", ())) == 1 and len(columns) == 1:
        stride = "1"  # the columns added as they are: the step is the term itself
    elif len(strides) == 1:
        stride = strides[0].value
    else:
        return False
    rest = [p for p in parts if not any(p is x for x in strides) and p is not targets[0]]
    if not all(isinstance(f, cst.Integer) or (isinstance(f, cst.Name) and f.value in an.params
                                              and not an.bindings.get(f.value)) for f in rest):
        return False  # a factor that may change from step to step, or be negative
    (vector,) = columns[stride]
    if not _walk_alone(an, definitions, pointers | {acc.tensor}, offsets, vector, k):
        return False
    signs = _nonnegative_value(an, cst.Name(vector)) if len(an.bindings.get(vector, ())) == 1 else None
    if signs is None:
        return False  # columns that may start before the row's first, or bound more than once
    found, _ = _left_of_row(an, acc, loops[0], k, vector, sorted(code(f) for f in rest))
    if found is None:
        return False
    an.row_bounds.append((acc.tensor, found, stride, acc.where))
    an.row_signs.extend((n, acc.where) for n in sorted(signs | {code(f) for f in rest if isinstance(f, cst.Name)}
                                                         | {f for f in per_value if not f.isdigit()}))
    return True


def _advanced_in_place(an: _Analyzer, acc: Access, pointers: set[str]) -> bool:
    """Whether an alias of the access's pointer is advanced in place (`a_ptrs += BLOCK_K * stride_ak`), whose walk the
    advance check bounds by the access's mask."""
    aliases = {n for e in an._pointer_definitions(acc.pointer, pointers) for n in names_in(e) & pointers}
    return any(n in an.rebound or any(n in names_in(v) for _, v in an.assignments.get(n, ())) for n in aliases)


def _walk_alone(an: _Analyzer, definitions: list[cst.BaseExpression], pointers: set[str], offsets: str, vector: str,
                k: str) -> bool:
    """Whether the address's terms, through its aliases, are the pointers, the rows (``offsets``), the columns
    ``vector`` and the loop variable ``k``'s term only: another term (`+ D`) starts the walk further along the row
    than the mask's bound counts from."""
    moving = columns = 0
    for e in definitions:
        for t, _ in _terms(_bare(e)):
            names = names_in(t)
            if isinstance(t, cst.Name) and t.value in pointers or offsets in names:
                continue
            if k in names and vector not in names:
                moving += 1
            elif vector in names and k not in names and not names & pointers:
                columns += 1
            else:
                return False
    return moving == 1 and columns == 1  # each once: two of either walk twice as far as the mask counts


def _literal_local(an: _Analyzer, name: str) -> bool:
    """``name`` is a local bound once, to an int literal (torch Inductor's `BLOCK_K : tl.constexpr = 32`)."""
    defs = an.assignments.get(name, [])
    return name not in an.params and len(defs) == 1 and len(an.bindings.get(name, ())) == 1 and isinstance(
        _bare(defs[0][1]), cst.Integer)


def _walked_bound(an: _Analyzer, acc: Access, pointers: set[str], vector: str, scale: tuple[str, ...],
                  offsets: str) -> bool:
    """Columns ``vector[None, :]`` (times the factors ``scale``) masked by what is left of the row on each step of a
    loop around the access (``vector[None, :] < X - j * F``, :func:`_left_of_row`) beside the one term of the address
    that reads the loop's variable, ``j * F`` times ``scale`` (``+ j * BLOCK_D`` beside ``cols[None, :]``): the columns
    touched are ``vector + j * F`` times ``scale``, below ``X`` times it, which each call compares with the row
    (``KernelAnalysis.row_bounds``; the loop's term itself is checked at its ends). Records that and returns True; False
    where the mask or the address is not so (a step the address takes other than the mask's reads past ``X``)."""
    if len(scale) > 1 or (scale and not (scale[0].isdigit() or (scale[0] in an.params and not an.bindings.get(
            scale[0])))):
        return False
    stride = scale[0] if scale else "1"
    definitions = an._pointer_definitions(acc.pointer, pointers)
    terms = [(t, negative) for e in definitions for t, negative in _terms(_bare(e))]
    for loop in an.findall(an.fn.body, m.For(target=m.Name())):
        k = loop.target.value
        if not _contains(an, loop, acc.where) or len(an.bindings.get(k, ())) != 1:
            continue
        moving = [(t, negative) for t, negative in terms if k in names_in(t)]
        if len(moving) != 1 or moving[0][1]:
            continue
        parts = _product_factors(moving[0][0])
        if sum(1 for p in parts if m.matches(p, m.Name(k))) != 1 or not all(
                isinstance(p, cst.Integer) or (isinstance(p, cst.Name) and (p.value == k or (
                    p.value in an.params and not an.bindings.get(p.value)) or _literal_local(an, p.value)))
                for p in parts):
            continue
        rest = sorted(code(p) for p in parts if not m.matches(p, m.Name(k)))
        if not _walk_alone(an, definitions, pointers | {acc.tensor}, offsets, vector, k):
            return False
        for factor in scale:  # the step the address takes is the mask's times the columns' scale
            if factor not in rest:
                break
            rest.remove(factor)
        else:
            found, _ = _left_of_row(an, acc, loop, k, vector, rest)
            if found is not None:
                an.row_bounds.append((acc.tensor, found, stride, acc.where))
                return True
    return False


def _left_of_row(an: _Analyzer, acc: Access, loop: cst.For, k: str, vector: str, rest: list[str],
                 down: cst.BaseExpression | None = None, beside: bool = False
                 ) -> tuple[tuple[tuple[bool, tuple[str, ...]], ...] | None, str | None]:
    """A conjunct of the access's mask that bounds the columns ``vector`` by what is left of the row on step ``k`` of
    ``loop``: ``vector[None, :] < X - k * F`` (``F`` the factors ``rest``; also through a local bound once in the loop
    before the access, ``k_remaining = K - k * BLOCK_K``, of names the loop does not bind), or, with ``beside`` (the
    vector advanced with the pointer, :func:`_advanced_beside`), ``vector[None, :] < X``. The mask itself may be such
    a local too (``masks_k = offsets_k < K``, then ``mask=masks_am[:, None] & masks_k[None, :]``). ``(X's terms as
    (subtracted, factors), None)`` when ``X`` is a sum of products of int literals and parameters the kernel leaves as
    passed, which each call compares with the row (``KernelAnalysis.row_bounds``); ``(None, X in source)`` when such a
    conjunct bounds them by anything else; ``(None, None)`` when none does."""

    def in_loop(ref: StmtRef) -> bool:
        """``ref`` runs on every iteration before the access: in the loop, in a block that holds the access."""
        where = an.where(ref.node)
        return ref.node is not loop and _contains(an, loop, where) and bool(ref.blocks) and _contains(
            an, ref.blocks[-1], acc.where) and (where.line, where.column) < (acc.where.line, acc.where.column)

    def bound_terms(node: cst.BaseExpression, depth: int = 0) -> list[tuple[cst.BaseExpression, bool]]:
        out = []
        for term, negative in _terms(node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node):
            defs = an.assignments.get(term.value, []) if isinstance(term, cst.Name) else []
            # a local bound before the loop holds the value of another step (`j = 0; left = D - j * BLOCK_D`)
            if depth < 8 and len(defs) == 1 and term.value not in an.params and term.value not in an.rebound \
                    and in_loop(defs[0][0]):
                out += [(t, n != negative) for t, n in bound_terms(defs[0][1], depth + 1)]
            else:
                out.append((term, negative))
        return out

    def varies(term: cst.BaseExpression) -> bool:
        """``term`` reads a name other than ``k`` that the loop binds: it may change from one step to the next."""
        return any(b != an.where(loop) and _contains(an, loop, b) for n in names_in(term) - {k}
                   for b, _ in an.bindings.get(n, []))

    def per_step(term: cst.BaseExpression) -> bool:
        parts, todo = [], [term]
        while todo:
            node = todo.pop()
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
                todo += [node.left, node.right]
            else:
                parts.append(code(node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node))
        return k in parts and sorted(p for p in parts if p != k) == rest and parts.count(k) == 1

    column = _as_column(vector)
    scalars = set(an.params) | {k}  # the step's number is one value on a step, as a parameter is
    conjuncts, todo = [], _conjuncts(acc.mask, scalars) if acc.mask is not None else []
    while todo and len(conjuncts) < 64:
        # a mask local bound once in the loop before the access holds, at the access, the value of this step
        node, wrap = _bare(todo.pop()), None
        if m.matches(node, m.Subscript(value=m.Name(), slice=_AS_COLUMNS)):
            node, wrap = node.value, node.slice
        defs = an.assignments.get(node.value, []) if isinstance(node, cst.Name) else []
        if len(defs) == 1 and len(an.bindings.get(node.value, ())) == 1 and node.value not in an.rebound \
                and node.value not in an.params and in_loop(defs[0][0]):
            for part in _conjuncts(code(defs[0][1]), scalars):
                todo.append(part if wrap is None else _broadcast_inside(cst.Subscript(
                    value=part.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]), slice=wrap), scalars))
        else:
            conjuncts.append(node if wrap is None else cst.Subscript(value=node, slice=wrap))
    def launch_factors(term: cst.BaseExpression, negative: bool) -> tuple[bool, tuple[str, ...]] | None:
        """A term of ``X`` as (subtracted, its factors), each an int literal or a parameter the kernel leaves as
        passed, which the launch reads; ``None`` for anything else."""
        parts, todo = [], [term]
        while todo:
            node = todo.pop()
            if getattr(node, "lpar", None):
                todo.append(node.with_changes(lpar=[], rpar=[]))
            elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
                todo += [node.left, node.right]
            elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
                negative = not negative
                todo.append(node.expression)
            elif isinstance(node, cst.Integer) or _passed(an, node):
                parts.append(code(node))
            elif (alias := an.param_alias(node)) is not None:
                parts.append(alias)  # `K = ks2`: the launch reads the argument it holds
            else:
                return None
        return negative, tuple(sorted(parts))

    unread = None
    for node in conjuncts:
        if not (isinstance(node, cst.Comparison) and len(node.comparisons) == 1
                and isinstance(node.comparisons[0].operator, cst.LessThan)):
            continue
        left, moved = _bare(node.left), []
        if isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Add):
            # `offs_k[None, :] + k * BLOCK_K < K`: the columns below `K - k * BLOCK_K`
            for mine, other in ((left.left, left.right), (left.right, left.left)):
                if m.matches(_bare(mine), column) and per_step(_bare(other)):
                    left, moved = _bare(mine), [(_bare(other), True)]
        if m.matches(left, column) and down is not None and not moved:
            # a loop counting down from X by F: `k` itself is what is left of the row (`rk[None, :] < k`)
            terms = bound_terms(node.comparisons[0].comparator)
            if len(terms) == 1 and not terms[0][1] and m.matches(_bare(terms[0][0]), m.Name(k)):
                read = [launch_factors(t, negative) for t, negative in _terms(_bare(down))]
                if None not in read:
                    return tuple(read), None  # type: ignore[arg-type]
                unread = code(down)
                continue
        if m.matches(left, column) and beside and not moved:
            # the vector moves with the pointer: compared with X itself on each step, it bounds what is left of the row
            terms = bound_terms(node.comparisons[0].comparator)
            if not any(k in names_in(t) for t, _ in terms) and not any(varies(t) for t, _ in terms):
                read = [launch_factors(t, negative) for t, negative in terms]
                if terms and None not in read:
                    return tuple(read), None  # type: ignore[arg-type]
                unread = " + ".join(code(t) for t, _ in terms) or "0"
            continue
        if m.matches(left, column):
            terms = moved + bound_terms(node.comparisons[0].comparator)
            if sum(1 for t, negative in terms if negative and per_step(t)) == 1 and not any(
                    k in names_in(t) for t, negative in terms if not (negative and per_step(t))) and not any(
                    varies(t) for t, _ in terms):
                # the mask bounds the columns by X, which the launch compares with the row: `D + BLOCK_D` reads the
                # next row
                bound = [(t, negative) for t, negative in terms if not (negative and per_step(t))]
                read = [launch_factors(t, negative) for t, negative in bound]
                if bound and None not in read:
                    return tuple(read), None  # type: ignore[arg-type]
                unread = " + ".join(code(t) for t, _ in bound) or "0"
    return None, unread


def _bare(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` without its own parentheses."""
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def _column_term(an: _Analyzer, term: cst.BaseExpression, offsets: str | None) -> tuple[str | None, str | None]:
    """A term of an address that scales a column vector: (the vector, the stride parameter) when its factors are
    exactly ``vector[...]`` and a parameter (``cols[None, :] * stride_xd``); (the vector, ``None``) when it has other
    factors too (``cols[None, :] * stride_xd * 2``); (``None``, ``None``) when no factor is a column vector."""
    parts = _product_factors(term)
    vectors = [p for p in parts if isinstance(p, cst.Subscript) and isinstance(p.value, cst.Name)
               and p.value.value != offsets]
    if not vectors:
        return None, None
    strides = [p for p in parts if isinstance(p, cst.Name) and p.value in an.params]
    if len(parts) == 2 and len(vectors) == 1 and len(strides) == 1:
        return vectors[0].value.value, strides[0].value
    return vectors[0].value.value, None


def _step_of(value: cst.BaseExpression, name: str) -> cst.BaseExpression | None:
    """``name + d`` / ``d + name`` / ``name - d`` -> ``d``; anything else -> ``None`` (an unknown move)."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract)):
        if m.matches(value.left, m.Name(name)) and name not in names_in(value.right):
            return value.right
        if isinstance(value.operator, cst.Add) and m.matches(value.right, m.Name(name)) \
                and name not in names_in(value.left):
            return value.left
    return None


def _judge_step(an: _Analyzer, acc: Access, tile: Tile, name: str, step: cst.BaseExpression | None,
                rows: set[str] | None, at: Where) -> None:
    hint = ("advance the pointer only along the other dimensions, by their stride (`a_ptrs += BLOCK_K * "
            "stride_ak`), and compute the rows of each tile afresh (`offs = start + tl.arange(0, BLOCK)`, "
            "`ptrs = base + offs[:, None] * stride + ...`) inside the loop")
    what = f"`{name}` is advanced at line {at.line}"
    if step is None:
        raise _refuse(acc, f"{what} by an expression TileLink cannot follow, so the rows of {acc.tensor!r} the "
                           f"{acc.kind} at line {acc.where.line} touches are unknown", hint)
    moved = names_in(step)
    if tile.offsets is None and not tile.dynamic:
        # the rows were named by tile=, not read from an offsets vector scaled by a stride: nothing tells which
        # dimension the advance moves along, so it may move the rows the tile names
        raise _refuse(acc, f"{what} in place (by `{code(step)}`), and the rows of {acc.tensor!r} are named by "
                           f"tile=({tile.start!r}, {tile.size!r}): with tile= TileLink does not read the rows from "
                           f"the pointer's offsets, so it cannot tell that the advance leaves them where the tile "
                           f"says",
                      f"leave tile= out: TileLink reads the rows from the offsets the pointer is made of and follows "
                      f"`{name}` along the other dimensions; keep tile= only with pointers computed afresh in the "
                      f"loop (`ptrs = base + offs[:, None] * stride + ...`)")
    if rows is not None and moved & rows:
        raise _refuse(acc, f"{what} by `{code(step)}`, along the rows of {acc.tensor!r}: the rows the {acc.kind} at "
                           f"line {acc.where.line} touches move with it, which TileLink does not follow", hint)
    if rows is None or tile.ndim == 1 or not (moved & (set(an.params) - set(an.constexpr))):
        raise _refuse(acc, f"{what} by `{code(step)}`, which TileLink cannot place on a dimension other than the "
                           f"rows of {acc.tensor!r} (it needs the rows scaled by a stride parameter and the step "
                           f"by another one)", hint)


def _expression(text: str, what: str, an: _Analyzer, at: Where) -> cst.BaseExpression:
    try:
        return cst.parse_expression(text)
    except (cst.ParserSyntaxError, SyntaxError) as exc:
        message = getattr(exc, "message", str(exc)).splitlines()[0]
        hint = "write a source expression of the kernel's parameters and variables, e.g. \"pid_m * BLOCK_M\""
        raise AnnotationError(f"{what} `{text}` is not a Python expression ({message})", file=at.file,
                              line=at.line, column=at.column, hint=hint) from None


def _check_size(an: _Analyzer, tensor: str, size: str | None, at: Where) -> None:
    """``size=`` is evaluated where the launcher reads the kernel's arguments: only parameters may appear in it."""
    if size is None:
        return
    unknown = sorted(names_in(_expression(size, "size=", an, at)) - set(an.params))
    if unknown:
        raise AnnotationError(
            f"size={size!r} for {tensor!r} names {', '.join(unknown)}, which "
            f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'} of {an.fn.name.value!r}: the "
            f"full size is read from the launch's arguments", file=at.file, line=at.line, column=at.column,
            hint=f"write the size from parameters ({', '.join(p for p in an.params if p not in an.constexpr)}), "
                 f"e.g. size=\"M\"")


def _renamed(source: str, names: dict[str, str]) -> str:
    """``source`` with its names renamed by ``names`` (attributes and keywords as written)."""
    class _T(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
            return updated.with_changes(value=names.get(updated.value, updated.value))

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
            return updated.with_changes(attr=original.attr)

    return code(cst.parse_expression(source).visit(_T()))


def _check_tile_names(an: _Analyzer, tensor: str, override: tuple[str, str], at: Where) -> None:
    """``tile=(start, size)`` must be expressions of names the kernel has."""
    known = set(an.params) | set(an.bindings) | {"tl", "triton"}
    for text, what in zip(override, ("start", "size"), strict=True):
        unknown = sorted(names_in(_expression(text, f"tile= {what}", an, at)) - known)
        if unknown:
            raise AnnotationError(
                f"tile= {what} `{text}` for {tensor!r} names {', '.join(unknown)}, which the kernel neither takes "
                f"nor assigns", file=at.file, line=at.line, column=at.column,
                hint="name the kernel's own variables, e.g. tile=(\"pid_m * BLOCK_M\", \"BLOCK_M\")")


def _check_tile_agrees(an: _Analyzer, acc: Access, dim: int, pointers: set[str], override: tuple[str, str],
                       size_param: str | None) -> Tile | None:
    """Where the rows of the access can be read from its offsets, ``tile=`` must name the same rows: a tile that
    moves with another dimension (``pid_n * BLOCK_N`` on a row gather) would wait for the wrong channels; the tile
    read from them is returned. Elsewhere the rows the access may read are bounded and must lie in the tile
    (:mod:`tilelink.tile_rows`), and ``None`` is returned."""
    try:
        inferred = an.tile(acc, dim, pointers, None, size_param)
    except AnnotationError:
        inferred = None  # a descriptor made over a tile's rows (`x_ptr + lo * stride`), which tile= names
    if inferred is None or inferred.dynamic:
        # the rows are not one offsets vector to compare with: bound them, and refuse what may leave the tile
        from tilelink.tile_rows import check_tile_covers

        signs, multiples = check_tile_covers(an, acc, dim, pointers, override, size_param)
        an.row_signs.extend((name, acc.where) for name in signs)
        an.row_multiples.extend((factors, divisor, acc.where) for factors, divisor in multiples)
        return None
    given = tuple(code(cst.parse_expression(x)) for x in override)
    found = (code(cst.parse_expression(inferred.start)), code(cst.parse_expression(inferred.size)))
    if given != found:
        # a descriptor read from 0 along `dim` (`desc_k.load([offsetk_y, 0])` with dim=1 over the attention tutorial's
        # flat 2-D rows) does not move along it: the blocks move along another dimension, the one to gather
        fixed = acc.descriptor and found[0] == "0"
        raise _refuse(acc, f"tile=({given[0]!r}, {given[1]!r}) does not name the rows this {acc.kind} of "
                           f"{acc.tensor!r} touches along dim {dim}: its offsets give rows [{found[0]}, {found[0]} + "
                           f"{found[1]})" + (f", the same for every block: it does not move along dim {dim}"
                                             if fixed else ""),
                      ("annotate the dimension its offsets move along (dim=0 for the rows of a 2-D descriptor over "
                       "a flat (Z * H * N_CTX, HEAD_DIM) matrix, each rank passing a run of its rows); to gather the "
                       "sequence of every head, read it through pointers and annotate dim 1 of the (Z * H, N_CTX, "
                       "HEAD_DIM) view" if fixed else
                       f"drop tile= (these rows are found without it), or make it tile=({found[0]!r}, {found[1]!r})"))
    return inferred


def _made_shape(an: _Analyzer, acc: Access) -> cst.List | cst.Tuple | None:
    """The ``shape=`` of the one descriptor the kernel makes over the whole annotated tensor that ``acc`` reads
    (``desc_k = tl.make_tensor_descriptor(desc_k, shape=[y_dim, HEAD_DIM], ...)``, or a helper taking the same
    arguments); ``None`` for any other access."""
    if not acc.descriptor:
        return None
    defs = an.assignments.get(acc.pointer, [])
    if len({code(v) for _, v in defs}) != 1 or not isinstance(make := defs[0][1], cst.Call):
        return None
    base = _arg(make, 0, "base")
    if not (isinstance(base, cst.Name) and base.value == acc.tensor):
        return None  # made over a part of the tensor (`x_ptr + lo * stride`): its shape is that part's
    shape = _arg(make, 1, "shape")
    return shape if isinstance(shape, (cst.List, cst.Tuple)) else None


def _check_descriptor_dims(an: _Analyzer, acc: Access, dim: int) -> None:
    """An annotation's ``dim`` past the dims of the descriptor the kernel reads the tensor through (``dim=2`` of the
    attention tutorial's flat ``(Z * H * N_CTX, HEAD_DIM)`` descriptors) names no rows of it."""
    shape = _made_shape(an, acc)
    if shape is None or dim < len(shape.elements):
        return
    written = ", ".join(code(e.value) for e in shape.elements)
    raise _refuse(acc, f"{acc.tensor!r} is gathered along dim {dim}, but the kernel reads it through the descriptor "
                       f"`{acc.pointer}`, made with {len(shape.elements)} dims (shape=[{written}]): it has no dim "
                       f"{dim}",
                  "gather the descriptor's rows with dim=0 (each rank passes a run of its rows), or make the "
                  "descriptor with a dim for each dim of the tensor, the gathered one among them")


def _check_descriptor_size(an: _Analyzer, acc: Access, dim: int, size: str | None) -> None:
    """A descriptor the kernel makes (``tl.make_tensor_descriptor(desc_k, shape=[y_dim, HEAD_DIM], ...)``) may be read
    at any row of its ``shape=``, and the gathered buffer holds ``size=`` rows: a ``size=`` other than the rows of the
    shape would let a block read rows past what was gathered (the attention tutorial's descriptors span every head,
    ``Z * H * N_CTX`` rows, not ``N_CTX``)."""
    shape = _made_shape(an, acc) if size is not None else None
    if shape is None or dim >= len(shape.elements):
        return
    written = shape.elements[dim].value
    rows = an._launch_size(written)
    if rows is None:
        return
    given, spanned = cst.parse_expression(size), cst.parse_expression(rows)
    same = _poly(given) == _poly(spanned) if _poly(given) is not None and _poly(spanned) is not None else \
        code(given) == code(spanned)
    if same:
        return
    local = f" (`{code(written)}` is `{rows}`)" if code(written) != rows else ""
    raise _refuse(acc, f"size={size!r} for {acc.tensor!r} is not the rows the descriptor `{acc.pointer}` spans along "
                       f"dim {dim}: it is made with shape=[{', '.join(code(e.value) for e in shape.elements)}]{local}, "
                       f"and its blocks may {'read' if acc.kind == 'load' else 'write'} any of those {rows} rows, "
                       f"but only {size} rows are {'gathered' if acc.kind == 'load' else 'reduced'}; the blocks past "
                       f"them would {'read past the gathered' if acc.kind == 'load' else 'write past the reduced'} "
                       f"buffer",
                  f"leave size= out: TileLink reads the rows from the descriptor's shape= ({rows}), and each rank "
                  f"passes its run of those rows")


def _host_descriptor(an: _Analyzer, tensor: str, descriptors: set[str]) -> bool:
    """Whether the annotated parameter is a tensor descriptor made on the host (``TensorDescriptor``): the
    kernel calls its ``load`` / ``store`` and never binds it. One bound to something other than its own
    ``tl.make_tensor_descriptor`` is refused (TileLink could not tell what it describes)."""
    if tensor in descriptors:
        return False
    calls = an.findall(an.fn.body, m.Call(func=m.Attribute(value=m.Name(tensor),
                                                           attr=m.Name("load") | m.Name("store"))))
    if not calls:
        return False
    if tensor in an.assignments or tensor in an.rebound:
        at = an.where(calls[0])
        raise AnnotationError(
            f"{tensor!r} is used as a tensor descriptor and bound again in the kernel: TileLink replaces the tensor "
            f"behind an annotated descriptor by its gathered or reduced buffer, and cannot tell what this one "
            f"describes", file=at.file, line=at.line, column=at.column,
            hint=f"pass the host `TensorDescriptor` and use it as it is, or make the descriptor in the kernel from "
                 f"the pointer, once: `{tensor} = tl.make_tensor_descriptor({tensor}, shape=[M, K], "
                 f"strides=[stride_m, 1], block_shape=[BLOCK_M, BLOCK_K])`")
    return True


def _without_dtypes(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` with each ``x.dtype`` read (``acc.to(c_ptr.dtype.element_ty)``: a type, not memory) made ``0``."""
    class _T(cst.CSTTransformer):
        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
            return cst.Integer("0") if original.attr.value == "dtype" else updated

    return node.visit(_T())  # type: ignore[return-value]


def _check_only_read(an: _Analyzer, tensor: str, pointers: set[str], descriptors: set[str], rule: str) -> None:
    """Refuse a store to ``tensor`` (or an atomic add) under ``rule``, which passes another buffer in its place (the
    gathered rows): the caller's tensor would not be written. Said before the address is read, since whatever the
    address's form, the store is what must change."""
    a = next((a for a in an.accesses(tensor, pointers, descriptors) if a.kind == "store"), None)
    if a is None:
        return
    raise AnnotationError(
        f"kernel {an.fn.name.value!r} {'adds to' if a.atomic else 'stores to'} {a.tensor!r}"
        f"{' with tl.atomic_add' if a.atomic else ''}, which {rule} replaces by the gathered buffer that the "
        f"peers read this rank's rows from: the caller's tensor would not be written",
        file=a.where.file, line=a.where.line, column=a.where.column,
        hint="write the kernel's output to another parameter; the gathered tensor is read-only in the kernel")


def _check_pointer_table(an: _Analyzer, tensor: str, pointers: set[str]) -> None:
    """Refuse a tensor the kernel reads pointers from (the grouped-GEMM tutorial's `a_ptr = tl.load(group_a_ptrs +
    g).to(tl.pointer_type(tl.float16))`): its elements are addresses of other tensors, whose rows TileLink cannot
    follow; said before anything about its rows, which would speak of the table's."""
    to_pointer = m.Arg(value=m.Call(func=m.Attribute(attr=m.Name("pointer_type"))))
    load = m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("load")))
    for call in an.findall(an.fn.body, m.Call(func=m.Attribute(attr=m.Name("to")), args=[to_pointer, m.ZeroOrMore()])
                           | m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("cast")),
                                    args=[m.Arg(), to_pointer, m.ZeroOrMore()])):
        # the value converted: `x.to(...)`, `tl.cast(x, ...)`; a load, or a name bound to one (`p = tl.load(tab + g)`)
        value = _bare(call.func.value if m.matches(call.func, m.Attribute(attr=m.Name("to")))  # type: ignore
                      else call.args[0].value)
        if isinstance(value, cst.Name):
            values = [v for _, v in an.assignments.get(value.value, [])]
            value = _bare(values[0]) if len(values) == 1 else value
        address = _arg(value, 0, "pointer") if m.matches(value, load) else None
        if address is None or not names_in(address) & (pointers | {tensor}):
            continue
        at = an.where(call)
        raise AnnotationError(
            f"kernel {an.fn.name.value!r} reads pointers from {tensor!r} (`{code(call)}`): its elements are addresses "
            f"of other tensors, whose rows TileLink cannot follow through memory", file=at.file, line=at.line,
            column=at.column,
            hint="annotate a kernel that takes the tensor itself as a parameter (one problem of the group a launch), "
                 "so that its loads or stores address it directly")


def _check_other_uses(an: _Analyzer, tensor: str, pointers: set[str], descriptors: set[str]) -> None:
    """Every use of the annotated tensor is one TileLink sees: a ``tl.load`` / ``tl.store`` through a pointer, a
    descriptor's ``load`` / ``store``, a descriptor made by ``tl.make_tensor_descriptor``, or pointer arithmetic.
    The tensor (or a pointer or descriptor made from it) handed to a ``@triton.jit`` helper, an atomic or any
    other call would be read or written without a wait or a notify: refused."""
    seen_ok = {"load", "store", "make_tensor_descriptor", "multiple_of", "max_contiguous", "cast", "where",
               "broadcast_to", "expand_dims", "reshape", "view"}
    aliases = pointers | descriptors
    # an atomic_add whose old values the kernel does not use (a statement of its own) only writes
    atomic_statements = {e.value for e in an.findall(an.fn.body, m.Expr(value=m.Call()))}
    for call in an.findall(an.fn.body, m.Call()):
        func = call.func
        name = code(func)
        is_tl = isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "tl"
        if is_tl and func.attr.value in seen_ok:  # type: ignore[union-attr]
            continue
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in descriptors \
                and func.attr.value in ("load", "store"):
            continue
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in pointers \
                and func.attr.value in ("load", "store"):
            # a descriptor under a name of its own (`d = a_desc`): its accesses would not be followed
            at = an.where(call)
            raise AnnotationError(
                f"`{name}` at line {at.line} reads or writes through `{func.value.value}` (from the annotated "
                f"{tensor!r}), which TileLink does not follow as a descriptor: it could neither wait before this "
                f"read nor notify after this write", file=at.file, line=at.line, column=at.column,
                hint=f"call the method on the descriptor by its own name (`{tensor}.{func.attr.value}(...)`), or "
                     f"make the descriptor with tl.make_tensor_descriptor")
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in aliases \
                and func.attr.value != "to":  # `desc.atomic_add(...)`, `desc.gather(...)`: an access not followed
            at = an.where(call)
            raise AnnotationError(
                f"the descriptor `{func.value.value}` (from the annotated {tensor!r}) is used by `{name}` at line "
                f"{at.line}: TileLink follows a descriptor's `.load` and `.store` only", file=at.file, line=at.line,
                column=at.column, hint="read with `.load([offsets])` and write with `.store([offsets], value)`")
        if isinstance(func, cst.Attribute) and func.attr.value == "to":
            continue
        if isinstance(func, cst.Attribute) and (
                through := names_outside_loads(_without_dtypes(func.value)) & aliases):
            # a method of something holding an alias (`descs[1].load(...)`, `(d if c else e).store(...)`): an access
            # on no name the analysis follows
            at = an.where(call)
            raise AnnotationError(
                f"{', '.join(sorted(through))} (from the annotated {tensor!r}) is used by `{code(call)}` at line "
                f"{at.line}: TileLink follows the `.load` / `.store` of a descriptor called by its own name only, and "
                f"could neither wait before this read nor notify after this write", file=at.file, line=at.line,
                column=at.column, hint="call the method on the descriptor by its own name (`desc.load([offsets])`), "
                                       "not through a tuple or an expression")
        if m.matches(func, m.Name("isinstance")):
            continue  # a type test (`isinstance(desc, tl.tensor_descriptor)`, Triton's own helpers) reads nothing
        if is_tl and func.attr.value == "atomic_add" and call in atomic_statements and not any(
                names_outside_loads(_without_dtypes(arg.value)) & aliases for arg in call.args[1:]):
            continue  # an access (a store that adds: a split-K write-back), which the rule judges
        used = set()
        for arg in call.args:
            used |= names_outside_loads(_without_dtypes(arg.value)) & aliases
        if not used:
            continue
        at = an.where(call)
        what = f"the atomic `{name}`" if name.startswith("tl.atomic") else f"`{name}`"
        raise AnnotationError(
            f"{', '.join(sorted(used))} (from the annotated {tensor!r}) is passed to {what} at line {at.line}: "
            f"TileLink does not see the reads or writes made there, so it could neither wait before a read nor "
            f"notify after a write",
            file=at.file, line=at.line, column=at.column,
            hint="store the result with `tl.store`; a split-K write-back into a reduce_scatter tensor may add with "
                 "`tl.atomic_add(ptrs, value, mask=...)` as a statement of its own (its old values unused)"
            if name.startswith("tl.atomic") else
            # block pointers are gone from newer Triton (its interpreter refuses them): their successor, which TileLink
            # follows
            f"make the block a tensor descriptor, `desc = tl.make_tensor_descriptor({tensor}, shape=[...], "
            f"strides=[...], block_shape=[...])` read with `desc.load([row_offset, col_offset])` and written with "
            f"`desc.store([...], value)` (the offsets moving through those lists instead of `tl.advance`), or make "
            f"pointers by arithmetic (`ptrs = base + offs[:, None] * stride + ...`)"
            if name in ("tl.make_block_ptr", "tl.advance") else
            f"make pointers by arithmetic (`ptrs = base + offs[:, None] * stride + ...`), not with `{name}`"
            if is_tl else
            "make that access a `tl.load` / `tl.store` (or a descriptor's `.load` / `.store`) in the annotated "
            "kernel itself: inline the helper's accesses, keep the rest of the helper")


def _sweeps(an: _Analyzer, anchor: cst.CSTNode, chain, acc: Access, tile: Tile) -> bool:
    """Whether ``anchor`` is a ``for`` loop whose body holds the access as a statement of its own (a
    store at the start of its line) that writes the same rows on every iteration: the loop binds neither
    the tile's offsets nor a name of its start, nor any name the store's address depends on other than
    through its column terms (``cols[None, :]``; a descriptor store: other than its column offsets)."""
    if not isinstance(anchor, cst.For) or chain.blocks[-1] is not anchor.body:
        return False
    if an.where(chain.node) != acc.where or not _own_statement(an, chain.node, acc):
        return False
    # every name the loop binds (its target included): one with a binding inside the loop's span
    bound = {name for name, spans in an.bindings.items() if any(_contains(an, anchor, at) for at, _ in spans)}
    rows = names_in(cst.parse_expression(tile.start)) | ({tile.offsets} if tile.offsets else set())
    if rows & bound:
        return False
    if acc.descriptor:  # the descriptor and its row offset stay; its column offsets may move
        if acc.offsets is None or acc.pointer in bound:
            return False
        offsets = cst.parse_expression(acc.offsets)
        if not isinstance(offsets, (cst.List, cst.Tuple)) or not offsets.elements:
            return False
        made = an.assignments.get(acc.pointer, [])
        box = _arg(made[0][1], 3, "block_shape") if len(made) == 1 and isinstance(made[0][1], cst.Call) else None
        width = code(box.elements[-1].value) if isinstance(box, (cst.List, cst.Tuple)) and box.elements else None
        return not (names_in(offsets.elements[0].value) & bound) and width is not None and not _exits(
            an, anchor) and _steady_in(an, anchor, names_in(offsets.elements[-1].value)) and _column_steps(
            anchor, offsets.elements[-1].value, width) is not None
    columns = _bounded_columns(an, acc)
    if not columns or _row_names(an, cst.parse_expression(acc.pointer), columns,
                                 flat=acc.where in an.row_programs) & bound:
        return False
    if not columns <= _address_reads(an, cst.parse_expression(acc.pointer), columns):
        # the mask bounds columns the address does not read (`base[None, :]` stored, `offs_n[None, :] < N` masked):
        # the count would move with them while the store writes the same columns on every step
        an.sweep_misses[acc.where] = (an.where(anchor), "columns")
        return False
    if _exits(an, anchor):
        # a step that leaves before its store stores nothing: the rows' counts would fall short
        an.sweep_misses[acc.where] = (an.where(anchor), "exits")
        return False
    if _sweep_steps(an, anchor, acc) is None:
        # the same rows on every iteration, but other columns on each is not shown: said where the store is refused,
        # with whether the loop moves the columns at all
        moved = any(_contains(an, anchor, at) for name in columns for at, _ in an.bindings.get(name, ()))
        an.sweep_misses[acc.where] = (an.where(anchor), "columns" if moved else "same")
        return False
    return True


def _sweep_steps(an: _Analyzer, loop: cst.For, acc: Access) -> tuple[int, int] | None:
    """The ``(k, d)`` of a pointer store's column tiles in a column sweep (:func:`_column_steps`): each iteration
    stores other columns; its column vector starts at ``(k * t + d) * WIDTH`` for the loop's own ``t``. Whether a
    step may leave the loop before the store (:func:`_exits`) is the caller's to check."""
    steps = None
    for name in _bounded_columns(an, acc):
        inside = [(ref, v) for ref, v in an.assignments.get(name, []) if _contains(an, loop, an.where(ref.node))]
        bound = [at for at, _ in an.bindings.get(name, ()) if _contains(an, loop, at)]
        # made once on each step, before the store, by a statement of the loop's own body: the store's columns are
        # that step's (one made after the store, or in a branch, leaves the store the columns of a step before)
        if len(inside) != 1 or len(bound) != 1 or inside[0][0].blocks[-1] is not loop.body or not (
                an.where(inside[0][0].node).line, an.where(inside[0][0].node).column) < (acc.where.line,
                                                                                       acc.where.column):
            return None
        parsed = _distinct_offsets(inside[0][1])
        # the start read as the loop's own step: nothing it reads bound again in the loop (`j = 0`, an inner loop's
        # target of the same name), the loop's target by the loop alone
        if parsed is None or not _steady_in(an, loop, names_in(cst.parse_expression(parsed[0]))):
            return None
        steps = _column_steps(loop, cst.parse_expression(parsed[0]), parsed[1])
        if steps is None:
            return None
    return steps


#: calls whose value is a scalar where their arguments are
_SCALAR_CALLS = {"program_id", "num_programs", "cdiv", "minimum", "maximum", "min", "max", "to", "cast",
                 "multiple_of"}


def _scalar_value(an: _Analyzer, node: cst.BaseExpression, depth: int = 0) -> bool:
    """Whether ``node`` is shown one value for every lane: literals, parameters, loop targets and program ids, with
    arithmetic and the calls of ``_SCALAR_CALLS``, through locals whose every value is so. Anything else (a helper's
    value, a load) may be a vector: a start of columns made so may repeat a column."""
    node = _bare(node)
    if depth > 8:
        return False
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.Name):
        if node.value in an.params:
            return node.value not in an.assignments and node.value not in an.rebound
        defs = an.assignments.get(node.value, [])
        targets = an.findall(an.fn.body, m.For(target=m.Name(node.value)))
        if len(an.bindings.get(node.value, ())) != len(defs) + len(targets):
            return False  # also bound by `+=`, `:=` or a `with`
        return all(_scalar_value(an, v, depth + 1) for _, v in defs) and all(
            m.matches(_bare(lp.iter), m.Call(func=m.Name("range") | m.Attribute(attr=m.Name("range")))) and all(
                _scalar_value(an, a.value, depth + 1) for a in lp.iter.args  # type: ignore[attr-defined]
                if a.keyword is None) for lp in targets)
    if isinstance(node, cst.BinaryOperation):
        return _scalar_value(an, node.left, depth + 1) and _scalar_value(an, node.right, depth + 1)
    if isinstance(node, cst.UnaryOperation):
        return _scalar_value(an, node.expression, depth + 1)
    if isinstance(node, cst.Call):
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
            else None
        if name not in _SCALAR_CALLS:
            return False
        if isinstance(func, cst.Attribute) and name in ("to",):
            return _scalar_value(an, func.value, depth + 1)
        if isinstance(func, cst.Attribute) and not m.matches(func.value, m.Name("tl")):
            return False
        return all(_scalar_value(an, a.value, depth + 1) or m.matches(a.value, m.Attribute(value=m.Name("tl")))
                   for a in node.args)
    return False


def _steady_in(an: _Analyzer, loop: cst.For, names: set[str]) -> bool:
    """Whether no name of ``names`` is bound inside ``loop`` but by the loop itself (its target)."""
    own = an.where(loop)
    return not any(_contains(an, loop, at) and at != own for n in names for at, _ in an.bindings.get(n, ()))


def _address_reads(an: _Analyzer, expr: cst.BaseExpression, names: set[str], depth: int = 0) -> set[str]:
    """The names of ``names`` the address ``expr`` reads: written in it, or through an alias bound once to a pure
    value (``c_ptrs = c_ptr + offs_m[:, None] * stride + offs_n[None, :]``)."""
    found = names_in(expr) & names
    for name in names_in(expr) - names:
        defs = an.assignments.get(name, [])
        if depth < 8 and len(defs) == 1 and name not in an.rebound and _pure(defs[0][1]):
            found |= _address_reads(an, defs[0][1], names, depth + 1)
    return found


def _exits(an: _Analyzer, loop: cst.For) -> bool:
    """Whether a step of ``loop`` may leave before its end: a `return`, or a `break` / `continue` of its own (not of
    a loop inside it)."""
    if an.findall(loop.body, m.Return()):
        return True
    inner = an.findall(loop.body, m.For() | m.While())
    return any(not any(_contains(an, lp, an.where(x)) for lp in inner)
               for x in an.findall(loop.body, m.Break() | m.Continue()))


def _distinct_offsets(value: cst.BaseExpression) -> tuple[str, str] | None:
    """``(start, size)`` of ``start + tl.arange(0, size)`` or ``tl.arange(0, size)`` (start 0), also widened or
    hinted, ``start`` with no `tl.arange` of its own: a vector whose lanes are distinct columns. Not one taken modulo
    a bound (`(off + tl.arange(0, W)) % N` wraps onto columns another lane or step holds)."""
    parsed = parse_offsets(_bare(value), wraps=False, alone=True)
    if parsed is None or m.findall(cst.parse_expression(parsed[0]), m.Call(func=m.Attribute(attr=m.Name("arange")))):
        return None
    return parsed


def _check_sweeps_disjoint(an: _Analyzer, accesses: list[Access]) -> None:
    """Several swept stores of the same rows in one loop must store other column tiles than each other too
    (``(2 * j) * W`` and ``(2 * j + 1) * W``): a column stored twice is counted twice, and its channel would
    complete before the rest of its columns are stored."""
    groups: dict = {}
    for acc in accesses:
        if acc.kind == "store" and acc.swept and not acc.descriptor and acc.tile is not None:
            groups.setdefault((acc.anchor, acc.tensor, acc.tile.start, acc.tile.offsets), []).append(acc)
    for (anchor, *_), group in groups.items():
        if len(group) < 2:
            continue
        loop = next(r.node for r in an.statements if isinstance(r.node, cst.For) and an.where(r.node) == anchor)
        steps = [_sweep_steps(an, loop, acc) for acc in group]
        ks = {st[0] for st in steps if st is not None}
        ds = [st[1] % st[0] for st in steps if st is not None]
        if None in steps or len(ks) != 1 or len(set(ds)) != len(ds):
            raise _refuse(group[1], f"the stores at lines {', '.join(str(a.where.line) for a in group)} write the "
                                    f"same rows in the loop at line {anchor.line}, and TileLink cannot tell that they "
                                    f"write other columns than each other",
                          "start each store's columns at `(K * t + d) * BLOCK_N` with the same K and another d "
                          "(`2 * t * BLOCK_N` and `(2 * t + 1) * BLOCK_N`)")


def _poly(node: cst.BaseExpression) -> dict[tuple[str, ...], int] | None:
    """``node`` as a polynomial over names with integer coefficients (``(2 * j + 1) * W`` -> {(j, W): 2, (W,): 1});
    ``None`` for anything but names, integers, ``+``, ``-`` and ``*``."""
    if isinstance(node, cst.Name):
        return {(node.value,): 1}
    if isinstance(node, cst.Integer):
        return {(): int(node.value)}
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _poly(node.expression)
        return None if inner is None else {k: -v for k, v in inner.items()}
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Subtract, cst.Multiply)):
        left, right = _poly(node.left), _poly(node.right)
        if left is None or right is None:
            return None
        out: dict[tuple[str, ...], int] = {}
        if isinstance(node.operator, cst.Multiply):
            for a, x in left.items():
                for b, y in right.items():
                    key = tuple(sorted(a + b))
                    out[key] = out.get(key, 0) + x * y
        else:
            sign = -1 if isinstance(node.operator, cst.Subtract) else 1
            out = dict(left)
            for b, y in right.items():
                out[b] = out.get(b, 0) + sign * y
        return {k: v for k, v in out.items() if v}
    return None


def _column_steps(loop: cst.For, start: cst.BaseExpression, width: str) -> tuple[int, int] | None:
    """``(k, d)`` when ``start`` is ``(k * t + d) * width`` for the target ``t`` of ``loop`` (a ``range`` of
    step 1), or ``t + d * width`` for a ``range(0, X, k * width)``, with ``k >= 1``: iteration ``t`` (the ``t``-th)
    stores column tile ``k * t + d``."""
    read = _range_args(loop)
    if not isinstance(loop.target, cst.Name) or read is None:
        return None
    t, w = loop.target.value, cst.parse_expression(width)
    poly = _poly(start)
    if poly is None or not isinstance(w, cst.Name):
        return None
    if not m.matches(read[2], m.Integer("1")):
        # `for off in range(0, N, k * W)`, the columns `off + d * W + tl.arange(0, W)` (the layer-norm tutorial's
        # sweep, k = 1): iteration i stores column tile k * i + d
        step, first = _poly(_bare(read[2])), _poly(_bare(read[0]))
        if step is None or set(step) != {(w.value,)} or first not in ({}, {(): 0}) or set(poly) - {(t,), (w.value,)} \
                or poly.get((t,)) != 1:
            return None
        k, d = step[(w.value,)], poly.get((w.value,), 0)
        return (k, d) if k >= 1 else None
    steps = {tuple(sorted((t, w.value))): 0, (w.value,): 0}
    if set(poly) - set(steps):
        return None
    k, d = poly.get(tuple(sorted((t, w.value))), 0), poly.get((w.value,), 0)
    return (k, d) if k >= 1 else None


def _bounded_columns(an: _Analyzer, acc: Access) -> set[str]:
    """The column vectors the store's mask bounds (``cols[None, :] < bound``): the store writes them only
    inside the row, so they may change from one iteration of a row sweep to the next."""
    if acc.mask is None:
        return set()
    if acc.where in an.row_programs:  # one row a program: its columns vector, which the mask bounds
        return {an.row_programs[acc.where][2]}
    defs = an.assignments.get(acc.mask, [])
    try:
        mask = defs[0][1] if len(defs) == 1 else cst.parse_expression(acc.mask)
    except cst.ParserSyntaxError:
        return set()
    comparisons = m.findall(mask, m.Comparison(comparisons=[m.ComparisonTarget(operator=m.LessThan())]))
    return {name for cmp in comparisons if (name := expanded(cmp.left, 1)) is not None}


#: calls a name's value may make and still be read as its expression (no side effect, no memory read)
_PURE_TL = {"arange", "program_id", "num_programs", "cdiv", "minimum", "maximum", "where", "full", "zeros",
            "zeros_like", "multiple_of", "max_contiguous", "broadcast_to", "expand_dims", "reshape", "abs", "cast"}


def _pure(expr: cst.BaseExpression) -> bool:
    for call in m.findall(expr, m.Call()):
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "to":
            continue
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "tl"
                and func.attr.value in _PURE_TL):
            return False
    return True


def _row_names(an: _Analyzer, expr: cst.BaseExpression, columns: set[str], depth: int = 0, flat: bool = False
               ) -> set[str]:
    """The names ``expr`` depends on other than through the bounded column terms ``cols[None, :]``
    (``columns``; with ``flat``, the columns of one row a program, ``cols`` itself), looking through names assigned
    once to a pure expression (a name assigned more than once, by ``+=``, or from a load, an atomic or any other call,
    stands for itself)."""
    found: set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Subscript(self, node: cst.Subscript) -> bool:
            # a bounded column term may change from one column tile to the next
            return expanded(node, 1) not in columns

        def visit_Name(self, node: cst.Name) -> None:
            if not (flat and node.value in columns):
                found.add(node.value)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)  # `tl.arange`: the module, not the attribute
            return False

    expr.visit(_V())
    out: set[str] = set()
    for name in found:
        defs = an.assignments.get(name, [])
        if len(defs) == 1 and name not in an.rebound and depth < 8 and _pure(defs[0][1]):
            out |= _row_names(an, defs[0][1], columns, depth + 1, flat)
        else:
            out.add(name)
    return out


def _targets(assign: cst.Assign) -> set[str]:
    return set().union(*(names_in(t.target) for t in assign.targets))


def _span(an: _Analyzer, node: cst.CSTNode) -> tuple[Where, Where]:
    """The first and last position of ``node``, as ``Where``s."""
    r = an.positions[node]
    return Where(an.file, r.start.line, r.start.column + 1), Where(an.file, r.end.line, r.end.column + 1)


def _contains(an: _Analyzer, node: cst.CSTNode, where: Where) -> bool:
    r = an.positions[node]
    return (r.start.line, r.start.column + 1) <= (where.line, where.column) <= (r.end.line, r.end.column + 1)


def _loads_written_out(an: _Analyzer, ref: StmtRef, value: cst.BaseExpression) -> cst.BaseExpression:
    """``value`` (bound by the statement ``ref``) with the address and mask of each ``tl.load`` in it that read a local
    bound more than once written out as the bindings that reach the load (torch Inductor's `idx_m`, `idx_n` and
    `xindex`, bound again for each operand of a K loop): the rules read each load's address as the values it has
    there."""
    def twice(arg: cst.Arg) -> bool:
        return any(n not in an.params and len(an.bindings.get(n, ())) > 1 for n in names_in(arg.value))

    matcher = m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("load")))
    calls = list(m.findall(value, matcher))
    # where each load is: the statement's own loads, in order (the value may have an offsets grid folded in, a node
    # the kernel does not hold)
    sites = [an.where(c) for node in [*small_statements(ref), *header_expressions(ref)]
             for c in an.findall(node, matcher)]
    swaps = {}
    for call, at in zip(calls, sites if len(sites) == len(calls) else [None] * len(calls), strict=True):
        # the address and the mask, as passed (`tl.load(A + (xindex), a_mask, ...)` or `mask=`)
        args = [i for i, a in enumerate(call.args) if not a.star and (
            (a.keyword is None and i < 2) or (a.keyword is not None and a.keyword.value in ("pointer", "mask")))]
        if at is None or not any(twice(call.args[i]) for i in args):
            continue
        new = list(call.args)
        for i in args:
            new[i] = call.args[i].with_changes(value=an.indices_written_out(call.args[i].value, at, set()))
        swaps[call] = call.with_changes(args=new)
    if not swaps:
        return value

    class _Swap(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            return swaps.get(original, updated)

    return value.visit(_Swap())


def _effects(an: _Analyzer) -> tuple[tuple[str, Where], ...]:
    """See ``KernelAnalysis.effects``."""
    out: list[tuple[str, Where]] = []
    for ref in an.statements:
        for small in small_statements(ref):
            if isinstance(small, cst.Expr):
                out.append((code(small.value), an.where(small)))
            elif isinstance(small, cst.AugAssign):
                out.append((code(small.value), an.where(small)))
            elif isinstance(small, cst.Return) and small.value is not None:
                out.append((code(small.value), an.where(small)))
        for header in header_expressions(ref):
            if isinstance(ref.node, cst.For) and isinstance(ref.node.target, cst.Name):
                # a loop's range with the name it binds, as `(name := range)`: what it reads goes into that name
                out.append((f"({ref.node.target.value} := {code(header)})", an.where(ref.node)))
            else:
                out.append((code(header), an.where(ref.node)))
    return tuple(out)


def _compile_time(node: cst.BaseExpression, names: set[str]) -> bool:
    """Whether Triton knows ``node`` at compile time: ``names`` (constexpr parameters and locals), literals, and
    comparisons, boolean and arithmetic operators of them (``ACTIVATION == "leaky_relu"``, ``not EVEN_K``)."""
    if isinstance(node, cst.Name):
        return node.value in names or node.value in ("True", "False", "None")
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.Comparison):
        return _compile_time(node.left, names) and all(_compile_time(c.comparator, names) for c in node.comparisons)
    if isinstance(node, (cst.BooleanOperation, cst.BinaryOperation)):
        return _compile_time(node.left, names) and _compile_time(node.right, names)
    if isinstance(node, cst.UnaryOperation):
        return _compile_time(node.expression, names)
    return False


def _compile_time_names(an: _Analyzer) -> set[str]:
    """The names Triton knows at compile time: the constexpr parameters, and the locals bound once as
    ``ACT: tl.constexpr = "relu"`` to a compile-time value."""
    names = set(an.constexpr)
    for node in an.findall(an.fn.body, m.AnnAssign(target=m.Name())):
        name = node.target.value
        if "constexpr" in code(node.annotation.annotation) and node.value is not None and \
                _compile_time(node.value, names) and len(an.bindings.get(name, ())) == 1:
            names.add(name)
    return names


def _static_test(an: _Analyzer, at: Where) -> str:
    """The test, in the kernel's parameters, that a launch compiles the statement at ``at``: the tests of the `if`
    sides around it that are decided at compile time, and-ed (a run-time `if` is compiled either way), with the
    constexpr locals replaced by their values; "" where no such side is around it."""
    names = _compile_time_names(an)
    tests = []
    for node in an.findall(an.fn.body, m.If()):
        if not _compile_time(node.test, names):
            continue
        if _contains(an, node.body, at):
            tests.append(f"({code(node.test)})")
        elif node.orelse is not None and _contains(an, node.orelse, at):
            tests.append(f"not ({code(node.test)})")
    if not tests:
        return ""
    expr = cst.parse_expression(" and ".join(tests))
    locals_ = {n: v for n, defs in an.assignments.items() if n in names and n not in an.params and len(defs) == 1
               for v in (defs[0][1],)}
    for _ in range(8):  # a local's value may name another local
        used = names_in(expr) & set(locals_)
        if not used:
            break
        expr = expr.visit(_Substitute({n: locals_[n] for n in used}))
    if not names_in(expr) - {"True", "False", "None"}:
        # literals alone (`EVEN_K: tl.constexpr = True`): every launch compiles it, or none does
        try:
            if eval(compile(code(expr), "<test>", "eval"), {"__builtins__": {}}) is True:  # noqa: S307
                return ""
        except Exception:  # noqa: BLE001 - not a literal test after all: said as written
            pass
    return code(expr)


class _Substitute(cst.CSTTransformer):
    """Each name of ``values`` replaced by its value, in parentheses."""

    def __init__(self, values: dict[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.values = values

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        value = self.values.get(updated.value)
        return updated if value is None else value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _branch_sides(an: _Analyzer) -> dict[Where, tuple[BranchSide, ...]]:
    """The `if` sides around each statement and in-place update of the kernel (see ``branch_sides``); an `elif`
    has the `else` side of the `if` before it around it."""
    names = _compile_time_names(an)
    sides: dict[Where, tuple[BranchSide, ...]] = {}
    around: list[BranchSide] = []

    class _V(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> bool:
            static, test, where = _compile_time(node.test, names), code(node.test), an.where(node)
            around.append(BranchSide(test, where, True, an.where(node.body.body[0]), static))
            node.body.visit(self)
            around.pop()
            if node.orelse is not None:
                first = an.where(node.orelse.body.body[0]) if isinstance(node.orelse, cst.Else) else None
                around.append(BranchSide(test, where, False, first, static))
                (node.orelse if isinstance(node.orelse, cst.If) else node.orelse.body).visit(self)
                around.pop()
            return False

        def on_visit(self, node: cst.CSTNode) -> bool:
            # a small statement too: one of a one-line suite (`if M > 0: acc = f(acc)`) is where it binds
            if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.BaseSmallStatement)):
                sides[an.where(node)] = tuple(around)
            return super().on_visit(node)

    an.fn.body.visit(_V())
    return sides


def _body_first(an: _Analyzer, fn: cst.FunctionDef) -> Where | None:
    """Where the kernel's first statement after its docstring starts (None: the body is only a docstring). A body
    on the ``def`` line (``def k(...): a = 1; b = 2``) starts at its first small statement."""
    body = list(fn.body.body)
    if body and fn.get_docstring(clean=False) is not None:
        body = body[1:]
    return an.where(body[0]) if body else None


def _returns(an: _Analyzer) -> tuple[tuple[Where, tuple[str, ...]], ...]:
    """Each ``return`` of the kernel and the tests of the branches and loops that hold it."""
    found: list[tuple[Where, tuple[str, ...]]] = []
    tests: list[str] = []

    class _V(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> None:
            tests.append(code(node.test))

        def leave_If(self, node: cst.If) -> None:
            tests.pop()

        def visit_While(self, node: cst.While) -> None:
            tests.append(code(node.test))

        def leave_While(self, node: cst.While) -> None:
            tests.pop()

        def visit_Return(self, node: cst.Return) -> None:
            found.append((an.where(node), tuple(tests)))

    an.fn.body.visit(_V())
    return tuple(found)


_POSITION_FUNCTIONS = ("program_id", "num_programs")


def _check_position_calls(an: _Analyzer, module: cst.Module, fn: cst.FunctionDef) -> None:
    """Refuse Triton's position functions used otherwise than called by their own name (`pf = tl.program_id` then
    `pf(0)`, `from triton.language import program_id as pf`): the tile order and split-K read the program's position
    where `tl.program_id(...)` is called, and would miss a read through another name."""
    def refuse(node: cst.CSTNode, said: str, function: str, hint: str) -> AnnotationError:
        at = an.where(node)
        return AnnotationError(f"{said}: TileLink reads the program's position where `tl.{function}(...)` is called, "
                               f"and cannot follow it through another name", file=at.file, line=at.line,
                               column=at.column, hint=hint)

    called = {id(c.func) for c in m.findall(fn.body, m.Call())}
    attrs = {id(a.attr) for a in m.findall(fn.body, m.Attribute())}  # the `program_id` of `tl.program_id`
    # the module's own names: an import of the function under its name, or any binding of that name at the top level
    # (a read in the kernel before its local is bound would find that one)
    module_names = {n for stmt in module.body if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef))
                    and not find_in(module, stmt, m.FunctionDef() | m.ClassDef())
                    for node in find_in(module, stmt, m.ImportAlias() | m.AssignTarget())
                    for n in names_in(node.asname.name if isinstance(node, cst.ImportAlias) and node.asname
                                      else node.name if isinstance(node, cst.ImportAlias) else node.target)}
    for ref in m.findall(fn.body, m.Attribute(attr=m.Name(value=m.MatchIfTrue(lambda v: v in _POSITION_FUNCTIONS)))
                         | m.Name(value=m.MatchIfTrue(lambda v: v in _POSITION_FUNCTIONS))):
        if isinstance(ref, cst.Name) and ref.value in an.bindings and ref.value not in module_names:
            # a local of that name holds a value (Liger's `program_id = tl.program_id(0).to(tl.int64)`); the function
            # bound to it uncalled (`program_id = tl.program_id`) is refused at that binding's value
            continue
        if id(ref) not in called and id(ref) not in attrs:
            function = code(ref).rpartition(".")[2]
            raise refuse(ref, f"`{code(ref)}` at line {an.where(ref).line} is used without being called", function,
                         f"call `tl.{function}(axis)` where the position is read")
    # a module-level name bound to the function (`PF = tl.program_id`) and read in the kernel
    for stmt in module.body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign) and m.matches(_bare(small.value), m.Attribute(attr=m.Name(
                    value=m.MatchIfTrue(lambda v: v in _POSITION_FUNCTIONS))) | m.Name(
                    value=m.MatchIfTrue(lambda v: v in _POSITION_FUNCTIONS))):
                read = sorted(names_in(small) & {n.value for n in m.findall(fn.body, m.Name())}
                              - {code(_bare(small.value)).rpartition(".")[2]} - set(an.bindings))
                if read:
                    function = code(_bare(small.value)).rpartition(".")[2]
                    raise refuse(small, f"`{code(small).strip()}` at the module's top level names "
                                        f"`{code(_bare(small.value))}` otherwise, and the kernel reads `{read[0]}`",
                                 function, f"call `tl.{function}(axis)` in the kernel where the position is read")
    for imp in find_in(module, module, m.ImportFrom()):
        for alias in imp.names if isinstance(imp.names, Sequence) else ():
            if code(alias.name) in _POSITION_FUNCTIONS and alias.asname is not None and m.findall(
                    fn.body, m.Name(code(alias.asname.name))):
                raise refuse(imp, f"`{code(imp)}` names `{code(alias.name)}` otherwise", code(alias.name),
                             f"import triton.language as tl and call `tl.{code(alias.name)}(axis)`")


def find_kernel(module: cst.Module, name: str) -> cst.FunctionDef | None:
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    return None


def analyse(module: cst.Module, file: str, kernel: str,
            tensors: dict[str, tuple[int, tuple[str, str] | None, str | None, str | None]],
            names_at: Callable[[int], dict[str, str]] | None = None,
            read_only: str | None = None) -> KernelAnalysis:
    """Analyse ``kernel`` of the parsed ``module`` (:func:`parse_source`) for the annotated ``tensors``.

    ``tensors`` maps each annotated parameter to ``(dim, tile override, size parameter, index
    parameter)``. Positions are those of ``module``'s nodes, so a rewrite of the same module object
    can find its anchors. ``read_only``: the rule whose tensors the kernel may only read (``all_gather``, which passes
    the gathered buffer in their place): a store to one is refused before anything else is read of it. Raises
    :class:`AnnotationError` (file, line, column, what to do) when the kernel cannot be used.
    """
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    fn = find_kernel(module, kernel)
    if fn is None:
        raise AnnotationError(f"no top-level function named {kernel!r}", file=file, line=None,
                              hint="@tilelink.overlap applies to top-level @triton.jit kernels")
    an = _Analyzer(module, wrapper, fn, file, tensors)
    types = frozenset(n for n, defs in an.assignments.items() if len(defs) == 1 and len(an.bindings.get(n, ())) == 1
                      and n not in an.params and m.matches(defs[0][1], _WIDE_INTS))
    with reading_int_types(types):
        return _analysed(an, module, file, kernel, fn, tensors, names_at, read_only)


def _analysed(an: _Analyzer, module: cst.Module, file: str, kernel: str, fn: cst.FunctionDef,
              tensors: dict[str, tuple[int, tuple[str, str] | None, str | None, str | None]],
              names_at: Callable[[int], dict[str, str]] | None, read_only: str | None) -> KernelAnalysis:
    fn_where = an.where(fn)
    overlap = next((d for d in fn.decorators if m.matches(
        d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator,
        m.Attribute(attr=m.Name("overlap")) | m.Name("overlap"))), None)
    where = an.where(overlap) if overlap is not None else fn_where
    if not any(is_triton_jit(d) for d in fn.decorators):
        raise AnnotationError(f"kernel {kernel!r} is not a @triton.jit function", file=file,
                              line=where.line, column=where.column,
                              hint="put @tilelink.overlap(...) directly above @triton.jit "
                                   "(and any @triton.autotune)")
    if overlap is not None:
        # a Triton wrapper above the overlapped kernel would launch it through Triton's own `run`, past every check
        # and handshake of TileLink's launch
        above = next((d for d in fn.decorators[:fn.decorators.index(overlap)] for w in ("heuristics", "autotune")
                      if _is_triton_wrapper(d, w) or (isinstance(d.decorator, cst.Name) and isinstance(
                          named := _bound_once(module, d.decorator.value), cst.Call)
                          and _is_triton_wrapper(d.with_changes(decorator=named), w))), None)
        if above is not None:
            at = an.where(above)
            raise AnnotationError(
                f"`@{code(above.decorator.func if isinstance(above.decorator, cst.Call) else above.decorator)}` is "
                f"above @tilelink.overlap on kernel {kernel!r}: it would wrap the overlapped kernel, which Triton's "
                f"wrappers cannot launch", file=file, line=at.line, column=at.column,
                hint="put @tilelink.overlap(...) above every Triton decorator: @tilelink.overlap, then "
                     "@triton.autotune / @triton.heuristics, then @triton.jit")
    warp_specialized = tuple(an.where(loop) for loop in m.findall(
        fn.body, m.Call(func=m.Attribute(value=m.Name("tl"), attr=m.Name("range")))) if (
        ws := _arg(loop, 99, "warp_specialize")) is not None and not m.matches(ws, m.Name("False")))  # type: ignore
    aliases: dict[str, tuple[str, ...]] = {}
    accesses: list[Access] = []
    row_scales: list[tuple[str, tuple[str, ...], Where]] = []
    row_shifts: list[tuple[str, tuple[tuple[bool, tuple[str, ...]], ...], Where]] = []
    row_steps: list[tuple[str, tuple[str, ...], str, Where]] = []
    for tensor, (dim, override, size_param, index) in tensors.items():
        if tensor not in an.params:
            raise AnnotationError(
                f"the annotation names {tensor!r}, which is not a parameter of {kernel!r} "
                f"(parameters: {', '.join(an.params)})", file=file, line=where.line, column=where.column,
                hint="name the pointer parameter the kernel loads from or stores to")
        if tensor in an.constexpr:
            raise AnnotationError(f"{tensor!r} is a tl.constexpr parameter, not a pointer", file=file,
                                  line=where.line, column=where.column,
                                  hint="annotate the pointer parameter of the tensor")
        pointers, descriptors = an.aliases(tensor)
        if _host_descriptor(an, tensor, descriptors):
            pointers.discard(tensor)
            descriptors.add(tensor)
        _check_pointer_table(an, tensor, pointers)
        if read_only is not None:
            _check_only_read(an, tensor, pointers, descriptors, read_only)
        _check_other_uses(an, tensor, pointers, descriptors)
        _check_size(an, tensor, size_param, where)
        if override is not None:
            _check_tile_names(an, tensor, override, where)
        aliases[tensor] = tuple(sorted(pointers))
        for acc in an.accesses(tensor, pointers, descriptors):
            # in a helper's copy that renamed the names tile= reads (its second call's `start_n_2`), those names
            renamed = names_at(acc.where.line) if names_at is not None and override is not None else {}
            named = tuple(_renamed(x, renamed) for x in override) if renamed else override
            _check_descriptor_dims(an, acc, dim)
            try:
                tile = an.tile(acc, dim, pointers, named, size_param, index)
            except AnnotationError as error:
                raise _with_row_program_hint(an, acc, error) from None
            if named is not None and index is None and tile is not None:
                inferred = _check_tile_agrees(an, acc, dim, pointers, named, size_param)
                if inferred is not None:
                    # tile= names the rows its offsets give: the access is the one TileLink reads without it, and its
                    # address is checked as that one's is (the rows' scale, the terms beside them), or a term such as
                    # `row * stride` beside the named rows would move the access off the rows its wait covers
                    tile = Tile(inferred.start, inferred.size, inferred.offsets, tile.size_param or inferred.size_param,
                                inferred.pid, inferred.defined_at, inferred.ndim, inferred.dynamic, inferred.wraps)
            _check_descriptor_size(an, acc, dim, size_param)
            try:
                accesses.append(_anchor(an, acc, tile, pointers))
            except AnnotationError as error:
                raise _with_row_program_hint(an, acc, error) from None
            scales, shifts, steps = _row_scales(an, accesses[-1], pointers)
            if acc.where in an.scalar_rows:
                scales = {*scales, ("1",)}  # one element a row: the launch checks the output's rows are that
            if acc.where in an.row_programs:
                # one row a program: the row stride parameter is a row of the gathered buffer, and the columns the
                # mask lets through lie in it
                stride, bound, _ = an.row_programs[acc.where]
                scales = {*scales, (stride,)}
                an.row_bounds.append((tensor, bound, "1", acc.where))
            row_scales.extend((tensor, scale, acc.where) for scale in sorted(scales))
            row_shifts.extend((tensor, terms, acc.where) for terms in shifts)
            row_steps.extend((tensor, factors, value, acc.where) for factors, value in sorted(steps))
            # a step's factors were read as moving forward: a negative one (`stride_xb` < 0) moves it back, before
            # the rows the launch bounds; each call checks them non-negative
            an.row_signs.extend((f, acc.where) for factors, _ in sorted(steps) for f in factors if not f.isdigit())
    _check_sweeps_disjoint(an, accesses)
    updates: dict[str, list[str]] = {}
    update_sites: dict[str, list[Where]] = {}
    for node in an.findall(fn.body, m.AugAssign(target=m.Name())):
        op = code(node.operator).rstrip("=").strip()
        updates.setdefault(node.target.value, []).append(f"{node.target.value} {op} ({code(node.value)})")
        update_sites.setdefault(node.target.value, []).append(an.where(node))
    _check_position_calls(an, module, fn)
    reserved = sorted((n, an.where(defs[0][0].node)) for n, defs in an.assignments.items() if n.startswith("tlk_"))
    if reserved:
        name, at = reserved[0]
        raise AnnotationError(f"kernel {kernel!r} assigns {name!r}: TileLink's inserted names start with tlk_",
                              file=at.file, line=at.line, column=at.column,
                              hint=f"rename {name!r} (the tlk_ prefix is reserved for the code TileLink inserts)")
    analysis = KernelAnalysis(kernel, file, an.params, an.constexpr, aliases,
                              tuple(sorted(accesses, key=lambda a: (a.where.line, a.where.column))),
                              fn_where,
                              {n: tuple(an.where(r.node) for r, _ in defs) for n, defs in an.assignments.items()},
                              {n: tuple(code(_loads_written_out(an, r, v)) for r, v in defs)
                               for n, defs in an.assignments.items()},
                              # a local annotated once (`BLOCK_K: tl.constexpr = 16`) is bound once, as assigned
                              frozenset(n for n in an.rebound if _bound_again(an, n)),
                              {n: tuple(b) for n, b in an.bindings.items()},
                              warp_specialized, {n: tuple(v) for n, v in updates.items()}, _returns(an),
                              tuple(row_scales), tuple(row_shifts), _effects(an), branch_sides=_branch_sides(an),
                              update_sites={n: tuple(w) for n, w in update_sites.items()},
                              row_signs=tuple(dict.fromkeys(an.row_signs)), row_steps=tuple(row_steps),
                              row_starts=tuple(dict.fromkeys(an.row_starts)),
                              row_bounds=tuple(dict.fromkeys(an.row_bounds)),
                              row_multiples=tuple(dict.fromkeys((factors, divisor, _static_test(an, at), at)
                                                                for factors, divisor, at in an.row_multiples)),
                              column_ends=tuple(dict.fromkeys((v, b, f, _static_test(an, at), at)
                                                              for v, b, f, at in an.column_ends)),
                              int_types=_INT_TYPES.get(),
                              helpers={**imported_helpers(module, file, is_triton_jit), **{
                                  f.name.value: code(f) for f in module.body if isinstance(f, cst.FunctionDef)
                                  and f.name.value != kernel and any(is_triton_jit(d) for d in f.decorators)}},
                              unpacked={an.where(ref.node): tuple(e.value.value for e in t.target.elements)
                                        for ref in an.statements for small in small_statements(ref)
                                        # keyed by the statement: one of several on its line is left out
                                        if isinstance(small, cst.Assign) and len(small_statements(ref)) == 1
                                        for t in small.targets
                                        if isinstance(t.target, (cst.Tuple, cst.List)) and all(
                                            isinstance(e.value, cst.Name) for e in t.target.elements)
                                        # each name bound to its element, as by an assignment of its own
                                        and not _elementwise(t.target, small.value)},
                              blocks={an.where(ref.node): _span(an, ref.blocks[-1]) for ref in an.statements
                                      if ref.blocks},
                              written_out=lambda source, at: launch_value(an, source, at),
                              launch_test=lambda at: _static_test(an, at),
                              while_loops=tuple((an.where(loop), _end(an, loop))
                                                for loop in an.findall(fn.body, m.While())),
                              body_first=_body_first(an, fn),
                              reaching_at_stores=_reaching_at_stores(an, accesses, aliases),
                              computed=_computed_params(an, fn, module),
                              row_program_misses=dict(an.row_program_misses),
                              sweep_misses=dict(an.sweep_misses),
                              row_columns={at: (columns, _terms_source(bound))
                                           for at, (_, bound, columns) in an.row_programs.items()
                                           if any(a.where == at and a.kind == "store" for a in accesses)})
    return analysis
