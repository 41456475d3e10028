"""The source of the ``@triton.jit`` helpers a kernel's file imports by name.

The tile-order rotation reads a helper that returns a tile mapping's coordinates (``pid_m, pid_n =
tile_coordinates(...)``) to tell that they are the mapping's pair; a helper it cannot read keeps the kernel's own
order. A helper of the kernel's file is read from that file; one imported by name (``from tilelink.ops.gemm_kernels
import tile_coordinates``, also ``as`` another name, or relative to the kernel's package), or called as a function
of an imported module (``import helpers`` ... ``helpers.block_start(...)``, known as ``helpers.block_start``), is
read from its module's file, found without running any module: next to the kernel's file where its folder is not a
package (a script's folder, first on the import path), else through Python's import system from the deepest package
above it whose parent is imported (``tilelink.ops`` under ``tilelink``: an editable install maps TileLink's packages
to folders of other names).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib.util
import os
import sys

import libcst as cst
import libcst.matchers as m

from tilelink.node_index import find_in


def imported_helpers(module: cst.Module, file: str, is_jit) -> dict[str, str]:
    """Each name ``module`` imports from another module, whose module's file TileLink finds and which is a
    ``@triton.jit`` function there (``is_jit`` tells a decorator), -> that function's source. A name not found so is
    left out: the rotation does not read it."""
    out: dict[str, str] = {}
    # only names the file calls: `from __future__ import annotations` and the like are not read
    called = {c.func.value for c in find_in(module, module, m.Call(func=m.Name()))}
    # the modules the file calls functions of (`import helpers` ... `helpers.block_start(...)`), by the name it binds
    through = {cst.Module(body=[]).code_for_node(c.func.value).strip()
               for c in find_in(module, module, m.Call(func=m.Attribute(value=m.Name() | m.Attribute())))}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                out.update(_module_helpers(small, through, file, is_jit))
                continue
            if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
                continue
            dotted = cst.Module(body=[]).code_for_node(small.module).strip() if small.module is not None else ""
            for alias in small.names:
                # a module imported from its package (FlagGems' `from flag_gems.utils import triton_lang_extension as
                # tle`), whose functions the file calls (`tle.program_id(0)`)
                if _local(alias) in through and isinstance(alias.name, cst.Name) and (
                        dotted or small.relative) and dotted.split(".")[0] not in _NOT_HELPERS:
                    inner = f"{dotted}.{alias.name.value}" if dotted else alias.name.value
                    out.update({f"{_local(alias)}.{name}": source for name, source in _jitted_in(
                        inner, len(small.relative), file, is_jit).items()})
            if not any(_local(alias) in called for alias in small.names):
                continue
            jitted = _jitted_in(dotted, len(small.relative), file, is_jit)
            for alias in small.names:
                if isinstance(alias.name, cst.Name) and alias.name.value in jitted:
                    out[_local(alias)] = jitted[alias.name.value]
    return out


def _jitted_in(dotted: str, level: int, file: str, is_jit) -> dict[str, str]:
    """The ``@triton.jit`` functions of the module ``dotted`` (imported ``level`` packages up from ``file``), by name,
    -> their source; none where TileLink does not find or read it. The lookup is recorded (``recording``)."""
    path, text = _module_text(dotted, level, file)
    lookups = _lookups.get()
    if lookups is not None:
        lookups.append(_lookup(dotted, level, file, path, text))
    if text is None:
        return {}
    return dict(_jitted_of(text, is_jit))


@functools.lru_cache(maxsize=64)
def _jitted_of(text: str, is_jit) -> tuple[tuple[str, str], ...]:
    """The ``@triton.jit`` functions a module of source ``text`` binds once, as ``(name, source)`` pairs. Kept by
    text: each kernel of a file that imports a module (``tilelink``, a helpers module) reads it again."""
    try:
        parsed = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return ()
    bound = module_bindings(parsed)
    # a name the module binds more than once (`program_id = _other` after its `def`, a second `def` under `if`) is
    # whichever ran last, not necessarily the `def` read here; so may a star import after it (`from m import *`)
    stars = [i for i, stmt in enumerate(parsed.body) if m.findall(stmt, m.ImportFrom(names=m.ImportStar()))]
    return tuple((f.name.value, cst.Module(body=[]).code_for_node(f).strip()) for i, f in enumerate(parsed.body)
                 if isinstance(f, cst.FunctionDef) and any(is_jit(d) for d in f.decorators)
                 and bound.get(f.name.value) == 1 and not any(star > i for star in stars))


def module_bindings(module: cst.Module) -> dict[str, int]:
    """How many times each name is bound anywhere in ``module``: by a `def` or `class`, an import, an assignment
    (plain, annotated, augmented, a named expression, an unpacking), a loop's or a `with`'s target, or a `global` or
    `nonlocal` declaration (a function may bind it)."""
    counts: dict[str, int] = {}

    def add(node: cst.CSTNode | None) -> None:
        for name in m.findall(node, m.Name()) if node is not None else ():
            counts[name.value] = counts.get(name.value, 0) + 1

    for node in find_in(module, module, m.FunctionDef() | m.ClassDef()):
        counts[node.name.value] = counts.get(node.name.value, 0) + 1
    for node in find_in(module, module, m.AssignTarget() | m.AnnAssign() | m.AugAssign() | m.NamedExpr() | m.For()):
        add(node.target if not isinstance(node, cst.AssignTarget) else node.target)
    for node in find_in(module, module, m.AsName()):
        add(node.name)
    for node in find_in(module, module, m.ImportAlias()):
        if node.asname is None:
            dotted = cst.Module(body=[]).code_for_node(node.name).strip().split(".")[0]
            counts[dotted] = counts.get(dotted, 0) + 1
    for node in find_in(module, module, m.Global() | m.Nonlocal()):
        for item in node.names:
            counts[item.name.value] = counts.get(item.name.value, 0) + 2  # rebound where the function runs
    return counts


#: modules whose functions a kernel calls that are not its helpers (Triton's, torch's): not looked up
_NOT_HELPERS = ("triton", "torch", "numpy", "math")


def _module_helpers(stmt: cst.Import, through: set[str], file: str, is_jit) -> dict[str, str]:
    """The ``@triton.jit`` functions of each module ``stmt`` imports whose functions the file calls (``through``),
    by the name the file calls them (``helpers.block_start``, ``h.block_start`` of ``import helpers as h``)."""
    out: dict[str, str] = {}
    for alias in stmt.names:
        dotted = cst.Module(body=[]).code_for_node(alias.name).strip()
        local = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) \
            else dotted
        if local not in through or dotted.split(".")[0] in _NOT_HELPERS:
            continue
        out.update({f"{local}.{name}": source for name, source in _jitted_in(dotted, 0, file, is_jit).items()})
    return out


#: while a rewrite is being kept (``tilelink.rewrite_cache``): each module looked up for helpers, and what was found
_lookups: contextvars.ContextVar[list | None] = contextvars.ContextVar("tilelink_helper_lookups", default=None)


@contextlib.contextmanager
def recording():
    """Within the block, ``imported_helpers`` adds each module it looks up to the list yielded, as ``look_up``
    describes it."""
    found: list[tuple] = []
    token = _lookups.set(found)
    try:
        yield found
    finally:
        _lookups.reset(token)


def look_up(dotted: str, level: int, file: str) -> tuple:
    """The module ``dotted``, imported ``level`` packages up from ``file``, as found now: ``(dotted, level, file,
    its file or None, the sha256 of its text or None)``."""
    return _lookup(dotted, level, file, *_module_text(dotted, level, file))


def _lookup(dotted: str, level: int, file: str, path: str | None, text: str | None) -> tuple:
    digest = None if text is None else hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return (dotted, level, file, path, digest)


def _module_text(dotted: str, level: int, file: str) -> tuple[str | None, str | None]:
    """The file of the module and its text (``None`` for what is not found or not read)."""
    path = _module_file(dotted, level, file)
    if path is None:
        return None, None
    try:
        with open(path, encoding="utf-8") as f:
            return path, f.read()
    except (OSError, UnicodeDecodeError):
        return path, None


def _local(alias: cst.ImportAlias) -> str:
    """The name an import binds in the file (``tile_of`` of ``import tile_of``, ``g`` of ``tile_of as g``)."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return alias.name.value if isinstance(alias.name, cst.Name) else ""


def _module_file(dotted: str, level: int, file: str) -> str | None:
    """The ``.py`` file of the module ``dotted`` imported ``level`` packages up from ``file`` (0: absolute), or
    ``None`` where TileLink does not find it without running code it has not run."""
    parts = [p for p in dotted.split(".") if p]
    here = os.path.dirname(os.path.abspath(file)) if os.path.isfile(file) else None
    if level:
        if here is None:
            return None
        base = here
        for _ in range(level - 1):
            base = os.path.dirname(base)
        return _in(base, parts)
    if not parts:
        return None
    # beside the file only where its folder is not a package: a script's folder is first on the import path, but
    # a module of a package imports `helpers` from the import path, never from its own folder
    if here is not None and not os.path.isfile(os.path.join(here, "__init__.py")):
        found = _in(here, parts)
        if found is not None:
            return found
    # through the import system (the import path, an editable install's folders): the spec of the module, or of the
    # deepest package above it, whose parent is imported already, so that finding it runs nothing (a package's
    # `__init__` may import torch, which the static commands do not load)
    for i in range(len(parts), 0, -1):
        name, parent = ".".join(parts[:i]), ".".join(parts[:i - 1])
        if parent and parent not in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if i == len(parts):
            origin = spec.origin
            return origin if isinstance(origin, str) and origin.endswith(".py") and os.path.isfile(origin) else None
        for folder in spec.submodule_search_locations or ():
            found = _in(folder, parts[i:])
            if found is not None:
                return found
        return None
    return None


def _in(root: str, parts: list[str]) -> str | None:
    """``root/a/b.py`` or ``root/a/b/__init__.py`` for the parts ``a``, ``b``, where it is a file; ``root/__init__.py``
    for none (``from . import f``)."""
    if not parts:
        path = os.path.join(root, "__init__.py")
        return path if os.path.isfile(path) else None
    stem = os.path.join(root, *parts)
    for path in (stem + ".py", os.path.join(stem, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None
