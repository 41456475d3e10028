"""Wait diagnostics: the int64[8] record a timed-out device wait leaves, and its host-side check.

Layout: ``[timed_out, kind, index, target, seen, 0, 0, 0]``; the first timeout wins (compare-and-swap
on word 0). Device waits never hang: they record and return, and the host raises here.
"""

from __future__ import annotations

import os

import torch

from tilelink.errors import TileLinkError, WaitTimeout

DIAG_WORDS = 8
KIND_NAMES = {1: "consumer_tile_wait", 2: "peer_tile_wait", 3: "wait_value", 4: "rank_wait"}

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_EMULATED_TIMEOUT_S = 60.0


def _emulated() -> bool:
    from tilelink.runtime import world

    if world.is_initialized():
        return world.current_world().backend == "emulated"
    return world.interpreting()


def wait_timeout_s(emulated: bool | None = None) -> float:
    """The wait budget in seconds: ``TILELINK_WAIT_TIMEOUT``, else 10 s (60 s emulated)."""
    value = os.environ.get("TILELINK_WAIT_TIMEOUT")
    if value:
        try:
            seconds = float(value)
        except ValueError:
            raise TileLinkError(f"TILELINK_WAIT_TIMEOUT={value!r} is not a number of seconds") from None
        if seconds <= 0:
            raise TileLinkError(f"TILELINK_WAIT_TIMEOUT={value!r} must be positive")
        return seconds
    if emulated is None:
        emulated = _emulated()
    return DEFAULT_EMULATED_TIMEOUT_S if emulated else DEFAULT_TIMEOUT_S


#: budgets of a wait for a peer to reach a call (``Launcher.handshake``), in wait budgets: a peer whose host is
#: behind between calls (an evaluation or a checkpoint on one rank, a first call that compiles) is waited for as
#: long as this, on a stream and no SM, before the call's kernels start waiting on it with the budget of a wait
SKEW_FACTOR = 30


def skew_timeout_s(emulated: bool | None = None) -> float:
    """How long a call waits for a peer to reach it: :data:`SKEW_FACTOR` wait budgets (5 min on a GPU by default)."""
    return SKEW_FACTOR * wait_timeout_s(emulated)


def check_diagnostics(diag: torch.Tensor, rank: int, kernel: str | None = None,
                      budget_s: float | None = None) -> None:
    """Raise :class:`tilelink.WaitTimeout` if a wait recorded a timeout in ``diag``, and clear it.

    Reading ``diag`` synchronises with the device (its stream must have finished the kernels).
    """
    record = [int(v) for v in diag.detach().to("cpu", non_blocking=False).tolist()]
    if record[0] == 0:
        return
    diag.zero_()
    kind, index, target, seen = record[1:5]
    raise WaitTimeout(rank=rank, primitive=KIND_NAMES.get(kind, f"wait kind {kind}"), index=index,
                      expected=target, seen=seen,
                      budget_s=wait_timeout_s() if budget_s is None else budget_s, kernel=kernel)


class Diagnostics:
    """A diagnostics record on this rank's device, and the budget kernels are given."""

    def __init__(self) -> None:
        from tilelink.runtime.world import current_world

        world = current_world()
        self.rank = world.rank
        self.budget_s = wait_timeout_s(world.backend == "emulated")
        self.budget_ns = int(self.budget_s * 1e9)
        self.buffer = torch.zeros(DIAG_WORDS, dtype=torch.int64, device=world.device)
        self._host: torch.Tensor | None = None  # pinned copy of the record, read without a device sync
        self._copied: torch.cuda.Event | None = None
        self._event: torch.cuda.Event | None = None  # one event, recorded again by each check_later
        self._kernel: str | None = None

    def check(self, kernel: str | None = None) -> None:
        """Raise :class:`tilelink.WaitTimeout` if a kernel's wait timed out since the last check.
        Synchronises with the device."""
        self._copied = None
        check_diagnostics(self.buffer, self.rank, kernel=kernel, budget_s=self.budget_s)

    def check_later(self, kernel: str | None = None) -> None:
        """Like :meth:`check` without stalling the launching thread: on a GPU the record is copied to
        pinned host memory behind the kernels and read by the next call (or :meth:`check_pending`),
        so a timed-out wait is reported one call late but launches stay asynchronous."""
        if self.buffer.device.type != "cuda":
            self.check(kernel)
            return
        self.check_pending(block=False)
        if self._copied is not None:
            # the last copy is still behind the kernels: it will be read, and a record stays in the buffer
            # until read, so this call adds nothing (one copy and one event record less on the launch path)
            self._kernel = kernel
            return
        if self._host is None:
            self._host = torch.zeros(DIAG_WORDS, dtype=torch.int64).pin_memory()
        self._host.copy_(self.buffer, non_blocking=True)
        if self._event is None:  # made once: creating an event per call cost the launching thread
            self._event = torch.cuda.Event()
        self._event.record()
        self._copied = self._event
        self._kernel = kernel

    def check_pending(self, block: bool = True) -> None:
        """Read the record :meth:`check_later` copied, waiting for the copy when ``block``."""
        if self._copied is None or self._host is None or (not block and not self._copied.query()):
            return
        self._copied.synchronize()
        self._copied = None
        record = [int(v) for v in self._host.tolist()]
        if record[0]:
            self.buffer.zero_()
            self._host.zero_()
            kind, index, target, seen = record[1:5]
            raise WaitTimeout(rank=self.rank, primitive=KIND_NAMES.get(kind, f"wait kind {kind}"), index=index,
                              expected=target, seen=seen, budget_s=self.budget_s, kernel=self._kernel)

    def __repr__(self) -> str:
        return f"Diagnostics(rank={self.rank}, budget_s={self.budget_s:g})"
