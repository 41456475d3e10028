"""The dynamic-mapping primitives (MoE): waits and notifies over a run-time vector of channels,
more than one 32-channel word of them, padding entries ignored. Run in this process (interpreter)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _run_wait(barriers: torch.Tensor, chans: list[int] = CHANNELS) -> torch.Tensor:
    diag = torch.zeros(8, dtype=torch.int64)
    out = torch.full((1,), 7, dtype=torch.int32)
    channels = torch.tensor(chans, dtype=torch.int32)
    _wait_kernel[(1,)](barriers, channels, diag, 200_000_000, out, N=len(chans))
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


#: sorted rows from two neighbouring channels: the span is polled with scalar acquires
SORTED = [-1, 6, 6, 6, 7, 7, -1, -1]


def test_narrow_span_passes_when_its_channels_arrived() -> None:
    barriers = torch.zeros(80, dtype=torch.int64)
    barriers[[6, 7]] = 5
    check_diagnostics(_run_wait(barriers, SORTED), rank=0)


def test_narrow_span_names_the_missing_channel() -> None:
    barriers = torch.zeros(80, dtype=torch.int64)
    barriers[6] = 5  # channel 7 never arrives
    diag = _run_wait(barriers, SORTED)
    assert diag[0].item() == 1 and diag[2].item() == 7 and diag[3].item() == 5 and diag[4].item() == 0


def test_notify_adds_each_channels_summed_counts() -> None:
    barriers = torch.zeros(80, dtype=torch.int64)
    channels = torch.tensor(CHANNELS, dtype=torch.int32)
    counts = torch.tensor([1, 2, 3, 100, 4, 5, 6, 100], dtype=torch.int32)
    _notify_kernel[(1,)](barriers, channels, counts, N=len(CHANNELS))
    expected = torch.zeros(80, dtype=torch.int64)
    expected[3], expected[40], expected[70], expected[33] = 1 + 5, 2 + 3, 4, 6
    assert torch.equal(barriers, expected)


@triton.jit
def _notify_rows_kernel(barriers, lo, hi, cols, M, rpr, rpc, C, MAX: tl.constexpr):
    tll.producer_tile_notify_rows(barriers, lo, hi, cols, M, rpr, rpc, C, MAX)


def _notify_rows(M: int, world: int, C: int, lo: int, hi: int, cols: int, max_rows: int) -> None:
    """Run producer_tile_notify_rows and compare every barrier word with the Python mapping's overlap."""
    from tilelink.mapping import RowSharding, channel_overlap

    sh = RowSharding(M, world, C)
    rpr, rpc = sh.rows_per_rank, sh.rows_per_channel
    barriers = torch.zeros(world * C, dtype=torch.int64)
    _notify_rows_kernel[(1,)](barriers, lo, hi, cols, M, rpr, rpc, C, MAX=max_rows)
    expected = torch.tensor([cols * channel_overlap(ch, lo, hi, M, rpr, rpc, C) for ch in range(world * C)])
    assert torch.equal(barriers, expected), (M, world, C, lo, hi, barriers, expected)
    assert barriers.sum().item() == cols * max(0, min(hi, M) - lo)


@pytest.mark.parametrize("lo, hi", [(0, 16), (5, 21), (9, 10), (28, 44), (40, 56), (11, 12)])
def test_notify_rows_adds_each_channels_rows_times_columns(lo: int, hi: int) -> None:
    """Rows [lo, hi) of M = 40 (rows 40+ ignored), 10 rows per rank in channels of 3 rows (4 per rank, the
    last one short): one, two or many channels, the first and last partly covered, each adds its rows
    inside the range times the columns."""
    _notify_rows(40, 4, 4, lo, hi, 7, 16)


def test_notify_rows_with_more_channels_than_rows_in_the_span() -> None:
    """99 rows per rank in 98 channels of 2 rows: 49 of them empty. A 16-row tile across the ranks'
    boundary spans 57 channel positions, more than its rows: each non-empty one is still notified."""
    _notify_rows(197, 2, 98, 96, 112, 3, 16)


@settings(max_examples=40, deadline=None)
@given(world=st.integers(1, 5), M=st.integers(1, 60), data=st.data())
def test_notify_rows_matches_the_mapping(world: int, M: int, data) -> None:
    rpr = -(-M // world)
    C = data.draw(st.integers(1, rpr))
    lo = data.draw(st.integers(0, M + 3))
    height = data.draw(st.sampled_from([1, 2, 4, 8, 16]))
    _notify_rows(M, world, C, lo, lo + height, data.draw(st.integers(1, 9)), 16)


def test_notify_rows_of_no_rows_adds_nothing() -> None:
    """A tile past the last row, or a tensor of no rows: every word stays 0 (and no word outside the
    barrier array is touched: the one add of 0 goes to channel 0)."""
    for rows, lo, hi in ((0, 0, 16), (20, 32, 48)):
        barriers = torch.zeros(4, dtype=torch.int64)
        _notify_rows_kernel[(1,)](barriers, lo, hi, 5, rows, 10, 5, 2, MAX=16)
        assert not barriers.any(), (rows, lo, hi, barriers)


@triton.jit
def _grouped_kernel(barriers, starts, stop, height, cols, M, rpr, rpc, C, MAX: tl.constexpr, FLUSH: tl.constexpr):
    pending = tll.no_pending_tiles()
    for t in range(0, stop):
        lo = tl.load(starts + t)
        pending = tll.producer_tile_notify_rows_grouped(barriers, pending, lo, lo + height, cols, M, rpr, rpc, C, MAX)
    if FLUSH:
        tll.producer_tile_notify_flush(barriers, pending)


@settings(max_examples=30, deadline=None)
@given(world=st.integers(1, 4), M=st.integers(1, 70), data=st.data())
def test_grouped_notify_adds_every_tile_once_at_most_three_tiles_late(world: int, M: int, data) -> None:
    """A loop of tiles notified four at a time: before the held adds are sent, every tile of a complete
    group of four is in, and of the tiles of the last, incomplete group only the channels strictly between
    their first and last (they go out at once); after the flush every channel holds exactly what per-tile
    notifies would have added."""
    from tilelink.mapping import RowSharding, channel_overlap, channels_of_rows

    rpr = -(-M // world)
    C = data.draw(st.integers(1, rpr))
    sh = RowSharding(M, world, C)
    height = data.draw(st.sampled_from([1, 4, 8, 16]))
    starts = data.draw(st.lists(st.integers(0, M + 3), min_size=0, max_size=11))
    cols = data.draw(st.integers(1, 9))

    def adds(lo: int, only_middle: bool = False) -> list[int]:
        first, count = channels_of_rows(lo, lo + height, M, sh.rows_per_rank, sh.rows_per_channel, C)
        return [cols * channel_overlap(ch, lo, lo + height, M, sh.rows_per_rank, sh.rows_per_channel, C)
                if not only_middle or first < ch < first + count - 1 else 0 for ch in range(world * C)]

    def expected(tiles: list[int], held: list[int]) -> torch.Tensor:
        rows = [adds(lo) for lo in tiles] + [adds(lo, True) for lo in held]
        return torch.tensor([sum(r[ch] for r in rows) for ch in range(world * C)], dtype=torch.int64)

    args = (torch.tensor(starts + [0], dtype=torch.int32), len(starts), height, cols, M, sh.rows_per_rank,
            sh.rows_per_channel, C)
    for flush in (False, True):
        barriers = torch.zeros(world * C, dtype=torch.int64)
        _grouped_kernel[(1,)](barriers, *args, MAX=16, FLUSH=flush)
        sent = len(starts) if flush else len(starts) - len(starts) % 4
        want = expected(starts[:sent], starts[sent:])
        assert torch.equal(barriers, want), (flush, starts, barriers, want)
