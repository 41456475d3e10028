"""Captured calls: the operators inside a CUDA graph (``torch.cuda.graph``), replayed with new inputs.

A graph replays the kernels, copies and arguments of the call it captured, frozen: whatever the host would
compute per call (the call count a barrier target is scaled by, which of two buffer sets a call uses, the
values of the copy engine's flags) is the same on every replay. So a context keeps a *captured twin*
(``Launcher.captured``): the same symmetric buffers, its own channels, handshake words and diagnostics array,
and its call count on the device, in word :data:`EPOCH_WORD` of that array. A captured call

- advances that word with a one-element add at its start (a node of the graph, so every replay advances it);
- passes the kernels the per-call multiples only (``tlk_epoch`` = 1, or ``k`` for an all-gather of ``k``
  tensors): every wait of :mod:`tilelink.language` scales its target by the word (:func:`call_target`, one
  scalar load, which a generated kernel makes once at its start and passes to its waits scaled; the word is 0 on
  an uncaptured context's array, where the host passes the count itself);
- replaces the host-side primitives whose values the host computes per call (``cuStreamWriteValue64`` /
  ``cuStreamWaitValue64`` of the copy engine and the handshake) by the small kernels below, which read the
  word: :func:`signal_kernel` stores ``count * mul - sub`` into a word of a rank's copy, :func:`wait_kernel`
  spins on the device until words reach it, bounded by the wait's budget, recording a timeout in the
  diagnostics array like every device wait; nothing waits on the host, so the watcher thread is not used;
- always uses the same buffer set; the all-gather and the SM reduce-scatters meet at a device-side barrier
  instead of alternating sets by the call's parity (see ``docs/ARCHITECTURE.md``).

A timed-out wait inside a replay leaves its record in the twin's diagnostics array; the next uncaptured check
(``OverlappedKernel.check()``, the context's next uncaptured call, ``tilelink.finalize()``) raises it as
:class:`tilelink.WaitTimeout`.

The emulated world has no CUDA graphs: :class:`EmulatedGraph` records the steps of a captured call
(:func:`enqueue`) instead of running them and runs them again on each :meth:`EmulatedGraph.replay`, with the
same arguments, as a CUDA graph replays its nodes. That is what the CPU tests capture: a captured call that
read a value the host computes per call would replay it frozen there too.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree
import triton
import triton.language as tl
from torch.utils._python_dispatch import TorchDispatchMode

from tilelink.errors import LaunchError
from tilelink.runtime.diagnostics import COUNT_WORD, EPOCH_WORD
from tilelink.runtime.language import _spin, peer_ptr

__all__ = ["COUNT_WORD", "EPOCH_WORD", "EmulatedGraph", "capturing", "enqueue", "kept", "signal", "wait", "warm_up"]

#: diagnostics kinds of the waits below (``tilelink.runtime.diagnostics.KIND_NAMES``)
KIND_RANK_WAIT = 4
KIND_HANDSHAKE = 5
_COUNT: tl.constexpr = tl.constexpr(COUNT_WORD)  # what the kernels read (a jit function sees constexpr globals only)

_recording: list | None = None  # the emulated graph being captured: its steps


class EmulatedGraph:
    """The emulated world's stand-in for ``torch.cuda.CUDAGraph``: ``with graph.capture(): ...`` records the
    steps of the captured calls (kernel launches, copies, the call count's advance) without running them;
    :meth:`replay` runs them all again, with the arguments they were recorded with. The tensor work around them
    (an operator's casts, pads, a per-tensor scale's expansion, the caller's own ops) runs at capture and is
    recorded in between (:class:`_TensorWork`), to run again on each replay into the same tensors, as a CUDA
    graph replays those kernels too."""

    def __init__(self) -> None:
        self.steps: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def capture(self):
        global _recording
        if _recording is not None:
            raise LaunchError("an emulated graph is already being captured; captures do not nest")
        _recording = self.steps
        try:
            with _TensorWork(self.steps):
                yield self
        finally:
            _recording = None

    def replay(self) -> None:
        if not self.steps:
            raise LaunchError("EmulatedGraph.replay: nothing was captured (no operator was called inside "
                              "`with graph.capture():`)")
        for step in self.steps:
            step()


#: allocations without values: a replay has nothing to redo for them (their tensors are the recorded ones)
_ALLOCATIONS = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                "aten::new_empty_strided")


class _TensorWork(TorchDispatchMode):
    """While an emulated graph captures: each tensor operation runs and is recorded as a step, which a replay runs
    again on the same arguments, its results copied into the tensors the capture returned (later steps read those).
    A view needs nothing (it shares its base's memory), nor does an allocation without values; an in-place
    operation writes its recorded argument again."""

    def __init__(self, steps: list) -> None:
        super().__init__()
        self.steps = steps

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not func.is_view and func._schema.name not in _ALLOCATIONS:
            self.steps.append(functools.partial(_redo, func, args, kwargs, out))
        return out


def recording_only() -> bool:
    """Whether the torch dispatch modes now active are all an emulated graph's recording of tensor work (none a
    trace): the operators' traceable wrappers then call the operators themselves, whose steps are recorded."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return all(isinstance(mode, _TensorWork) for mode in _get_current_dispatch_mode_stack())


def _redo(func, args, kwargs, recorded) -> None:
    result = func(*args, **kwargs)
    for old, new in zip(pytree.tree_leaves(recorded), pytree.tree_leaves(result), strict=True):
        if isinstance(old, torch.Tensor) and new is not old:
            old.copy_(new)


def capturing(device: torch.device) -> bool:
    """Whether the caller's call is being captured: an emulated graph is recording, or the current CUDA stream
    of ``device`` is capturing."""
    if _recording is not None:
        return True
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _warming_pool(device: torch.device):
    """The pool of Inductor's CUDA graphs (``torch.compile(mode="reduce-overhead")``, CUDA graph trees) that this
    thread's allocations go to while the trees warm a compiled function up, or None. The trees run a compiled
    function's first call eagerly, on a stream of their own, with every allocation of the thread routed to their
    graphs' pool; that pool may hold only what the function returns."""
    trees = sys.modules.get(_TREES)
    if trees is None or device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        manager = trees.get_manager(index, create_if_none_exists=False)
        # the warm-up runs on the trees' own stream: after it, the manager stays in its warm-up state until the
        # next compiled call, while the thread's allocations go to torch's pools again
        if manager is None or not manager.in_warmup or torch.cuda.current_stream(index) != manager.stream:
            return None
        return index, manager.cuda_graphs_thread_pool
    except Exception:  # noqa: BLE001 - another torch's trees: nothing of theirs to step out of
        return None


class kept:  # noqa: N801 - used as a function: ``with graphs.kept(device):``
    """Allocations made inside are kept past the call (a context's buffers and tables, the scratch of a launch, a
    prepared launch): they come from torch's own pools, also while Inductor's CUDA graph trees warm a compiled
    function up (:func:`_warming_pool`). Kept in the graphs' pool, such a buffer would fail the trees' check ("tensor(s)
    in the cudagraph pool not tracked as outputs") or have its memory handed to a graph's outputs. Nested, an inner
    one does nothing. A class, not a generator: it is entered on every call of the launch path."""

    __slots__ = ("device", "warming")

    def __init__(self, device: torch.device) -> None:
        self.device, self.warming = device, None

    def __enter__(self) -> kept:
        if self.warming is not None:
            raise RuntimeError("graphs.kept is entered again inside itself: make one per with-statement")
        if _TREES not in sys.modules or getattr(_kept, "out", False):  # no trees; or already out of their pool
            return self
        warming = _warming_pool(self.device)
        if warming is not None:
            index, pool = warming
            torch._C._cuda_endAllocateToPool(index, pool)  # raises where the thread was not routed there
            _kept.out, self.warming = True, warming
        return self

    def __exit__(self, *exc) -> None:
        if self.warming is None:
            return
        (index, pool), self.warming = self.warming, None
        _kept.out = False
        torch._C._cuda_beginAllocateCurrentThreadToPool(index, pool)
        # that begin took a reference on the pool, which the trees' own end of the warm-up does not return
        torch._C._cuda_releasePool(index, pool)


_TREES = "torch._inductor.cudagraph_trees"
#: ``out``: this thread's allocations were taken out of the trees' pool by an enclosing :func:`kept`
_kept = threading.local()


def enqueue(fn: Callable[[], None]) -> None:
    """A step of a captured call: recorded by the emulated graph being captured, else run now (on a GPU that
    is when the capturing stream records it)."""
    if _recording is not None:
        _recording.append(fn)
    else:
        fn()


@triton.jit(do_not_specialize=["index", "rank", "world", "mul", "sub"])
def signal_kernel(peer_table, like_ptr, index, rank, world, diag_ptr, mul, sub, EVERY_PEER: tl.constexpr):
    """Store ``calls * mul - sub`` (``calls``: the call count in ``diag_ptr[COUNT_WORD]``) into word ``index``
    of rank ``rank``'s copy of the array ``like_ptr`` (its peer table ``peer_table``), or with ``EVERY_PEER`` of
    every other rank's copy. Release at system scope: what this rank's stream did before is visible to whoever
    acquires the value (the copy engine's copies before it too: the stream ran them first)."""
    value = tl.load(diag_ptr + _COUNT) * mul - sub
    if EVERY_PEER:
        for step in range(1, world):
            dst = (rank + step) % world
            tl.atomic_xchg(peer_ptr(peer_table, like_ptr, dst) + index, value, sem="release", scope="sys")
    else:
        tl.atomic_xchg(peer_ptr(peer_table, like_ptr, rank) + index, value, sem="release", scope="sys")


@triton.jit(do_not_specialize=["first", "count", "skip", "mul", "sub", "budget", "kind"])
def wait_kernel(flags_ptr, first, count, skip, diag_ptr, mul, sub, budget, kind):
    """Spin until words ``first .. first+count-1`` of the local array ``flags_ptr`` (but ``skip``) each reach
    ``calls * mul - sub`` (``calls``: the call count in ``diag_ptr[COUNT_WORD]``), each for at most ``budget`` ns;
    a word that does not is recorded in ``diag_ptr`` (``[1, kind, index, target, seen]``) and the kernel returns,
    as every device wait does."""
    target = tl.load(diag_ptr + _COUNT) * mul - sub
    for i in range(first, first + count):
        # once a wait of the call timed out its results are void: the later waits do not spend their budgets too
        if (i != skip) & (tl.load(diag_ptr) == 0):
            _spin(flags_ptr + i, target, diag_ptr, budget, kind, i)


def _int(x: int) -> int:
    return int(x)


def signal(channel, index: int, world, diag: torch.Tensor, *, dst: int | None = None, mul: int = 1,
           sub: int = 0) -> None:
    """Launch :func:`signal_kernel` on the current stream: word ``index`` of rank ``dst``'s copy of ``channel``
    (a :class:`tilelink.runtime.Channel`), or of every peer's when ``dst`` is None."""
    every = dst is None
    signal_kernel[(1,)](channel.peer_table, channel.barriers, _int(index), _int(world.rank if every else dst),
                        _int(world.world_size), diag, _int(mul), _int(sub), EVERY_PEER=every)


def wait(barriers: torch.Tensor, first: int, count: int, diag: torch.Tensor, budget_ns: int, *, skip: int = -1,
         mul: int = 1, sub: int = 0, kind: int = KIND_RANK_WAIT) -> None:
    """Launch :func:`wait_kernel` on the current stream (one program: it holds one SM's slot while it spins)."""
    wait_kernel[(1,)](barriers, _int(first), _int(count), _int(skip), diag, _int(mul), _int(sub),
                      _int(budget_ns), _int(kind), num_warps=1)


_warm: set = set()


def warm_up(device: torch.device) -> None:
    """On a GPU, once per device and process, before anything is captured: compile and load the kernels above
    (a module loaded while a stream captures would be loaded at capture, and a compilation there is host work
    the capture does not need). Against a private word whose waits pass at once."""
    if device.type != "cuda" or device in _warm or capturing(device):
        return
    from types import SimpleNamespace

    word = torch.zeros(2, dtype=torch.int64, device=device)
    diag = torch.zeros(8, dtype=torch.int64, device=device)
    table = torch.full((1,), word.data_ptr(), dtype=torch.int64, device=device)
    channel = SimpleNamespace(peer_table=table, barriers=word)
    world = SimpleNamespace(rank=0, world_size=1)
    for every in (False, True):
        signal(channel, 0, world, diag, dst=None if every else 0)
    wait(word, 0, 1, diag, 10**10)
    torch.cuda.synchronize(device)
    _warm.add(device)


#: the diagnostics arrays of the twins a call was captured on, with the kernel's name and the world (finalize)
_captured: list = []


def note_captured(diag, kernel: str, world) -> None:
    """Remember a twin's diagnostics array: :func:`replay_timeout` reads it when ``world`` ends."""
    diag.replays = True
    if not any(d is diag for d, _, _ in _captured):
        _captured.append((diag, kernel, world))


#: readers of what replays record on the device besides the waits (an MoE routing's ids out of range: tilelink.ops.
#: moe_routing), read when a world ends
_record_readers: list = []


def read_at_finalize(reader: Callable[[], Exception | None]) -> None:
    """Have :func:`replay_records` call ``reader``: it returns the error to raise for what captured calls' replays
    recorded since it was last read, or None, and clears the record."""
    if reader not in _record_readers:
        _record_readers.append(reader)


def replay_records() -> Exception | None:
    """The first error of the records that :func:`read_at_finalize` registered, or None; every record is read
    (and cleared). Synchronises with the device."""
    found = None
    for reader in _record_readers:
        error = reader()
        found = found or error
    return found


def replay_timeout(world):
    """The :class:`tilelink.WaitTimeout` of the first call captured in ``world`` whose replay had a wait time out
    since its last check, or None; forgets that world's twins (it is ending). Synchronises with the device."""
    from tilelink.errors import WaitTimeout

    found = None
    for diag, kernel, owner in _captured:
        if owner is not world:
            continue
        try:
            diag.check_pending(block=True)
            diag.check(kernel=kernel)
        except WaitTimeout as exc:
            found = found or exc
    _captured[:] = [entry for entry in _captured if entry[2] is not world]
    return found
