"""``Diagnostics.check_later`` on a GPU, with stand-ins for the device record, its pinned copy and the event (the
CPU build of torch has no CUDA): how often the record is copied for the host, that nothing is copied while a copy
is in flight, and that a timed-out wait is raised by the first call that finds the copy behind it landed."""

from __future__ import annotations

import types

import numpy as np
import pytest

import tilelink
from tilelink.runtime import diagnostics
from tilelink.runtime.diagnostics import CHECK_EVERY, DIAG_WORDS, Diagnostics


class Record:
    """The device record: a buffer on "cuda" whose words a timed-out wait sets."""

    def __init__(self) -> None:
        self.words = np.zeros(DIAG_WORDS, dtype=np.int64)
        self.device = types.SimpleNamespace(type="cuda")

    def __getitem__(self, part):
        record = self

        class Part:
            def zero_(self) -> None:
                record.words[part] = 0

        return Part()


class PinnedCopy:
    """The pinned host copy: ``copy_`` takes the record as it is when the copy lands (``land``)."""

    def __init__(self) -> None:
        self.array = np.zeros(DIAG_WORDS, dtype=np.int64)
        self.copies = 0
        self.source = None

    def copy_(self, source, non_blocking: bool) -> None:
        assert non_blocking
        self.copies += 1
        self.source = source

    def land(self) -> None:
        self.array[:] = self.source.words

    def numpy(self):
        return self.array

    def tolist(self):
        return self.array.tolist()

    def zero_(self) -> None:
        self.array[:] = 0


class Event:
    def __init__(self) -> None:
        self.done, self.streams = False, []

    def record(self, stream=None) -> None:
        self.done = False
        self.streams.append(stream)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


@pytest.fixture
def diag(monkeypatch):
    d = Diagnostics.__new__(Diagnostics)
    d.rank, d.budget_s, d.budget_ns = 0, 1.0, 10**9
    d.buffer, d._host, d._event = Record(), PinnedCopy(), Event()
    d._record, d._copied, d._kernel, d._calls, d._copy_time = d._host.numpy(), None, None, 0, 0.0
    d._ordinal = d._copy_ordinal = d._clean_through = 0
    clock = [100.0]
    monkeypatch.setattr(diagnostics.time, "perf_counter", lambda: clock[0])
    d.clock = clock
    return d


def _land(d) -> None:
    d._host.land()
    d._event.done = True


def test_a_copy_every_few_calls_and_none_in_flight(diag) -> None:
    diag.check_later("k", stream="main")  # the first call copies
    assert diag._host.copies == 1 and diag._event.streams == ["main"]
    for _ in range(3 * CHECK_EVERY):  # in flight: nothing more, however many calls
        diag.check_later("k", stream="main")
    assert diag._host.copies == 1
    _land(diag)
    for _ in range(CHECK_EVERY):  # landed and read; the next copy after CHECK_EVERY calls
        diag.check_later("k", stream="main")
        _land(diag)
    assert diag._host.copies == 2
    diag.clock[0] += 2 * diagnostics.CHECK_INTERVAL_S  # a call long after the last copy copies at once
    diag.check_later("k", stream="main")
    assert diag._host.copies == 3


def test_a_timed_out_wait_is_raised_once_its_copy_lands(diag) -> None:
    diag.check_later("k")
    _land(diag)
    diag.check_later("k")  # read: nothing recorded
    diag.buffer.words[:5] = [1, 1, 7, 3, 2]  # a wait of a later call times out on the device
    diag.clock[0] += 1.0
    diag.check_later("consumer_kernel")  # its copy is made behind it
    diag.check_later("consumer_kernel")  # not landed yet: nothing to raise
    _land(diag)
    with pytest.raises(tilelink.WaitTimeout) as info:
        diag.check_later("consumer_kernel")
    assert (info.value.index, info.value.expected, info.value.seen) == (7, 3, 2)
    assert "consumer_kernel" in str(info.value)
    assert not diag.buffer.words[:5].any() and not diag._host.array.any()  # cleared once raised


def unread_record_at_finalize() -> str:
    """A rank whose last call's wait timed out on the device, its record not copied or read by any check yet (as
    after the last calls of a burst): ``tilelink.finalize()`` reads it and raises."""
    import torch

    record = Diagnostics()
    record.buffer[:5] = torch.tensor([1, 1, 7, 3, 2])
    record._kernel = "consumer_kernel"
    try:
        tilelink.finalize()
    except tilelink.WaitTimeout as exc:
        return str(exc)
    return "NO ERROR"


def test_finalize_raises_a_timed_out_wait_no_check_read() -> None:
    (message,) = tilelink.spawn(unread_record_at_finalize, 1)
    assert "consumer_kernel" in message and "NO ERROR" not in message, message


def test_a_check_waits_for_kernels_on_every_stream(diag, monkeypatch) -> None:
    """The kernels behind a record run on the caller's stream at its calls, on a side stream, or in a graph's
    replay: a check made with another stream current (``tilelink.finalize()`` after calls under
    ``torch.cuda.stream(s)``, a replay's record) must wait for the device, or it reads the record before a wait
    that is still spending its budget has timed out."""
    import torch

    class Device(Record):
        def detach(self):
            return self

        def to(self, device, non_blocking=False):
            return self

        def tolist(self):
            return self.words.tolist()

    diag.buffer = Device()

    def synchronize(device=None) -> None:  # the kernel on the other stream finishes: its wait timed out
        diag.buffer.words[:5] = [1, 1, 7, 3, 2]

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    with pytest.raises(tilelink.WaitTimeout) as info:
        diag.check(kernel="consumer_kernel")
    assert (info.value.index, info.value.expected, info.value.seen) == (7, 3, 2)
    assert not diag.buffer.words[:5].any()


def test_a_timed_out_wait_says_how_many_returned_results_to_discard(diag, monkeypatch) -> None:
    diag.check_later("k")
    _land(diag)
    diag.check_later("k")  # call 2 reads the copy of call 1: clean through call 1
    diag.buffer.words[:5] = [1, 1, 7, 3, 2]  # a wait of call 2 times out on the device
    for _ in range(CHECK_EVERY - 1):  # calls 3.. up to the next copy
        diag.check_later("k")
    assert diag._copied is not None  # the copy covering the timed-out wait is behind the kernels
    diag.check_later("k")  # in flight: returns
    _land(diag)
    with pytest.raises(tilelink.WaitTimeout) as info:
        diag.check_later("k")  # this call raises; every call after call 1 returned a result
    calls = CHECK_EVERY + 1
    assert info.value.spoiled_calls == calls, info.value.spoiled_calls
    assert f"the last {calls} calls of this operator on rank 0" in str(info.value)
    _land(diag)
    diag.check_later("k")  # the record was cleared: the calls after the error start a clean count
    diag.check_later("k")
    _land(diag)
    import torch

    def timed_out(*args, **kwargs):  # the device record read synchronously shows a timed-out wait
        raise tilelink.WaitTimeout(rank=0, primitive="consumer_tile_wait", index=7, expected=3, seen=2, budget_s=1.0)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(diagnostics, "check_diagnostics", timed_out)
    with pytest.raises(tilelink.WaitTimeout) as info:
        diag.check()  # a synchronous check: the calls it covers all returned
    assert info.value.spoiled_calls == 2 and "the last 2 calls" in str(info.value)


def test_each_call_checked_when_asked(diag, monkeypatch) -> None:
    checked = []
    monkeypatch.setattr(diag, "check", lambda kernel=None, returned=None: checked.append(returned))
    monkeypatch.setenv("TILELINK_CHECK_WAITS", "each")
    diag.check_later("k")
    diag.check_later("k")
    assert checked == [0, 1] and diag._host.copies == 0  # synchronous: no copy behind the kernels


def test_a_replay_wait_does_not_count_eager_calls(diag) -> None:
    """A captured call's twin record counts the eager calls that check it, not the replays its kernels ran in: the
    error says the replays are void instead of a count of calls."""
    diag.replays = True
    diag.check_later("k")
    _land(diag)
    diag.check_later("k")
    diag.buffer.words[:5] = [1, 1, 7, 3, 2]  # a replay's wait times out
    diag.clock[0] += 1.0
    diag.check_later("k")
    _land(diag)
    with pytest.raises(tilelink.WaitTimeout) as info:
        diag.check_later("k")
    assert info.value.spoiled_calls is None
    assert "replay of a captured call" in str(info.value) and "calls of this operator" not in str(info.value)
