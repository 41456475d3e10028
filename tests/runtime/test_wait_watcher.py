"""The host-wait watcher of the NVSHMEM backend: the waits enqueued on a stream pass in order, so each poll looks at
each stream's first pending wait alone (and at the next ones once it passed), however far the host ran ahead; a
wait the stream reached and did not pass within its budget is diagnosed and released, and the next one watched."""

from __future__ import annotations

import random
import threading
import time
from types import SimpleNamespace

from tilelink.errors import WaitTimeout
from tilelink.runtime.nvshmem import NvshmemBackend, _WaitWatcher


class _Event:
    def __init__(self) -> None:
        self.done = False
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done


def _backend() -> SimpleNamespace:
    released: list[tuple[int, int]] = []

    def expire(address: int, value: int, budget: float, index: int) -> WaitTimeout:
        released.append((address, value))
        return WaitTimeout(rank=0, primitive="rank_wait", index=index, expected=value, seen=value - 1, budget_s=budget)

    return SimpleNamespace(rank=0, _spare_events=[], _expire=expire, _release_wait=lambda a, v: None,
                           released=released)


def _watched(watcher: _WaitWatcher, stream: int, waits: int, budget: float = 60.0) -> list[tuple[_Event, _Event]]:
    events = [(_Event(), _Event()) for _ in range(waits)]
    for i, (reached, passed) in enumerate(events):
        watcher.watch(stream, reached, passed, 0x1000 + 8 * i, i + 1, budget, i)
    return events


def test_each_poll_looks_at_each_streams_first_pending_wait() -> None:
    backend = _backend()
    watcher = _WaitWatcher(backend, thread=False)
    one, two = _watched(watcher, 7, 200), _watched(watcher, 9, 3)
    assert watcher.poll()  # nothing passed: one look at each stream's first wait
    assert [sum(e.queries for e in pair) for pair in one[:2]] == [2, 0]
    assert sum(e.queries for pair in one + two for e in pair) == 4
    for reached, passed in one[:150]:
        reached.done = passed.done = True
    assert watcher.poll()
    assert one[150][1].queries == 1 and one[151][1].queries == 0  # the passed ones gone, the next one looked at
    assert len(watcher._pending()) == 50 + 3 and len(backend._spare_events) == 300  # their events reused
    for reached, passed in one[150:] + two:
        reached.done = passed.done = True
    assert not watcher.poll() and watcher._pending() == []
    watcher.raise_timeout()  # nothing timed out


def test_a_wait_reached_and_not_passed_in_its_budget_is_diagnosed_and_released() -> None:
    backend = _backend()
    watcher = _WaitWatcher(backend, thread=False)
    events = _watched(watcher, 7, 3, budget=0.0)
    events[0][0].done = True  # the stream is at the first wait; its budget of 0 s starts now
    assert watcher.poll()  # reached: its deadline is set
    assert watcher.poll()  # past it: diagnosed, released; the next wait is not reached
    assert backend.released == [(0x1000, 1)] and len(watcher._pending()) == 2
    try:
        watcher.raise_timeout()
    except WaitTimeout as timeout:
        assert timeout.expected == 1 and timeout.index == 0
    else:
        raise AssertionError("the timed-out wait was not raised")


def test_a_chained_waits_budget_starts_once_the_wait_before_it_is_over() -> None:
    backend = _backend()
    watcher = _WaitWatcher(backend, thread=False)
    (reached, passed), = _watched(watcher, 7, 1)
    chained = _Event()
    watcher.watch(7, None, chained, 0x2000, 5, 0.0, 1)  # enqueued right behind the first: no event of its own
    assert watcher.poll() and watcher._pending()[1][6] is None  # the first is pending: the chained one not looked at
    assert chained.queries == 0
    reached.done = passed.done = True
    assert watcher.poll()  # the first passed; the chained one is the stream's next: its budget (0 s) starts
    assert chained.queries == 1 and watcher._pending()[0][6] is not None
    assert backend._spare_events == [reached, passed] and backend.released == []
    assert not watcher.poll()  # past its budget: diagnosed and released
    assert backend.released == [(0x2000, 5)]
    chained.done = True
    assert backend._spare_events == [reached, passed]  # the released one's event is not reused: it may be pending


def test_threads_waiting_on_one_stream_are_watched_in_the_streams_order() -> None:
    # two threads enqueue waits on one stream: the watcher must take them in the order the stream runs them
    enqueued: list[int] = []
    rng = random.Random(5)

    class _Recorded(_Event):
        def record(self, stream) -> None:
            time.sleep(rng.random() * 1e-4)  # a thread may lose the core between its driver calls

    def wait(stream, address, value) -> None:
        time.sleep(rng.random() * 1e-4)
        enqueued.append(value)

    backend = NvshmemBackend.__new__(NvshmemBackend)
    watcher = _WaitWatcher(_backend(), thread=False)
    stream = SimpleNamespace(cuda_stream=7)
    backend.__dict__.update(
        _enqueue_order=threading.Lock(), _spare_events=[], _ops=SimpleNamespace(wait=wait), _finalized=False,
        _stream=lambda s: s, _event=_Recorded, _watcher=lambda: watcher)

    def enqueue(first: int) -> None:
        for value in range(first, first + 200, 2):
            backend.wait_value_at(0x1000, value, stream, 60.0, block=False, index=value, chained=value % 4 > 1)

    threads = [threading.Thread(target=enqueue, args=(first,)) for first in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [item[3] for item in watcher._pending()] == enqueued and len(enqueued) == 200
