"""The plain data passed from a rule to the code generator and the launcher, and the report.

A rule reads a :class:`~tilelink.analysis.KernelAnalysis` and returns a :class:`RewritePlan`: which
lines to insert where, which parameters to add, which partner kernels to emit, and the launch
metadata the runtime needs. Every decision is also a :class:`ReportEntry`, so nothing is silently
left un-overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilelink.analysis import Where
from tilelink.spec import Options, Spec


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
    launch: dict = field(default_factory=dict)  # JSON-able metadata for the launcher
    report: tuple[ReportEntry, ...] = ()


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
