"""Launching a compiled variant of a kernel again without Triton's launch path.

``kernel[grid](...)`` binds every argument, specialises each (``native_specialize_impl``: its type, a pointer's
16-byte alignment, an int equal to 1 or a multiple of 16), builds Triton's cache key from them and only then calls
the compiled kernel's launcher. For an operator's rewritten kernel of some twenty arguments that is most of a
call's host time once the rest of the call is cached (world 1 on an H200: about 60 µs of a 120 µs call). The
launchers call their kernels through :func:`direct`: the first call of a variant goes through Triton, which
compiles, loads and returns the compiled kernel; a later call of the same variant (the terms of
:func:`tilelink.rules.launch.variant_key`, finer than Triton's own key and never coarser, with the argument names
and types, the device and the Triton settings its compile options read: debug, instrumentation, the
architecture override and the default multiply-add fusion) launches that compiled kernel as Triton's
launch would, with the same arguments in the kernel's parameter order, the grid, the caller's current stream and
Triton's launch hooks.

Triton's own path is taken, every time, for a kernel the fast path does not know how to launch: under Triton's
interpreter (no compiled kernel), on a Triton release other than the ones whose launch step this repeats
(:data:`RELEASES`), for an autotuned or heuristics kernel (its configuration depends on more than the variant),
and for one with pre-run hooks. It is taken for one call when a stream is capturing a CUDA graph, when a global the
kernel read has changed since it compiled (Triton then raises), and for the first call of each variant.
"""

from __future__ import annotations

import functools
import os

import torch

#: Triton releases whose launch step (the end of ``JITFunction.run``: ``CompiledKernel.run(grid_0, grid_1, grid_2,
#: stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *arguments)``) :class:`DirectKernel`
#: repeats; another release may launch differently and takes Triton's own path
RELEASES = ("3.6.",)

_get_device = getattr(torch._C, "_cuda_getDevice", None)
_get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def _current_device() -> int:
    return _get_device()


def _current_stream(device: int) -> int:
    """The raw handle of ``device``'s current stream, which Triton's launch takes too."""
    return _get_stream(device)


def _capturing() -> bool:
    return _is_capturing is not None and _is_capturing()


_KNOBS = []  # triton.knobs, imported at the first launch


def _knobs():
    if not _KNOBS:
        from triton import knobs

        _KNOBS.append(knobs)
    return _KNOBS[0]


#: every setting Triton's compile options read besides the call (its backend's ``parse_options``: the debug flag, the
#: instrumentation, the architecture it compiles for and whether it fuses multiply-adds), as (group of
#: ``triton.knobs``, name)
_SETTINGS = (("runtime", "debug"), ("compilation", "instrumentation_mode"), ("runtime", "override_arch"),
             ("language", "default_fp_fusion"))


def _read_settings() -> tuple:
    """The values of :data:`_SETTINGS`, read through ``triton.knobs`` as Triton reads them."""
    knobs = _knobs()
    return tuple(getattr(getattr(knobs, group), name) for group, name in _SETTINGS)


#: Triton's settings read from one environment variable, unless set in Python (``triton.knobs``' descriptors)
_ONE_VARIABLE = ("env_str", "env_bool", "env_int", "env_opt_str", "env_opt_bool")
_ENVIRON = getattr(os.environ, "_data", None) if hasattr(os.environ, "encodekey") else None
_SOURCES: list = []  # the function that reads what the settings are read from (_marks_reader), made at the first read
_READ: dict[tuple, tuple] = {}  # what the settings' sources held -> the settings read from them


def _marks_reader():
    """A function that returns what :func:`_settings` looks at (generated once: a loop over the settings cost a
    call as much as reading them): for a setting of one variable, what is set in Python and the variable's raw
    value; for any other (a plain attribute), its value."""
    knobs = _knobs()
    scope, terms = {"environ": _ENVIRON, "missing": _MISSING}, []
    for i, (group_name, name) in enumerate(_SETTINGS):
        group = getattr(knobs, group_name)
        how = next((vars(c)[name] for c in type(group).__mro__ if name in vars(c)), None)  # not its __get__
        scope[f"group{i}"], scope[f"values{i}"] = group, vars(group)
        if type(how).__name__ in _ONE_VARIABLE and isinstance(getattr(how, "key", None), str):
            scope[f"variable{i}"] = os.environ.encodekey(how.key)
            terms.append(f"values{i}.get({name!r}, missing), environ.get(variable{i})")
        else:
            terms.append(f"group{i}.{name}")
    source = f"def marks():\n    return ({''.join(t + ', ' for t in terms)})\n"
    exec(compile(source, "<settings of the direct launch>", "exec"), scope)  # noqa: S102 - generated above
    return scope["marks"]


def _settings() -> tuple:
    """:func:`_read_settings`, at each call, at the cost of a look at what each setting is read from: a value set in
    Python (``knobs.runtime.debug = True``) and the raw value of its environment variable (``TRITON_DEBUG``), or
    the value itself for any other setting (a plain attribute: Triton 3.9's ``debug``), read through ``triton.knobs``.
    The settings are read again (through ``triton.knobs``, as Triton reads them) when one of those changes. A read of
    the four through ``triton.knobs`` cost microseconds: each encodes its variable's name and decodes its value."""
    if not isinstance(_ENVIRON, dict):
        return _read_settings()
    if not _SOURCES:
        _SOURCES.append(_marks_reader())
    marks = _SOURCES[0]()
    try:
        found = _READ.get(marks)
    except TypeError:  # a value that cannot be a key
        return _read_settings()
    if found is None:
        if len(_READ) >= 64:
            _READ.clear()
        found = _READ[marks] = _read_settings()
    return found


def supported(kernel) -> bool:
    """Whether :class:`DirectKernel` can launch ``kernel``: a plain ``@triton.jit`` function, compiled (not under
    the interpreter) by a Triton release of :data:`RELEASES`, on a GPU."""
    import triton
    from triton.runtime.jit import JITFunction

    return (type(kernel) is JITFunction and triton.__version__.startswith(RELEASES) and _get_device is not None
            and _get_stream is not None and torch.cuda.is_available())


#: id(kernel) -> (kernel, what :func:`direct` gives for it): the kernel is held, so its id is not reused
_DIRECT: dict[int, tuple] = {}


def direct(kernel):
    """``kernel``, or a :class:`DirectKernel` over it where :func:`supported`: launched the same way
    (``direct(kernel)[grid](*args, **kwargs)``)."""
    entry = _DIRECT.get(id(kernel))
    if entry is None or entry[0] is not kernel:
        entry = _DIRECT[id(kernel)] = (kernel, DirectKernel(kernel) if supported(kernel) else kernel)
    return entry[1]


class DirectKernel:
    """A ``@triton.jit`` kernel whose compiled variants are launched directly after their first call (see the
    module's description). Every other attribute is the kernel's."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.params = kernel.params  # what variant_key reads of a kernel
        self.names = tuple(p.name for p in kernel.params)
        #: (device, debug, instrumentation, the call's form, its variant) -> the compiled kernel Triton launched
        self.compiled: dict[tuple, object] = {}
        #: a call's form (its argument names and their types) -> its variant and launch arguments (:func:`_reader`)
        self.readers: dict[tuple, object] = {}
        self._globals: tuple = (None, {})  # Triton's used_global_vals, and its globals last found unchanged

    def __getattr__(self, name: str):
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        return functools.partial(self.run, grid)

    def variant(self, call: dict) -> tuple:
        """The variant of a call: its form (argument names and types) and the terms of ``variant_key``."""
        form, (variant, _arguments) = self._read_form(call)
        return form, variant

    def _read_form(self, call: dict) -> tuple:
        """``(form, (variant, arguments))`` of a call: its form (argument names and types) and what the form's
        reader (:func:`_reader`, generated at the form's first call) gives for its values."""
        values = tuple(call.values())
        form = (tuple(call), tuple(map(type, values)))
        reader = self.readers.get(form)
        if reader is None:
            reader = self.readers[form] = _reader(self.kernel, *form)
        return form, reader(values)

    def read(self, call: dict):
        """``(key, arguments)`` of a call: what decides its compiled kernel (the device, the settings Triton's
        compile options read: ``debug``, instrumentation, ``override_arch``, ``default_fp_fusion``; the call's form
        and its variant) and its arguments in the kernel's parameter
        order, defaults included (``None`` when one is missing: Triton's launch then says so)."""
        form, (variant, arguments) = self._read_form(call)
        return (_current_device(), _settings(), form, variant), arguments

    def globals_changed(self) -> bool:
        used = self.kernel.used_global_vals  # Triton replaces the dict when it reads them again
        if self._globals[0] is not used:
            self._globals = (used, {})
        return _globals_changed(used, self._globals[1])

    def run(self, grid, *args, **kwargs):
        """``kernel[grid](*args, **kwargs)``."""
        kernel = self.kernel
        if _capturing() or kernel.pre_run_hooks:
            return kernel[grid](*args, **kwargs)
        if args:
            call = dict(zip(self.names, args, strict=False))
            call.update(kwargs)
        else:
            call = kwargs
        key, arguments = self.read(call)
        compiled = self.compiled.get(key)
        if compiled is None or arguments is None or self.globals_changed():
            result = kernel[grid](*args, **kwargs)
            if compiled is None and arguments is not None and launchable(result):
                self.compiled[key] = result
            return result
        launch(compiled, grid, arguments, self.names)
        return compiled

    def bound(self, grid, call: dict, names: tuple[str, ...]) -> Bound:
        """``self[grid](**call)`` made ready to run again with other values of the tensors ``names`` (:class:`Bound`),
        every other argument ``call``'s."""
        return Bound(self, grid, call, names)


class Bound:
    """A launch of a :class:`DirectKernel` of which only some tensors (or ints) change from call to call:
    ``bound(*tensors)`` is ``kernel[grid](**call)`` with ``names`` given ``tensors``. The other arguments' terms of the
    variant (ints, constexprs, launch options) are read once: a call reads its tensors' types, dtypes and 16-byte
    alignments (an int's terms, for a name whose value in ``call`` is an int), the device and Triton's settings
    (:func:`_settings`), and launches the compiled kernel of those, found by a code generated for this launch
    (:func:`_bound_reader`). A variant's first call, a capture, pre-run hooks and a
    changed global take :meth:`DirectKernel.run`, as a call with every argument would."""

    __slots__ = ("call", "compiled", "direct", "grid", "names", "read")

    def __init__(self, direct: DirectKernel, grid, call: dict, names: tuple[str, ...]) -> None:
        self.direct, self.grid, self.names = direct, grid, tuple(names)
        self.read = _bound_reader(direct.kernel, call, self.names)
        # not the first call's values of ``names``: every call gives its own, and the first call's tensors (an
        # activation, a buffer of a CUDA graph's pool) must not be kept alive by the launch
        self.call = emptied(call, self.names)
        #: (device, settings, the tensors' variant) -> the compiled kernel a call of them launched
        self.compiled: dict[tuple, object] = {}

    def __call__(self, *tensors):
        direct = self.direct
        if _capturing() or direct.kernel.pre_run_hooks:
            return direct.kernel[self.grid](**self.whole(tensors))
        variant, arguments = self.read(*tensors)
        key = (_current_device(), _settings(), variant)
        compiled = self.compiled.get(key)
        if compiled is None or direct.globals_changed():
            result = direct.run(self.grid, **self.whole(tensors))
            if compiled is None and arguments is not None and launchable(result):
                self.compiled[key] = result
            return result
        launch(compiled, self.grid, arguments, direct.names)
        return compiled

    def whole(self, tensors) -> dict:
        """The call's arguments with the tensors ``names`` given ``tensors``."""
        return {**self.call, **dict(zip(self.names, tensors, strict=True))}

    def find(self, *tensors) -> tuple | None:
        """The compiled kernel a call with ``tensors`` would launch and its arguments, found without launching
        anything: a variant this launch launched, or one the kernel launched for a call of every argument of the
        same form (a launcher's first calls); ``None`` where the call would take Triton's launch path (a variant
        not compiled yet, a capture, pre-run hooks, a changed global), so that a caller with kernels in flight
        that may spin for a peer can take its own way first (loading a module waits for the running kernels)."""
        direct = self.direct
        if _capturing() or direct.kernel.pre_run_hooks:
            return None
        variant, arguments = self.read(*tensors)
        if arguments is None:
            return None
        key = (_current_device(), _settings(), variant)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = direct.compiled.get(direct.read(self.whole(tensors))[0])
            if compiled is None:
                return None
            self.compiled[key] = compiled
        if direct.globals_changed():
            return None
        return compiled, arguments

    def launch(self, found: tuple) -> None:
        """Launch what :meth:`find` found, on the current stream."""
        launch(found[0], self.grid, found[1], self.direct.names)


def emptied(call: dict, names: tuple[str, ...]) -> dict:
    """``call`` with ``None`` for the values of ``names``, in its order: ``{**emptied, **given}`` is a call of the
    same form (the order of its arguments, which the direct launch's reader is made for) with the values given."""
    return {k: None if k in names else v for k, v in call.items()}


def _bound_reader(kernel, call: dict, names: tuple[str, ...]):
    """A function of the values of ``names`` (in this order) that returns their terms of the variant and the
    arguments of ``kernel``'s call in its parameter order: theirs, ``call``'s values of the others, the defaults
    (``None`` for the arguments when one is missing: Triton's launch then says so). A name whose value in ``call`` is
    a tensor is read as one (its type, dtype and 16-byte alignment); one whose value is an int as ``variant_key`` reads
    an int (a call's count: by its width where the kernel does not specialise on it, as it does not on the channels'
    scalars; by whether it is 1 and a multiple of 16 too where it does; a constexpr by its value)."""
    slots = {name: f"t{i}" for i, name in enumerate(names)}
    params = {p.name: p for p in kernel.params}
    scope: dict = {}
    each = []
    for i, name in enumerate(names):
        v, param = f"t{i}", params.get(name)
        if type(call.get(name)) is not int:
            each.append(f"type({v}), {v}.dtype, {v}.data_ptr() % 16 == 0, ")
        elif param is None or param.is_constexpr:
            each.append(f"type({v}), {v}, ")
        elif param.do_not_specialize:
            each.append(f"type({v}), -2147483648 <= {v} < 2147483648, {v} < 9223372036854775808, ")
        else:
            each.append(f"type({v}), {v} == 1, {v} % 16 == 0, -2147483648 <= {v} < 2147483648, "
                        f"{v} < 9223372036854775808, ")
    terms = "".join(each)
    arguments = []
    for p in kernel.params:
        if p.name in slots:
            arguments.append(slots[p.name])
        elif p.name in call or p.has_default:
            scope[f"c_{p.name}"] = call[p.name] if p.name in call else p.default
            arguments.append(f"c_{p.name}")
        else:
            arguments = None
            break
    given = "None" if arguments is None else "(" + "".join(a + ", " for a in arguments) + ")"
    source = f"def read({', '.join(slots.values())}):\n    return ({terms}), {given}\n"
    exec(compile(source, f"<bound launch of {kernel.__name__}>", "exec"), scope)  # noqa: S102 - generated above
    return scope["read"]


def _reader(kernel, names: tuple, types: tuple):
    """A function of a call's values (of these ``names`` and ``types``, in this order) that returns its variant and
    its arguments in ``kernel``'s parameter order. Generated per form, as Triton's own binder is: a loop over the
    arguments cost the call more than the launch. The variant is ``tilelink.rules.launch.variant_key``'s, term for
    term: a tensor's dtype and 16-byte alignment; an int Triton specialises by whether it is 1 and a multiple of
    16, a ``do_not_specialize`` one by neither, both by their width; a constexpr or a launch option (``num_warps``)
    by its value; anything else as ``variant_key`` keys it."""
    from tilelink.rules.launch import _value_key

    params = {p.name: p for p in kernel.params}
    scope = {"_value_key": _value_key, "params": params}
    terms, slots = [], {}
    for i, (name, kind) in enumerate(zip(names, types, strict=True)):
        v, param = f"v{i}", params.get(name)
        slots[name] = v
        plain = param is not None and not param.is_constexpr
        if kind is torch.Tensor:
            terms.append(f"{v}.dtype, {v}.data_ptr() % 16 == 0")
        elif kind is int and plain and not param.do_not_specialize:
            terms.append(f"{v} == 1, {v} % 16 == 0, -2147483648 <= {v} < 2147483648, {v} < 9223372036854775808")
        elif kind is int and plain:
            terms.append(f"-2147483648 <= {v} < 2147483648, {v} < 9223372036854775808")
        elif kind in (int, bool, str, type(None)):
            terms.append(v)
        else:
            terms.append(f"_value_key({v}, params.get({name!r}), False)")
    arguments = []
    for p in kernel.params:
        if p.name in slots:
            arguments.append(slots[p.name])
        elif p.has_default:
            scope[f"default_{p.name}"] = p.default
            arguments.append(f"default_{p.name}")
        else:  # a missing argument: Triton's launch raises
            arguments = None
            break
    unpack = "".join(f"v{i}, " for i in range(len(names)))
    source = (f"def read(values):\n"
              f"    {unpack or '_'} = values\n" if names else "def read(values):\n") + (
              f"    return ({''.join(t + ', ' for t in terms)}), "
              f"{'None' if arguments is None else '(' + ''.join(a + ', ' for a in arguments) + ')'}\n")
    exec(compile(source, f"<launch of {kernel.__name__}>", "exec"), scope)  # noqa: S102 - generated above
    return scope["read"]


def launchable(result) -> bool:
    """Whether what ``kernel[grid](...)`` returned is a compiled, loaded kernel that :func:`launch` can launch."""
    return (type(result).__name__ == "CompiledKernel" and getattr(result, "packed_metadata", None) is not None
            and getattr(result, "function", None) is not None and callable(getattr(result, "run", None)))


def _globals_changed(used: dict, seen: dict) -> bool:
    """Whether a global a kernel read when it compiled (``used``: Triton's ``used_global_vals``) has another value
    now (Triton refuses the launch). A global that is still the object found equal before (``seen``) is not
    compared again: Triton keeps a copy of each value, and comparing a ``tl.constexpr`` makes new ones
    (microseconds a call)."""
    for key, (value, where) in used.items():
        now = where.get(key[0], _MISSING)
        if seen.get(key) is not now:
            if now != value:
                return True
            seen[key] = now
    return False


_MISSING = object()


def _quiet(hook) -> bool:
    """Whether a launch hook of Triton's would do nothing: none, or a chain of no hooks."""
    return hook is None or getattr(hook, "calls", True) == []


def launch(compiled, grid, values: list, names: tuple) -> None:
    """Launch ``compiled`` on ``grid`` (a tuple, or a function of the arguments by name) with ``values``, the
    arguments in the kernel's parameter order, on the current stream: Triton's launch step, with its hooks."""
    if callable(grid):
        grid = grid(dict(zip(names, values, strict=True)))
    size = len(grid)
    stream = _current_stream(_current_device())
    knobs = _knobs()
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if _quiet(enter) and _quiet(leave):
        metadata = enter = leave = None
    else:
        metadata = compiled.launch_metadata(grid, stream, *values)
    compiled.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, stream, compiled.function,
                 compiled.packed_metadata, metadata, enter, leave, *values)
