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
            with self._remember_timeout():
                return launcher.launch(grid, self.bind(args, kwargs))

        return launch

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
