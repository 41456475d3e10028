"""Host-side coordination of the ranks: bounded exchanges and barriers, and what became of each rank.

Everything here goes through the key-value store ``torch.distributed`` rendezvoused on (the
``MASTER_ADDR:MASTER_PORT`` TCP store; under torchrun, its agent's), never through a gloo collective:
a gloo collective waits 30 minutes for a peer that is elsewhere, and says nothing about which one.

- :meth:`Control.exchange` gathers one small value from every rank (an operator's shard sizes, a
  symmetric allocation's shape); :meth:`Control.barrier` is an exchange of nothing. Each waits at most
  :func:`tilelink.runtime.diagnostics.skew_timeout_s` (the time a call waits for its peers to reach it),
  names the ranks that did not come, and refuses values from a rank at another point of the program
  (ranks that diverged).
- A rank that fails announces it (:meth:`Control.announce`, from the exception hook ``tilelink.init``
  installs, or ``tilelink.spawn``); one that finishes announces that (``tilelink.finalize``). Every host
  wait for a peer, here and in an operator's handshake (:meth:`Control.watch`), looks at those every
  :data:`WATCH_EVERY_S` and stops at once with :class:`~tilelink.runtime.diagnostics.PeerFailedError`:
  a failure ends the whole world in seconds instead of leaving its peers to wait out their budgets.
"""

from __future__ import annotations

import contextlib
import ctypes
import pickle
import sys
import time

from tilelink.errors import WorldMismatchError
from tilelink.runtime.diagnostics import HandshakeTimeout, PeerFailedError, skew_timeout_s

#: how often a host wait for a peer looks at what became of the peers (one store round trip)
WATCH_EVERY_S = 0.2
_POLL_FIRST_S = 1e-4
_POLL_MAX_S = 5e-3


def _in_operator(point: str) -> str:
    """``point`` and, when an overlapped kernel's launcher is on the stack (a call creating its buffers), which."""
    if not point.startswith("tilelink.runtime."):
        return point
    frame = sys._getframe(1)
    while frame is not None:
        okernel = getattr(frame.f_locals.get("self"), "okernel", None)
        if okernel is not None:
            return f"{point} (creating the buffers of {getattr(okernel, 'name', okernel)})"
        frame = frame.f_back
    return point


class Control:
    """One rank's view of the world's store, under a prefix of its own world (``tilelink/<session>/<n>``; a
    world of a group has a session of its own, so two groups never read each other's keys). ``ranks``: the job's
    rank of each rank of a group's world (they are named too), None for the whole job."""

    def __init__(self, store, rank: int, world_size: int, prefix: str, emulated: bool,
                 ranks: tuple[int, ...] | None = None) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.ranks = ranks
        self.prefix = prefix
        self.emulated = emulated
        #: set by ``tilelink.finalize``: the peers that finished are then where this rank is going too
        self.finalizing = False
        self._sequence = 0  # exchanges so far (every rank makes them in the same order)
        self._calls: dict[str, int] = {}  # exchanges per point (an operator's name): its call number
        self._gone_count = 0
        self._gone: dict[int, tuple[str, str]] = {}  # peer -> ("failed" | "finished", what it said)
        self._announced: str | None = None

    def _key(self, *parts) -> str:
        return "/".join((self.prefix, *map(str, parts)))

    def who(self, rank: int) -> str:
        """``rank N``, and in a group's world the job's rank of it: ``rank 1 (rank 3 of the job)``."""
        if self.ranks is None or not 0 <= rank < len(self.ranks):
            return f"rank {rank}"
        return f"rank {rank} (rank {self.ranks[rank]} of the job)"

    # -- what became of the ranks ------------------------------------------------------------------
    def announce(self, state: str, detail: str) -> None:
        """Tell the peers this rank ``"failed"`` (``detail``: its exception) or ``"finished"`` (it called
        ``tilelink.finalize``). Best effort, never raises: the store may be gone with its host."""
        if self._announced == "failed" or self._announced == state:
            return
        self._announced = state
        with contextlib.suppress(Exception):
            self.store.set(self._key(state, self.rank), detail[:2000])
            self.store.add(self._key("gone"), 1)

    def gone(self, peers) -> dict[int, tuple[str, str]]:
        """Which of ``peers`` failed or finished: ``{peer: (state, what it said)}``. One store round trip
        unless a rank announced something since the last look."""
        count = self.store.add(self._key("gone"), 0)
        if count != self._gone_count:
            self._gone_count = count
            for peer in range(self.world_size):
                if peer == self.rank or self._gone.get(peer, ("",))[0] == "failed":
                    continue
                for state in ("failed", "finished"):
                    key = self._key(state, peer)
                    if self.store.check([key]):
                        self._gone[peer] = (state, self.store.get(key).decode(errors="replace"))
                        break
        return {peer: self._gone[peer] for peer in peers if peer in self._gone}

    def watch(self, peers, point: str) -> None:
        """Raise :class:`PeerFailedError` if one of ``peers``, which this rank waits for at ``point``, failed,
        or finished its work (unless this rank is finishing too)."""
        try:
            gone = self.gone(peers)
        except Exception as exc:  # noqa: BLE001 - the store's host is gone
            raise self.lost(exc, point) from None
        for peer, (state, detail) in sorted(gone.items(), key=lambda item: item[1][0] != "failed"):
            if state == "failed":
                raise PeerFailedError(
                    f"{self.who(self.rank)}: {self.who(peer)} failed ({detail}) while this rank waited for it at "
                    f"{point}; rank {peer}'s own report says why", rank=self.rank, peer=peer, cause=detail)
            if not self.finalizing:
                raise PeerFailedError(
                    f"{self.who(self.rank)}: {self.who(peer)} finished its work (called tilelink.finalize) without "
                    f"reaching {point}, where this rank waits for it. Every rank must make the same calls of an "
                    f"operator (and the same symmetric allocations), in the same order: rank {peer} skipped one or "
                    f"took another branch", rank=self.rank, peer=peer, cause=detail, consequence=False)

    def lost(self, exc: BaseException, point: str) -> PeerFailedError:
        """The error of a rank that lost the store (its host, rank 0 under ``tlxform run`` and ``spawn``,
        exited) while waiting at ``point``."""
        return PeerFailedError(
            f"rank {self.rank}: lost the world's store while waiting at {point} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}): the process hosting it (the job's rank 0 under tlxform "
            f"run and tilelink.spawn, the agent under torchrun) has exited", rank=self.rank, peer=0,
            cause=f"{type(exc).__name__}: {exc}")

    # -- bounded exchanges ------------------------------------------------------------------------------
    def exchange(self, value, point: str, *, count: bool = True, budget_s: float | None = None) -> list:
        """Every rank's ``value`` (small and picklable), by rank. Collective: every rank calls it at the same
        ``point`` (an operator's name, a runtime call), in the same order; ``count``: this is the next call of
        ``point`` (else the same call as the last exchange there). Waits at most ``budget_s`` (default
        :func:`skew_timeout_s`) for the peers, watching what becomes of them."""
        if count or point not in self._calls:
            self._calls[point] = self._calls.get(point, 0) + 1
        call = self._calls[point]
        sequence = self._sequence
        self._sequence += 1
        if self.world_size == 1:
            return [value]
        budget = skew_timeout_s(self.emulated) if budget_s is None else budget_s
        where = f"call {call} of {point}"
        try:
            self.store.set(self._key("x", sequence, self.rank), pickle.dumps((point, call, value)))
        except Exception as exc:  # noqa: BLE001
            raise self.lost(exc, where) from None
        keys = {peer: self._key("x", sequence, peer) for peer in range(self.world_size) if peer != self.rank}
        self._wait_keys(keys, budget, point, call)
        try:
            blobs = self.store.multi_get([keys[peer] for peer in sorted(keys)])
        except Exception as exc:  # noqa: BLE001
            raise self.lost(exc, where) from None
        got = dict(zip(sorted(keys), (pickle.loads(blob) for blob in blobs), strict=True))
        got[self.rank] = (point, call, value)
        others = {peer: (p, c) for peer, (p, c, _) in got.items() if (p, c) != (point, call)}
        if others:
            listing = "; ".join(f"rank {peer} at call {c} of {p}" for peer, (p, c) in sorted(others.items()))
            raise WorldMismatchError(
                f"rank {self.rank} is at call {call} of {point}, but {listing}: the ranks diverged (every rank must "
                f"make the same operator calls and symmetric allocations, in the same order)")
        if sequence > 0:  # every rank has posted this exchange: all of them are done reading the last one
            with contextlib.suppress(Exception):
                self.store.delete_key(self._key("x", sequence - 1, self.rank))
        return [got[rank][2] for rank in range(self.world_size)]

    def barrier(self, point: str, *, count: bool = True) -> None:
        """Every rank has reached ``point`` (an exchange of nothing, with its bounds and checks)."""
        self.exchange(None, point, count=count)

    def _wait_keys(self, keys: dict[int, str], budget: float, point: str, call: int) -> None:
        start = time.monotonic()
        deadline = start + budget
        next_watch = start + WATCH_EVERY_S
        pause = _POLL_FIRST_S
        point = _in_operator(point)
        where = f"call {call} of {point}"
        pending = dict(keys)
        while pending:
            try:
                if self.store.check(list(pending.values())):
                    return
                now = time.monotonic()
                if now >= next_watch or now > deadline:
                    pending = {peer: key for peer, key in pending.items() if not self.store.check([key])}
            except Exception as exc:  # noqa: BLE001
                raise self.lost(exc, where) from None
            if not pending:
                return
            if now >= next_watch:
                try:
                    self.watch(list(pending), where)
                except PeerFailedError:
                    # a peer that posted, then finished or failed, between the check above and this watch
                    with contextlib.suppress(Exception):
                        if self.store.check(list(pending.values())):
                            return
                    raise
                next_watch = now + WATCH_EVERY_S
            if now > deadline:
                peer = min(pending)
                raise HandshakeTimeout(rank=self.rank, peer=peer, call=call, seen=-1, budget_s=budget, what=point,
                                       others=sorted(pending)[1:])
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)

    def wait_word(self, address: int, value: int, peer: int, what: str, budget_s: float) -> None:
        """Emulated: wait on the host until the int64 at ``address`` (``peer``'s word of the handshake of ``what``,
        in this process's memory) is ``>= value``, the call number; at most ``budget_s``, watching the peers."""
        word = ctypes.c_int64.from_address(address)
        if word.value >= value:
            return
        start = time.monotonic()
        deadline, next_watch = start + budget_s, start + WATCH_EVERY_S
        pause = 1e-5
        while True:
            seen = word.value
            if seen >= value:
                return
            now = time.monotonic()
            if now >= next_watch:
                try:
                    self.watch([peer], f"call {value} of {what}")
                except PeerFailedError:
                    if word.value >= value:  # it reached the call, then finished or failed, since the last look
                        return
                    raise
                next_watch = now + WATCH_EVERY_S
            if now > deadline:
                raise HandshakeTimeout(rank=self.rank, peer=peer, call=value, seen=seen, budget_s=budget_s, what=what)
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
