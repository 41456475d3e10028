"""``@tilelink.overlap``: the decorator users put on a plain ``@triton.jit`` kernel.

At decoration time the kernel's source file is analysed and rewritten (errors name the user's file
and line); the generated module is written to a cache directory keyed by its hash and imported on
first launch. ``kernel[grid](args...)`` then launches the overlapped operator on the current world
following the launch contract: the annotated tensor argument is this rank's shard,
every other argument is the full problem's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from tilelink.codegen import GeneratedModule, Request, generate
from tilelink.errors import AnnotationError, LaunchError, WaitTimeout
from tilelink.plan import Report
from tilelink.spec import AllGatherSpec, AllReduceSpec, ReduceScatterSpec, make_options


def cache_dir() -> Path:
    """Where generated modules are written: ``$TILELINK_CACHE_DIR`` or ``~/.cache/tilelink``."""
    root = os.environ.get("TILELINK_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tilelink")
    path = Path(root) / "generated"
    path.mkdir(parents=True, exist_ok=True)
    return path


def python_function(kernel: Any) -> Any:
    """The plain Python function under a JITFunction / InterpretedFunction / Autotuner stack."""
    fn = kernel
    seen = 0
    while not inspect.isfunction(fn):
        inner = getattr(fn, "fn", None)
        if inner is None or seen > 8:
            raise AnnotationError(
                f"@tilelink.overlap expects a @triton.jit kernel, got {type(kernel).__name__}",
                hint="put @tilelink.overlap(...) directly above @triton.jit (and any @triton.autotune)")
        fn, seen = inner, seen + 1
    return fn


def load_generated(generated: GeneratedModule, stem: str) -> ModuleType:
    """Write ``generated`` to the cache (atomically) and import it as a module of its own."""
    name = f"tilelink_generated_{stem}_{generated.source_hash[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    path = cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != generated.text:
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(generated.text)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class OverlappedKernel:
    """A Triton kernel rewritten for compute-communication overlap.

    Attributes:
        source: the generated module's text (rewritten kernel, partner kernels, launch plan).
        report: what was rewritten where, and what was not and why.
        kernel: the original (plain) kernel, still launchable on one GPU.
    """

    def __init__(self, kernel: Any, specs: tuple, options) -> None:
        self.kernel = kernel
        self.fn = python_function(kernel)
        self.params = tuple(inspect.signature(self.fn).parameters)  # bound on every launch: read once
        self.name = self.fn.__name__
        self.file = inspect.getsourcefile(self.fn) or "<unknown>"
        try:
            text = Path(self.file).read_text()
        except OSError as exc:
            raise AnnotationError(f"cannot read the source of kernel {self.name!r}: {exc}",
                                  hint="define kernels in a .py file") from None
        self.specs = specs
        self.options = options
        self._text = text
        self._row_scales: tuple | None = None
        self._defaults: dict | None = None
        self.generated = generate(text, _display_path(self.file), [Request(self.name, specs, options)])
        self.plan = self.generated.plans[0]
        self.check_waits = os.environ.get("TILELINK_CHECK_WAITS", "1") != "0"
        self._module: ModuleType | None = None
        self._launcher = None
        self.__doc__ = self.fn.__doc__
        self.__name__ = self.name

    @property
    def source(self) -> str:
        return self.generated.text

    @property
    def report(self) -> Report:
        return self.generated.report

    @property
    def module(self) -> ModuleType:
        """The imported generated module (imported on first use)."""
        if self._module is None:
            self._module = load_generated(self.generated, Path(self.file).stem)
        return self._module

    @property
    def launcher(self):
        if self._launcher is None:
            from tilelink.rules import launch

            self._launcher = launch.launcher_for(self)
        return self._launcher

    def context(self, *args: Any, **kwargs: Any):
        """Allocate (collectively) the symmetric buffers and channels for these launch arguments
        once; later launches with the same shapes reuse them."""
        return self.launcher.context(self.bind(args, kwargs))

    def check(self) -> None:
        """Wait for this operator's kernels and raise :class:`tilelink.WaitTimeout` if a wait timed out.

        In the emulated world every call checks; on a GPU a call reads the previous calls' record
        without stalling, so call this (or any synchronising check) to see the last call's."""
        if self._launcher is not None:
            with self._remember_timeout():
                self._launcher.check()

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Bind a launch's arguments to the kernel's parameter names."""
        if len(args) > len(self.params):
            raise LaunchError(f"{self.name}: {len(args)} positional arguments for {len(self.params)} parameters")
        bound = dict(zip(self.params, args, strict=False))
        for k, v in kwargs.items():
            if k in bound:
                raise LaunchError(f"{self.name}: argument {k!r} given twice")
            bound[k] = v
        return bound

    def __getitem__(self, grid):
        def launch(*args: Any, **kwargs: Any):
            launcher = self.launcher
            launcher.world()  # a new world starts clean
            if launcher.timed_out is not None:
                raise LaunchError(
                    f"{self.name}: an earlier call on this rank had a wait time out ({launcher.timed_out}). That "
                    f"call's results were not valid, and its channels' counts no longer match the other ranks' "
                    f"(a late notify still adds to them), so later calls could pass their waits too early: "
                    f"start the world again (tilelink.finalize(), then tilelink.init()) once the cause is fixed")
            bound = self.bind(args, kwargs)
            self._check_row_scales(bound, launcher)
            with self._remember_timeout():
                return launcher.launch(grid, bound)

        return launch

    def _check_row_scales(self, bound: dict, launcher) -> None:
        """The rows a wait or notify covers are the offsets vector's, ``offs``; an access reads or writes the elements
        ``offs * scale`` (``offs[:, None] * stride_am``, ``x_ptr + offs * 2``). Both are the same rows only when the
        scale is the row stride of the buffer the rewritten kernel is given: the gathered rows or the partial sums,
        contiguous tensors of the argument's shape (the full size along the rows); and the address's scalar terms along
        dim 0, when each is known, stay within a row (``+ D`` on a (M, D) tensor is the next row). Checked on each call
        with more than one rank (alone, the kernel runs on the caller's tensors as written)."""
        if launcher.world().world_size == 1:
            return
        if self._row_scales is None:  # read once, at the first call with peers
            self._row_scales = _row_scales(self._text, _display_path(self.file), self.name, self.specs)
        scales, shifts = self._row_scales
        if not (scales or shifts):
            return
        # a parameter the call leaves out runs with its default (`STEP: tl.constexpr = 2`): compare that value
        if self._defaults is None:  # read once
            self._defaults = {n: p.default for n, p in inspect.signature(self.fn).parameters.items()
                              if p.default is not inspect.Parameter.empty}
        if self._defaults:
            bound = {**self._defaults, **bound}
        for tensor, dim, factors, line in scales:
            t = bound.get(tensor)
            if not (hasattr(t, "shape") and hasattr(t, "stride")) or len(t.shape) <= dim:
                continue  # not a tensor (a host descriptor: its rows are its offsets); the launcher says what is wrong
            scale = 1
            for f in factors:
                value = int(f) if f.isdigit() else bound.get(f)
                if not isinstance(value, int) or isinstance(value, bool):
                    break  # a parameter the call leaves to its default, or not an int: nothing to compare
                scale *= value
            else:
                rows = 1
                for n in t.shape[dim + 1:]:
                    rows *= int(n)
                if scale != rows:
                    said = " * ".join(f"{f}={bound[f]}" if not f.isdigit() else f for f in factors) or "1"
                    buffer = "the gathered rows" if self.specs[0].kind == "all_gather" else "the partial sums"
                    raise LaunchError(
                        f"{self.name}: the rows of {tensor!r} are addressed {scale} elements apart at "
                        f"{_display_path(self.file)}:{line} (its offsets times {said}), but the buffer TileLink "
                        f"passes as {tensor!r} ({buffer}, "
                        f"contiguous, of the shape of the argument along its other dims, {tuple(t.shape)}) has its "
                        f"dim-{dim} rows {rows} elements apart, so the access would touch other rows than those its "
                        f"wait or notify covers: pass a contiguous {tensor} and its own stride "
                        f"({tensor}.stride({dim})), or view it so that one step along dim {dim} is the kernel's "
                        f"scale (`x.view(-1, {scale})` for a 1-D `x_ptr + offs * {scale}`)")
        for tensor, terms, line in shifts:
            t = bound.get(tensor)
            if not hasattr(t, "shape") or len(t.shape) < 1:
                continue
            rows = 1
            for n in t.shape[1:]:
                rows *= int(n)
            shift = 0
            for negative, factors in terms:
                term = 1
                for f in factors:
                    value = int(f) if f.isdigit() else bound.get(f)
                    if not isinstance(value, int) or isinstance(value, bool):
                        break
                    term *= value
                else:
                    shift += -term if negative else term
                    continue
                break  # a term not known at this call
            else:
                if not 0 <= shift < rows:
                    said = " + ".join(("-" if neg else "") + " * ".join(
                        f"{f}={bound[f]}" if not f.isdigit() else f for f in factors) for neg, factors in terms)
                    raise LaunchError(
                        f"{self.name}: the address at {_display_path(self.file)}:{line} adds {shift} elements ({said}) "
                        f"to the rows of {tensor!r}, whose rows are {rows} elements long: it touches other rows than "
                        f"those its wait or notify covers; index those rows with an offsets vector of their own "
                        f"(`nxt = start + BLOCK + tl.arange(0, BLOCK)`, `x_ptr + nxt[:, None] * stride`)")

    @contextlib.contextmanager
    def _remember_timeout(self):
        """A :class:`tilelink.WaitTimeout` raised here is raised, and kept by the launcher for this world:
        later launches refuse to run."""
        try:
            yield
        except WaitTimeout as exc:
            self.launcher.timed_out = exc
            raise

    def __repr__(self) -> str:
        return f"<overlapped kernel {self.name} ({', '.join(s.describe() for s in self.specs)})>"


def _row_scales(text: str, file: str, kernel: str, specs: tuple) -> tuple:
    """``(tensor, dim, factors, line)`` for each scale the rows of a pointer access of ``kernel`` are multiplied by
    (``KernelAnalysis.row_scales``), and ``(tensor, terms, line)`` for each access's scalar terms along dim 0
    (``KernelAnalysis.row_shifts``), read from the source again: the analysis is static, and the rewrite keeps only
    what the rules plan from it."""
    from tilelink.analysis import analyse, parse_source
    from tilelink.inline import inline_helpers

    dims = {t: s.dim for s in specs for t in s.tensors}
    tensors = {t: (s.dim, s.tile, s.size, s.index) for s in specs for t in s.tensors}
    inlined = inline_helpers(parse_source(text, file), file, kernel, list(tensors))
    an = analyse(inlined.module, file, kernel, tensors)
    return (tuple(sorted({(tensor, dims[tensor], factors, inlined.user_line(where.line))
                          for tensor, factors, where in an.row_scales})),
            tuple((tensor, terms, inlined.user_line(where.line)) for tensor, terms, where in an.row_shifts))


def _display_path(file: str) -> str:
    try:
        return os.path.relpath(file)
    except ValueError:
        return file


def overlap(*specs: AllGatherSpec | ReduceScatterSpec | AllReduceSpec, via: str | None = None,
            mode: str | None = None, order: str | None = None, comm_block: int | None = None,
            comm_sms: int | None = None, channels_per_rank: int | None = None):
    """Annotate a ``@triton.jit`` kernel for compute-communication overlap.

    Args:
        specs: ``tilelink.all_gather(...)``, ``tilelink.reduce_scatter(...)`` or ``tilelink.all_reduce(...)``.
        via: ``"sm"`` or ``"copy_engine"``: what moves the data (paper §3.1, resource binding).
        mode: ``"pull"`` or ``"push"``.
        order: ``"local_first"``, ``"ring"`` or ``"mesh"``: the compute tile order.
        comm_block: rows per communication tile (channel), decoupled from the compute tile.
        comm_sms: programs the communication kernel runs on.
        channels_per_rank: channels per rank (overrides ``comm_block``).
    """
    for s in specs:
        if not isinstance(s, (AllGatherSpec, ReduceScatterSpec, AllReduceSpec)):
            raise TypeError(f"overlap: expected tilelink.all_gather(...), tilelink.reduce_scatter(...) or "
                            f"tilelink.all_reduce(...), got {s!r}")
    if not specs:
        raise TypeError("overlap: give at least one spec, e.g. overlap(tilelink.all_gather(\"a_ptr\"))")
    options = make_options(via, mode, order, comm_block, comm_sms, channels_per_rank)

    def decorate(kernel: Any) -> OverlappedKernel:
        return OverlappedKernel(kernel, tuple(specs), options)

    return decorate


def build(path: str | os.PathLike) -> GeneratedModule:
    """Generate the module for every ``@tilelink.overlap`` kernel of the file at ``path``."""
    from tilelink.annotations import requests_in

    text = Path(path).read_text()
    return generate(text, str(path), requests_in(text, str(path)))
