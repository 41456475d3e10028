"""The read of every channel at a program's start (``channels_ready``) and the waits that take its answer: 1 exactly
when every one of the first ``count`` channels has reached the target, and a wait told so passes without polling,
while one told 0 still polls (and records its timeout). Run in this process (interpreter)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import tilelink.language as tll


@triton.jit
def _ready_kernel(barriers, count, target, out):
    tl.store(out, tll.channels_ready(barriers, count, target))


@triton.jit
def _wait_kernel(barriers, first, count, target, diag, budget, ready, out):
    tl.store(out, tll.consumer_tile_wait(barriers, first, count, target, diag, budget, scaled=True, ready=ready))


@triton.jit
def _wait_channels_kernel(barriers, channels_ptr, target, diag, budget, ready, out, N: tl.constexpr):
    channels = tl.load(channels_ptr + tl.arange(0, N))
    tl.store(out, tll.consumer_tile_wait_channels(barriers, channels, target, diag, budget, scaled=True,
                                                  ready=ready))


def _ready(barriers: torch.Tensor, count: int, target: int) -> int:
    out = torch.full((1,), 7, dtype=torch.int32)
    _ready_kernel[(1,)](barriers, count, target, out)
    return out.item()


@settings(max_examples=25, deadline=None)
@given(values=st.lists(st.integers(0, 6), min_size=1, max_size=90), count=st.integers(0, 90),
       target=st.integers(1, 6))
def test_ready_exactly_when_every_counted_channel_reached_the_target(values, count, target) -> None:
    count = min(count, len(values))
    barriers = torch.tensor(values, dtype=torch.int64)
    assert _ready(barriers, count, target) == int(all(v >= target for v in values[:count]))


def test_a_channel_of_the_last_lane_counts_and_more_channels_than_lanes_are_not_read() -> None:
    lanes = int(tll.READY_CHANNELS.value)
    barriers = torch.full((lanes + 1,), 4, dtype=torch.int64)
    assert _ready(barriers, lanes, 4) == 1
    barriers[lanes - 1] = 3
    assert _ready(barriers, lanes, 4) == 0
    barriers[lanes - 1] = 4
    assert _ready(barriers, lanes + 1, 4) == 0  # every channel there, but too many to read: every wait polls


def _wait(ready: int) -> torch.Tensor:
    barriers = torch.zeros(4, dtype=torch.int64)  # channel 2 never arrives
    diag = torch.zeros(8, dtype=torch.int64)
    out = torch.full((1,), 7, dtype=torch.int32)
    _wait_kernel[(1,)](barriers, 1, 2, 5, diag, 20_000_000, ready, out)
    assert out.item() == 0
    return diag


def test_a_wait_told_every_channel_is_there_does_not_poll() -> None:
    assert _wait(1)[0].item() == 0  # nothing read: no timeout recorded


def test_a_wait_told_nothing_polls_and_records_its_timeout() -> None:
    diag = _wait(0)
    assert diag[0].item() == 1 and diag[2].item() == 1 and diag[3].item() == 5  # channel 1 first, target 5


def test_a_dynamic_wait_takes_the_answer_too() -> None:
    barriers = torch.zeros(40, dtype=torch.int64)
    channels = torch.tensor([3, 33, -1, 3], dtype=torch.int32)
    for ready, timed_out in ((1, 0), (0, 1)):
        diag = torch.zeros(8, dtype=torch.int64)
        out = torch.full((1,), 7, dtype=torch.int32)
        _wait_channels_kernel[(1,)](barriers, channels, 5, diag, 20_000_000, ready, out, N=4)
        assert diag[0].item() == timed_out and out.item() == 0, (ready, diag)
