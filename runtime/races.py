"""Race exposure for the emulated world: run every call on its most adversarial schedule.

In the plain emulated world a rank runs an operator's producer to completion before its consumer, so a
consumer read that no wait orders, or a notify that comes before the store it publishes, still sees the
right data. With ``TILELINK_RACES=1`` (the default in the test suite) the launchers instead:

- all-gather: fill the rows that peers provide with poison (NaN, or the largest integer) before the call,
  and deliver a channel's rows only at the moment a wait of the consumer asks for that channel; when the
  interpreter starts the next program, every delivered channel is poison again, so that each program reads only
  the channels it waited for itself (on a GPU the programs run at once: another program's wait orders nothing).
  A read that no wait of its program covers finds poison on every run, not on an unlucky one. A program's read of
  every channel at its start (``channels_ready``, which lets its waits pass without polling when they are all
  there) finds none here, so that each program takes its waits; with ``TILELINK_RACES_START_READ=1`` it finds
  every channel, each delivered then, and the program's reads must find only those (a read that counted fewer
  channels than the program reads finds poison);
- reduce-scatter: take each channel's rows at the moment the producer's notifies complete it (what a
  consumer polling that channel would read) and hand those to the consumer. A store after the notify that
  should publish it, or a notify that counts too much, changes the result.

The hooks are called from the interpreted device primitives (``tilelink.language``), in the rank's own
thread, with the addresses the kernel polls or releases: the schedule is the same on every run. Compiled
(GPU) kernels never call them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

ENV = "TILELINK_RACES"
#: on the race-exposing schedule, each program's read of every channel at its start finds them (see
#: start_read_finds_channels)
START_READ_ENV = "TILELINK_RACES_START_READ"


def enabled() -> bool:
    """Whether launchers in this (emulated) process run calls on the adversarial schedule."""
    return os.environ.get(ENV, "0") not in ("", "0") and os.environ.get("TRITON_INTERPRET") == "1"


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with a value no correct computation reads: NaN, or the dtype's largest integer."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t.fill_(True)
    return t.fill_(torch.iinfo(t.dtype).max)


@dataclass
class _Watch:
    base: int
    count: int
    on_wait: Callable[[int], None] | None
    on_release: Callable[[int], None] | None


_WATCHES: list[_Watch] = []


@contextmanager
def watch(barriers: torch.Tensor, on_wait: Callable[[int], None] | None = None,
          on_release: Callable[[int], None] | None = None) -> Iterator[None]:
    """While inside, a wait on word ``i`` of the int64 array ``barriers`` calls ``on_wait(i)`` before it
    polls, and a release that adds to word ``i`` calls ``on_release(i)`` after the add."""
    w = _Watch(barriers.data_ptr(), barriers.numel(), on_wait, on_release)
    _WATCHES.append(w)
    try:
        yield
    finally:
        _WATCHES.remove(w)


@contextmanager
def program_starts(callback: Callable[[], None]) -> Iterator[bool]:
    """While inside, ``callback()`` runs each time Triton's interpreter starts a program of a grid. Yields
    whether it could be hooked (an interpreter without ``interpreter_builder.set_grid_idx`` cannot: then
    programs share what earlier programs' waits delivered, a weaker schedule)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        yield False
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    original = getattr(builder, "set_grid_idx", None)
    if original is None:
        yield False
        return

    def set_grid_idx(*args, **kwargs):
        callback()
        return original(*args, **kwargs)

    builder.set_grid_idx = set_grid_idx
    try:
        yield True
    finally:
        del builder.set_grid_idx  # the class's method again


def _words(ptr, mask=None) -> list[tuple[_Watch, int]]:
    addresses = np.asarray(ptr.handle.data).reshape(-1)
    if mask is not None:
        keep = np.asarray(mask.handle.data if hasattr(mask, "handle") else mask).reshape(-1)
        addresses = addresses[np.broadcast_to(keep, addresses.shape).astype(bool)]
    found = []
    for w in _WATCHES:
        for a in addresses.tolist():
            i = (int(a) - w.base) // 8
            if 0 <= i < w.count:
                found.append((w, i))
    return found


def waiting(flag_ptr, mask=None) -> None:
    """Called by an interpreted wait before it polls ``flag_ptr`` (the lanes of ``mask``)."""
    if _WATCHES:
        for w, i in _words(flag_ptr, mask):
            if w.on_wait is not None:
                w.on_wait(i)


def start_read_finds_channels() -> bool:
    """Called by an interpreted ``channels_ready`` at the start of a program: whether its read of every channel may
    find them. Outside this schedule, always: it reads the words as they are. On it, by default never: each program
    takes each of its waits, which deliver its channels one at a time (the waits are what the schedule checks). With
    ``TILELINK_RACES_START_READ=1``, always, each channel delivered first, as a wait would have it delivered: the
    schedule of programs that start after every channel arrived, whose reads must find only what their read at the
    start was given (the channels it counted)."""
    if not _WATCHES:
        return True
    return os.environ.get(START_READ_ENV, "0") not in ("", "0")


def released(flag_ptr, mask=None) -> None:
    """Called by an interpreted notify after it added to ``flag_ptr`` (the lanes of ``mask``)."""
    if _WATCHES:
        for w, i in _words(flag_ptr, mask):
            if w.on_release is not None:
                w.on_release(i)
