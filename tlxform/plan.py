"""The plain data passed from a rule to the code generator and the launcher, and the report.

A rule reads a :class:`~tilelink.analysis.KernelAnalysis` and returns a :class:`RewritePlan`: which
lines to insert where, which parameters to add, which partner kernels to emit, and the
:class:`LaunchPlan` the rule's launcher runs from. Every decision is also a :class:`ReportEntry`, so
nothing is silently left un-overlapped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from tilelink.analysis import Where
from tilelink.errors import PlanError
from tilelink.spec import ALL_REDUCE_MODES, MODES, ORDERS, VIA, Options, Spec


@dataclass(frozen=True)
class Insertion:
    """Source lines to insert before or after the statement that starts at ``anchor``."""

    anchor: Where
    position: str  # "before" | "after"
    lines: tuple[str, ...]


@dataclass(frozen=True)
class ReportEntry:
    """One line of the rewrite report."""

    kernel: str
    rule: str
    status: str  # "applied" | "not applied" | "note"
    message: str
    where: Where | None = None

    def __str__(self) -> str:
        at = f" ({self.where.file}:{self.where.line})" if self.where else ""
        return f"[{self.status}] {self.kernel} / {self.rule}{at}: {self.message}"


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _name(value: object) -> bool:
    return isinstance(value, str) and value.isidentifier()


def _factors(value: object) -> bool:
    """A tuple of a row fact's factors: int literals and parameter names."""
    return isinstance(value, tuple) and all(isinstance(f, str) and (f.isdigit() or f.isidentifier()) for f in value)


def _shift_factors(value: object) -> bool:
    """The factors of a term of ``row_shifts``: as :func:`_factors`, or one parenthesised expression the launch bounds
    over a loop's range and the grid."""
    return _factors(value) or isinstance(value, tuple) and len(value) == 1 and isinstance(value[0], str) and \
        value[0].startswith("(") and value[0].endswith(")")


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """What a rule's launcher needs of a rewrite: the fields every rule has, set by keyword.

    Each rule's plan is a subclass that adds its own (:class:`AllGatherLaunch`, :class:`ReduceScatterLaunch`,
    :class:`AllReduceLaunch`); the rule's ``rewrite`` makes it and its launcher reads it (``Launcher.plan``). It is
    checked when it is made, while the kernel is rewritten: a missing or unknown field (a ``TypeError`` naming it)
    or a value of the wrong kind (:class:`PlanError`) fails ``tlxform build`` and the decoration, not the first
    launch on a GPU. The generated module carries it, readable, as ``TILELINK_PLAN`` (:meth:`as_dict`), which
    :meth:`from_dict` reads back.
    """

    #: the rule (a spec's ``kind``) whose launcher runs this plan
    rule: ClassVar[str] = ""

    tensors: tuple[str, ...]  # the annotated parameters, in the spec's order
    dim: int  # the communicated dimension
    size_param: str  # the full size along ``dim``: a parameter, or an expression of the int arguments
    via: str  # the producer or consumer partner's resource: "sm" | "copy_engine"
    mode: str  # "pull" | "push"
    order: str  # the rewritten kernel's tile order: "local_first" | "ring" | "mesh"
    comm_sms: int  # programs of the SM partner kernels
    comm_block: int | None  # rows per channel; None: 128 rows on SMs, a rank's rows on the copy engine
    channels_per_rank: int | None  # None: from comm_block
    #: the scale of each pointer access's rows, ``(tensor, factors, line)``: the product of the factors (int literals
    #: and parameters) must be the tensor's row stride in the buffer the launcher passes (``KernelAnalysis.row_scales``,
    #: at the user's line); each call with more than one rank checks it
    row_scales: tuple[tuple[str, tuple[str, ...], int], ...] = ()
    #: the scalar terms each pointer access adds along dim 0, ``(tensor, ((subtracted, factors), ...), line)``: their
    #: sum must stay within one row (``KernelAnalysis.row_shifts``); an access bound two ways has an entry per way
    row_shifts: tuple[tuple[str, tuple[tuple[bool, tuple[str, ...]], ...], int], ...] = ()
    #: the parameters a proof of an access's rows took as non-negative (read by a ``tile=`` proof, where a column
    #: vector advanced in a loop starts, a factor of its advance or of a step), ``(parameter, line of the access)``
    #: (``KernelAnalysis.row_signs``); each call with more than one rank refuses a negative int among them
    row_signs: tuple[tuple[str, int], ...] = ()
    #: the factors of a term the kernel computes (``b * stride_xb``) that an access along an inner dim adds,
    #: ``(tensor, factors, value, line)`` (``KernelAnalysis.row_steps``; ``value`` the computed value in source, over
    #: program ids and parameters): their product must be a multiple of the gathered buffer's stride of the dim before
    #: the rows, or, in a sequence-major buffer, the values bounded from the grid must keep the access in the row; each
    #: call with more than one rank checks it
    row_steps: tuple[tuple[str, tuple[str, ...], str, int], ...] = ()
    #: where a column vector starts at a program's position whose sign its form does not tell, ``(value, line)``
    #: (``KernelAnalysis.row_starts``; ``value`` in source over program ids and parameters): its least value over the
    #: call's grid must be non-negative, on each call with more than one rank
    row_starts: tuple[tuple[str, int], ...] = ()
    #: the column bound ``X`` of each pointer a loop advances in the matmul form (``mask=offs_k[None, :] < X - k *
    #: BLOCK_K``), ``(tensor, ((subtracted, factors), ...), column stride parameter, line)``
    #: (``KernelAnalysis.row_bounds``): ``X`` times the column stride must be at most the row stride of the buffer the
    #: launcher passes; each call with more than one rank checks it
    row_bounds: tuple[tuple[str, tuple[tuple[bool, tuple[str, ...]], ...], str, int], ...] = ()
    #: the divisibility facts a ``tile=`` proof or an unmasked walk of whole blocks took, ``(factors, divisor, test,
    #: line of the load)`` (``KernelAnalysis.row_multiples``): the product of the factors (parameters) must be a
    #: multiple of the divisor (a parameter, an int literal, or a product of them joined by `` * ``) on each call with
    #: more than one rank whose arguments make the compile-time ``test`` hold ("": every call), as ``KV_CHUNK %
    #: BLOCK_N == 0`` under ``EVEN_N``, or ``K % BLOCK_K == 0`` under ``EVEN_K``
    row_multiples: tuple[tuple[tuple[str, ...], str, str, int], ...] = ()
    #: where the columns of each unmasked walk of whole blocks start, ``(start, block factors, step factors, test,
    #: line)`` (``KernelAnalysis.column_ends``; ``start`` in source over program ids and parameters,
    #: ``triton.ops.matmul``'s ``pid_z * BLOCK_K``): each step reads ``block`` columns from ``start`` plus a multiple
    #: of ``step``, so the columns stay in the row only where ``start + block <= step`` on every program of the call's
    #: grid, checked on each call whose arguments make the compile-time ``test`` hold ("": every call)
    column_ends: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str, int], ...] = ()
    #: each rotation of a tile index the tile order inserted, ``(index, tiles, others, test, line)``: the index's value
    #: where the kernel binds it, the count of tiles it is rotated among, and the program's other coordinates (the
    #: values of the other names that read its position, and the program ids of the axes the index does not read,
    #: joined by " ; "), in source over program ids and the arguments; the compile-time test under which the binding
    #: is compiled ("" always) and its line. The rotation gives each program another of the tiles ``[0, tiles)`` at
    #: the same other coordinates: it computes the kernel's own tiles only where, at each of those, the call's grid
    #: gives the index every tile or none, which each call with more than one rank that takes the test checks. The last
    #: field says whether the rotation stands on that check (a coordinate it groups by is no exact pair of the index's,
    #: ``rules.emit._checked_coordinates``): a call whose grid the check cannot read is then refused, not passed
    rotations: tuple[tuple[str, str, str, str, int, bool], ...] = ()
    #: the parameters an ``if`` read as one binding took as ints (``tilelink.branches``: its casts of them to int64
    #: dropped as keeping their values), ``(parameter, line of the if)``: each call with more than one rank refuses a
    #: float among them
    int_params: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.rule or type(self) is LaunchPlan:
            raise PlanError("LaunchPlan holds the fields every rule has; make the rule's own plan "
                            f"({', '.join(c.__name__ for c in LAUNCH_PLANS.values())})")
        self._check("tensors", isinstance(self.tensors, tuple) and bool(self.tensors)
                    and all(map(_name, self.tensors)), "a non-empty tuple of parameter names")
        self._check("dim", isinstance(self.dim, int) and not isinstance(self.dim, bool) and self.dim >= 0,
                    "a non-negative int")
        self._check("size_param", isinstance(self.size_param, str) and bool(self.size_param.strip()),
                    "a parameter name or an expression of the int arguments")
        for name, allowed in (("via", VIA), ("mode", MODES), ("order", ORDERS)):
            self._check(name, getattr(self, name) in allowed, f"one of {', '.join(map(repr, allowed))}")
        self._check("comm_sms", _positive(self.comm_sms), "a positive int")
        for name in ("comm_block", "channels_per_rank"):
            self._check(name, getattr(self, name) is None or _positive(getattr(self, name)), "None or a positive int")
        self._check("row_scales", isinstance(self.row_scales, tuple) and all(
            isinstance(e, tuple) and len(e) == 3 and _name(e[0]) and _factors(e[1]) and _positive(e[2])
            for e in self.row_scales), "a tuple of (tensor, factors, line)")
        self._check("row_shifts", isinstance(self.row_shifts, tuple) and all(
            isinstance(e, tuple) and len(e) == 3 and _name(e[0]) and isinstance(e[1], tuple) and bool(e[1]) and all(
                isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], bool) and _shift_factors(t[1]) for t in e[1])
            and _positive(e[2]) for e in self.row_shifts), "a tuple of (tensor, ((subtracted, factors), ...), line)")
        self._check("row_signs", isinstance(self.row_signs, tuple) and all(
            isinstance(e, tuple) and len(e) == 2 and _name(e[0]) and _positive(e[1]) for e in self.row_signs),
            "a tuple of (parameter, line)")
        self._check("row_steps", isinstance(self.row_steps, tuple) and all(
            isinstance(e, tuple) and len(e) == 4 and _name(e[0]) and _factors(e[1]) and bool(e[1])
            and isinstance(e[2], str) and _positive(e[3])
            for e in self.row_steps), "a tuple of (tensor, factors, value, line)")
        self._check("row_starts", isinstance(self.row_starts, tuple) and all(
            isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str) and _positive(e[1])
            for e in self.row_starts), "a tuple of (value, line)")
        self._check("row_bounds", isinstance(self.row_bounds, tuple) and all(
            isinstance(e, tuple) and len(e) == 4 and _name(e[0]) and isinstance(e[1], tuple) and bool(e[1]) and all(
                isinstance(t, tuple) and len(t) == 2 and isinstance(t[0], bool) and _factors(t[1]) for t in e[1])
            and (_name(e[2]) or (isinstance(e[2], str) and e[2].isdigit() and int(e[2]) > 0)) and _positive(e[3])
            for e in self.row_bounds),
            "a tuple of (tensor, ((subtracted, factors), ...), stride parameter or positive literal, line)")
        self._check("row_multiples", isinstance(self.row_multiples, tuple) and all(
            isinstance(e, tuple) and len(e) == 4 and _factors(e[0]) and bool(e[0]) and isinstance(e[1], str)
            and _factors(tuple(e[1].split(" * "))) and isinstance(e[2], str) and _positive(e[3])
            for e in self.row_multiples), "a tuple of (factors, divisor, compile-time test, line)")
        self._check("column_ends", isinstance(self.column_ends, tuple) and all(
            isinstance(e, tuple) and len(e) == 5 and isinstance(e[0], str) and bool(e[0]) and _factors(e[1])
            and bool(e[1]) and _factors(e[2]) and bool(e[2]) and isinstance(e[3], str) and _positive(e[4])
            for e in self.column_ends), "a tuple of (start, block factors, step factors, compile-time test, line)")
        self._check("rotations", isinstance(self.rotations, tuple) and all(
            isinstance(e, tuple) and len(e) == 6 and all(isinstance(x, str) for x in e[:4]) and all(e[:2])
            and _positive(e[4]) and isinstance(e[5], bool) for e in self.rotations),
            "a tuple of (index, tiles, others, test, line, whether it stands on the check)")

    def _check(self, name: str, ok: bool, wanted: str) -> None:
        if not ok:
            raise PlanError(f"{type(self).__name__}.{name}={getattr(self, name)!r}: expected {wanted}")

    def as_dict(self) -> dict[str, Any]:
        """The plan as plain data (``rule`` and every field set when it is made; tuples, at any depth, as lists), as
        the generated module's ``TILELINK_PLAN`` writes it."""
        out: dict[str, Any] = {"rule": self.rule}
        for f in fields(self):
            if f.init:
                value = getattr(self, f.name)
                out[f.name] = _lists(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchPlan:
        """The plan :meth:`as_dict` wrote: the class of its ``rule`` (a subclass of ``cls``), with every field
        present and none unknown, else :class:`PlanError` naming them."""
        rule = data.get("rule")
        plan_cls = LAUNCH_PLANS.get(rule) if isinstance(rule, str) else None
        if plan_cls is None or not issubclass(plan_cls, cls):
            known = ", ".join(repr(k) for k, c in LAUNCH_PLANS.items() if issubclass(c, cls))
            raise PlanError(f"launch plan: rule={rule!r} is not one of {known}; rebuild the module with tlxform build")
        names = [f.name for f in fields(plan_cls) if f.init]
        missing = [n for n in names if n not in data]
        unknown = sorted(k for k in data if k not in names and k != "rule")
        if missing or unknown:
            said = [f"missing field(s) {', '.join(map(repr, missing))}"] if missing else []
            said += [f"unknown field(s) {', '.join(map(repr, unknown))}"] if unknown else []
            raise PlanError(f"launch plan of rule {rule!r}: {'; '.join(said)} ({plan_cls.__name__} has "
                            f"{', '.join(names)}); rebuild the module with tlxform build")
        return plan_cls(**{n: _tuples(data[n]) for n in names})


def _lists(value: Any) -> Any:
    """A field as plain data: tuples (at any depth) as lists."""
    return [_lists(v) for v in value] if isinstance(value, tuple) else value


def _tuples(value: Any) -> Any:
    """A field read back from plain data: lists (at any depth, as JSON would give them) as tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True, kw_only=True)
class AllGatherLaunch(LaunchPlan):
    """The all-gather's plan (``rules/all_gather``)."""

    rule: ClassVar[str] = "all_gather"

    index: str | None  # the gather-index parameter of a dynamic (MoE) mapping, or None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check("index", self.index is None or _name(self.index), "None or a parameter name")


@dataclass(frozen=True, kw_only=True)
class ReduceScatterLaunch(LaunchPlan):
    """The reduce-scatter's plan (``rules/reduce_scatter``)."""

    rule: ClassVar[str] = "reduce_scatter"

    index: str | None  # the scatter-index parameter of a dynamic (MoE) mapping, or None
    topk: str | None  # the parameter counting a token's expert slots (the MoE top-k reduction), or None
    #: a split-K write-back (``tl.atomic_add``): the grid axes its address reads (the others are the K splits,
    #: counted from the grid at launch); None for stores
    atomic_axes: tuple[int, ...] | None
    #: where the kernel adds on some launches and stores on others (`if SPLIT_K == 1: tl.store(...)` / `else:
    #: tl.atomic_add(...)`): the test, in its constexpr parameters, of the launches that add; "": every launch adds
    atomic_when: str = ""
    #: the launches a non-linear epilogue refuses, ``(test, message)``: the test, in the kernel's constexpr parameters,
    #: of a compile-time side holding a ``tl.static_assert(False, message)``; the launcher raises the message before
    #: anything of a call whose arguments pass it is enqueued (the interpreter meets the assert mid-call)
    refused: tuple[tuple[str, str], ...] = ()
    #: what each store of the reduced tensors writes, ``(row start, rows, column start, columns, test, line, stored per
    #: row)`` in source over program ids and the arguments (``rules.reduce_scatter.rewrite.stored_tiles``; columns
    #: ``""``: whole rows; ``test``: the ``if`` tests under which it runs, ``""``: always; stored per row: the elements
    #: of each of the tile's rows it writes, ``""`` where TileLink cannot tell): each call with more than one rank
    #: checks over its grid that no element is stored by two programs or two steps, and that every element of the
    #: output's rows is stored (a channel short of one never completes)
    stored_tiles: tuple[tuple[str, str, str, str, str, int, str], ...] = ()
    #: the types the stored partial sums are started with, in source over literals and the constexpr parameters
    #: (``rules.reduce_scatter.rewrite.sums_dtypes``): a call reducing into an integer tensor is refused unless each
    #: is an integer type, since a rank's float sums are truncated when stored there, before the ranks add them
    sums_dtypes: tuple[str, ...] = ()
    #: pointer parameters read only in terms added to the stored partial sums once (a bias, `acc + bias[None, :]`,
    #: or an accumulator started from one): every rank would add them, so every rank but the first is launched with
    #: zeros of the same layout in their place (``rules.reduce_scatter.rewrite.first_rank_terms``), and the sum
    #: over the ranks adds them once, as vLLM's row-parallel linear adds its bias on rank 0 only
    first_rank_only: tuple[str, ...] = ()
    #: what a split-K loop's steps ask of the grid, ``(programs, axis, line, step)``: each program along the grid axis
    #: ``axis`` starts its K blocks at its index's place and moves by ``step`` (source) a step, ``programs`` (source
    #: over the arguments, `SPLIT_K`) times its blocks (``rules.reduce_scatter.rewrite.split_steps``): its programs
    #: tile K only where the grid has ``programs`` of them along ``axis``, which each call with more than one rank
    #: checks (a rank's own slice would otherwise lose or repeat other columns than the full K does)
    split_steps: tuple[tuple[str, int, int, str], ...] = ()

    def adds(self, values: Mapping[str, Any]) -> bool:
        """Whether a launch with the constexpr arguments ``values`` takes the split-K write-back (``tl.atomic_add``):
        always with one and ``atomic_when`` empty, never without one. Raises ``NameError`` (a parameter the values
        leave out) or the test's own error where it cannot be evaluated."""
        if self.atomic_axes is None or not self.atomic_when:
            return self.atomic_axes is not None
        env = {n: getattr(v, "value", v) for n, v in values.items()}  # tl.constexpr(x): x
        return bool(eval(self.atomic_when, {"__builtins__": {}}, env))  # noqa: S307 - the kernel's own test

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check("stored_tiles", isinstance(self.stored_tiles, tuple) and all(
            isinstance(e, tuple) and len(e) == 7 and all(isinstance(x, str) for x in (*e[:5], e[6])) and all(e[:2])
            and bool(e[2]) == bool(e[3]) and _positive(e[5]) for e in self.stored_tiles),
            "a tuple of (row start, rows, column start, columns, test, line, stored per row)")
        self._check("split_steps", isinstance(self.split_steps, tuple) and all(
            isinstance(e, tuple) and len(e) == 4 and isinstance(e[0], str) and e[0] and type(e[1]) is int
            and 0 <= e[1] <= 2 and _positive(e[2]) and isinstance(e[3], str) for e in self.split_steps),
            "a tuple of (programs, axis, line, step)")
        self._check("first_rank_only", isinstance(self.first_rank_only, tuple) and all(
            _name(e) for e in self.first_rank_only), "a tuple of parameter names")
        self._check("sums_dtypes", isinstance(self.sums_dtypes, tuple) and all(
            isinstance(e, str) and e for e in self.sums_dtypes), "a tuple of type sources")
        self._check("refused", isinstance(self.refused, tuple) and all(
            isinstance(e, tuple) and len(e) == 2 and all(isinstance(x, str) and x for x in e) for e in self.refused),
            "a tuple of (test, message)")
        for name in ("index", "topk"):
            self._check(name, getattr(self, name) is None or _name(getattr(self, name)), "None or a parameter name")
        self._check("atomic_when", isinstance(self.atomic_when, str) and (
            not self.atomic_when or self.atomic_axes is not None), "a str, empty without a split-K write-back")
        axes = self.atomic_axes
        self._check("atomic_axes", axes is None or (isinstance(axes, tuple) and bool(axes) and all(
            type(a) is int and 0 <= a <= 2 for a in axes) and list(axes) == sorted(set(axes))),
                    "None or a sorted tuple of grid axes (0, 1, 2)")


@dataclass(frozen=True, kw_only=True)
class AllReduceLaunch(ReduceScatterLaunch):
    """The all-reduce's plan (``rules/all_reduce``): its launcher is the reduce-scatter's, on the SM pull, with no
    dynamic mapping."""

    rule: ClassVar[str] = "all_reduce"

    index: None = field(default=None, init=False)
    topk: None = field(default=None, init=False)
    atomic_axes: tuple[int, ...] | None = None  # a split-K write-back's, as the reduce-scatter's
    algorithm: str | None  # "one_shot" | "two_shot", or None: chosen by the message's size per shape

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check("via", self.via == "sm", "'sm' (the all-reduce's partners pull on SMs)")
        self._check("mode", self.mode == "pull", "'pull' (the all-reduce's partners pull on SMs)")
        self._check("algorithm", self.algorithm is None or self.algorithm in ALL_REDUCE_MODES,
                    f"None or one of {', '.join(map(repr, ALL_REDUCE_MODES))}")


#: a rule's kind -> the class of its launch plan
LAUNCH_PLANS: dict[str, type[LaunchPlan]] = {c.rule: c for c in (AllGatherLaunch, ReduceScatterLaunch, AllReduceLaunch)}


@dataclass(frozen=True)
class RewritePlan:
    """What one rule does to one kernel."""

    kernel: str
    rule: str
    spec: Spec
    options: Options
    extra_params: tuple[str, ...]
    insertions: tuple[Insertion, ...]
    partner_kernels: tuple[str, ...]  # names of @triton.jit functions in the rule module
    launch: LaunchPlan  # what the rule's launcher runs from
    report: tuple[ReportEntry, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.launch, LaunchPlan) or self.launch.rule != self.rule:
            wanted = LAUNCH_PLANS[self.rule].__name__ if self.rule in LAUNCH_PLANS else "LaunchPlan subclass"
            raise PlanError(f"{self.kernel} / {self.rule}: the rewrite's launch plan is a "
                            f"{type(self.launch).__name__}, not the rule's {wanted}: make one (tilelink.plan) "
                            f"with every field by keyword, which its launcher reads")


@dataclass(frozen=True)
class Report:
    """The report of one generated module: every rewrite applied, and every one not applied."""

    entries: tuple[ReportEntry, ...]

    @property
    def applied(self) -> bool:
        """True when every rule was applied (no entry says "not applied")."""
        return all(e.status != "not applied" for e in self.entries)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.entries) if self.entries else "(nothing to rewrite)"
