"""The dynamic-mapping primitives (MoE): waits and notifies over a run-time vector of channels,
more than one 32-channel word of them, padding entries ignored. Run in this process (interpreter)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import tilelink.language as tll
from tilelink.runtime.diagnostics import check_diagnostics

CHANNELS = [3, 40, 40, -1, 70, 3, 33, -1]


@triton.jit
def _wait_kernel(barriers, channels_ptr, diag, budget, out, N: tl.constexpr):
    channels = tl.load(channels_ptr + tl.arange(0, N))
    token = tll.consumer_tile_wait_channels(barriers, channels, 5, diag, budget)
    tl.store(out, token)


@triton.jit
def _notify_kernel(barriers, channels_ptr, counts_ptr, N: tl.constexpr):
    channels = tl.load(channels_ptr + tl.arange(0, N))
    counts = tl.load(counts_ptr + tl.arange(0, N))
    tll.producer_tile_notify_channels(barriers, channels, counts)


def _run_wait(barriers: torch.Tensor) -> torch.Tensor:
    diag = torch.zeros(8, dtype=torch.int64)
    out = torch.full((1,), 7, dtype=torch.int32)
    channels = torch.tensor(CHANNELS, dtype=torch.int32)
    _wait_kernel[(1,)](barriers, channels, diag, 200_000_000, out, N=len(CHANNELS))
    assert out.item() == 0  # the token is zero
    return diag


def test_wait_on_every_distinct_channel_passes_when_all_arrived() -> None:
    barriers = torch.zeros(80, dtype=torch.int64)
    barriers[[3, 33, 40, 70]] = 5
    check_diagnostics(_run_wait(barriers), rank=0)  # no timeout


def test_wait_names_the_one_missing_channel() -> None:
    barriers = torch.zeros(80, dtype=torch.int64)
    barriers[[3, 33, 70]] = 5  # channel 40 (second 32-channel word) never arrives
    diag = _run_wait(barriers)
    assert diag[0].item() == 1 and diag[2].item() == 40 and diag[3].item() == 5 and diag[4].item() == 0


def test_notify_adds_each_channels_summed_counts() -> None:
    barriers = torch.zeros(80, dtype=torch.int64)
    channels = torch.tensor(CHANNELS, dtype=torch.int32)
    counts = torch.tensor([1, 2, 3, 100, 4, 5, 6, 100], dtype=torch.int32)
    _notify_kernel[(1,)](barriers, channels, counts, N=len(CHANNELS))
    expected = torch.zeros(80, dtype=torch.int64)
    expected[3], expected[40], expected[70], expected[33] = 1 + 5, 2 + 3, 4, 6
    assert torch.equal(barriers, expected)
