"""The rules: one package per communication pattern, each in three parts.

- ``rewrite``: where the pattern's waits or notifies go in the user's kernel (static: no torch);
- ``kernels``: the partner kernels that move the data (``@triton.jit``);
- ``launcher``: buffers, channels and streams per shape, and the launch of the rewritten kernel with its
  partners.

:data:`RULES` maps a spec's ``kind`` to its rule; nothing else names the rule packages.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class Rule:
    """One communication pattern: the names of its three parts."""

    kind: str  # the spec's kind, and the package's name
    launcher_class: str
    #: the kernel may only read its annotated tensors (the launch passes another buffer in their place)
    read_only: bool = False

    @property
    def package(self) -> str:
        return f"{__name__}.{self.kind}"

    def rewrite_module(self) -> ModuleType:
        return importlib.import_module(f"{self.package}.rewrite")

    def kernels_module(self) -> ModuleType:
        return importlib.import_module(f"{self.package}.kernels")

    def kernel_source(self, name: str) -> str:
        """The source of the partner kernel ``name``, decorators included, as ``inspect.getsource`` gives it,
        read from the ``kernels`` module's file without importing it: the module imports Triton and the
        device primitives (torch), which a static rewrite (``tlxform build``, ``check``, ``show``) never runs."""
        spec = importlib.util.find_spec(f"{self.package}.kernels")
        if spec is None or spec.origin is None:
            raise LookupError(f"rule {self.kind!r} has no kernels module")
        sources = _top_level_functions(spec.origin)
        if name not in sources:
            raise LookupError(f"rule {self.kind!r} has no partner kernel {name!r} in {spec.origin}; it defines "
                              f"{', '.join(sorted(sources)) or 'none'}")
        return sources[name]

    def launcher(self, okernel):
        """A launcher for ``okernel``, an overlapped kernel this rule rewrote."""
        return getattr(importlib.import_module(f"{self.package}.launcher"), self.launcher_class)(okernel)


@functools.cache
def _top_level_functions(path: str) -> dict[str, str]:
    """Each top-level function of the file at ``path``: name -> its lines from the first decorator to the end
    of its body, without the surrounding newlines."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    out: dict[str, str] = {}
    for node in ast.parse(text, filename=path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = "\n".join(lines[first - 1:node.end_lineno]).strip("\n")
    return out


RULES: dict[str, Rule] = {rule.kind: rule for rule in (
    Rule("all_gather", "AllGatherLauncher", read_only=True),
    Rule("reduce_scatter", "ReduceScatterLauncher"),
    Rule("all_reduce", "AllReduceLauncher"),
)}


def rule_of(kind: str) -> Rule:
    """The rule of a spec's ``kind`` (``spec.kind``, ``plan.rule``)."""
    try:
        return RULES[kind]
    except KeyError:
        raise KeyError(f"no rule {kind!r}; the rules are {', '.join(RULES)}") from None
