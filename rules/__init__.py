"""The rules: one package per communication pattern, each in three parts.

- ``rewrite``: where the pattern's waits or notifies go in the user's kernel (static: no torch);
- ``kernels``: the partner kernels that move the data (``@triton.jit``);
- ``launcher``: buffers, channels and streams per shape, and the launch of the rewritten kernel with its
  partners.

:data:`RULES` maps a spec's ``kind`` to its rule; nothing else names the rule packages.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Rule:
    """One communication pattern: the names of its three parts."""

    kind: str  # the spec's kind, and the package's name
    launcher_class: str

    @property
    def package(self) -> str:
        return f"{__name__}.{self.kind}"

    def rewrite_module(self) -> ModuleType:
        return importlib.import_module(f"{self.package}.rewrite")

    def kernels_module(self) -> ModuleType:
        return importlib.import_module(f"{self.package}.kernels")

    def launcher(self, okernel):
        """A launcher for ``okernel``, an overlapped kernel this rule rewrote."""
        return getattr(importlib.import_module(f"{self.package}.launcher"), self.launcher_class)(okernel)


RULES: dict[str, Rule] = {rule.kind: rule for rule in (
    Rule("all_gather", "AllGatherLauncher"),
    Rule("reduce_scatter", "ReduceScatterLauncher"),
)}


def rule_of(kind: str) -> Rule:
    """The rule of a spec's ``kind`` (``spec.kind``, ``plan.rule``)."""
    try:
        return RULES[kind]
    except KeyError:
        raise KeyError(f"no rule {kind!r}; the rules are {', '.join(RULES)}") from None
