"""The launch side shared by the rules: contexts per shape, streams, preloading, wait diagnostics.

A rule's launcher turns ``kernel[grid](args...)`` into the overlapped operator: it validates the
arguments against the launch contract, finds (or collectively creates) the context for their
shapes, and issues the producer and consumer kernels. On a GPU the partner kernel runs on a side
stream; in the emulated world kernels run one after the other (the interpreter is synchronous), in
an order where nothing waits for a kernel that has not run.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from tilelink.errors import LaunchError, WaitTimeout
from tilelink.mapping import RowSharding
from tilelink.plan import LaunchPlan
from tilelink.rules.direct import DirectKernel, direct, emptied
from tilelink.runtime.world import current_world


def launcher_for(okernel):
    """The launcher of the rule that rewrote ``okernel``."""
    from tilelink.rules import RULES

    if okernel.plan.rule not in RULES:
        raise LaunchError(f"no launcher for rule {okernel.plan.rule!r}")
    return RULES[okernel.plan.rule].launcher(okernel)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Streams:
    """The main stream of the caller and the side stream of the partner kernel (GPU only)."""

    main: Any
    side: Any
    joined: Any = None  # the event the main stream waits on for the side stream's work (join), made once
    forked: Any = None  # the event the side stream waits on for the main stream's work (fork), made once

    def join(self) -> None:
        """Make the main stream wait for the work issued to the side stream so far: ``main.wait_stream(side)``
        with one event of the context recorded again each call (a new event per call cost the host)."""
        if self.joined is None:
            self.joined = torch.cuda.Event()
        self.joined.record(self.side)
        self.main.wait_event(self.joined)

    def fork(self) -> None:
        """Make the side stream wait for the work issued to the main stream so far: ``side.wait_stream(main)`` with
        one event of the context recorded again each call (``wait_stream`` makes and records a new one)."""
        if self.forked is None:
            self.forked = torch.cuda.Event()
        self.forked.record(self.main)
        self.side.wait_event(self.forked)

    @classmethod
    def for_world(cls, world) -> Streams:
        if world.device.type != "cuda":
            return cls(None, None)
        return cls(torch.cuda.current_stream(world.device), torch.cuda.Stream(world.device))

    def follow_caller(self, device) -> None:
        """Take the caller's current stream as the main one, at each call: the kernels, the shard's copy and
        the caller's later work run on it, so the flags, waits and joins of the call must too (a context made
        under one stream and called under another ordered them on the old one)."""
        if self.main is not None and _current_stream_id(device.index) != self.main.stream_id:
            self.main = torch.cuda.current_stream(device.index)


class on_stream:  # noqa: N801 - used as a context manager, like torch.cuda.stream
    """``with on_stream(stream):`` work issued in the block goes to ``stream`` (a GPU's; ``None``: nothing changes,
    as emulated kernels run in order). ``torch.cuda.stream`` does the same, but finds the current device and makes
    a Stream object of the current stream each time: 10-30 µs of a call's host time for the two or three blocks a
    reduce-scatter enters. Here, for a stream of the current device, the current stream is read and set by id; a
    stream of another device takes ``torch.cuda.stream``, which also switches the device."""

    __slots__ = ("other", "previous", "stream")

    def __init__(self, stream) -> None:
        self.stream, self.previous, self.other = stream, None, None

    def __enter__(self) -> None:
        stream = self.stream
        if stream is None:
            return
        index = stream.device_index
        if _cuda_set_stream is None or _cuda_get_device() != index:
            self.other = torch.cuda.stream(stream)
            self.other.__enter__()
            return
        self.previous = _cuda_current_stream(index)  # (id, device index, device type)
        _cuda_set_stream(stream.stream_id, index, stream.device_type)

    def __exit__(self, *exc) -> None:
        if self.other is not None:
            self.other.__exit__(*exc)
        elif self.previous is not None:
            _cuda_set_stream(*self.previous)


def _current_stream_id(index: int | None) -> int | None:
    """The id of the current stream of GPU ``index`` (None: the current GPU's), read without making a Stream:
    ``torch.cuda.current_stream`` cost every call microseconds, and the caller's stream rarely changes."""
    if index is None or _cuda_current_stream is None:
        return None
    return _cuda_current_stream(index)[0]


_cuda_current_stream = getattr(torch._C, "_cuda_getCurrentStream", None)
_cuda_set_stream = getattr(torch._C, "_cuda_setStream", None)
_cuda_get_device = getattr(torch._C, "_cuda_getDevice", None)


def copy_address(src: torch.Tensor, dst: torch.Tensor, what: str) -> tuple[int, int, int]:
    """``(destination, source, bytes)`` of the copy engine's copy of ``src`` into ``dst`` (either may be a peer's
    view), checked as ``rank_copy_data`` checks a copy: a launcher that makes the same copies every call reads
    their addresses once, so that each is one driver call on the host."""
    if src.shape != dst.shape or src.dtype != dst.dtype or not (src.is_contiguous() and dst.is_contiguous()):
        raise LaunchError(f"{what}: the copy engine's views do not match ({src.dtype} {list(src.shape)} into "
                          f"{dst.dtype} {list(dst.shape)}) or are not contiguous")
    return dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size()


def vector_peer_table(buffer: torch.Tensor) -> torch.Tensor:
    """``tilelink.runtime.peer_table(buffer)`` for a partner kernel that tells the compiler every entry is
    16-byte aligned (``tll.peer_ptr_aligned``, so a peer's rows move as vectors): checked here, once per
    context, since a wrong hint would load misaligned vectors."""
    from tilelink.runtime import peer_table

    table = peer_table(buffer)
    if table.device.type == "cuda":  # the interpreter ignores the hint
        check_vector_aligned(table.tolist())
    return table


def check_vector_aligned(addresses: list[int]) -> None:
    """Raise :class:`LaunchError` unless every address is a multiple of 16 bytes."""
    odd = [hex(a) for a in addresses if a % 16]
    if odd:
        raise LaunchError(f"a symmetric buffer's copies must start 16-byte aligned for the partner kernels' "
                          f"vector loads; these do not: {', '.join(odd)} (allocate it with "
                          f"tilelink.runtime.symmetric_empty, not as a view at an odd offset)")


def is_host_descriptor(value) -> bool:
    """Whether ``value`` is a tensor descriptor made on the host (``triton.tools.tensor_descriptor.
    TensorDescriptor``: a base tensor, its shape, strides and block shape)."""
    return isinstance(getattr(value, "base", None), torch.Tensor) and hasattr(value, "block_shape")


def described(value):
    """The tensor an argument stands for: a host descriptor's base seen with the descriptor's shape and strides,
    anything else as it is."""
    if not is_host_descriptor(value):
        return value
    base = value.base
    return base.as_strided([int(n) for n in value.shape], [int(n) for n in value.strides], base.storage_offset())


def rebuilt(value, buffer: torch.Tensor):
    """The argument to pass in place of ``value`` so that the kernel reads or writes ``buffer`` instead: ``buffer``
    itself, or, for a host descriptor, the same descriptor (block shape, padding) over the whole of ``buffer``."""
    if not is_host_descriptor(value):
        return buffer
    return dataclasses.replace(value, base=buffer, shape=list(buffer.shape), strides=list(buffer.stride()))


#: zeros of each layout passed in place of an argument read by the first rank only, made once (the latest
#: ``_ZEROS_KEPT`` layouts), with the CUDA streams each is recorded as read on: a call of the same layout passes the
#: same one
_ZEROS: dict[tuple, tuple[torch.Tensor, set[int]]] = {}
_ZEROS_KEPT = 16
#: those made while a CUDA graph was being captured: the graph's replays zero them (their fill is captured too), and
#: they live as long as the process, since the graph reads them on every replay
_CAPTURED_ZEROS: list[torch.Tensor] = []


def zeros_in_layout(value, kernel: str, name: str):
    """What to pass in place of ``value`` so that the kernel reads zeros wherever it would read ``value``: a tensor of
    its shape, strides, type and device over zeros (a host descriptor: the same descriptor over them). Made once per
    layout and kept; the kernel only reads it (``ReduceScatterLaunch.first_rank_only``)."""
    tensor = described(value)
    if not isinstance(tensor, torch.Tensor):
        raise LaunchError(f"{kernel}: {f'argument {name!r}' if name else 'an argument'} is read only in terms the "
                          f"kernel adds to its partial sums, which every rank but the first reads as zeros: pass a "
                          f"torch.Tensor or a host tensor descriptor (got {type(value).__name__})")
    key = (tensor.device, tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
    capturing = tensor.is_cuda and torch.cuda.is_current_stream_capturing()
    kept = None if capturing else _ZEROS.pop(key, None)
    if kept is None:
        # made during a capture, a tensor's fill runs only when the graph replays: an uncaptured call must not take
        # it, and the captured call must not take one whose fill the graph does not hold
        steps = zip(tensor.shape, tensor.stride(), strict=True)
        extent = 1 + sum((n - 1) * st for n, st in steps) if tensor.numel() else 0
        kept = (torch.zeros(extent, dtype=tensor.dtype, device=tensor.device).as_strided(
            tuple(tensor.shape), tuple(tensor.stride())), set())
    zeros, streams = kept
    if capturing:
        _CAPTURED_ZEROS.append(zeros)
        return rebuilt(value, zeros)
    _ZEROS[key] = kept  # the latest used last
    while len(_ZEROS) > _ZEROS_KEPT:
        del _ZEROS[next(iter(_ZEROS))]
    if zeros.is_cuda:
        # read on a stream other than the one it was made on: once it leaves the cache, its memory must not go to
        # another tensor before what that stream has queued has run
        stream = torch.cuda.current_stream(zeros.device)
        if stream.stream_id not in streams:
            zeros.record_stream(stream)
            streams.add(stream.stream_id)
    return rebuilt(value, zeros)


#: a size the launch reads from its grid (``tl.num_programs(0)``: one row a program, nothing in the kernel counting the
#: rows): the programs along that axis
_GRID_SIZE = re.compile(r"tl\.num_programs\(([012])\)")


def grid_axis(size: str) -> int | None:
    """The grid axis whose programs count the rows where the size ``size`` is read from the launch's grid, else
    ``None`` (a parameter, or an expression of the integer arguments)."""
    found = _GRID_SIZE.fullmatch(size)
    return int(found.group(1)) if found else None


@functools.lru_cache(maxsize=64)
def _size_code(expression: str):
    """A ``size=`` expression compiled once (it is evaluated at every launch)."""
    return compile(expression, "<size>", "eval")


def variant_key(kernel, call: dict) -> tuple:
    """What of ``call`` decides which variant of ``kernel`` Triton compiles: constexprs by value, tensors
    by dtype and 16-byte alignment, other ints by what Triton specializes them on (equal to 1, a
    multiple of 16; neither for ``do_not_specialize`` ones) and their width, floats by type. Finer than
    Triton's own key, never coarser: two calls with one key run one compiled kernel. An autotuned (or
    heuristics) kernel is keyed on every int's value and every tensor's shape and strides too, since
    its configuration may depend on any of them. A kernel launched directly (:class:`tilelink.rules.direct.
    DirectKernel`) reads the same terms with the code it generated for the call's form."""
    if type(kernel) is DirectKernel:
        return kernel.variant(call)
    params, ints, wrapped = _kernel_params(kernel)
    if wrapped:
        return tuple((name, _value_key(value, params.get(name), True)) for name, value in call.items())
    tensor = torch.Tensor
    key = []
    for name, value in call.items():  # plain tensors and ints inline (most arguments are): this runs every call
        kind = type(value)
        if kind is tensor:
            key.append((name, (value.dtype, value.data_ptr() % 16 == 0)))
        elif kind is int:
            spec = ints.get(name)  # None: by value; else whether Triton specializes it (as _value_key)
            key.append((name, value if spec is None else (
                spec and value == 1, spec and value % 16 == 0, -2**31 <= value < 2**31, value < 2**63)))
        else:
            key.append((name, _value_key(value, params.get(name), False)))
    return tuple(key)


_KERNEL_PARAMS: dict[int, tuple] = {}


def _kernel_params(kernel) -> tuple[dict, dict, bool]:
    """``kernel``'s parameters by name; for each that is not a constexpr, whether Triton specializes an int passed
    to it (not ``do_not_specialize``); and whether the kernel is wrapped (autotuned, heuristics): read once."""
    entry = _KERNEL_PARAMS.get(id(kernel))
    if entry is None or entry[0] is not kernel:
        fn, wrapped = kernel, False
        while not hasattr(fn, "params") and hasattr(fn, "fn"):
            fn, wrapped = fn.fn, True
        params = {p.name: p for p in getattr(fn, "params", ())}
        ints = {name: not getattr(p, "do_not_specialize", False) for name, p in params.items() if not p.is_constexpr}
        entry = _KERNEL_PARAMS[id(kernel)] = (kernel, params, ints, wrapped)
    return entry[1], entry[2], entry[3]


def _value_key(value, param, wrapped: bool):
    if isinstance(value, torch.Tensor):
        key = (value.dtype, value.data_ptr() % 16 == 0)
        return key + (tuple(value.shape), value.stride()) if wrapped else key
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if param is None or param.is_constexpr or wrapped:
            return value
        plain = bool(getattr(param, "do_not_specialize", False))
        return (not plain and value == 1, not plain and value % 16 == 0, -2**31 <= value < 2**31, value < 2**63)
    if isinstance(value, float):
        return value if param is not None and param.is_constexpr else float
    if isinstance(value, (tuple, list)):
        return type(value), tuple(_value_key(v, None, wrapped) for v in value)
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor) and hasattr(value, "block_shape"):  # a host tensor descriptor
        return type(value), _value_key(base, None, wrapped), tuple(value.block_shape)
    return value if isinstance(value, Hashable) else type(value)


def metas(kernel, bound: dict) -> list[tuple[dict, str]]:
    """The meta-parameters Triton may evaluate a grid function on for ``kernel`` launched with ``bound``: the
    arguments, with each configuration's of an autotuner and the values of a heuristics wrapper (outermost first,
    as they run), each with a description of the configuration."""
    found = [(dict(bound), "the call's arguments")]
    for _ in range(8):  # the wrappers down to the JIT function
        if isinstance(getattr(kernel, "configs", None), list):  # triton.autotune
            found = [({**meta, **config.kwargs}, ", ".join(f"{k}={v!r}" for k, v in config.kwargs.items()) or what)
                     for meta, what in found for config in kernel.configs]
        elif isinstance(getattr(kernel, "values", None), dict):  # triton.heuristics
            for meta, _ in found:
                for name, heuristic in kernel.values.items():
                    try:
                        meta[name] = heuristic(meta)
                    except Exception as exc:
                        stood = [k for k, v in meta.items() if isinstance(v, _Launched) or isinstance(
                            getattr(v, "base", None), _Launched)]
                        if not stood:
                            raise
                        if isinstance(exc, ReadsValues):
                            raise LaunchError(
                                f"the @triton.heuristics value {name!r} reads `.{exc.args[0]}` of the tensors TileLink "
                                f"gives the rewritten kernel in place of {', '.join(map(repr, stood))} (the gathered "
                                f"rows or the partial sums, whose values are not all there when Triton evaluates it): "
                                f"compute it from the arguments' layout (shape, strides, dtype) and int "
                                f"values") from None
                        raise LaunchError(
                            f"the @triton.heuristics value {name!r} fails ({type(exc).__name__}: {exc}) where TileLink "
                            f"evaluates it as Triton's launch does, with stand-ins for the tensors the rewritten "
                            f"kernel is given in place of {', '.join(map(repr, stood))} (their layout only)") from None
        kernel = getattr(kernel, "fn", None)
        if kernel is None:
            break
    return found


class ReadsValues(AttributeError):  # noqa: N818 - a read, said in the launch's refusal
    """A grid function or a heuristic read something of a tensor the rewritten kernel is given other than its
    layout: its values, which are not all there before the launch (:class:`_Launched`). An ``AttributeError``, so
    that a look that has a default (``getattr(v, "value", v)``, ``hasattr``) takes it."""


class _Launched:
    """Stands for a tensor the rewritten kernel is given (the gathered rows, the partial sums) where a grid function or
    a heuristic is evaluated before the launch: its layout (shape, strides, dtype, device, size) as Triton's launch
    sees it, and an aligned address; any other read (its values: `x.abs().max().item()`) raises
    :class:`ReadsValues`, since the peers' rows are still in flight when Triton evaluates them."""

    __slots__ = ("_shape", "_strides", "dtype", "device")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        self._shape = torch.Size(shape)
        strides, step = [], 1
        for n in reversed(self._shape):
            strides.append(step)
            step *= max(int(n), 1)
        self._strides = tuple(reversed(strides))
        self.dtype, self.device = dtype, device

    @property
    def shape(self) -> torch.Size:
        return self._shape

    ndim = property(lambda self: len(self._shape))
    is_cuda = property(lambda self: self.device.type == "cuda")
    is_cpu = property(lambda self: self.device.type == "cpu")

    def size(self, dim: int | None = None):
        return self._shape if dim is None else self._shape[dim]

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    def dim(self) -> int:
        return len(self._shape)

    def numel(self) -> int:
        n = 1
        for d in self._shape:
            n *= int(d)
        return n

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype, device="meta").element_size()

    itemsize = property(element_size)
    nbytes = property(lambda self: self.numel() * self.element_size())
    layout = property(lambda self: torch.strided)

    def storage_offset(self) -> int:
        return 0

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def is_complex(self) -> bool:
        return self.dtype.is_complex

    def is_contiguous(self, *args, **kwargs) -> bool:
        return True

    def get_device(self) -> int:
        return -1 if self.device.type == "cpu" else int(self.device.index or 0)

    def data_ptr(self) -> int:
        return 0  # the symmetric buffers are aligned past any alignment a heuristic tests

    def __len__(self) -> int:
        return int(self._shape[0]) if self._shape else 0

    def __getattr__(self, name: str):
        raise ReadsValues(name)

    def __repr__(self) -> str:
        return f"<the buffer the rewritten kernel is given: {tuple(self._shape)}, {self.dtype}>"


def has_heuristics(kernel) -> bool:
    """Whether ``kernel``'s wrappers include a ``triton.heuristics``, whose values are computed from the arguments."""
    for _ in range(8):
        if isinstance(getattr(kernel, "values", None), dict):
            return True
        kernel = getattr(kernel, "fn", None)
        if kernel is None:
            break
    return False


class Launcher:
    """Common part of the rules' launchers."""

    BLOCK = 1024  # elements per program step of the partner kernels
    #: the SM pull partners on a GPU (``BLOCK``, ``num_warps``): each of their few programs pulls a round trip
    #: over the link per step, so the bytes in flight per SM set the bandwidth. On 2 H200s (comm_sms 16)
    #: 1024-element steps of 4 warps pulled 15-29 GB/s, these settings 67-253 GB/s
    PULL_CONSUMER_GPU = {"BLOCK": 8192, "num_warps": 16}
    PULL_PRODUCER_GPU = {"BLOCK": 16384, "num_warps": 8}

    def pull_meta(self, world, gpu: dict) -> dict:
        """The launch options of an SM pull partner: ``gpu`` on a GPU, else the emulated world's small
        steps (more blocks per channel for the tests to cover)."""
        return dict(gpu) if world.device.type == "cuda" else {"BLOCK": self.BLOCK}

    def __init__(self, okernel) -> None:
        self.okernel = okernel
        self.plan: LaunchPlan = okernel.plan.launch  # the rule's LaunchPlan subclass
        self.contexts: dict[tuple, Any] = {}
        #: fast_key(call) -> its context: a call like one seen before skips the checks and sizes of context()
        self.fast_contexts: dict[tuple, Any] = {}
        self._world = None  # the world the contexts belong to
        #: id(context) -> (context, its channel arguments in a world of one: the same every call, made once)
        self.alone_args: dict[int, tuple] = {}
        #: a wait of a call in this world timed out (kept by OverlappedKernel): later calls refuse to run
        self.timed_out: Exception | None = None
        #: id(context) -> (context, its HandshakeLaunch): a GPU context's handshake, made once
        self.handshakes: dict[int, tuple] = {}

    # -- helpers -------------------------------------------------------------------------------
    @property
    def kernel(self):
        """The rewritten kernel, launched directly once a variant has run (:func:`tilelink.rules.direct.direct`)."""
        return direct(getattr(self.okernel.module, self.okernel.name))

    def partner(self, name: str):
        """A partner kernel of the generated module, launched as :attr:`kernel` is."""
        return direct(getattr(self.okernel.module, name))

    def world(self):
        """The current world. A new one (``finalize()``, then ``init()``) drops what belonged to the old:
        the contexts, whose symmetric buffers and channels were freed with it (reusing them crashed the
        rank), and a timed-out wait."""
        world = current_world()
        if world is not self._world:
            self.contexts.clear()
            self.fast_contexts.clear()
            self.alone_args.clear()
            self.handshakes.clear()
            self.timed_out = None
            self._world = world  # held: a new world cannot reuse the identity of this one
        return world

    def size_of(self, bound: dict, grid: Any = None) -> int:
        """The full size of the communicated dimension for a call of ``bound`` launched on ``grid``: its ``size=``
        argument, an expression of the integer arguments, or the grid's programs along one axis (:func:`grid_axis`)."""
        name = self.plan.size_param
        axis = grid_axis(name)
        if axis is not None:
            value = self.okernel.grid_size(grid, bound, axis)
        elif name.isidentifier():
            if name not in bound:
                raise LaunchError(f"{self.okernel.name}: missing argument {name!r} (the full size of the "
                                  f"communicated dimension)")
            value = bound[name]
        else:  # an expression of the integer arguments, e.g. "num_valid_tokens // top_k"
            scalars = {k: v for k, v in bound.items() if isinstance(v, int) and not isinstance(v, bool)}
            try:
                value = eval(_size_code(name), {"__builtins__": {}}, scalars)  # noqa: S307
            except Exception as exc:  # noqa: BLE001 - reported with the expression
                raise LaunchError(f"{self.okernel.name}: cannot evaluate size={name!r} from the integer "
                                  f"arguments: {exc}") from None
        if hasattr(value, "item"):
            value = value.item()
        if not isinstance(value, int) or value < 1:
            raise LaunchError(f"{self.okernel.name}: {self.size_said(value)} must be a positive int")
        return value

    def launched_shapes(self, bound: dict, size: int) -> dict[str, tuple[int, ...]]:
        """The shape of each annotated tensor as the rewritten kernel is given it, for a call of ``size`` rows, where
        it is not the argument's (the gathered rows in place of the shard, the partial sums in place of the output's
        rows)."""
        return {}

    def as_launched(self, bound: dict, grid: Any = None) -> dict:
        """``bound`` as Triton's launch evaluates the grid function and the heuristics on it: each annotated tensor
        replaced by a stand-in of the layout of the one the rewritten kernel is given (:class:`_Launched`: no memory,
        no values). The checks that evaluate them must see what the launch sees: a grid of
        ``X.shape[0]`` programs reads the shard's rows here and the gathered rows there, and a heuristic that
        splits K by the rows would add in one and store in the other. ``bound`` itself where neither is evaluated,
        or where the call's size is not known (the launch refuses it, saying why)."""
        if not callable(grid) and not has_heuristics(self.okernel.kernel):
            return bound
        try:
            size = self.size_of(bound, grid)
        except LaunchError:
            return bound
        shapes = self.launched_shapes(bound, size)
        view = dict(bound)
        for name, shape in shapes.items():
            t = bound.get(name)
            if type(t) is torch.Tensor:
                view[name] = _Launched(shape, t.dtype, t.device)
            elif is_host_descriptor(t):  # the same descriptor over the buffer, as `rebuilt` makes it at the launch
                stand_in = _Launched(shape, t.base.dtype, t.base.device)
                view[name] = dataclasses.replace(t, base=stand_in, shape=list(shape), strides=list(stand_in.stride()))
        return view

    def size_said(self, size: Any) -> str:
        """The size of a call as its messages say it: ``M=64``, or the grid's programs that count the rows."""
        axis = grid_axis(self.plan.size_param)
        if axis is None:
            return f"{self.plan.size_param}={size!r}"
        return f"{size!r} rows (the grid's programs along axis {axis}, one row each)"

    def context(self, bound: dict, grid: Any = None):
        """The context of a call's shapes (:meth:`checked_context`), found from :meth:`fast_key` when a call like
        this one was seen before in this world. ``grid``: the call's, where the size is read from it."""
        self.world()  # a new world drops the old one's contexts first
        fast = self.fast_key(bound, grid)
        ctx = self.fast_contexts.get(fast) if fast is not None else None
        if ctx is None:
            ctx = self.checked_context(bound, grid)
            if fast is not None:
                self.fast_contexts[fast] = ctx
        return ctx

    def checked_context(self, bound: dict, grid: Any = None):
        """Check a call's arguments (and, where the size is read from it, its ``grid``) against the rule's contract
        and find (or collectively create) the context of their shapes."""
        raise NotImplementedError

    def fast_key(self, bound: dict, grid: Any = None) -> tuple | None:
        """What :meth:`context` decides a call's context from, read without a check: the size argument (every int
        argument for a size expression), the top-k, and each annotated tensor's shape, dtype and device. A call
        whose key was seen before gets that call's context: its checks passed for the same values. ``None`` (the
        checked way every time) when an annotated argument is not a contiguous plain tensor, or the size not an
        int. The checks and the sharding cost the host more than the kernels' launch, every call. A size read from
        the grid is its programs along the axis where the grid is a tuple of ints (a function is evaluated by the
        checked way)."""
        name = self.plan.size_param
        axis = grid_axis(name)
        if axis is not None:
            if type(grid) not in (tuple, list) or not all(type(n) is int for n in grid):
                return None
            size = ("grid", grid[axis] if axis < len(grid) else 1)
        elif name.isidentifier():
            size = bound.get(name)
            if type(size) is not int:
                return None
        else:
            size = tuple((k, v) for k, v in bound.items() if type(v) is int)
        topk = self.topk_param()
        key = [size, bound.get(topk) if topk else None]
        for tensor in self.plan.tensors:
            t = bound.get(tensor)
            if type(t) is not torch.Tensor or not t.is_contiguous():
                return None
            key.append((t.shape, t.dtype, t.device))
        return tuple(key)

    def topk_param(self) -> str | None:
        """The argument that counts a token's expert slots (a reduce-scatter's ``topk=``), on which a call's
        context depends; none for a rule without one."""
        return None

    def sharding(self, world, size: int) -> RowSharding:
        rpr = cdiv(size, world.world_size)
        # default channel size: 128 rows for SM communication; a whole rank's rows for the copy engine,
        # whose every copy and flag costs the host an enqueue
        block = self.plan.comm_block or (rpr if self.plan.via == "copy_engine" else 128)
        wanted = self.plan.channels_per_rank or cdiv(rpr, block)
        return RowSharding(size, world.world_size, max(1, min(wanted, rpr)))

    def tensor_arg(self, bound: dict, name: str, world) -> torch.Tensor:
        """This rank's shard passed as ``name``: a tensor, or the tensor a host ``TensorDescriptor`` describes."""
        t = described(bound.get(name))
        if not isinstance(t, torch.Tensor):
            raise LaunchError(f"{self.okernel.name}: argument {name!r} must be a torch.Tensor (this rank's "
                              f"shard) or a triton.tools.tensor_descriptor.TensorDescriptor over it, got "
                              f"{type(t).__name__}")
        if t.device != world.device and not (t.device.type == world.device.type == "cuda"
                                             and t.device.index == world.device.index):
            raise LaunchError(f"{self.okernel.name}: {name} is on {t.device}, but this rank computes on "
                              f"{world.device}; move it there first")
        if not t.is_contiguous():
            raise LaunchError(f"{self.okernel.name}: {name} must be contiguous (call .contiguous())")
        return t

    def channel_args(self, barriers: torch.Tensor, epoch: int, world, sharding: RowSharding,
                     diag) -> dict[str, Any]:
        """The ``tlk_*`` arguments of the rewritten kernel."""
        return channel_args(barriers, epoch, world.rank, world.world_size, sharding, diag.buffer, diag.budget_ns)

    def satisfied_args(self, rows: int, world_size: int, device) -> dict[str, Any]:
        """``tlk_*`` arguments for rank 0 of a world of ``world_size`` with the operator's own channels,
        every barrier word far above its target: each wait passes at once (benchmarks of the compute part)."""
        from types import SimpleNamespace

        sh = self.sharding(SimpleNamespace(world_size=world_size), rows)
        return channel_args(torch.full((sh.num_channels,), 1 << 40, dtype=torch.int64, device=device), 1, 0,
                            world_size, sh, torch.zeros(8, dtype=torch.int64, device=device), 10**10)

    def scratch_table(self, ctx, world) -> torch.Tensor:
        """A peer table whose every entry is this rank's scratch array: a dry run's p2p notifies and
        peer waits stay on this rank."""
        return torch.full((world.world_size,), ctx.scratch.data_ptr(), dtype=torch.int64, device=world.device)

    def warm_up(self, ctx, world, grid, call: dict, partners=lambda: None) -> None:
        """On a GPU, before a call that would make Triton compile and load a kernel (loading
        a module waits for the running kernels, so a module loaded while another kernel spins for it
        deadlocks until the wait's budget runs out).

        Before the first real call of a context: run the rewritten kernel against the scratch channel at
        epoch 0 (no wait can block), then ``partners()`` (the partner kernels, the same way), and wait.
        This compiles, loads and autotunes every kernel. The partners' variant is fixed by the context
        (their epoch is not specialized on) but for the alignment of the caller's output shard, a
        reduce-scatter's: another one compiles at its launch, before the rewritten kernel's, which waits
        for nothing (a pause, not a deadlock). The rewritten kernel's variant is not: a later call with other
        constexprs (an MoE layer with other experts, or whose routing picks another tile, on buffers of
        the same shape) or differently aligned tensors needs another variant. That one is run dry
        again, here, before anything of the call is enqueued, on zeroed stand-ins for the symmetric
        buffers (the peers may still be reading this rank's copies of them)."""
        if world.backend == "emulated":
            return
        key = variant_key(self.kernel, call)
        if key in ctx.variants:
            return
        ctx.scratch.zero_()
        first = not ctx.variants
        if not first:
            call = {**call, **{name: rebuilt(call[name], torch.zeros_like(described(call[name])))
                               for name in self.plan.tensors}}
        self.kernel[grid](**call, **self.channel_args(ctx.scratch, 0, world, ctx.sharding, ctx.diag))
        if first:
            partners()
        if world.device.type == "cuda":
            torch.cuda.synchronize(world.device)
        ctx.variants.add(key)

    def load(self, grid, bound: dict) -> None:
        """On a GPU, compile and load the variant of the rewritten kernel that a call of ``bound`` launches, running
        nothing: a form of call that only captured calls take (an MoE call's grid and tile of the shapes' worst case)
        is then found loaded by the capture, which cannot load it. The context of ``bound``'s shapes must have had a
        call already, which loaded its partner kernels (and whose first variant a dry run autotuned); without one,
        nothing is loaded here. Under the interpreter there is nothing to load."""
        from tilelink.runtime.preload import preload

        world = self.world()
        if world.backend == "emulated":
            return
        ctx = self.context(bound, grid)
        alone = self.alone_call(bound, world)
        if not alone and not ctx.variants:
            return  # its first call warms every kernel up (Launcher.warm_up)
        call = dict(bound) if alone else self.kernel_call(bound, ctx)
        key = variant_key(self.kernel, call)
        if key in ctx.variants:
            return
        preload(self.kernel, grid, **call, **self.channel_args(ctx.scratch, 0, world, ctx.sharding, ctx.diag))
        ctx.variants.add(key)

    def alone_call(self, bound: dict, world) -> bool:
        """Whether a call of ``bound`` runs the rewritten kernel on the caller's own tensors (:meth:`alone`)."""
        return world.world_size == 1

    def kernel_call(self, bound: dict, ctx) -> dict:
        """The arguments the rewritten kernel gets for a call of ``bound`` on ``ctx`` (the annotated tensors rebuilt
        over the context's buffers), but the channel arguments."""
        raise NotImplementedError

    @staticmethod
    def peer_order(world) -> list[int]:
        """The other ranks, ring order (the next rank first)."""
        return [(world.rank + step) % world.world_size for step in range(1, world.world_size)]

    def handshake(self, ctx, ready, world, epoch: int, flags: tuple[int, int, int] = (0, 0, 0),
                  copy: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Tell every peer that this rank reached call ``epoch`` (word ``rank`` of their ``ready``), then wait for
        every peer's word: on a GPU one kernel on the current stream does both (:class:`HandshakeLaunch`), so the
        work enqueued behind it starts once every peer has reached the call; in the emulated world the host
        notifies and waits. ``flags``: ``(first, count, value)``, words ``first`` to ``first + count - 1`` of this
        rank's ``ctx.channel`` set to ``value`` with it (a copy-engine gather's own channels). The wait's budget is
        :func:`tilelink.runtime.diagnostics.skew_timeout_s`: a peer whose
        host is behind between calls is waited for there, on one program of one warp (GPU) and no other SM, and the
        kernels launched behind it then wait on that peer only for its GPU work, with the budget of a wait
        (without it, ten seconds of host work on one rank between two calls timed out the others' kernels). A peer
        that does not come in time is reported as :class:`~tilelink.runtime.diagnostics.HandshakeTimeout` ("rank
        1 has not reached call 3 of ag_gemm_kernel"): on a GPU from the record the kernel leaves in ``ctx.diag``,
        read as any wait's (``finish``); in the emulated world at once, and the host's wait also stops, with
        :class:`~tilelink.runtime.diagnostics.PeerFailedError`, when the peer failed or finished its work.
        ``copy``: ``(shard, place)``, this rank's shard to copy into its place in the gathered set first (a
        contiguous place of the shard's shape and dtype); on a GPU the handshake's kernel makes the copy
        (:func:`tilelink.runtime.handshake.shard_handshake_kernel`) where the shard is 16-byte aligned."""
        from tilelink.runtime.diagnostics import skew_timeout_s

        emulated = world.backend == "emulated"
        budget = skew_timeout_s(emulated)
        if world.device.type == "cuda":
            entry = self.handshakes.get(id(ctx))
            if entry is None or entry[0] is not ctx:
                launch = HandshakeLaunch(ready, ctx.diag, ctx.channel, ctx.scratch, world, flags[:2])
                entry = self.handshakes[id(ctx)] = (ctx, launch)
            entry[1](epoch, int(budget * 1e9), flags[2], copy)
            return
        if copy is not None:
            copy[1].copy_(copy[0])
        from tilelink.runtime import rank_notify

        peers = self.peer_order(world)
        first, count, value = flags
        for index in range(first, first + count):
            rank_notify(ctx.channel, index, value, world.rank)
        for dst in peers:
            rank_notify(ready, world.rank, epoch, dst)
        what = self.okernel.name
        for src in peers:  # the host waits: it watches what becomes of the peer meanwhile
            world.control.wait_word(ready.word_address(src, world.rank, "handshake"), epoch, src, what, budget)

    def finish(self, ctx) -> None:
        """Join the side stream and turn a timed-out wait into :class:`tilelink.WaitTimeout`."""
        if ctx.streams.main is not None:
            ctx.streams.join()
        if self.okernel.check_waits:
            ctx.diag.check_later(kernel=self.okernel.name, stream=ctx.streams.main)
            twin = getattr(ctx, "twin", None)  # a rule without captured calls has none
            if twin is not None and twin.captured:  # a replay's timed-out wait
                twin.diag.check_later(kernel=self.okernel.name)
            self.world().impl.check_waits()  # a copy-engine wait released by the watcher (non-blocking)

    def check(self) -> None:
        """Wait for every context's kernels and raise :class:`tilelink.WaitTimeout` for a timed-out wait (a
        captured call's too, from its replays)."""
        for ctx in self.contexts.values():
            twin = getattr(ctx, "twin", None)  # a rule without captured calls has none
            for diag in (ctx.diag, twin.diag if twin is not None and twin.captured else None):
                if diag is not None:
                    diag.check_pending(block=True)
                    diag.check(kernel=self.okernel.name)

    # -- captured calls (CUDA graphs; tilelink.runtime.graphs) ------------------------------------------
    def refuse_capture(self, world, why: str) -> None:
        """Raise :class:`LaunchError` when the caller's call is being captured and cannot be."""
        from tilelink.runtime import graphs

        if graphs.capturing(world.device):
            raise LaunchError(f"{self.okernel.name}: cannot be captured in a CUDA graph here: {why}")

    def make_twin(self, ctx, world, **channels):
        """Give a new context its twin for captured calls (:mod:`tilelink.runtime.graphs`): the same buffers,
        streams and loaded variants, its own ``channels`` (``Channel``s replacing the context's, zeroed: their
        counts are the twin's calls'), diagnostics array (whose words ``EPOCH_WORD`` and ``COUNT_WORD`` count
        the twin's calls on the device) and barrier words. Made with the context, on every rank in the same order:
        symmetric memory cannot be allocated while a stream captures."""
        from dataclasses import replace

        from tilelink.runtime import Channel, Diagnostics, graphs

        ctx.twin = replace(ctx, diag=Diagnostics(), twin=None,
                           fence=Channel(world.world_size) if world.world_size > 1 else None, **channels)
        graphs.warm_up(world.device)

    def begin_captured(self, ctx, world, grid, call: dict):
        """Start a captured call on ``ctx``: its twin, after checking that nothing of the call would compile or
        load a kernel, and the twin's call count advanced on the device (a node of the graph: every replay
        advances it)."""
        from tilelink.runtime import graphs

        twin = ctx.twin
        if world.backend != "emulated" and variant_key(self.kernel, call) not in ctx.variants:
            raise LaunchError(f"{self.okernel.name}: this variant of the kernel (these shapes, dtypes, alignments "
                              f"and constexprs) has not run on this rank yet, and it cannot be compiled and loaded "
                              f"while a stream captures: call the operator once outside the capture with the "
                              f"same arguments first (the warm-up that torch.cuda.graph asks for)")
        twin.captured = True
        graphs.note_captured(twin.diag, self.okernel.name, world)
        # the count, and the kernels' target factor with it (a launcher that resets its channels per call keeps
        # the factor at 0: its targets are the call's own)
        first = graphs.COUNT_WORD if self.resets_channels else graphs.EPOCH_WORD
        words = twin.diag.buffer[first:graphs.COUNT_WORD + 1]
        graphs.enqueue(lambda: words.add_(1))
        return twin

    #: whether a captured call of this launcher starts its data channels from zero (and its notifies store the
    #: call's own counts with the stream's memory operations) instead of scaling them by the call count
    resets_channels = False

    @staticmethod
    def on(stream):
        """Work issued in this block goes to ``stream`` (GPU) or runs in order (emulated, ``None``)."""
        return on_stream(stream)

    def device_handshake(self, twin, ready, world, notify_stream, wait_stream, mul: int = 1, sub: int = 0) -> None:
        """:meth:`handshake` of a captured call: tell every peer that this rank reached it (word ``rank`` of
        their ``ready``: the twin's call count times ``mul``, less ``sub``), then make ``wait_stream`` wait for
        every peer's word, both by small kernels that read the count on the device. Bounded by the handshake's
        budget; a peer that does not come is recorded in the twin's diagnostics array."""
        from tilelink.runtime import graphs
        from tilelink.runtime.diagnostics import skew_timeout_s

        budget = int(skew_timeout_s(world.backend == "emulated") * 1e9)
        diag = twin.diag.buffer

        def step() -> None:
            with self.on(notify_stream):
                graphs.signal(ready, world.rank, world, diag, mul=mul, sub=sub)
            with self.on(wait_stream):
                graphs.wait(ready.barriers, 0, world.world_size, diag, budget, skip=world.rank, mul=mul, sub=sub,
                            kind=graphs.KIND_HANDSHAKE)

        graphs.enqueue(step)

    def device_barrier(self, twin, world, stream, last: bool = False) -> None:
        """A barrier of every rank's ``stream`` in a captured call (the twin's ``fence`` words): at its start
        (every peer is past its previous call) or, with ``last``, at its end (every peer is done with this one)."""
        self.device_handshake(twin, twin.fence, world, stream, stream, mul=2, sub=0 if last else 1)

    def notify(self, ctx, channel, index: int, value: int, rank: int, stream) -> None:
        """:func:`tilelink.runtime.rank_notify` (word ``index`` of ``rank``'s copy of ``channel``, a
        :class:`~tilelink.runtime.Channel` of ``ctx``, set to ``value`` behind ``stream``'s work); in a captured call
        a kernel that sets it to ``value`` times the call count. The word is addressed from the Channel's table (a
        bare array's costs checks and a view of the peer's copy)."""
        if not ctx.captured or self.resets_channels:  # the latter: a call's own count, frozen like its kernels
            from tilelink.runtime import rank_notify

            rank_notify(channel, index, value, rank, stream)
            return
        from tilelink.runtime import graphs

        with self.on(stream):
            graphs.signal(channel, index, self.world(), ctx.diag.buffer, dst=rank, mul=value)

    def wait(self, ctx, channel, index: int, value: int, stream, chained: bool = False) -> None:
        """:func:`tilelink.runtime.rank_wait` (``stream`` waits until local word ``index`` of ``channel``, a
        :class:`~tilelink.runtime.Channel` of ``ctx``, reaches ``value``; the host goes on, a watcher checks the
        wait); in a captured call a one-program kernel that spins until the word reaches ``value`` times the call
        count, bounded by the wait's budget. ``chained``: only copies and flags were enqueued on ``stream`` since
        its last wait (``rank_wait``)."""
        if not ctx.captured:
            from tilelink.runtime import rank_wait

            rank_wait(channel, index, value, stream, block=False, chained=chained)
            return
        from tilelink.runtime import graphs

        with self.on(stream):
            graphs.wait(channel.barriers, index, 1, ctx.diag.buffer, ctx.diag.budget_ns, mul=value)

    def finish_captured(self, twin) -> None:
        """Join the side stream into the main one (the capture's fork and join); nothing is checked on the
        host: a timed-out wait stays in the twin's record for the next uncaptured check."""
        if twin.streams.main is not None:
            twin.streams.main.wait_stream(twin.streams.side)

    def alone(self, grid, call: dict, ctx, world) -> None:
        """A world of one rank: nothing to communicate. The rewritten kernel runs on the caller's own
        tensors against a barrier array far above any target (every wait passes; notifies only add to
        it): no copy, no barrier, no partner kernel."""
        from tilelink.runtime import graphs

        if graphs.capturing(world.device):  # every wait passes: nothing depends on the call count
            args = self.channel_args(ctx.satisfied, 1, world, ctx.sharding, ctx.diag)
            graphs.enqueue(lambda: self.kernel[grid](**call, **args))
            return
        self.kernel[grid](**call, **self.satisfied_channels(ctx, world))
        if self.okernel.check_waits:
            ctx.diag.check_later(kernel=self.okernel.name, stream=ctx.streams.main)

    def satisfied_channels(self, ctx, world) -> dict[str, Any]:
        """The channel arguments of a world of one's calls on ``ctx`` (:meth:`alone`): every wait passes, the same
        every call, made once per context."""
        entry = self.alone_args.get(id(ctx))
        if entry is None or entry[0] is not ctx:
            if ctx.satisfied is None:
                ctx.satisfied = torch.full_like(ctx.scratch, 1 << 60)
            entry = self.alone_args[id(ctx)] = (ctx, self.channel_args(ctx.satisfied, 1, world, ctx.sharding, ctx.diag))
        return entry[1]

    def prepared(self, grid, bound: dict, names: tuple[str, ...]):
        """A call of ``bound`` made ready to launch again with other values of its tensors ``names``
        (:class:`AloneLaunch`), where it runs alone (:meth:`alone`: a world of one, no top-k) and writes over its
        output (no split-K write-back, which zeroes it first); with peers, what the rule makes
        (:meth:`prepared_with_peers`); ``None`` otherwise (every call takes :meth:`launch`). Made after a call of
        ``bound``'s form has run: its context exists, and the checks of the arguments it fixes passed."""
        world = self.world()
        if self.timed_out is not None or self.topk_param() or getattr(self.plan, "atomic_axes", None) is not None:
            return None
        if world.world_size != 1:
            return self.prepared_with_peers(world, grid, bound, names)
        return AloneLaunch(self, world, self.context(bound, grid), grid, bound, names)

    def prepared_with_peers(self, world, grid, bound: dict, names: tuple[str, ...]):
        """:meth:`prepared` in a world of several ranks: ``None`` (every call takes :meth:`launch`) unless the rule
        makes one."""
        return None


def kept_form_may_run(prepared) -> bool:
    """Whether a launch prepared for one form of call (:class:`AloneLaunch`, the rules' launches with peers) may run
    this call, rather than the launch path: the world it was made in, no earlier wait timed out, no capture."""
    return current_world() is prepared.world and prepared.launcher.timed_out is None and not prepared.capturing(
        prepared.device)


def bound_launch(kernel, grid, call: dict, names: tuple[str, ...]):
    """``kernel[grid](**call)`` made ready to run again with other values of ``names``, as ``find(*values)`` then
    ``launch(found)``: a :class:`tilelink.rules.direct.Bound` for a kernel launched directly, else a
    :class:`TritonLaunch` (the interpreter's kernels, which have nothing to compile or load)."""
    if type(kernel) is DirectKernel:
        return kernel.bound(grid, call, names)
    return TritonLaunch(kernel, grid, call, names)


class TritonLaunch:
    """The interface of :meth:`tilelink.rules.direct.Bound`'s ``find`` and ``launch`` over Triton's own launch, for
    the emulated world's kernels (the interpreter compiles and loads nothing: a call is always found)."""

    __slots__ = ("call", "grid", "kernel", "names")

    def __init__(self, kernel, grid, call: dict, names: tuple[str, ...]) -> None:
        self.kernel, self.grid, self.names = kernel, grid, tuple(names)
        self.call = emptied(call, self.names)  # as Bound keeps it

    def find(self, *values) -> dict:
        return dict(zip(self.names, values, strict=True))

    def launch(self, found: dict) -> None:
        self.kernel[self.grid](**{**self.call, **found})

    def __call__(self, *values) -> None:  # as a Bound is called
        self.launch(self.find(*values))


class AloneLaunch:
    """One form of a world of one's call, ready to launch (:meth:`Launcher.prepared`): ``launch(*tensors)`` is
    ``launcher.launch(grid, bound)`` with the tensors ``names`` given ``tensors``, every other argument ``bound``'s,
    in a few steps: the world, the launcher's timed-out wait and a capture are checked, the caller's stream taken
    (``Streams.follow_caller``), the kernel launched with the context's satisfied channels (a
    :class:`tilelink.rules.direct.Bound` on a GPU) and the wait record checked (``Diagnostics.check_later``, which
    reads ``TILELINK_CHECK_WAITS`` at each call). It returns ``False``, launching nothing, where the call must take
    ``launch``: a new world, an earlier wait that timed out, a capture. The caller keeps what else decides the call
    (its tensors' shapes, strides, dtypes and devices: what the context and the checks read) in its own key."""

    __slots__ = ("capturing", "ctx", "device", "launcher", "name", "run", "world")

    def __init__(self, launcher: Launcher, world, ctx, grid, bound: dict, names: tuple[str, ...]) -> None:
        from tilelink.runtime import graphs

        self.launcher, self.world, self.ctx, self.device = launcher, world, ctx, world.device
        self.capturing = graphs.capturing
        self.name = launcher.okernel.name
        call = {**bound, **launcher.satisfied_channels(ctx, world)}
        self.run = bound_launch(launcher.kernel, grid, call, names)

    def __call__(self, *tensors) -> bool:
        launcher = self.launcher
        if not kept_form_may_run(self):
            return False
        ctx = self.ctx
        ctx.streams.follow_caller(self.device)
        try:
            self.run(*tensors)
            if launcher.okernel.check_waits:
                ctx.diag.check_later(kernel=self.name, stream=ctx.streams.main)
        except WaitTimeout as exc:  # later calls refuse to run (OverlappedKernel's launch)
            launcher.timed_out = exc
            raise
        return True


class HandshakeLaunch:
    """The handshake of one context's uncaptured calls on a GPU (:meth:`Launcher.handshake`), made once per context:
    ``launch(call, budget_ns, flag_value, copy)`` launches :func:`tilelink.runtime.handshake.handshake_kernel` on the
    current stream over the context's ``ready`` words, diagnostics array and ``flags`` (``(first, count)`` of
    ``channel``'s words), through a bound launch (:class:`tilelink.rules.direct.Bound`: only the call's number, the
    budget and the flags' value change between calls); with ``copy`` (an all-gather's ``(shard, place)``),
    :func:`~tilelink.runtime.handshake.shard_handshake_kernel`, which copies the shard into its place first, one
    bound launch per place. Each form of those ints (their widths) and places is compiled and loaded first by a dry
    run against the context's scratch array, once this rank's streams are idle: loading a module waits for the
    kernels already running, and the call's kernel may be the one a peer waits for. It stands in for a
    ``cuStreamWriteValue64`` per peer and, per peer, a ``cuStreamWaitValue64`` with two events for the host thread
    that watched it (and, with ``copy``, for the shard's ``cuMemcpyAsync``)."""

    __slots__ = ("call", "copies", "device", "dry", "kernel", "loaded", "run", "sms")

    #: elements a program copies a step (4 warps: 16-byte vectors of a 2-byte type, 4 each per thread)
    COPY_BLOCK = 4096

    def __init__(self, ready, diag, channel, scratch: torch.Tensor, world, flags: tuple[int, int]) -> None:
        from tilelink.runtime.handshake import handshake_kernel

        self.device = world.device
        self.kernel = direct(handshake_kernel)
        self.call = dict(ready_table=ready.peer_table, ready_ptr=ready.barriers, rank=world.rank,
                         world=world.world_size, call=1, diag_ptr=diag.buffer, budget=1, flags_ptr=channel.barriers,
                         first_flag=flags[0], flags=flags[1], flag_value=1, num_warps=1)
        # the dry run's words are all this rank's scratch array (as many words as the channel), whose words (never
        # negative) pass a wait for call 0
        table = torch.full((world.world_size,), scratch.data_ptr(), dtype=torch.int64, device=world.device)
        self.dry = {**self.call, "ready_table": table, "ready_ptr": scratch, "flags_ptr": scratch, "call": 0}
        self.loaded: set[tuple] = set()
        self.copies: dict[tuple, tuple] = {}  # (place's address, numel, dtype) -> (its launch, its dry run's call)
        self.sms = 0
        self.run = self._bound(self.kernel, (1,), self.call, ("call", "budget", "flag_value"))

    @staticmethod
    def _bound(kernel, grid, call: dict, names: tuple[str, ...]):
        if type(kernel) is DirectKernel:
            return kernel.bound(grid, call, names)

        def run(*values) -> None:  # Triton's own launch
            kernel[grid](**{**call, **dict(zip(names, values, strict=True))})

        return run

    def _copying(self, place: torch.Tensor) -> tuple:
        """The launch that copies a shard into ``place`` and hands shakes, and its dry run's call, made once per
        place: the place (its address, size and dtype) is the same every call of its set."""
        key = (place.data_ptr(), place.numel(), place.dtype)
        entry = self.copies.get(key)
        if entry is None:
            from tilelink.runtime.handshake import shard_handshake_kernel

            if not self.sms:
                self.sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            n = place.numel()
            grid = (max(1, min(cdiv(n, self.COPY_BLOCK), 4 * self.sms)),)
            # a count per place: two calls of a context on two streams, not ordered, are of two parities
            count = torch.zeros(1, dtype=torch.int64, device=self.device)
            call = {"src_ptr": place, "dst_ptr": place, "n": n, "count_ptr": count,
                    **{k: v for k, v in self.call.items() if k != "num_warps"}, "BLOCK": self.COPY_BLOCK,
                    "num_warps": 4}
            kernel = direct(shard_handshake_kernel)
            # the dry run copies the place onto itself: the same bytes, whoever reads them meanwhile
            dry = {**call, **{k: v for k, v in self.dry.items() if k != "num_warps"}}
            entry = self.copies[key] = (self._bound(kernel, grid, call, ("src_ptr", "call", "budget", "flag_value")),
                                        kernel, grid, dry)
        return entry

    def __call__(self, call: int, budget: int, flag_value: int, copy: tuple | None = None) -> None:
        # what of the three ints Triton compiles on: their widths
        form = (-2**31 <= call < 2**31, -2**31 <= budget < 2**31, -2**31 <= flag_value < 2**31)
        if copy is not None:
            shard, place = copy
            if shard.data_ptr() % 16 or place.data_ptr() % 16:  # the kernel's variant of aligned rows only
                place.copy_(shard)
                copy = None
        if copy is None:
            run, kernel, grid, dry, key, given = self.run, self.kernel, (1,), self.dry, form, ()
        else:
            run, kernel, grid, dry = self._copying(place)
            key, given = (*form, place.data_ptr(), place.numel(), place.dtype), (shard,)
        if key not in self.loaded:
            torch.cuda.synchronize(self.device)
            kernel[grid](**{**dry, "budget": budget, "flag_value": flag_value})
            torch.cuda.synchronize(self.device)
            self.loaded.add(key)
        run(*given, call, budget, flag_value)


def channel_args(barriers: torch.Tensor, epoch: int, rank: int, world_size: int, sharding: RowSharding,
                 diag: torch.Tensor, budget_ns: int) -> dict[str, Any]:
    """The ``tlk_*`` arguments a rewritten kernel gets (rules/emit.py's CHANNEL_PARAMS)."""
    return dict(tlk_barriers=barriers, tlk_epoch=epoch, tlk_rank=rank, tlk_world=world_size, tlk_rows=sharding.size,
                tlk_rows_per_rank=sharding.rows_per_rank, tlk_rows_per_channel=sharding.rows_per_channel,
                tlk_channels_per_rank=sharding.channels_per_rank, tlk_diag=diag, tlk_budget=budget_ns)
