"""``@tilelink.overlap``: the decorator users put on a plain ``@triton.jit`` kernel.

At decoration time the kernel's source file is analysed and rewritten (errors name the user's file
and line); the generated module is written to a cache directory keyed by its hash and imported on
first launch. ``kernel[grid](args...)`` then launches the overlapped operator on the current world
following the launch contract: the annotated tensor argument is this rank's shard,
every other argument is the full problem's.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import inspect
import math
import numbers
import operator
import os
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from tilelink.codegen import GeneratedModule, Request, generate
from tilelink.errors import AnnotationError, LaunchError, WaitTimeout
from tilelink.plan import Report
from tilelink.rewrite_cache import cache_dir, generate_kept
from tilelink.spec import AllGatherSpec, AllReduceSpec, ReduceScatterSpec, make_options


def generated_dir() -> Path:
    """Where generated modules are written: ``generated/`` of TileLink's cache."""
    path = cache_dir() / "generated"
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
    path = generated_dir() / f"{name}.py"
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


#: what Triton's wrappers (`Autotuner`, `Heuristics`) read of the kernel they wrap
_TRITON_WRAPPED = frozenset({"arg_names", "params", "constexprs", "src", "signature", "cache", "repr"})


class _WrappedAbove(AnnotationError, AttributeError):
    """A Triton wrapper above @tilelink.overlap reading what only Triton's kernels have; an AttributeError too, so
    that a probe (`hasattr`) still finds no such attribute."""


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
        self.generated = generate_kept(text, _display_path(self.file), [Request(self.name, specs, options)])
        self.plan = self.generated.plans[0]
        self.check_waits = os.environ.get("TILELINK_CHECK_WAITS", "1") != "0"
        self._module: ModuleType | None = None
        self._launcher = None
        self.__doc__ = self.fn.__doc__
        self.__name__ = self.name

    def __getattr__(self, name: str) -> Any:
        # what a Triton wrapper reads of the function it wraps (`arg_names`, `fn`'s `run`...): one above
        # @tilelink.overlap that the build could not tell for one (imported from another module) lands here
        if name in _TRITON_WRAPPED:
            raise _WrappedAbove(
                f"kernel {self.__dict__.get('name', '?')!r}: a Triton wrapper above @tilelink.overlap reads "
                f"`{name}` of the overlapped kernel, which only Triton's own kernels have: it would launch the "
                f"kernel past TileLink's launch", file=self.__dict__.get("file", "<unknown>"),
                line=getattr(getattr(self.__dict__.get("fn"), "__code__", None), "co_firstlineno", None),
                hint="put @tilelink.overlap(...) above every Triton decorator: @tilelink.overlap, then "
                     "@triton.autotune / @triton.heuristics, then @triton.jit")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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

    @functools.cached_property
    def _int_fact_names(self) -> tuple[str, ...]:
        """The parameters the launch plan's row facts multiply, add or compare as ints (strides, steps, shifts,
        column bounds, divisors): each call refuses a float among them."""
        plan, names = self.plan.launch, set()
        for _, factors, _ in plan.row_scales:
            names |= set(factors)
        for _, factors, _, _ in plan.row_steps:
            names |= set(factors)
        for _, terms, _ in plan.row_shifts:
            names |= {f for _, factors in terms for f in factors}
        for _, terms, stride, _ in plan.row_bounds:
            names |= {f for _, factors in terms for f in factors} | {stride}
        for factors, divisor, _, _ in plan.row_multiples:
            names |= set(factors) | set(divisor.split(" * "))
        for _, block, step, _, _ in plan.column_ends:
            names |= set(block) | set(step)
        names |= {name for name, _ in plan.int_params}
        return tuple(sorted(n for n in names if n.isidentifier()))

    def grid_size(self, grid: Any, bound: dict, axis: int) -> int:
        """The rows of a kernel that reads one row a program and counts them nowhere: its grid's programs along
        ``axis``, the same under every autotuning configuration the call may run. A grid function or a heuristic that
        reads a gathered tensor is refused: it sees this rank's shard here and the gathered rows in Triton's launch."""
        said_grid = f"the gathered rows are counted by the grid (one row a program, along axis {axis})"
        if grid is None:
            raise LaunchError(
                f"{self.name}: {said_grid}, which this call does not give: launch it as `{self.name}[grid](...)`, or "
                f"pass size= to the annotation (an int parameter of the kernel holding the full row count)")
        from tilelink.rules.launch import metas

        withheld = {name: _Withheld(name) for name in self.plan.launch.tensors}
        counts: dict[int, str] = {}
        try:
            for meta, config in metas(self.kernel, {**bound, **withheld}):
                said = "" if config == "the call's arguments" else f" under the autotuning configuration {config}"
                values = {**self.defaults, **meta}
                found = grid
                if callable(grid):  # evaluated once here, so that a read of a gathered tensor is told apart
                    try:
                        found = grid(values)
                    except _ReadsGathered:
                        raise
                    except Exception:  # noqa: BLE001 - not evaluated: said below
                        found = None
                programs = _grid_of(found, values) if found is not None else None
                if programs is None:
                    raise LaunchError(
                        f"{self.name}: {said_grid}, but TileLink cannot evaluate the grid {grid!r}{said}: pass it as a "
                        f"tuple of ints or a function of the arguments, or pass size= to the annotation")
                counts.setdefault(programs[axis], said)
        except _ReadsGathered as read:
            raise LaunchError(
                f"{self.name}: {said_grid}, but the grid or a heuristic reads {read.args[0]!r}, which is this rank's "
                f"shard here and the gathered rows where Triton launches the kernel: compute the grid from int "
                f"arguments (`({read.args[0]}_rows,)`), or pass size= to the annotation") from None
        if len(counts) > 1:
            raise LaunchError(
                f"{self.name}: {said_grid}, but the grid launches "
                + ", ".join(f"{n} programs{said or ' as called'}" for n, said in counts.items())
                + ": pass size= to the annotation (an int parameter holding the full row count)")
        return next(iter(counts))

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

    def prepared(self, grid, args: tuple, kwargs: dict, tensors: tuple[int, ...]):
        """``self[grid](*args, **kwargs)`` made ready to launch again with other tensors at the positions ``tensors``
        of ``args``, every other argument the same: a function of those tensors that launches and returns ``True``,
        or returns ``False`` where the call must take ``self[grid]`` (a new world, a timed-out wait, a capture);
        ``None`` where every call does (:meth:`tilelink.rules.launch.Launcher.prepared`: a world of one). Make it after
        ``self[grid](*args, **kwargs)`` has run, and keep it for calls whose tensors have the same shapes, strides,
        dtypes and devices as ``args``'s (the caller's own key): nothing else of the call is checked again."""
        from tilelink.runtime import graphs

        names = tuple(self.params[i] for i in tensors)
        with graphs.kept(self.launcher.world().device):  # what it makes is kept for later calls
            return self.launcher.prepared(grid, self.bind(args, kwargs), names)

    def __getitem__(self, grid):
        def launch(*args: Any, **kwargs: Any):
            from tilelink.runtime import graphs

            launcher = self.launcher
            world = launcher.world()  # a new world starts clean
            if launcher.timed_out is not None:
                raise LaunchError(
                    f"{self.name}: an earlier call on this rank had a wait time out ({launcher.timed_out}). That "
                    f"call's results were not valid, and its channels' counts no longer match the other ranks' "
                    f"(a late notify still adds to them), so later calls could pass their waits too early: "
                    f"start the world again (tilelink.finalize(), then tilelink.init()) once the cause is fixed")
            bound = self.bind(args, kwargs)
            if world.world_size > 1 and self._heuristics:
                # evaluated as Triton's launch evaluates them: one that reads the values of a tensor TileLink
                # replaces (the gathered rows, in flight then) is refused, whatever the checks below read
                self._launch_metas(bound, launcher, grid)
            self._check_row_scales(bound, launcher, grid)
            self._check_stored_once(bound, launcher, grid)
            # a call may make its context, tables and prepared steps, kept for the later calls
            with self._remember_timeout(), graphs.kept(world.device):
                return launcher.launch(grid, bound)

        return launch

    def load(self, grid, *args: Any, **kwargs: Any) -> None:
        """Compile and load, on a GPU, the variant of the rewritten kernel that ``kernel[grid](*args, **kwargs)``
        launches, running nothing (a form of call that only a later capture takes: a capture cannot load a
        kernel). A call with the same shapes must have run before."""
        from tilelink.runtime import graphs

        with graphs.kept(self.launcher.world().device):  # it may make the context, kept for later calls
            self.launcher.load(grid, self.bind(args, kwargs))

    @functools.cached_property
    def defaults(self) -> dict[str, Any]:
        """The kernel's parameters that have a default (``STEP: tl.constexpr = 2``) and their defaults, read once: a
        call that leaves one out runs with its default, which the row-scale check and a split-K grid read too."""
        return {n: p.default for n, p in inspect.signature(self.fn).parameters.items()
                if p.default is not inspect.Parameter.empty}

    def _launch_metas(self, bound: dict, launcher, grid: Any) -> list[tuple[dict, str]]:
        """The meta-parameters of each configuration the call may run (:func:`tilelink.rules.launch.metas`), the
        heuristics evaluated on ``bound`` as Triton's launch evaluates them (:meth:`Launcher.as_launched`: the tensors
        the rewritten kernel is given in place of the annotated ones, where a grid function or a heuristic reads
        them). A heuristic that reads more of such a tensor than its layout (its values) refuses the call."""
        from tilelink.rules.launch import metas

        if not callable(grid) and not self._heuristics:
            return metas(self.kernel, bound)
        try:
            return metas(self.kernel, launcher.as_launched(bound, grid))
        except LaunchError as exc:
            raise LaunchError(f"{self.name}: {exc}") from None

    def _check_row_scales(self, bound: dict, launcher, grid: Any = None) -> None:
        """The rows a wait or notify covers are the offsets vector's, ``offs``; an access reads or writes the elements
        ``offs * scale`` (``offs[:, None] * stride_am``, ``x_ptr + offs * 2``). Both are the same rows only when the
        scale is the row stride of the buffer the rewritten kernel is given: the gathered rows or the partial sums,
        contiguous tensors of the argument's shape (the full size along the rows); and the address's scalar terms along
        dim 0 stay within a row (``+ D`` on a (M, D) tensor is the next row). The facts are the launch plan's
        (``row_scales``, ``row_shifts``). Checked on each call with more than one rank (alone, the kernel runs on the
        caller's tensors as written), under each autotuning configuration the call may run (a ``triton.Config``
        sets a constexpr the call does not pass). Along an inner dim (``dim >= 1``) the scalar terms may also step
        along the dims before the rows, by whole steps of the gathered buffer (the full size along the rows times a
        row's elements), and a computed term's factors (``row_steps``: ``b * stride_xb``) must be such a step, or, where
        the buffer's dims before the rows are all of size 1, blocks of the row that the computed values, bounded from
        ``grid`` (the call's), keep the access's whole read in (:meth:`_sequence_major`). The
        ``tile=`` proofs took every name as non-negative, and so did the proofs of a step's factors and of where a
        matmul-form advance's columns start: an int argument they read (``row_signs``) that is negative is refused,
        naming it and the access. A pointer a loop advances along the columns reads the columns ``[0, X)``
        of its row, ``X`` its mask's bound (``row_bounds``): ``X`` times the column stride's argument must be at most
        a row's elements."""
        plan = self.plan.launch
        if not (plan.row_scales or plan.row_shifts or plan.row_signs or plan.row_steps or plan.row_bounds
                or plan.row_multiples or plan.row_starts or plan.column_ends or plan.rotations or plan.int_params) \
                or launcher.world().world_size == 1:
            return
        # a kernel with only sign facts (and ints) is checked once per form of call: the values of the parameters they
        # name
        key = None
        if not (plan.row_scales or plan.row_shifts or plan.row_steps or plan.row_bounds or plan.row_multiples
                or plan.row_starts or plan.column_ends or plan.rotations) and self._sign_names is not None:
            values = tuple(bound.get(n) for n in self._sign_names)
            # by type too: 10.0 equals 10 (and hashes alike), and a float is refused where an int passed
            key = tuple((type(v), v) for v in values)
            if not all(v is None or isinstance(v, (int, float)) for v in values):
                key = None  # a tensor or another object (kept out of the record): checked every call
            elif key in self._signs_passed:
                return
        dim, full = plan.dim, None
        if dim > 0 and (plan.row_shifts or plan.row_steps):
            # rows along an inner dim: a step of the dim before them is the full size along the rows times a row
            try:
                full = launcher.size_of(bound, grid)
            except LaunchError:
                pass  # the launcher refuses the call, saying why
        for meta, config in self._launch_metas(bound, launcher, grid):
            # a parameter the call leaves out runs with its default (`STEP: tl.constexpr = 2`): compare that value
            values = {**self.defaults, **meta}
            said_config = "" if config == "the call's arguments" else f" under the autotuning configuration {config}"
            gathered = self.specs[0].kind == "all_gather"
            access, touches, waits = ("load", "reads", "wait") if gathered else ("store", "writes", "notify")
            floats = [n for n in self._int_fact_names if _is_float(values.get(n))]
            if floats:
                # the proofs computed with ints: a float the kernel casts (`tl.cast(stride, tl.int64)` truncates
                # 4.25 to 4) or compares with (`cols < n_cols` lets column 20 of rows of 20 through for 20.5) is
                # another value than the one each check below would read
                why = next((f"the `if` at {_display_path(self.file)}:{line} was read as one binding, its casts of "
                            f"{name} to int64 as keeping its value" for name, line in plan.int_params
                            if name == floats[0]), f"{floats[0]} an int (a row stride, a step, a column bound)")
                raise LaunchError(
                    f"{self.name}: argument {floats[0]!r} is {values[floats[0]]!r}{said_config}, not an int, but the "
                    f"rows and columns its accesses touch were proven to be those their {waits}s cover with {why}: "
                    f"pass an int")
            for name, line in plan.row_signs:
                value = values.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                    raise LaunchError(
                        f"{self.name}: argument {name!r} is {value}{said_config}, but the rows the {access} at "
                        f"{_display_path(self.file)}:{line} {touches} were proven to be those its {waits} covers with "
                        f"{name} taken as non-negative (in its tile=, where its columns start, or as a factor of a "
                        f"step it takes): a negative {name} can move them onto rows its {waits} does not cover; pass "
                        f"a non-negative {name}, or write the {access} so that no proof needs its sign (the rows it "
                        f"touches, {name} included, named in tile=; its columns started at a non-negative offset; its "
                        f"steps taken forward)")
            for factors, divisor, test, line in plan.row_multiples:
                self._check_multiple(factors, divisor, test, line, values, said_config)
            programs = _grid_of(grid, values)
            for value, line in plan.row_starts:
                self._check_start(value, line, values, programs, said_config, access, waits)
            for start, block, step, test, line in plan.column_ends:
                if self._holds(test, values):
                    self._check_column_end(start, block, step, line, values, programs, said_config)
            # the bindings of one index a launch compiles, checked together: the tiles they cover between them
            held: dict[tuple, list[tuple[str, str, int]]] = {}
            stands: dict[tuple, bool] = {}
            for index, tiles, others, test, line, required in plan.rotations:
                if self._holds(test, values):
                    group = (tiles, len([o for o in others.split(" ; ") if o]))
                    held.setdefault(group, []).append((index, others, line))
                    stands[group] = stands.get(group, False) or required
            for group, bindings in held.items():
                self._check_rotation(bindings, group[0], values, programs, said_config, stands[group])
            for tensor, factors, line in plan.row_scales:
                t = bound.get(tensor)
                if not (hasattr(t, "shape") and hasattr(t, "stride")) or len(t.shape) <= plan.dim:
                    continue  # not a tensor (a host descriptor: its rows are its offsets); the launcher says why
                scale = _product(factors, values)
                rows = _product(tuple(str(int(n)) for n in t.shape[plan.dim + 1:]), {})
                if scale is not None and scale != rows:
                    said = _said(factors, values)
                    buffer = "the gathered rows" if self.specs[0].kind == "all_gather" else "the partial sums"
                    if factors == ("1",):  # one element a row (`y_ptr + row`): the output must be a vector
                        raise LaunchError(
                            f"{self.name}: {tensor!r} is addressed one element a row at {_display_path(self.file)}:"
                            f"{line}, but the buffer TileLink passes as {tensor!r} ({buffer}, of the shape of the "
                            f"argument, {tuple(t.shape)}) has rows of {rows} elements, so the access would touch "
                            f"other rows than those its wait or notify covers: pass {tensor} of one element a row "
                            f"(shape (rows,) or (rows, 1))")
                    raise LaunchError(
                        f"{self.name}: the rows of {tensor!r} are addressed {scale} elements apart at "
                        f"{_display_path(self.file)}:{line} (its offsets times {said}{said_config}), but the buffer "
                        f"TileLink passes as {tensor!r} ({buffer}, "
                        f"contiguous, of the shape of the argument along its other dims, {tuple(t.shape)}) has its "
                        f"dim-{plan.dim} rows {rows} elements apart, so the access would touch other rows than those "
                        f"its wait or notify covers: pass a contiguous {tensor} and its own stride "
                        f"({tensor}.stride({plan.dim})), or view it so that one step along dim {plan.dim} is the "
                        f"kernel's scale (`x.view(-1, {scale})` for a 1-D `x_ptr + offs * {scale}`)")
            grouped: dict[tuple[str, int], list[tuple[tuple[str, ...], str]]] = {}
            for tensor, factors, computed, line in plan.row_steps:
                grouped.setdefault((tensor, line), []).append((factors, computed))
            for (tensor, line), steps in grouped.items():
                t = bound.get(tensor)
                if not hasattr(t, "shape") or len(t.shape) <= dim or full is None:
                    continue
                rows = _product(tuple(str(int(n)) for n in t.shape[dim + 1:]), {})
                outer = _product(tuple(str(int(n)) for n in t.shape[:dim]), {})
                if outer == 1 and self._sequence_major(tensor, line, steps, rows, full, dim, values, programs,
                                                       said_config):
                    continue
                for factors, computed in steps:
                    value = _product(factors, values)
                    if value is None or not value % (full * rows):
                        continue
                    said = _said(factors, values)
                    packed = "" if outer != 1 else (
                        f"; in this buffer, whose dims before dim {dim} are all of size 1, a step within the row "
                        f"passes only where the grid bounds `{computed}`, which it cannot here (pass the grid as a "
                        f"tuple or a function of the arguments, and compute the value from tl.program_id and "
                        f"parameters)")
                    raise LaunchError(
                        f"{self.name}: the address at {_display_path(self.file)}:{line} adds a value the kernel "
                        f"computes times {said}{said_config} ({value} elements) to {tensor!r}, but one step along the "
                        f"dims before dim {dim} of the buffer TileLink passes as {tensor!r} (contiguous, the full "
                        f"{full} rows along dim {dim} of {rows} elements each) is {full * rows} elements: the term "
                        f"moves the access along dim {dim}, onto other rows than those its wait or notify covers; pass "
                        f"the full tensor's stride of dim {dim - 1} ({full * rows} here), or add the rows to the "
                        f"offsets vector along dim {dim}{packed}")
                if grid is not None:
                    self._whole_steps(tensor, line, steps, rows * full, outer, dim, values, programs, said_config)
            for tensor, terms, stride, line in plan.row_bounds:
                # a pointer a loop advances along the columns reads the columns [0, X) of its row, X the mask's bound
                t = bound.get(tensor)
                if not hasattr(t, "shape") or len(t.shape) <= dim:
                    continue
                rows = _product(tuple(str(int(n)) for n in t.shape[dim + 1:]), {})
                known = [_product(factors, values) for _, factors in terms]
                step = int(stride) if stride.isdigit() else values.get(stride)  # `cols[None, :]`: a stride of 1
                step = int(step) if isinstance(step, bool) else step  # `* True` steps by 1, as the kernel computes
                if None in known or not isinstance(step, int):
                    continue  # a parameter that is not an int at this call: Triton refuses the call itself
                if step <= 0:
                    # the columns [0, X) walked backwards, or all at one place, lie before the row's first column or
                    # in other rows: only a forward column stride keeps them in the row the mask bounds
                    raise LaunchError(
                        f"{self.name}: the load or store at {_display_path(self.file)}:{line} walks the columns of "
                        f"{tensor!r} in its loop along argument {stride!r} = {step}{said_config}, which is not "
                        f"positive: TileLink bounds those columns by the row only when they walk forward from its "
                        f"first column (a negative stride reads the rows before, which its wait or notify does not "
                        f"cover); pass {stride!r} the stride of the columns in the row (positive, 1 for a contiguous "
                        f"{tensor!r})")
                last = sum(-v if negative else v for (negative, _), v in zip(terms, known, strict=True))
                if last * step > rows:
                    said = " + ".join(("-" if neg else "") + _said(factors, values) for neg, factors in terms)
                    literal = stride.isdigit()  # columns the address adds as they are (`cols[None, :]`)
                    raise LaunchError(
                        f"{self.name}: the load or store at {_display_path(self.file)}:{line} walks the columns of "
                        f"{tensor!r} up to the mask's bound {said} = {last}{said_config}, {last * step} "
                        + ("elements" if literal else f"elements at argument {stride!r} = {step} elements a column")
                        + ", but the rows of the buffer "
                        f"TileLink passes as {tensor!r} (contiguous, of the shape of the argument along its other "
                        f"dims, {tuple(t.shape)}) are {rows} elements long: the last steps touch the next rows, "
                        f"which its wait or notify does not cover; pass arguments that make the mask's bound at most "
                        f"{rows // step} (the row's length, `K` for a matmul's `a` of shape "
                        f"(M, K))" + ("" if literal else f", and {stride!r} the stride of the columns in the row"))
            for tensor, terms, line in plan.row_shifts:
                t = bound.get(tensor)
                if not hasattr(t, "shape") or len(t.shape) <= dim or dim > 0 and full is None:
                    continue
                rows = _product(tuple(str(int(n)) for n in t.shape[dim + 1:]), {})
                if any(_spanned(factors) for _, factors in terms):
                    self._check_span(tensor, terms, line, rows, values, programs, grid, said_config)
                    continue
                known = [_product(factors, values) for _, factors in terms]
                if None in known:
                    continue  # a parameter that is not an int at this call: Triton refuses the call itself
                shift = sum(-v if negative else v for (negative, _), v in zip(terms, known, strict=True))
                # along an inner dim, whole steps of the dims before it are not rows: what is left must stay in a row
                within = shift if dim == 0 else shift % (full * rows)
                if not 0 <= within < rows:
                    said = " + ".join(("-" if neg else "") + _said(factors, values) for neg, factors in terms)
                    if dim > 0:
                        raise LaunchError(
                            f"{self.name}: the address at {_display_path(self.file)}:{line} adds {shift} elements "
                            f"({said}{said_config}) to {tensor!r}, which in the buffer TileLink passes as {tensor!r} "
                            f"(contiguous, the full {full} rows along dim {dim} of {rows} elements each) moves it "
                            f"{within // rows} row{'' if within // rows == 1 else 's'} along dim {dim}: it touches "
                            f"other rows than those its wait or notify covers; scale an offset along dim {dim} by its "
                            f"stride in the offsets vector (`(start + tl.arange(0, BLOCK))[:, None] * stride_{dim}`), "
                            f"and one along another dim by that dim's stride parameter")
                    raise LaunchError(
                        f"{self.name}: the address at {_display_path(self.file)}:{line} adds {shift} elements ({said}"
                        f"{said_config}) to the rows of {tensor!r}, whose rows are {rows} elements long: it touches "
                        f"other rows than those its wait or notify covers; index those rows with an offsets vector of "
                        f"their own (`nxt = start + BLOCK + tl.arange(0, BLOCK)`, `x_ptr + nxt[:, None] * stride`), "
                        f"and give a descriptor a shape within the row (`shape=[M, D]` for rows of D elements)")
        if key is not None and len(self._signs_passed) < 1024:
            self._signs_passed.add(key)

    def _sequence_major(self, tensor: str, line: int, steps: list[tuple[tuple[str, ...], str]], rows: int, full: int,
                        dim: int, values: dict, programs: tuple[int, int, int] | None, said_config: str) -> bool:
        """Whether the steps of the access at ``line`` (``row_steps``) keep it within one row of a buffer whose dims
        before the rows are all of size 1, which has the dims the kernel steps packed into its row, sequence-major
        (sp_attention's ``(1, 1, S, B * H * D)``, ``off_z * stride_kz + off_hkv * stride_kh``): every element it
        touches, the values the kernel computes bounded from the grid (``off_z = tl.program_id(1) // HEADS`` below
        ``cdiv(batch * HEADS, HEADS)``) times their factors plus its own terms (``row_shifts``: a descriptor's whole
        read, a pointer's unmasked columns), lies in ``[0, rows)``. ``False`` where the grid cannot bound a value or
        the access has no terms of its own to place (the whole-step check judges it); refused where the bound reaches
        past the row."""
        plan = self.plan.launch
        known = [[(neg, _product(f, values)) for neg, f in terms]
                 for name, terms, at in plan.row_shifts if name == tensor and at == line]
        shifts = [sum(-v if neg else v for neg, v in terms) for terms in known if None not in [v for _, v in terms]]
        if programs is None or not shifts or len(shifts) != len(known):
            return False
        if 0 in programs:
            return True  # no program runs
        low, high = min(shifts), max(shifts)
        said = []
        for factors, computed in steps:
            value, span = _product(factors, values), _value_range(computed, values, programs)
            if value is None or span is None:
                return False
            low += min(span[0] * value, span[1] * value)
            high += max(span[0] * value, span[1] * value)
            said.append(f"`{computed}` in [{span[0]}, {span[1]}] times {_said(factors, values)}")
        if 0 <= low and high < rows:
            return True
        grid = "(" + ", ".join(map(str, programs)) + ")"
        raise LaunchError(
            f"{self.name}: the address at {_display_path(self.file)}:{line} steps {tensor!r} by values the kernel "
            f"computes, on the grid {grid}{said_config}: {'; '.join(said)}, so it reaches "
            f"{f'element {high} of a row' if high >= rows else f'{-low} elements before the start of a row'}, but the "
            f"buffer TileLink passes as {tensor!r} (contiguous, its dims before dim "
            f"{dim} all of size 1, the full {full} rows along dim {dim}) has rows of {rows} elements: the access "
            f"touches other rows than those its wait or notify covers; launch no more programs than the row holds "
            f"blocks (a grid of batch * heads along the axis the kernel divides by its heads), or pass the strides of "
            f"the row's packed dims")

    def _whole_steps(self, tensor: str, line: int, steps: list[tuple[tuple[str, ...], str]], step: int, outer: int,
                     dim: int, values: dict, programs: tuple[int, int, int] | None, said_config: str) -> None:
        """Refuse the steps of the access at ``line`` (``row_steps``, each a whole ``step`` of the dims before the rows
        at this call) unless the values the kernel computes, bounded from the grid, keep it in the buffer: together
        they must index one of the ``outer`` blocks of rows before dim ``dim`` (``b * stride_xb`` with ``b =
        tl.program_id(1)`` on a grid of more programs than the batch, or ``x_ptr - b * stride_xb``, reads outside the
        gathered rows, maybe another tensor's, which no wait covers)."""
        if programs is not None and 0 in programs:
            return  # no program runs
        low = high = 0
        said = []
        for factors, computed in steps:
            value = _product(factors, values)
            span = None if programs is None else _value_range(computed, values, programs)
            if value is None:
                return  # a parameter that is not an int at this call: Triton refuses the call itself
            if span is None:
                raise LaunchError(
                    f"{self.name}: the address at {_display_path(self.file)}:{line} steps {tensor!r} by `{computed}` "
                    f"times {_said(factors, values)}{said_config}, which TileLink cannot bound from the grid of this "
                    f"call: it cannot check that the access stays within the {outer} blocks of rows before dim {dim} "
                    f"of the buffer it passes as {tensor!r}, whose rows its wait or notify covers; compute the value "
                    f"from tl.program_id and parameters (`b = tl.program_id(1)`), and pass the grid as a tuple or a "
                    f"function of the arguments")
            blocks = value // step
            low += min(span[0] * blocks, span[1] * blocks)
            high += max(span[0] * blocks, span[1] * blocks)
            said.append(f"`{computed}` in [{span[0]}, {span[1]}] times {_said(factors, values)}")
        if 0 <= low and high < outer:
            return
        grid = "(" + ", ".join(map(str, programs or ())) + ")"
        raise LaunchError(
            f"{self.name}: the address at {_display_path(self.file)}:{line} steps {tensor!r} by values the kernel "
            f"computes, on the grid {grid}{said_config}: {'; '.join(said)}, so it reaches block "
            f"{high if high >= outer else low} of the dims before dim {dim}, but the buffer TileLink passes as "
            f"{tensor!r} holds {outer} of them ({step} elements each): the access touches memory outside the rows its "
            f"wait or notify covers; launch no more programs along that axis than the buffer holds blocks (the batch "
            f"size), and step forward from the tensor's start")

    def _check_start(self, value: str, line: int, values: dict, programs: tuple[int, int, int] | None,
                     said_config: str, access: str, waits: str) -> None:
        """A column vector of the access at ``line`` starts at the program's position ``value`` (``row_starts``),
        masked by the row's length from above only: refuse the call unless ``value``, over the programs of the grid, is
        never negative (a negative start reaches back into the row before, which the wait or notify does not cover)."""
        if programs is not None and 0 in programs:
            return  # no program runs
        # a start already bounded under the same values of the names it reads and the same grid passes again at no
        # cost (an uncaptured call checks its starts every time)
        seen = tuple(getattr(values.get(n), "value", values.get(n)) for n in _names_read(value))
        key = (value, seen, programs) if all(v is None or isinstance(v, int) for v in seen) else None
        if key is not None and key in self._starts_passed:
            return
        where = f"{_display_path(self.file)}:{line}"
        wraps: list[str] = []
        exact, bounds = _over_grid(value, values, programs, wraps)
        if exact is None and bounds is None and wraps:
            raise LaunchError(
                f"{self.name}: the columns of the {access} at {where} start at `{value}`{said_config}, whose step "
                f"`{wraps[0]}` may reach past what a 32-bit int holds over the grid of this call, where the kernel's "
                f"arithmetic wraps (to a negative start in the row before, which its {waits} does not cover); pass "
                f"arguments under which the position stays below 2**31, or cast to tl.int64 before it grows")
        if exact is None and bounds is None:
            raise LaunchError(
                f"{self.name}: the columns of the {access} at {where} start at `{value}`{said_config}, which TileLink "
                f"cannot bound over the grid of this call" + ("" if programs is not None else " (a grid it cannot "
                "evaluate: pass it as a tuple or a function of the arguments)") + f": a negative start would reach "
                f"into the row before, which its {waits} does not cover; compute the position from tl.program_id, "
                f"int arguments, tl.cdiv, min / max, +, -, * and // or % of a non-negative value by a positive one")
        grid = "(" + ", ".join(map(str, programs or ())) + ")"
        high = exact[2] if exact is not None else bounds[1]  # type: ignore[index]
        if high >= 1 << 31:
            raise LaunchError(
                f"{self.name}: the columns of the {access} at {where} start at `{value}`, which reaches {high} over "
                f"the grid {grid}{said_config}: past what a 32-bit int holds, where the kernel's arithmetic may wrap "
                f"to a negative start in the row before, which its {waits} does not cover; pass arguments under which "
                f"the position stays below 2**31")
        if exact is not None and exact[0] < 0:
            raise LaunchError(
                f"{self.name}: the columns of the {access} at {where} start at `{value}`, which is {exact[0]} for the "
                f"program {exact[1]} of the grid {grid}{said_config}: they reach back {-exact[0]} element(s), into the "
                f"row before, which its {waits} does not cover; pass arguments (and a grid) under which every program "
                f"starts its columns at 0 or past it")
        if bounds is not None and bounds[0] < 0:
            why = " (a grid too large to evaluate each program)" if programs is not None and math.prod(
                programs) > _EXACT_PROGRAMS else ""
            raise LaunchError(
                f"{self.name}: the columns of the {access} at {where} start at `{value}`, which TileLink can bound "
                f"over the grid {grid}{said_config} only from {bounds[0]} up{why}: they may reach back into the row "
                f"before, which its {waits} does not cover; pass arguments "
                f"(and a grid) under which the position cannot be negative, or compute it so that its form shows it "
                f"non-negative (program ids, parameters, +, *, //, %, tl.cdiv, minima)")
        if key is not None and len(self._starts_passed) < 4096:
            self._starts_passed.add(key)

    def _check_stored_once(self, bound: dict, launcher, grid: Any) -> None:
        """Each notify of a reduction counts what its store wrote, so the channels are complete only if no element is
        stored twice: refuse a call whose grid makes two programs (or two steps of a program's tile loop) store the
        same elements (``stored_tiles``; a persistent kernel launched with more programs than its loop's step, a
        grid axis the store's address does not read, a position taken modulo the tiles' count), evaluated for each
        program and step of the grid. Checked on each call with more than one rank, once per grid and values of the
        names the tiles read."""
        tiles = getattr(self.plan.launch, "stored_tiles", ())
        if not tiles or launcher.world().world_size == 1:
            return
        size, width = launcher.size_of(bound, grid), self._row_width(bound, launcher)
        # every name a tile's fields read, the elements it stores per row too: a call passes again at no cost only
        # where they and the output's row are as at a call that passed
        names = sorted({n for tile in tiles for x in (*tile[:5], *tile[6:]) for n in _names_read(x)})
        for meta, config in self._launch_metas(bound, launcher, grid):
            values = {**self.defaults, **meta}
            said_config = "" if config == "the call's arguments" else f" under the autotuning configuration {config}"
            programs = _grid_of(grid, values)
            seen = tuple(tuple(v.block_shape) if hasattr(v, "block_shape") else getattr(v, "value", v)
                         for v in (values.get(n) for n in names))
            key = _tiles_key(programs, (size, width), seen)
            if key is not None and key in self._tiles_passed:
                continue
            tensor = self.specs[0].tensors[0]
            if programs is None:
                raise LaunchError(
                    f"{self.name}: TileLink cannot evaluate the grid of this call{said_config}, so it cannot check "
                    f"that no two programs store the same elements of {tensor!r} (each notify counts what its store "
                    f"wrote: an element stored twice completes its channel early): pass the grid as a tuple of ints or "
                    f"a function of the arguments")
            if 0 in programs:
                continue
            if math.prod(programs) > _TILES_CHECKED:
                raise LaunchError(
                    f"{self.name}: the grid {programs}{said_config} has {math.prod(programs)} programs, more than the "
                    f"{_TILES_CHECKED} whose tiles TileLink checks one by one for elements of {tensor!r} stored twice "
                    f"(each notify counts what its store wrote: an element stored twice completes its channel early); "
                    f"launch fewer programs: larger tiles, or a persistent grid (`grid = (NUM_SMS,)`) whose programs "
                    f"loop over the tiles")
            atomic = getattr(self.plan.launch, "atomic_axes", None)
            if atomic is not None and not self.plan.launch.adds(values):
                atomic = None  # this configuration stores (`if SPLIT_K == 1: tl.store(...)`)
            splits = () if atomic is None else tuple(a for a in range(3) if a not in atomic)
            found = _stored_twice(tiles, values, programs, size, splits)
            if found is not None and found[0]:
                raise LaunchError(
                    f"{self.name}: on the grid {programs}{said_config}, {found[1]} of {tensor!r}: each notify counts "
                    f"what its store wrote, so an element stored twice completes its channel while other tiles of it "
                    f"are still unstored, and the reduction would read them; launch one program per tile (a "
                    f"persistent kernel: at most as many programs as its tile loop's step, `grid = (min(NUM_SMS, "
                    f"tiles),)`), with every grid axis read by the store's position")
            if found is not None:
                raise LaunchError(
                    f"{self.name}: on the grid {programs}{said_config}, {found[1]}: it cannot check that no two "
                    f"programs store the same elements of {tensor!r} (each notify counts what its store wrote, so an "
                    f"element stored twice completes its channel early); compute the tile's position from "
                    f"tl.program_id, one tile loop's target and int arguments, with +, -, *, // and % of non-negative "
                    f"values, tl.cdiv, min / max, and tiles of one height")
            short = _unstored(tiles, values, programs, size, width, tensor) if width is not None and atomic is None \
                else None
            if short is not None:
                raise LaunchError(
                    f"{self.name}: on the grid {programs}{said_config}, {short}: the reduction waits "
                    f"for every element of each row, so this call's waits would run until they time out. "
                    f"{_UNSTORED_HINT}")
            if key is not None and len(self._tiles_passed) < 4096:
                self._tiles_passed.add(key)

    def _row_width(self, bound: dict, launcher) -> int | None:
        """The elements of a row of the reduced output, whose rows are its first dim (a 2-D tensor; a 1-D one has
        rows of one element): what each row's channel counts to; ``None`` otherwise (no check of the columns
        stored)."""
        if getattr(self.specs[0], "dim", 0) != 0:
            return None
        from tilelink.rules.launch import described

        out = described(bound.get(self.specs[0].tensors[0]))
        shape = getattr(out, "shape", None)
        if shape is not None and len(shape) == 1:
            return 1
        return int(shape[1]) if shape is not None and len(shape) == 2 else None

    @functools.cached_property
    def _tiles_passed(self) -> set[tuple]:
        """The grids, sizes and values of the names the stored tiles read, under which a call passed
        :meth:`_check_stored_once`."""
        return set()

    @functools.cached_property
    def _starts_passed(self) -> set[tuple]:
        """The column starts (``row_starts``), with the values of the names they read and the grid, that a call
        bounded and passed."""
        return set()

    def _check_span(self, tensor: str, terms, line: int, rows: int, values: dict,
                    programs: tuple[int, int, int] | None, grid: Any, said_config: str) -> None:
        """A way of an access's terms along the rows (``row_shifts``, dim 0) of which one or more is a term a loop
        moves, written out with the loop as its range (``(offs_ks * stride_as_k)`` as ``((tl.range(0, tl.cdiv(K,
        BLOCK_K), 1, loop=L) * BLOCK_K // group_k) * stride_as_k)``): refuse the call unless their sum, bounded over
        every step of the loop and every program of ``grid``, lies within a row of ``rows`` elements. A bound
        TileLink cannot find (a grid it cannot evaluate, a step that may wrap its int width) refuses the call too."""
        low = high = 0
        for negative, factors in terms:
            if _spanned(factors):
                # a term that reads no program id is bounded by the loop alone, whatever the grid
                over = programs if programs is not None or "program" in factors[0] else (1, 1, 1)
                found = _value_bounds(factors[0], values, over) if over is not None and 0 not in over else None
                if found is None:
                    raise LaunchError(
                        f"{self.name}: the address at {_display_path(self.file)}:{line} adds "
                        f"`{_unwrapped(factors[0])}` to the rows of {tensor!r}, which TileLink bounds at each call "
                        f"over the loop and the grid, but cannot here{said_config}"
                        + ("" if programs is not None else " (a grid it cannot evaluate: pass it as a tuple or a "
                           "function of the arguments)")
                        + ": the access may touch other rows than those its wait or notify covers; pass int "
                          "arguments under which the term stays within its int width, or add the term to a column "
                          "vector masked by the row's length")
                lo, hi = found
            else:
                value = _product(factors, values)
                if value is None:
                    return  # a parameter that is not an int at this call: Triton refuses the call itself
                lo = hi = value
            low, high = (low - hi, high - lo) if negative else (low + lo, high + hi)
        if 0 <= low and high < rows:
            return
        said = " + ".join(("-" if neg else "") + (f"`{_unwrapped(f[0])}`" if _spanned(f) else _said(f, values))
                          for neg, f in terms)
        raise LaunchError(
            f"{self.name}: the address at {_display_path(self.file)}:{line} adds {said} to the rows of {tensor!r}, "
            f"from {low} to {high} elements over the steps of its loop and the programs of the grid {grid}"
            f"{said_config}, but the rows of the buffer TileLink passes as {tensor!r} are {rows} elements long: it "
            f"touches other rows than those its wait or notify covers; pass arguments under which the term stays "
            f"within [0, {rows}) (a row's length, the scale groups of a row for a scale tensor)")

    def _check_column_end(self, start: str, block: tuple[str, ...], step: tuple[str, ...], line: int, values: dict,
                          programs: tuple[int, int, int] | None, said_config: str) -> None:
        """An unmasked walk of whole blocks (``column_ends``) reads ``block`` columns from ``start`` plus a multiple of
        ``step`` on each step of its loop: refuse the call unless ``start + block <= step`` on every program of the
        grid, so that the last step ends at the row's last column at the latest (``triton.ops.matmul``'s ``pid_z *
        BLOCK_K`` over a grid of ``SPLIT_K`` along its split axis)."""
        width, moves = _product(block, values), _product(step, values)
        if width is None or moves is None or (programs is not None and 0 in programs):
            return  # a parameter that is not an int at this call (Triton refuses it), or no program runs
        exact, bounds = _over_grid(start, values, programs)
        high = exact[2] if exact is not None else bounds[1] if bounds is not None else None
        if high is not None and high + width <= moves:
            return
        where = f"{_display_path(self.file)}:{line}"
        said = f"reads {_said(block, values)} columns a step from `{start}` without a mask, moving by " \
               f"{_said(step, values)}{said_config}"
        if high is None:
            raise LaunchError(
                f"{self.name}: the load at {where} {said}; TileLink cannot bound that start over the grid of this call"
                + ("" if programs is not None else " (a grid it cannot evaluate: pass it as a tuple or a function of "
                   "the arguments)") + ": a start past the step's end reads past the row, into rows the wait does not "
                   "cover; compute the start from tl.program_id and the arguments as passed")
        grid = "(" + ", ".join(map(str, programs or ())) + ")"
        raise LaunchError(
            f"{self.name}: the load at {where} {said}: over the grid {grid} the start reaches {high}, so that "
            f"program's columns end at {high + width}, past the {moves} columns a step moves, and its last step reads "
            f"past the row, into rows its wait does not cover; launch a grid under which every program's columns "
            f"start at {moves - width} at most (as many programs along the split axis as the split count)")

    def _check_multiple(self, factors: tuple[str, ...], divisor: str, test: str, line: int, values: dict,
                        said_config: str) -> None:
        """A divisibility fact of a ``tile=`` proof or of a walk along a row without a column mask
        (``row_multiples``): the product of ``factors`` must be a multiple of ``divisor`` where the call's arguments
        make the compile-time ``test`` hold (the load is compiled only then). A test the host cannot evaluate is taken
        as held."""
        if not self._holds(test, values):
            return
        divisors = tuple(divisor.split(" * "))
        dividend, by = _product(factors, values), _product(divisors, values)
        if dividend is None or by is None:
            return  # a parameter that is not an int at this call: Triton refuses the call itself
        if by > 0 and dividend % by == 0:
            return
        product = " * ".join(factors)
        under = f" (the load is compiled where `{test}` holds, as it does here)" if test else ""
        said = _said(factors, values) + (f" = {dividend}" if len(factors) > 1 else "")
        reduced = self.plan.rule in ("reduce_scatter", "all_reduce")
        covers = ("columns of this rank's slice of K, whose sum over the ranks is the kernel's" if reduced else
                  "rows its wait covers")
        past = ("columns past this rank's slice of K, which the sum over the ranks would add" if reduced else
                "rows its wait does not cover")
        raise LaunchError(
            f"{self.name}: the load at {_display_path(self.file)}:{line} reads {covers} only with {product} a "
            f"multiple of {divisor}{under}: its loop steps by {divisor} (rows from its tile='s first row, or columns "
            f"it reads without a mask), and its last block ends inside them only then; here {said} and "
            f"{_said(divisors, values)}{said_config}, so its last block can read past them, {past}; pass arguments "
            f"that make {product} a multiple of {divisor}" + (f", or ones under which `{test}` does not hold" if test
                                                            else "") + (
                f", or mask the loads along K (`mask=offs_k[None, :] < K - k * {divisor}`, `other=0.0`)" if reduced
                else ""))

    def _check_rotation(self, bindings: list[tuple[str, str, int]], tiles: str, values: dict,
                        programs: tuple[int, int, int] | None, said_config: str, required: bool = False) -> None:
        """The tile order rotates a tile index among ``tiles`` tiles; ``bindings`` are its bindings a launch of these
        values compiles, each ``(its value over program ids and the arguments, the program's other coordinates there
        joined by " ; ", its line)``: each program then computes another tile of the same others. The programs compute
        the kernel's own tiles only where, at each of the others the grid gives, the index takes every tile of ``[0,
        tiles)`` or none, over all its bindings together (a persistent kernel's main tile loop and the loop over its
        last wave's pieces): refuse a call whose grid takes some and not all (a grid shorter than the tiles, by rows or
        by part of one; a persistent kernel's tile loop on fewer programs than its step, each program's index read at
        each step of the loop). A grid larger than ``_EXACT_PROGRAMS`` programs, or a value TileLink does not
        evaluate, is not checked, unless the rotation stands on the check (``required``: a coordinate it groups by is
        no exact pair of the index's), which refuses such a call."""
        import numpy as np

        index, others, line = bindings[0]
        lines = ", ".join(str(n) for n in sorted({b[2] for b in bindings}))

        def unread(why: str) -> None:
            if required:
                raise LaunchError(
                    f"{self.name}: the tile order rotates the tile index bound at {_display_path(self.file)}:{lines} "
                    f"(`{index}`) at the program's other coordinates `{others}`, which it takes for the mapping's "
                    f"only where each call's grid gives the index every tile at each of them, but {why}"
                    f"{said_config}: pass order=\"mesh\" to keep the kernel's own order")

        if programs is None or 0 in programs or math.prod(programs) > _EXACT_PROGRAMS:
            unread("this call's grid cannot be read" if programs is None or 0 in programs else
                   f"this call's grid of {math.prod(programs)} programs is more than the {_EXACT_PROGRAMS} it reads")
            return
        key = (tuple(bindings), tiles, programs, tuple(sorted(
            (n, getattr(v, "value", v)) for n, v in values.items() if isinstance(getattr(v, "value", v), int))))
        if key in self._rotations_passed:
            return  # the same grid and the same values: checked already
        tables, n = [], None
        for index, others, _line in bindings:
            dom = _PerProgram(programs)
            sources = (tiles, index, *(o for o in others.split(" ; ") if o))
            parts = [_evaluate(x, values, dom) for x in sources]
            if any(p is None for p in parts) and "tl.range(" in " ".join(sources):
                # a persistent kernel's tile loop (`for tile_id in tl.range(start_pid, num_tiles, NUM_SMS)`): each
                # program's index at each step of the loop; a grid shorter than the loop's step leaves tiles out
                dom, parts = _each_step(sources, values, programs)
                if dom.loops and dom.steps is None:
                    n = n if n is not None else int(np.max(_evaluate(tiles, values, _PerProgram(programs)) or 0))
                    continue  # the loops run no step: no program computes a tile here
            if any(p is None for p in parts):
                unread("TileLink cannot evaluate them over this call's grid and arguments (a value past its type, a "
                       "`//` or `%` of a negative one, or loops of more steps than it evaluates)")
                return
            count, found, *coords = parts
            n = int(np.max(count))
            shape = np.broadcast_shapes(*(np.shape(x) for x in parts))
            tables.append(np.stack([np.broadcast_to(x, shape).ravel() for x in (*coords, found)], axis=1))
        if not tables or n is None:
            return
        table = np.concatenate(tables)
        table = np.unique(table[(table[:, -1] >= 0) & (table[:, -1] < n)], axis=0)
        groups, taken = np.unique(table[:, :-1], axis=0, return_counts=True)
        short = np.flatnonzero(taken != n)
        if not short.size:
            self._rotations_passed.add(key)
            if len(self._rotations_passed) > 64:
                self._rotations_passed.pop()
            return
        where = groups[short[0]]
        taken_there = table[(table[:, :-1] == where).all(axis=1), -1]
        missing = int(np.setdiff1d(np.arange(n), taken_there)[0])
        index, others, _ = bindings[0]
        names = [o for o in others.split(" ; ") if o]
        # a coordinate read over a loop's range is left out: its source is TileLink's, not the kernel's
        at = ", ".join(f"`{o}` = {int(v)}" for o, v in zip(names, where, strict=True)
                       if "tl.range(" not in o
                       and not ((axis := re.fullmatch(r"tl\.program_id\((\d)\)", o)) and programs[int(axis[1])] == 1))
        grid = "(" + ", ".join(map(str, programs)) + ")"
        looped = any("tl.range(" in b[0] for b in bindings)
        shown = "" if looped or len(bindings) > 1 else f" (`{index}`)"
        over = " over the steps of its tile loops" if looped else ""
        covers = "every tile (a tile loop: at least as many programs as its step, or as its tiles)" if looped else \
            "every tile"
        raise LaunchError(
            f"{self.name}: the tile order rotates the tile index bound at {_display_path(self.file)}:{lines}{shown} "
            f"among its {n} tiles{said_config}, but the grid {grid} gives it {taken_there.size} of them{over}"
            f"{f' where {at}' if at else ''} (not tile {missing}): rotated, its programs would compute other tiles "
            f"than the kernel as written; launch a grid that covers {covers}, or pass order=\"mesh\" to keep the "
            f"kernel's own order")

    @functools.cached_property
    def _rotations_passed(self) -> set:
        """The rotations, grids and values :meth:`_check_rotation` found covering every tile."""
        return set()

    def _holds(self, test: str, values: dict) -> bool:
        """Whether the call's arguments ``values`` make the compile-time ``test`` of a row fact hold (the access is
        compiled only then); "" always holds, and so does a test the host cannot evaluate (the fact is checked)."""
        if not test:
            return True
        compiled = self._tests.get(test)
        if compiled is None:
            compiled = self._tests[test] = compile(test, "<test>", "eval")
        env = {n: getattr(values[n], "value", values[n]) for n in compiled.co_names if n in values}
        try:
            return bool(eval(compiled, {"__builtins__": {}}, env))  # noqa: S307 - the kernel's own test
        except Exception:  # noqa: BLE001 - not decided here: the fact is checked
            return True

    @functools.cached_property
    def _tests(self) -> dict:
        """The compile-time tests of the launch plan's ``row_multiples``, compiled once."""
        return {}

    @functools.cached_property
    def _heuristics(self) -> bool:
        """Whether a ``triton.heuristics`` wraps the kernel (read once)."""
        from tilelink.rules.launch import has_heuristics

        return has_heuristics(self.kernel)

    @functools.cached_property
    def _sign_names(self) -> tuple[str, ...] | None:
        """The parameters of the launch plan's ``row_signs`` and ``int_params``, whose values key the calls already
        checked; ``None`` when a ``triton.heuristics`` wrapper may compute one of them from other arguments (checked
        every call)."""
        if self._heuristics:
            return None
        plan = self.plan.launch
        return tuple(dict.fromkeys(n for n, _ in (*plan.row_signs, *plan.int_params)))

    @functools.cached_property
    def _signs_passed(self) -> set[tuple]:
        """The values of ``_sign_names`` of the calls whose signs were checked and passed."""
        return set()

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


class _ReadsGathered(Exception):  # noqa: N818 - a read, said in the launch's refusal
    """A grid function or heuristic read a gathered tensor (:meth:`OverlappedKernel.grid_size`)."""


class _Withheld:
    """A gathered tensor as a grid function sees it while the rows are counted from the grid: any read of it raises
    :class:`_ReadsGathered` (the function would see the shard here, the gathered rows in Triton's launch)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        raise _ReadsGathered(object.__getattribute__(self, "_name"))

    def _read(self, *_args):
        raise _ReadsGathered(self._name)

    __getitem__ = __len__ = __bool__ = __int__ = __index__ = __iter__ = _read


def _is_float(value: Any) -> bool:
    """A real number that is not an int (a Python or numpy float; a bool is an int)."""
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)


def _product(factors: tuple[str, ...], values: dict[str, Any]) -> int | None:
    """The product of a row fact's ``factors`` (int literals and parameter names) with the parameters' ``values``;
    ``None`` when one of them is not an int there. A bool is its int, as the kernel computes with it (`row * True` is
    `row`): Triton takes it as a 1-bit int, so it must be checked as one."""
    product = 1
    for f in factors:
        value = int(f) if f.isdigit() else values.get(f)
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int):
            return None
        product *= value
    return product


def _unwrapped(source: str) -> str:
    """``source`` without the parentheses around the whole of it, as many pairs as there are."""
    while source.startswith("(") and source.endswith(")"):
        depth = 0
        for i, c in enumerate(source):
            depth += c == "("
            depth -= c == ")"
            if depth == 0 and i < len(source) - 1:
                return source  # `(a) * (b)`: the first pair closes before the end
        source = source[1:-1]
    return source


def _spanned(factors: tuple[str, ...]) -> bool:
    """A term of ``row_shifts`` that is an expression over a loop's range, bounded at each call, not a product."""
    return len(factors) == 1 and factors[0].startswith("(")


def _grid_of(grid: Any, values: dict[str, Any]) -> tuple[int, int, int] | None:
    """The programs along each axis of a launch's ``grid`` (a tuple, or a function of the arguments by name that Triton
    evaluates on them), ``None`` where they are not ints."""
    try:
        found = grid(values) if callable(grid) else grid
        found = tuple(found) + (1,) * (3 - len(found))
    except Exception:  # noqa: BLE001 - not known here: the checks that need it do not pass on it
        return None
    try:  # ints, numpy's too
        if any(isinstance(n, bool) for n in found):
            return None
        found = tuple(operator.index(n) for n in found)
    except TypeError:
        return None
    return found if len(found) == 3 else None  # type: ignore[return-value]


def _value_range(source: str, values: dict[str, Any], programs: tuple[int, int, int]) -> tuple[int, int] | None:
    """The least and the largest value of the kernel's expression ``source`` over a launch of ``programs`` programs:
    exact where the grid is small enough to evaluate every program (:func:`_least_program`), else bounded by
    :func:`_value_bounds`. ``None`` where neither can read it."""
    exact = _least_program(source, values, programs)
    if exact is not None:
        return exact[0], exact[2]
    return _value_bounds(source, values, programs)


#: the most programs whose values :func:`_least_program` evaluates one by one (as one array)
_EXACT_PROGRAMS = 1 << 20


def _over_grid(source: str, values: dict[str, Any], programs: tuple[int, int, int] | None,
               wraps: list[str] | None = None) -> tuple[tuple[int, tuple[int, int, int], int] | None,
                                                        tuple[int, int] | None]:
    """The values of the kernel's expression ``source`` over a launch of ``programs`` programs: exactly, computed for
    each program (:func:`_least_program`), or else bounded operand by operand (:func:`_value_bounds`, ``wraps`` as
    there); each ``None`` where not known (no grid to evaluate)."""
    exact = None if programs is None else _least_program(source, values, programs)
    bounds = None if programs is None or exact is not None else _value_bounds(source, values, programs, wraps)
    return exact, bounds


def _least_program(source: str, values: dict[str, Any],
                   programs: tuple[int, int, int]) -> tuple[int, tuple[int, int, int], int] | None:
    """The least value of the kernel's expression ``source`` over every program of a launch of ``programs``, the first
    program that takes it and the largest value, computed for each program (``pid - (pid // n) * n`` is never negative,
    which a bound of each operand alone cannot tell). ``None`` where the grid is larger than ``_EXACT_PROGRAMS`` or
    :func:`_evaluate` cannot read the expression (a loop's range among them: its values are bounded by
    :func:`_value_bounds`)."""
    import numpy as np

    if math.prod(programs) > _EXACT_PROGRAMS or 0 in programs:
        return None
    found = _evaluate(source, values, _PerProgram(programs))
    if found is None:
        return None
    full = np.broadcast_to(found, programs)
    at = np.unravel_index(int(np.argmin(full)), programs)
    return int(full[at]), tuple(int(i) for i in at), int(np.max(full))  # type: ignore[return-value]


def _int_cast(node: ast.Call) -> tuple[ast.expr, int] | None:
    """The value and the width of the signed int ``x.to(tl.int32)`` / ``x.to(tl.int64)`` or ``tl.cast(x, tl.int64)``
    casts to (a value that fits keeps it); ``None`` for any other call or cast (``tl.int8`` wraps, an unsigned one
    changes a negative value's sign, ``bitcast=True`` reinterprets the bits)."""
    func = node.func
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr == "to":
        value, rest = func.value, list(node.args)
    elif func.attr == "cast" and isinstance(func.value, ast.Name) and func.value.id == "tl" and node.args:
        value, rest = node.args[0], list(node.args[1:])
    else:
        return None
    rest += [k.value for k in node.keywords if k.arg == "dtype"]
    if len(rest) != 1 or any(k.arg != "dtype" for k in node.keywords):
        return None
    target = rest[0]
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "tl":
        width = {"int32": 32, "int64": 64}.get(target.attr)
        return None if width is None else (value, width)
    return None


def _value_bounds(source: str, values: dict[str, Any], programs: tuple[int, int, int],
                  wraps: list[str] | None = None) -> tuple[int, int] | None:
    """The least and the largest value of the kernel's expression ``source`` over a launch of ``programs`` programs,
    each operand bounded on its own (``tl.program_id(a)`` in ``[0, programs[a])``, a loop's ``tl.range(a, b, step)``
    any of its values); ``None`` where :func:`_evaluate` cannot read it (``wraps`` gets the step that may leave its
    int width, if that is why)."""
    return _evaluate(source, values, _Interval(programs), wraps)


class _Interval:
    """The values of :func:`_evaluate`: ``(least, largest)`` over the grid, each operand's on its own."""

    def __init__(self, programs: tuple[int, int, int]) -> None:
        self.programs = programs

    def const(self, v: int):
        return v, v

    def least(self, x) -> int:
        return x[0]

    def largest(self, x) -> int:
        return x[1]

    def neg(self, x):
        return -x[1], -x[0]

    def add(self, a, b):
        return a[0] + b[0], a[1] + b[1]

    def sub(self, a, b):
        return a[0] - b[1], a[1] - b[0]

    def mul(self, a, b):
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)

    def floordiv(self, a, b):  # a >= 0, b > 0
        return a[0] // b[1], a[1] // b[0]

    def mod(self, a, b):  # a >= 0, b > 0
        return (a[0], a[1]) if a[1] < b[0] else (0, b[1] - 1)

    def cdiv(self, a, b):  # a >= 0, b > 0
        return -(-a[0] // b[1]), -(-a[1] // b[0])

    def pick(self, a, b, least: bool):
        f = min if least else max
        return f(a[0], b[0]), f(a[1], b[1])

    def program_id(self, axis: int):
        return 0, self.programs[axis] - 1

    def loop(self, a, b, step, key=None):
        # any value of a loop `for v in range(a, b, step)` of a positive step: from the least `a` to below the largest
        # `b` (a loop that runs no step has no value to bound)
        return None if step[0] <= 0 else (a[0], max(a[0], b[1] - 1))


class _PerProgram(_Interval):
    """The values of :func:`_evaluate`: each program's, an int64 array over the grid."""

    def const(self, v: int):
        import numpy as np

        return np.int64(v)

    def least(self, x) -> int:
        import numpy as np

        return int(np.min(x))

    def largest(self, x) -> int:
        import numpy as np

        return int(np.max(x))

    def neg(self, x):
        return -x

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def mul(self, a, b):
        return a * b

    def floordiv(self, a, b):
        return a // b

    def mod(self, a, b):
        return a % b

    def cdiv(self, a, b):
        return -(-a // b)

    def pick(self, a, b, least: bool):
        import numpy as np

        return (np.minimum if least else np.maximum)(a, b)

    def program_id(self, axis: int):
        import numpy as np

        shape = [1, 1, 1]
        shape[axis] = self.programs[axis]
        return np.arange(self.programs[axis], dtype=np.int64).reshape(shape)

    def loop(self, a, b, step, key=None):
        return None  # one value per program: a loop has several


class _PerStep(_PerProgram):
    """The values of :func:`_evaluate`: each program's at each step of the loops the expression reads (a persistent
    kernel's tile loop, loops inside it), each loop named by its line (``tl.range(a, b, step, loop=L)``). Without
    ``steps``: int64 arrays over ``(step of the last loop found, ..., step of the first, axis 0, axis 1, axis 2)``,
    which find the loops (``loops``: their lines, in the order found; ``valid``: the steps that run), though an
    expression defined only where its loop runs (a grouped position divides by what is left of the tiles) may not be
    read there; with ``steps`` (the indices of the steps that run along those axes, as ``np.nonzero`` gives them, and
    the loops they are of): 1-D arrays over those steps alone. A loop it cannot name, a step that is not one positive
    value, or more values than ``_EXACT_PROGRAMS`` are not read."""

    def __init__(self, programs: tuple[int, int, int], steps: tuple | None = None, loops: tuple = ()) -> None:
        import numpy as np

        super().__init__(programs)
        self.steps = steps
        self.loops: list = list(loops)
        self.found: dict = {}  # each loop's values, by its line
        self.valid = np.ones((1, 1, 1), dtype=bool)

    def program_id(self, axis: int):
        import numpy as np

        if self.steps is not None:
            return self.steps[len(self.loops) + axis]
        shape = [1, 1, 1]
        shape[axis] = self.programs[axis]
        return np.arange(self.programs[axis], dtype=np.int64).reshape(shape)

    def loop(self, a, b, step, key=None):
        import numpy as np

        if key is None or int(np.min(step)) != int(np.max(step)) or int(np.min(step)) <= 0:
            return None
        step = int(np.min(step))
        if key in self.found:
            return self.found[key]
        if self.steps is not None:
            if key not in self.loops:
                return None
            values = a + self.steps[len(self.loops) - 1 - self.loops.index(key)] * step
            if not bool(np.all(values < b)):
                return None
            self.found[key] = values
            return values
        count = max(1, int(np.max(-(-(b - a) // step))))
        shape = (count, *np.broadcast_shapes(np.shape(a), np.shape(b), self.valid.shape))
        if math.prod(shape) > _EXACT_PROGRAMS:
            return None
        values = a + np.arange(count, dtype=np.int64).reshape((count,) + (1,) * (len(shape) - 1)) * step
        self.loops.append(key)
        self.found[key] = values
        self.valid = self.valid & (values < b)
        return values


#: a value :func:`_evaluate` holds as Triton does: a compile-time constant (literals and constexpr arguments, folded
#: as Python ints), or a tensor of 32 or 64 bits
_CONST = 0


#: the comparisons a test of the launch's checks reads, as Python's operators
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
            ast.GtE: operator.ge}


def _constant_test(node: ast.AST, values: dict[str, Any]) -> bool | None:
    """The truth of a test made of the call's constants alone (bool and int literals, the values of arguments in
    ``values``, a constexpr's too, ``not``, ``and``, ``or``, comparisons, ``+``, ``-``, ``*``, ``//``, ``%``) where
    Python reads it as Triton does (no ``//`` or ``%`` of a negative value, every value inside 32 bits); ``None`` for
    anything else (a program id, a loop target, a call), which may differ between programs."""
    compare = _COMPARE
    arith = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
             ast.Mod: operator.mod}

    def value(n: ast.AST):
        if isinstance(n, ast.Constant) and isinstance(n.value, (bool, int)):
            return n.value
        if isinstance(n, ast.Name) and n.id in values:
            v = getattr(values[n.id], "value", values[n.id])
            return v if isinstance(v, (bool, int)) else None
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            inner = value(n.operand)
            return None if inner is None else not inner
        if isinstance(n, ast.BoolOp):
            parts = [value(v) for v in n.values]
            if any(p is None for p in parts):
                return None
            return all(parts) if isinstance(n.op, ast.And) else any(parts)
        if isinstance(n, ast.Compare) and all(type(op) in compare for op in n.ops):
            sides = [value(x) for x in (n.left, *n.comparators)]
            if any(x is None for x in sides):
                return None
            return all(compare[type(op)](a, b) for op, a, b in zip(n.ops, sides, sides[1:], strict=False))
        if isinstance(n, ast.BinOp) and type(n.op) in arith:
            a, b = value(n.left), value(n.right)
            # where Python's and Triton's arithmetic agree: `//` and `%` of a non-negative value by a positive one
            # (Triton truncates), and results inside 32 bits (Triton's wrap)
            if a is None or b is None or isinstance(n.op, (ast.FloorDiv, ast.Mod)) and not (a >= 0 and b > 0):
                return None
            out = arith[type(n.op)](a, b)
            return out if -(1 << 31) <= out < 1 << 31 else None
        return None

    found = value(node)
    return None if found is None else bool(found)


def _evaluate(source: str, values: dict[str, Any], dom: _Interval, wraps: list[str] | None = None):
    """The kernel's expression ``source`` over the grid, in the values of ``dom``: int literals, int arguments,
    ``tl.program_id`` / ``tl.num_programs``, ``+``, ``-``, ``*``, ``//`` and ``%`` of a non-negative value by a positive
    one (where Triton's and Python's agree), ``tl.cdiv`` of such, ``tl.minimum`` / ``tl.maximum`` / ``min`` / ``max``,
    ``tl.range(a, b, step)`` (where ``dom`` reads it), casts to 32- or 64-bit ints of values that fit, and ``a if test
    else b`` whose test reads the call's constants alone (:func:`_constant_test`).

    Every value is held as Triton holds it. Literals and constexpr arguments are constants, folded among themselves
    as Python ints; a constant beside a tensor takes the tensor's width, which it must fit. Program ids are 32-bit
    ints, an int argument one of 32 bits where it fits, else of 64, a cast the width it names, and a step of two
    tensors the wider one's. Where any step may leave its width, the kernel's value wraps and this one would not, so
    it is ``None`` (the step, written out, added to ``wraps``), as for anything else."""
    limit = {32: 1 << 31, 64: 1 << 63}

    def wrap(node: ast.AST) -> None:
        if wraps is not None and not wraps:
            wraps.append(ast.unparse(node))

    def size(x) -> int:
        return max(abs(dom.least(x)), abs(dom.largest(x)))

    def width_of(v: int) -> int | None:
        """The width Triton makes a constant a tensor of, alone (``tl.minimum(2, x)``, a loop's bound): 32 bits where
        it fits, 64 past 32 unsigned bits (an unsigned one between them: not read here)."""
        return 32 if -(1 << 31) <= v < 1 << 31 else 64 if not 0 <= v < 1 << 32 else None

    def tensor(x, width: int | None = None):
        """``x`` as a tensor of at least ``width`` bits: ``(value, width)``; ``None`` for a constant that does not
        fit."""
        value, kind = x
        if kind != _CONST:
            return value, kind
        if width is None:
            width = width_of(value)
            return None if width is None else (dom.const(value), width)
        return (dom.const(value), width) if -limit[width] <= value < limit[width] else None

    def both(a, b):
        """Two operands as tensors of one width (a constant takes the other's), or ``None``."""
        if a[1] == _CONST:
            b = tensor(b)
            return None if b is None else (tensor(a, b[1]), b)
        if b[1] == _CONST:
            return a, tensor(b, a[1])
        return a, b

    def walk(node: ast.AST):
        """``(value, kind)``: a Python int and ``_CONST``, or a value of ``dom`` and its width."""
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return (node.value, _CONST) if abs(node.value) < 1 << 62 else None
        if isinstance(node, ast.Name):
            raw = values.get(node.id)
            v = getattr(raw, "value", raw)  # a constexpr argument
            if not isinstance(v, int) or isinstance(v, bool) or abs(v) >= 1 << 62:
                return None
            if raw is not v or not -(1 << 31) <= v < 1 << 31:
                # a constexpr (also one passed as a plain int: past 32 bits it may be either, and as a constant it
                # folds as Triton folds it, or takes the 32 bits of a tensor beside it, which it does not fit)
                return v, _CONST
            return dom.const(v), 32
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and isinstance(
                node.value.value, ast.Name) and node.value.attr == "block_shape" and isinstance(
                node.slice, ast.Constant) and isinstance(node.slice.value, int):
            # a host descriptor's block (`c_desc.block_shape[1]`): a constant of the compiled kernel
            shape = getattr(values.get(node.value.value.id), "block_shape", None)
            try:
                v = shape[node.slice.value]  # type: ignore[index]
            except (TypeError, IndexError):
                return None
            return (v, _CONST) if isinstance(v, int) and not isinstance(v, bool) else None
        if isinstance(node, ast.IfExp):
            # `BLOCK_N if not SUBTILE else BLOCK_N // 2`: the side its test takes, a test of the call's constants
            # only (no program id, no loop): one that may differ between programs is not read
            taken = _constant_test(node.test, values)
            return None if taken is None else walk(node.body if taken else node.orelse)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            if inner is None or inner[1] == _CONST:
                return inner if inner is None else (-inner[0], _CONST)
            if size(inner[0]) >= limit[inner[1]]:
                return wrap(node)
            return dom.neg(inner[0]), inner[1]
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            if a is None or b is None:
                return None
            if a[1] == _CONST and b[1] == _CONST:
                x, y = a[0], b[0]
                if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and y == 0:
                    return None
                folded = {ast.Add: lambda: x + y, ast.Sub: lambda: x - y, ast.Mult: lambda: x * y,
                          ast.FloorDiv: lambda: x // y, ast.Mod: lambda: x % y}.get(type(node.op))
                value = None if folded is None else folded()
                return None if value is None or abs(value) >= 1 << 62 else (value, _CONST)
            pair = both(a, b)
            if pair is None or pair[0] is None or pair[1] is None:
                return wrap(node)  # a constant out of the tensor's width: Triton refuses to compile it
            (x, width), (y, other) = pair
            width = max(width, other)
            if isinstance(node.op, (ast.Add, ast.Sub)):
                if size(x) + size(y) >= limit[width]:
                    return wrap(node)
                return (dom.add if isinstance(node.op, ast.Add) else dom.sub)(x, y), width
            if isinstance(node.op, ast.Mult):
                if size(x) * size(y) >= limit[width]:
                    return wrap(node)
                return dom.mul(x, y), width
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and dom.least(x) >= 0 and dom.least(y) > 0:
                return (dom.floordiv if isinstance(node.op, ast.FloorDiv) else dom.mod)(x, y), width
            return None
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        pair = len(node.args) == 2 and not node.keywords
        builtin = isinstance(func, ast.Name) and func.id in ("min", "max") and pair
        if builtin or isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "tl" \
                and func.attr in ("minimum", "maximum") and pair:
            a, b = walk(node.args[0]), walk(node.args[1])
            if a is None or b is None:
                return None
            least = (func.id if isinstance(func, ast.Name) else func.attr) in ("min", "minimum")
            if builtin and a[1] == _CONST and b[1] == _CONST:
                return (min if least else max)(a[0], b[0]), _CONST
            a, b = tensor(a), tensor(b)  # each converted on its own, then the narrower widened
            if a is None or b is None:
                return None
            return dom.pick(a[0], b[0], least), max(a[1], b[1])
        if not isinstance(func, ast.Attribute):
            return None
        cast = _int_cast(node)
        if cast is not None or func.attr == "to":
            if cast is None:
                return None
            inner, kind = walk(cast[0]), cast[1]
            if inner is None or inner[1] == _CONST:
                return None
            if kind == 32 and not (-(1 << 31) <= dom.least(inner[0]) and dom.largest(inner[0]) < 1 << 31):
                return wrap(node)
            return inner[0], kind
        if not (isinstance(func.value, ast.Name) and func.value.id in ("tl", "triton")):
            return None
        if func.attr == "cdiv" and pair:
            a, b = walk(node.args[0]), walk(node.args[1])
            if a is None or b is None:
                return None
            if a[1] == _CONST and b[1] == _CONST:  # Triton's `(x + div - 1) // div`, folded
                return ((a[0] + b[0] - 1) // b[0], _CONST) if b[0] != 0 else None
            pair_ = both(a, b)
            if pair_ is None or pair_[0] is None or pair_[1] is None:
                return wrap(node)
            (x, width), (y, other) = pair_
            width = max(width, other)
            if dom.least(x) < 0 or dom.least(y) <= 0:
                return None
            if size(x) + size(y) >= limit[width]:
                return wrap(node)  # its sum `x + div - 1` must stay in the width too
            return dom.cdiv(x, y), width
        if func.value.id != "tl":
            return None
        if func.attr == "range" and len(node.args) == 3 and all(
                k.arg == "loop" and isinstance(k.value, ast.Constant) for k in node.keywords):
            parts = [walk(arg) for arg in node.args]
            parts = [None if p is None else tensor(p) for p in parts]
            if None in parts:
                return None
            loop = next((k.value.value for k in node.keywords), None)  # which loop: its line
            found = dom.loop(*(p[0] for p in parts), loop)  # type: ignore[index]
            return None if found is None else (found, max(p[1] for p in parts))  # type: ignore[index]
        args = node.args or [k.value for k in node.keywords if k.arg == "axis"]
        if func.attr in ("program_id", "num_programs") and len(args) == 1 and len(node.args) + len(
                node.keywords) == 1:
            given = values.get(args[0].id) if isinstance(args[0], ast.Name) else None
            given = getattr(given, "value", given)  # an axis passed as an argument: a constexpr of the kernel
            axis = (given, _CONST) if isinstance(given, int) and not isinstance(given, bool) else walk(args[0])
            if axis is None or axis[1] != _CONST or not 0 <= axis[0] < 3:
                return None
            if func.attr == "num_programs":
                return dom.const(dom.programs[axis[0]]), 32
            return dom.program_id(axis[0]), 32
        return None

    tree = _parsed(source)
    found = None if tree is None else walk(tree)
    if found is None:
        return None
    return dom.const(found[0]) if found[1] == _CONST else found[0]


#: the column end of a tile that spans whole rows: past any row's columns
_WHOLE_ROWS = 1 << 40


def _holds(source: str, values: dict[str, Any], dom: _Interval):
    """Where the kernel's test ``source`` holds over the grid, in the values of ``dom`` (booleans): comparisons of
    what :func:`_evaluate` reads, ``and``, ``or``, ``not`` and ``True`` / ``False``; ``None`` where it cannot read
    it."""
    compare = _COMPARE

    def walk(node: ast.AST):
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = walk(node.operand)
            return None if inner is None else ~inner if hasattr(inner, "dtype") else not inner
        if isinstance(node, ast.BoolOp):
            parts = [walk(v) for v in node.values]
            if any(p is None for p in parts):
                return None
            out = parts[0]
            for p in parts[1:]:
                out = (out & p) if isinstance(node.op, ast.And) else (out | p)
            return out
        if isinstance(node, ast.Compare) and all(type(op) in compare for op in node.ops):
            # `a < b < c` is `a < b and b < c`
            sides = [_evaluate(ast.unparse(x), values, dom) for x in (node.left, *node.comparators)]
            if any(x is None for x in sides):
                return None
            out = True
            for op, a, b in zip(node.ops, sides, sides[1:], strict=False):
                out = out & compare[type(op)](a, b)
            return out
        if isinstance(node, ast.Name) and isinstance(getattr(values.get(node.id), "value", values.get(node.id)), bool):
            return getattr(values.get(node.id), "value", values.get(node.id))  # a constexpr flag
        value = _evaluate(ast.unparse(node), values, dom)  # an int, true where not 0
        return None if value is None else value != 0

    tree = _parsed(source)
    return None if tree is None else walk(tree)


def _each_step(sources: tuple[str, ...], values: dict[str, Any], programs: tuple[int, int, int]):
    """The kernel's expressions ``sources`` (:func:`_evaluate`) for each program of the grid and each step of the
    loops they read: ``(dom, values)``; where they read loops, ``dom.steps`` are the steps that run (the values 1-D
    over them; ``None`` with ``dom.loops`` set: the loops run no step), else the values are arrays over the grid. A
    position past a loop's end need not be defined (a grouped one divides by what is left of the tiles), so the loops
    are found first and the expressions read again over the steps that run."""
    import numpy as np

    dom = _PerStep(programs)
    found = [_evaluate(x, values, dom) for x in sources]
    if not dom.loops or not np.any(dom.valid):
        return dom, found
    shape = np.broadcast_shapes(dom.valid.shape, (1,) * len(dom.loops) + programs)
    dom = _PerStep(programs, tuple(np.nonzero(np.broadcast_to(dom.valid, shape))), tuple(dom.loops))
    dom.shape = shape
    return dom, [_evaluate(x, values, dom) for x in sources]


def _tiles_key(programs: tuple | None, size: tuple | int, seen: tuple) -> tuple | None:
    """What a call that passed :meth:`OverlappedKernel._check_stored_once` is remembered by: its grid, its size (and
    the output's row), and the values of the names the stored tiles read (ints, floats, strings, a descriptor's block
    shape); ``None`` (checked on every call) where a value is of another kind."""
    if all(v is None or isinstance(v, (int, float, str, tuple)) for v in seen):
        return programs, size, tuple((type(v), v) for v in seen)  # 2, 2.0 and True are not one call
    return None


def _stored_twice(tiles: tuple[tuple[str, str, str, str, str, int], ...], values: dict[str, Any],
                  programs: tuple[int, int, int], size: int,
                  splits: tuple[int, ...] = ()) -> tuple[bool, str] | None:
    """Whether two programs of a launch of ``programs``, or two steps of one program's tile loop, store the same
    elements (``LaunchPlan.stored_tiles``, the tiles of each store: rows ``[row, row + rows)``, columns ``[col, col +
    cols)`` or whole rows). Tiles whose rows all lie past ``size`` or before 0, or whose loop step does not run, store
    nothing any channel counts. One program's stores on one pass may overlap (the two sides of an ``if``: the build
    proved that a program stores each element once); across programs and steps the tiles must be disjoint, their rows
    on one lattice of the tiles' height. A store runs where its ``if`` tests hold (one TileLink cannot evaluate:
    everywhere). ``splits``: the grid axes of a split-K write-back's splits, whose programs add into the same tile
    by design (each add is counted per split), so they count as one program here. ``None`` where they are disjoint,
    else ``(True, the two that overlap)``, or ``(False, why TileLink cannot tell)``, in words. At most
    ``_TILES_CHECKED`` programs: the launch refuses larger grids before it asks."""
    import numpy as np

    found: list[tuple] = []  # each store's live tiles: rows, columns' start and end, pass, program, step, line
    passes: list[tuple] = []
    height = None
    for row, rows, col, cols, test, line, *_ in tiles:
        sources = (row, rows, *((col, cols) if col else ()))
        dom, parts = _each_step(sources, values, programs)
        if dom.loops and dom.steps is None:
            continue  # loops that run no step: the store never runs
        holds = _holds(test, values, dom) if test else None
        unread = next((x for x, v in zip(sources, parts, strict=False) if v is None), None)
        if unread is not None:
            return False, (f"the tile the store at line {line} writes starts at or spans `{unread}`, which TileLink "
                           f"cannot evaluate for each program of this grid (a value of the wrong kind, a step that may "
                           f"leave its int width, a division it cannot read as Triton does, or loops of more steps "
                           f"than it evaluates)")
        h = parts[1]
        if int(np.min(h)) != int(np.max(h)) or (height is not None and int(np.min(h)) != height):
            return False, (f"the stores' tiles are not all one height (`{rows}` at line {line}), so TileLink cannot "
                           f"lay them on one lattice of rows")
        height = int(np.min(h))
        # one entry per program (and step that runs): the program's index in the grid and the step
        if dom.steps is not None:
            loops = len(dom.loops)
            at = list(dom.steps[loops:])
            step = np.ravel_multi_index(dom.steps[:loops], dom.shape[:loops]).astype(np.int64)
        else:
            at = list(np.unravel_index(np.arange(math.prod(programs), dtype=np.int64), programs))
            step = np.zeros(at[0].size, dtype=np.int64)
        for axis in splits:  # the K splits of one tile: one program, as far as storing each element once goes
            at[axis] = np.zeros_like(at[axis])
        program = np.ravel_multi_index(tuple(at), programs).astype(np.int64)

        def spread(x, shape=programs if dom.steps is None else program.shape):
            return np.broadcast_to(x, shape).reshape(-1)

        r = spread(parts[0])
        c = spread(parts[2]) if col else np.zeros(program.shape, dtype=np.int64)
        e = c + spread(parts[3]) if col else np.full(program.shape, _WHOLE_ROWS, dtype=np.int64)
        live = (r < size) & (r + height > 0) & (e > c)
        if holds is not None:
            live = live & spread(holds)
        key = tuple(dom.loops)  # the steps of the same loops are the same passes
        if key not in passes:
            passes.append(key)
        n = int(live.sum())
        found.append((r[live], c[live], np.minimum(e[live], _WHOLE_ROWS), np.full(n, passes.index(key)),
                      program[live], step[live], np.full(n, line)))
    if height is None or height <= 0 or not found:
        return None
    r, c, e, pass_of, program, step, line_of = (np.concatenate(x).astype(np.int64) for x in zip(*found, strict=True))
    if not r.size:
        return None
    if np.unique(r % height).size > 1:
        first = int(r[0])
        other = int(r[np.argmax(r % height != first % height)])
        return False, (f"its tiles' rows start at {first} and {other}, which are not a whole number of tiles "
                       f"({height} rows) apart, so TileLink cannot tell that they do not overlap")
    # a pass: one program on one step of its loops (its stores there may overlap: the sides of an `if`)
    by = np.lexsort((step, program, pass_of))
    ident = np.empty(r.size, dtype=np.int64)
    ident[by] = np.cumsum(np.concatenate(([False], (np.diff(pass_of[by]) != 0) | (np.diff(program[by]) != 0)
                                          | (np.diff(step[by]) != 0))))
    # each pass's tiles in one group of rows, merged into runs that do not overlap (the sides of an `if` may store
    # the same tile): any overlap left between runs is then between two passes
    order = np.lexsort((c, ident, r))
    r, c, e, ident = r[order], c[order], e[order], ident[order]
    pass_of, program, step, line_of = pass_of[order], program[order], step[order], line_of[order]
    group = np.concatenate(([0], np.cumsum(r[1:] != r[:-1])))
    same = np.concatenate(([False], (group[1:] == group[:-1]) & (ident[1:] == ident[:-1])))
    block = np.cumsum(~same) - 1
    reach = _running_max(e, block)
    first = np.flatnonzero(~same | (c >= np.concatenate(([0], reach[:-1]))))
    run_c, run_e, run_group = c[first], np.maximum.reduceat(e, first), group[first]
    # the runs in order of their first column in each group of rows; one that starts before the farthest end
    # reached by an earlier run of its rows overlaps it
    by = np.lexsort((run_c, run_group))
    reach = _running_max(run_e[by], run_group[by])
    clash = np.flatnonzero((run_c[by][1:] < reach[:-1]) & (run_group[by][1:] == run_group[by][:-1]))
    if not clash.size:
        return None
    later = by[clash[0] + 1]
    earlier = next(int(j) for j in by[:clash[0] + 1] if run_group[j] == run_group[later] and run_e[j] > run_c[later])

    def tiles_of(run: int) -> np.ndarray:
        return np.arange(first[run], first[run + 1] if run + 1 < first.size else r.size)

    def widest(among: np.ndarray, lo: int, hi: int) -> int:
        """The tile of ``among`` sharing the most columns with ``[lo, hi)``."""
        return int(among[np.argmax(np.minimum(e[among], hi) - np.maximum(c[among], lo))])

    # the later run's tile reaching furthest into the earlier run, then the earlier run's tile it shares most with
    # (a run covers its columns with its tiles: the two overlap)
    i = widest(tiles_of(later), int(run_c[earlier]), int(run_e[earlier]))
    j = widest(tiles_of(earlier), int(c[i]), int(e[i]))

    def said(k: int) -> str:
        loops = passes[int(pass_of[k])]
        at = tuple(int(v) for v in np.unravel_index(int(program[k]), programs))
        where = f"program {at}" + (
            f" (step {int(step[k])} of its tile loop)" if len(loops) == 1 else
            f" (step {int(step[k])} of the loops at lines {', '.join(map(str, sorted(loops)))})"
            if loops else "")
        return f"{where} at line {int(line_of[k])}"
    cols = "" if e[i] >= _WHOLE_ROWS and e[j] >= _WHOLE_ROWS else (
        f", columns [{max(int(c[i]), int(c[j]))}, {min(int(e[i]), int(e[j]))})")
    return True, f"{said(j)} and {said(i)} both store rows [{int(r[i])}, {int(r[i]) + height}){cols}"


def _running_max(values, groups):
    """The largest of ``values`` up to each position within its run of equal ``groups`` (sorted into runs), as
    ranks of the values so that ``group * count + rank`` stays in int64."""
    import numpy as np

    ends, rank = np.unique(values, return_inverse=True)
    top = np.maximum.accumulate(groups * ends.size + rank.reshape(-1)) - groups * ends.size
    return ends[top]


#: the most programs whose tiles :func:`_stored_twice` evaluates one by one
_TILES_CHECKED = 1 << 24


_UNSTORED_HINT = ("Store every element of the output: launch one program per tile over all of its rows and "
                  "columns (a persistent kernel: a tile loop over all of them), give the output the columns the "
                  "store's mask bounds (not a wider, padded row), and return early only from programs past the "
                  "last tile.")


def _unstored(tiles: tuple[tuple, ...], values: dict[str, Any], programs: tuple[int, int, int], size: int,
              width: int, tensor: str = "the output") -> str | None:
    """What of an output of ``size`` rows of ``width`` elements the stores (``LaunchPlan.stored_tiles``) leave
    unstored, or store past a row's end, on the grid ``programs``, in words; ``None`` where every element is stored
    once, or where TileLink cannot tell (a test it cannot evaluate, tiles not all of one height; where a store's
    elements per row are not counted, only rows no store reaches are said). Each row's channel counts its elements to
    ``width``: one short of them never completes. Called after :func:`_stored_twice` found the tiles disjoint."""
    import numpy as np

    starts, counts, lines = [], [], []
    height, counted = None, True
    for row, rows, _col, _cols, test, line, *rest in tiles:
        live = rest[0] if rest else ""
        if not live:
            # elements per row it cannot count: the rows no program stores are still said (their channels never
            # complete), the rows' counts are not
            live, counted = "1", False
        dom, parts = _each_step((row, rows, live), values, programs)
        if dom.loops and dom.steps is None:
            continue  # loops that run no step: the store never runs
        if any(p is None for p in parts):
            return None
        holds = _holds(test, values, dom) if test else None
        if test and holds is None:
            return None
        shape = programs if dom.steps is None else dom.steps[0].shape

        def spread(x, shape=shape):
            return np.broadcast_to(np.asarray(x), shape).reshape(-1).astype(np.int64)

        h = spread(parts[1])
        if int(h.min()) != int(h.max()) or (height is not None and int(h.min()) != height) or int(h.min()) <= 0:
            return None
        height = int(h.min())
        r, n = spread(parts[0]), np.maximum(spread(parts[2]), 0)
        live_at = (r < size) & (r + height > 0) & (n > 0)
        if holds is not None:
            live_at &= spread(holds).astype(bool)
        starts.append(r[live_at])
        counts.append(n[live_at])
        lines.append(np.full(int(live_at.sum()), line))
    if height is None:
        return None
    r, n, at = np.concatenate(starts), np.concatenate(counts), np.concatenate(lines)
    origin = int(r[0] % height) if r.size else 0
    if r.size and np.unique(r % height).size > 1:
        return None
    expected = np.arange(origin - height if origin > 0 else origin, size, height)
    expected = expected[expected + height > 0]
    group, stored = np.unique(r, return_inverse=True)
    per_group = np.bincount(stored.reshape(-1), weights=n, minlength=group.size).astype(np.int64) if r.size else \
        np.zeros(0, dtype=np.int64)
    have = dict(zip(group.tolist(), per_group.tolist(), strict=True))

    def rows_of(start: int) -> str:
        return f"rows [{max(start, 0)}, {min(start + height, size)})"

    missing = [int(s) for s in expected if int(s) not in have]
    if missing:
        more = f" (nor {len(missing) - 1} more tile{'s' if len(missing) > 2 else ''} of rows)" if len(missing) > 1 \
            else ""
        return f"no program stores {rows_of(missing[0])} of {tensor!r}{more}"
    if not counted:
        return None
    for start, got in sorted(have.items()):
        if got != width:
            line = int(at[np.argmax(r == start)])
            past = ", past the row's end" if got > width else ""
            return (f"the stores write {got} of the {width} elements of each row of {tensor!r} in {rows_of(start)}"
                    f"{past} (the store at line {line})")
    return None


@functools.lru_cache(maxsize=256)
def _names_read(source: str) -> tuple[str, ...]:
    """The names the kernel's expression ``source`` reads, sorted (found once: each call reads their values)."""
    tree = _parsed(source)
    return tuple(sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)})) if tree is not None else ()


@functools.lru_cache(maxsize=256)
def _parsed(source: str) -> ast.AST | None:
    """The kernel's expression ``source``, parsed once (each call bounds it from its own grid)."""
    try:
        return ast.parse(source, mode="eval").body
    except SyntaxError:
        return None


def _said(factors: tuple[str, ...], values: dict[str, Any]) -> str:
    """A row fact's ``factors`` as an error shows them, each parameter with its value at the call: ``4 * D=64``."""
    return " * ".join(f if f.isdigit() else f"{f}={values[f]}" for f in factors) or "1"


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
