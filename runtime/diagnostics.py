"""Wait diagnostics: the int64[8] record a timed-out device wait leaves, and its host-side check.

Layout: ``[timed_out, kind, index, target, seen, epoch, count, 0]``; the first timeout wins (compare-and-swap
on word 0). Device waits never hang: they record and return, and the host raises here. Words ``EPOCH_WORD``
and ``COUNT_WORD`` belong to a context's twin for captured calls (:mod:`tilelink.runtime.graphs`): its call
count, advanced on the device, as the factor of the kernels' wait targets (0 where the host passes the count
itself) and as the value of its handshakes; clearing a record leaves them.
"""

from __future__ import annotations

import time
import weakref

import torch

from tilelink.errors import TileLinkError, WaitTimeout
from tilelink.runtime.settings import setting

DIAG_WORDS = 8
#: the words of a timeout's record (cleared once it is raised), then the two of a context's twin (runtime/graphs.py)
RECORD_WORDS = 5
EPOCH_WORD = 5
COUNT_WORD = 6
KIND_NAMES = {1: "consumer_tile_wait", 2: "peer_tile_wait", 3: "wait_value", 4: "rank_wait",
              5: "handshake (a captured call's wait for a peer's word)", 6: "handshake"}
#: the kind an uncaptured call's handshake on the device records (``tilelink.runtime.handshake``): its index is the
#: peer, its target the call, its value seen the last call the peer reached; read as :class:`HandshakeTimeout`
KIND_HANDSHAKE_CALL = 6

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_EMULATED_TIMEOUT_S = 60.0


def _emulated() -> bool:
    from tilelink.runtime import world

    if world.is_initialized():
        return world.current_world().backend == "emulated"
    return world.interpreting()


def wait_timeout_s(emulated: bool | None = None) -> float:
    """The wait budget in seconds: ``TILELINK_WAIT_TIMEOUT``, else 10 s (60 s emulated)."""
    value = setting("TILELINK_WAIT_TIMEOUT")
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


def describe_budget(seconds: float, factor: int = 1) -> str:
    """How long a wait waited and where that came from: ``30 s (30 x TILELINK_WAIT_TIMEOUT=1)``."""
    value = setting("TILELINK_WAIT_TIMEOUT")
    source = f"TILELINK_WAIT_TIMEOUT={value}" if value else f"the default wait budget of {seconds / factor:g} s"
    return f"{seconds:g} s ({source})" if factor == 1 else f"{seconds:g} s ({factor} x {source})"


class PeerFailedError(TileLinkError):
    """A rank this one was waiting for failed, or finished its work without reaching the same point.

    ``rank`` is this rank, ``peer`` the one it waited for, ``cause`` what the peer reported (its exception,
    or that it called ``tilelink.finalize``), ``consequence`` whether this error only follows from the peer's
    failure (the launchers then report the peer's failure, not this one)."""

    def __init__(self, message: str, *, rank: int = -1, peer: int = -1, cause: str = "",
                 consequence: bool = True) -> None:
        super().__init__(message)
        self.rank, self.peer, self.cause, self.consequence = rank, peer, cause, consequence


class HandshakeTimeout(WaitTimeout):
    """A peer did not reach an operator's call (or a collective call of the runtime) within its budget.

    ``rank`` waited; ``peer`` (also ``index``) is the rank it waited for, ``call`` (also ``expected``) the
    call number, ``seen`` the last call the peer had reached (-1 when unknown), ``what`` the operator or the
    runtime call, ``others`` further ranks that had not reached it either."""

    def __init__(self, *, rank: int, peer: int, call: int, seen: int, budget_s: float, what: str,
                 factor: int | None = None, kernel: str | None = None, others=()) -> None:
        super().__init__(rank=rank, primitive="handshake", index=peer, expected=call, seen=seen,
                         budget_s=budget_s, kernel=kernel)
        if factor is None:
            factor = max(1, round(budget_s / wait_timeout_s()))
        self.peer, self.call, self.what, self.factor, self.others = peer, call, what, factor, list(others)
        where = f"; it last reached call {seen}" if seen >= 0 else ""
        also = f" (nor have ranks {self.others})" if self.others else ""
        self.args = (
            f"rank {rank}: rank {peer} has not reached call {call} of {what}{also} after "
            f"{describe_budget(budget_s, factor)}{where}. Every rank must make the same calls of an operator, "
            f"in the same order, with the same shapes: check that rank {peer} did not skip this call, take "
            f"another branch, or stop in work of its own (its output says where it is). If it is only slow "
            f"(compiling, an evaluation between calls), raise TILELINK_WAIT_TIMEOUT=<seconds>"
            f"{f'; a call waits {factor} times that for its peers' if factor > 1 else ''}.",)


#: what a rank raises when a peer it needed is gone: the peer's failure is the one to report
_CONSEQUENCE_TEXT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                     "Connection refused", "failed to recv", "failed to send")


def is_consequence(exc: BaseException) -> bool:
    """Whether ``exc`` only follows from another rank's failure (a peer's socket closed, a peer reported gone):
    a launcher names the rank that failed first, and this is not it."""
    if isinstance(exc, PeerFailedError):
        return exc.consequence
    text = str(exc)
    return isinstance(exc, (RuntimeError, ConnectionError, OSError)) and any(t in text for t in _CONSEQUENCE_TEXT)


def check_diagnostics(diag: torch.Tensor, rank: int, kernel: str | None = None,
                      budget_s: float | None = None) -> None:
    """Raise :class:`tilelink.WaitTimeout` if a wait recorded a timeout in ``diag``, and clear it.

    Reading ``diag`` synchronises with the device (its stream must have finished the kernels).
    """
    record = [int(v) for v in diag.detach().to("cpu", non_blocking=False).tolist()]
    if record[0] == 0:
        return
    diag[:RECORD_WORDS].zero_()
    raise recorded_timeout(record, rank, kernel, wait_timeout_s() if budget_s is None else budget_s)


def recorded_timeout(record: list[int], rank: int, kernel: str | None, budget_s: float) -> WaitTimeout:
    """The :class:`tilelink.WaitTimeout` of a diagnostics record (``budget_s``: the wait budget the kernels were
    given). An uncaptured call's handshake (``KIND_HANDSHAKE_CALL``) is a :class:`HandshakeTimeout` naming the peer
    and the call, as the host's wait for a peer names them: it waited :data:`SKEW_FACTOR` budgets."""
    kind, index, target, seen = record[1:5]
    if kind == KIND_HANDSHAKE_CALL:
        return HandshakeTimeout(rank=rank, peer=index, call=target, seen=seen, budget_s=SKEW_FACTOR * budget_s,
                                what=kernel or "an operator", factor=SKEW_FACTOR, kernel=kernel)
    return WaitTimeout(rank=rank, primitive=KIND_NAMES.get(kind, f"wait kind {kind}"), index=index,
                       expected=target, seen=seen, budget_s=budget_s, kernel=kernel)


#: a call's :meth:`Diagnostics.check_later` copies the record for the host at most every this many calls of a context
#: (the copy and its event cost a call some microseconds of host time) ...
CHECK_EVERY = 8
#: ... unless this long has passed since the last copy: calls spaced out in time each copy it, so a timed-out wait
#: is raised by the next call or the one after
CHECK_INTERVAL_S = 1e-3


#: every live record and the world it belongs to: tilelink.finalize() reads those of its world, so that a timed-out
#: wait of the last calls, whose copy check_later had not made or read yet, is still raised
_live: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unread_timeout(world) -> WaitTimeout | None:
    """The :class:`tilelink.WaitTimeout` recorded by a wait of ``world``'s kernels and not raised yet (the first
    one found), or None; reads every record of the world, each cleared. Synchronises with the device."""
    found = None
    for diag, owner in list(_live.items()):
        if owner is not world:
            continue
        try:
            diag.check_pending(block=True)
            diag.check(kernel=diag._kernel)
        except WaitTimeout as exc:
            found = found or exc
    return found


class Diagnostics:
    """A diagnostics record on this rank's device, and the budget kernels are given."""

    #: the record of a captured call's twin: its kernels run in the graph's replays, not at the calls it counts
    replays = False

    def __init__(self) -> None:
        from tilelink.runtime.world import current_world

        world = current_world()
        _live[self] = world
        self.rank = world.rank
        self.budget_s = wait_timeout_s(world.backend == "emulated")
        self.budget_ns = int(self.budget_s * 1e9)
        self.buffer = torch.zeros(DIAG_WORDS, dtype=torch.int64, device=world.device)
        self._host: torch.Tensor | None = None  # pinned copy of the record, read without a device sync
        self._record = None  # a numpy view of it: reading its words costs no torch call
        self._copied: torch.cuda.Event | None = None
        self._event: torch.cuda.Event | None = None  # one event, recorded again by each check_later
        self._kernel: str | None = None
        self._calls = 0  # calls of check_later since the last copy
        self._copy_time = 0.0  # time.perf_counter() of the last copy
        # calls counted to tell a user how many returned results a timed-out wait spoils: this call's number, the
        # last call the copy in flight covers, and the last call a clean read covered
        self._ordinal = self._copy_ordinal = self._clean_through = 0

    def check(self, kernel: str | None = None, returned: int | None = None) -> None:
        """Raise :class:`tilelink.WaitTimeout` if a kernel's wait timed out since the last check.
        Synchronises with the device: every stream of it. ``returned``: the number of the last call that returned
        its result to the caller (default: every call counted so far)."""
        self._copied = None
        if self.buffer.device.type == "cuda":
            # the kernels writing this record ran on the caller's stream at its calls, on a side stream or in a
            # graph's replay, not necessarily on the stream current now (tilelink.finalize() after calls made under
            # torch.cuda.stream(s)): a read ordered on the current stream alone could come before a wait that is
            # still spending its budget times out
            torch.cuda.synchronize(self.buffer.device)
        try:
            check_diagnostics(self.buffer, self.rank, kernel=kernel, budget_s=self.budget_s)
        except WaitTimeout as exc:
            exc.spoiled(self._spoiled(returned), replays=self.replays)
            raise
        finally:
            self._clean_through = self._ordinal

    def _spoiled(self, returned: int | None) -> int:
        """How many calls returned a result after the last clean read, up to call ``returned``."""
        last = self._ordinal if returned is None else returned
        return max(0, last - self._clean_through)

    def check_later(self, kernel: str | None = None, stream=None) -> None:
        """Like :meth:`check` without stalling the launching thread: on a GPU the record is copied to
        pinned host memory behind the kernels on ``stream`` (default: the current stream) and read by a
        later call once the copy has landed (or by :meth:`check_pending`), so launches stay asynchronous.
        A copy is made every :data:`CHECK_EVERY` calls, or at a call :data:`CHECK_INTERVAL_S` after the
        last copy, and read by the first later call that finds it landed: a timed-out wait is raised by the
        call after the next copy behind it has landed (within about that many calls while the GPU keeps up;
        the next call or the one after when calls are spaced out). :meth:`check` and
        ``OverlappedKernel.check()`` read it at once. A record stays in the buffer until it is read."""
        self._ordinal += 1
        if self.buffer.device.type != "cuda" or setting("TILELINK_CHECK_WAITS") == "each":
            self.check(kernel, returned=self._ordinal - 1)
            return
        self._kernel = kernel
        if self._copied is not None:
            self.check_pending(block=False, returned=self._ordinal - 1)
            if self._copied is not None:
                # the last copy is still behind the kernels: it will be read, so this call adds nothing
                return
        self._calls += 1
        now = time.perf_counter()
        if self._calls < CHECK_EVERY and now - self._copy_time < CHECK_INTERVAL_S:
            return
        self._calls, self._copy_time = 0, now
        if self._host is None:
            self._host = torch.zeros(DIAG_WORDS, dtype=torch.int64).pin_memory()
            self._record = self._host.numpy()
        self._host.copy_(self.buffer, non_blocking=True)
        self._copy_ordinal = self._ordinal
        if self._event is None:  # made once: creating an event per call cost the launching thread
            self._event = torch.cuda.Event()
        # on the stream given: torch.cuda.current_stream() behind a plain record() cost the call microseconds
        self._event.record(stream)
        self._copied = self._event

    def check_pending(self, block: bool = True, returned: int | None = None) -> None:
        """Read the record :meth:`check_later` copied, waiting for the copy when ``block``; ``returned`` as
        :meth:`check`'s."""
        if self._copied is None or self._host is None or (not block and not self._copied.query()):
            return
        if block:
            self._copied.synchronize()
        self._copied = None
        if not self._record[0]:
            self._clean_through = self._copy_ordinal
            return
        record = [int(v) for v in self._host.tolist()]
        self.buffer[:RECORD_WORDS].zero_()
        self._host.zero_()
        exc = recorded_timeout(record, self.rank, self._kernel, self.budget_s)
        exc.spoiled(self._spoiled(returned), replays=self.replays)
        self._clean_through = self._ordinal
        raise exc

    def __repr__(self) -> str:
        return f"Diagnostics(rank={self.rank}, budget_s={self.budget_s:g})"
