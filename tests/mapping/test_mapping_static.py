"""Properties of the static tile-centric mapping, checked on the Python model.

Example budget (fixed, for CI): every property runs ``@settings(max_examples=200, deadline=None,
derandomize=True)`` (``FAST`` below) over ranks 1–16, channels per rank 1–8 (capped at rows per
rank, see ``shardings``), tile sizes 16–256 and M from 1 to 10**5, biased towards non-divisible
sizes and small cases. Each example is checked over *all* rows, channels and tiles at once with numpy
(the model's functions accept arrays), so an example costs milliseconds.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tilelink.mapping as mp
from tilelink.mapping import RowSharding

FAST = settings(max_examples=200, deadline=None, derandomize=True)


@st.composite
def shardings(draw) -> RowSharding:
    world = draw(st.integers(1, 16))
    size = draw(st.one_of(st.integers(1, 64), st.integers(1, 2000), st.integers(1, 100_000)))
    rpr = -(-size // world)
    channels = draw(st.integers(1, min(8, rpr)))
    return RowSharding(size, world, channels)


tiles = st.integers(16, 256)


def _row_channels(s: RowSharding) -> np.ndarray:
    return mp.channel_of_row(np.arange(s.size), s.rows_per_rank, s.rows_per_channel, s.channels_per_rank)


def _channel_ranges(s: RowSharding) -> tuple[np.ndarray, np.ndarray]:
    return mp.channel_range(np.arange(s.num_channels), *s.args)


@FAST
@given(shardings())
def test_every_row_in_exactly_one_rank_and_channel_of_that_rank(s: RowSharding) -> None:
    rows = np.arange(s.size)
    ch = _row_channels(s)
    lo, hi = _channel_ranges(s)
    assert (hi >= lo).all() and lo.min() >= 0 and hi.max() <= s.size
    # channel c's range holds every row mapped to c and nothing else: the ranges partition [0, M)
    assert ((lo[ch] <= rows) & (rows < hi[ch])).all()
    assert (np.bincount(ch, minlength=s.num_channels) == hi - lo).all()
    assert (mp.channel_rows(np.arange(s.num_channels), *s.args) == hi - lo).all()
    # same for ranks, and a row's channel belongs to the row's rank
    r_lo, r_hi = mp.rank_range(np.arange(s.world), s.size, s.rows_per_rank)
    rank = rows // s.rows_per_rank
    assert ((r_lo[rank] <= rows) & (rows < r_hi[rank])).all()
    assert (np.bincount(rank, minlength=s.world) == r_hi - r_lo).all()
    assert (mp.channel_rank(ch, s.channels_per_rank) == rank).all()
    # channel_of_row is monotone (what makes a tile's wait set a contiguous span)
    assert (np.diff(ch) >= 0).all()
    # the dataclass agrees with the arrays on a few points
    for row in {0, s.size // 2, s.size - 1}:
        assert s.channel_of_row(row) == ch[row] and s.rank_of_row(row) == rank[row]
        assert s.channel_rank(s.channel_of_row(row)) == s.rank_of_row(row)


def _tile_pairs_truth(s: RowSharding, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted keys tile*nc + channel for every (tile, channel) sharing a row, and the row counts."""
    keys = (np.arange(s.size) // tile) * s.num_channels + _row_channels(s)
    return np.unique(keys, return_counts=True)


def _span_pairs(s: RowSharding, tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tile, channel, rows of the channel in the tile) for every channel of every tile's span."""
    t = np.arange(s.num_tiles(tile))
    lo, hi = mp.tile_range(t, tile, s.size)
    first, count = mp.channels_of_rows(lo, hi, *s.args)
    assert (count >= 1).all()
    tile_of = np.repeat(t, count)
    channel = np.repeat(first, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
    rows = mp.channel_overlap(channel, lo[tile_of], hi[tile_of], *s.args)
    return tile_of, channel, rows


@FAST
@given(shardings(), tiles)
def test_consumer_tile_waits_exactly_on_the_channels_it_reads(s: RowSharding, tile: int) -> None:
    truth, _ = _tile_pairs_truth(s, tile)
    tile_of, channel, _ = _span_pairs(s, tile)
    nonempty = mp.channel_rows(channel, *s.args) > 0
    waits = tile_of[nonempty] * s.num_channels + channel[nonempty]
    # no missing wait (race), no extra wait on a channel with rows (lost overlap)
    assert np.array_equal(np.sort(waits), truth)
    # the span is tight: its ends hold rows of the tile
    t = np.arange(s.num_tiles(tile))
    lo, hi = mp.tile_range(t, tile, s.size)
    first, count = mp.channels_of_rows(lo, hi, *s.args)
    ch = _row_channels(s)
    assert np.array_equal(first, ch[lo]) and np.array_equal(first + count - 1, ch[hi - 1])
    for k in {0, len(t) - 1, len(t) // 3}:
        assert s.consumer_channels(int(k), tile) == (first[k], count[k])
        assert s.channels_overlapping(int(lo[k]), int(hi[k])) == sorted(set(ch[lo[k]:hi[k]].tolist()))


@FAST
@given(shardings(), tiles)
def test_producer_tile_notifies_exactly_the_channels_it_writes(s: RowSharding, producer: int) -> None:
    truth, truth_rows = _tile_pairs_truth(s, producer)
    tile_of, channel, rows = _span_pairs(s, producer)
    notes = rows > 0
    keys = tile_of[notes] * s.num_channels + channel[notes]
    order = np.argsort(keys)
    assert np.array_equal(keys[order], truth)
    assert np.array_equal(rows[notes][order], truth_rows)
    # counter protocol: a channel receives exactly its rows over all producer tiles, whatever the tile
    received = np.bincount(channel, weights=rows, minlength=s.num_channels)
    assert np.array_equal(received, mp.channel_rows(np.arange(s.num_channels), *s.args))
    # the dataclass method gives the same notifications
    for k in {0, s.num_tiles(producer) - 1, s.num_tiles(producer) // 2}:
        mine = (tile_of == k) & notes
        assert s.producer_notifies(k, producer) == list(zip(channel[mine].tolist(), rows[mine].tolist(),
                                                            strict=True))


@FAST
@given(shardings(), tiles)
def test_all_gather_every_waited_channel_is_notified_once(s: RowSharding, tile: int) -> None:
    """All-gather, producer tile = channel: each channel is notified once per call (k = 1).

    A consumer waits on its whole span with target ``epoch * 1``, so every channel of every span
    (empty ones included) must be notified exactly once, and the notify count of a channel must
    equal the k its waiters use.
    """
    notified = np.zeros(s.num_channels, dtype=np.int64)
    c_lo, c_hi = _channel_ranges(s)
    for ch in range(s.num_channels):  # the producer of channel ch copies its rows, then notifies ch
        notified[ch] += 1
        first, count = s.channels_of_rows(int(c_lo[ch]), int(c_hi[ch]))
        assert (first, count) == ((ch, 1) if c_hi[ch] > c_lo[ch] else (0, 0))
    _, channel, _ = _span_pairs(s, tile)
    assert (notified[channel] == 1).all()
    assert channel.min() >= 0 and channel.max() < s.num_channels
    # one-notify target for empty channels written as epoch * min(rows, 1) is also consistent
    rows = mp.channel_rows(np.arange(s.num_channels), *s.args)
    assert (np.minimum(rows, 1)[channel] <= notified[channel]).all()


@FAST
@given(st.integers(1, 5000), st.integers(1, 16), st.data(), st.sampled_from(mp.ORDERS))
def test_remap_tile_is_a_bijection(num_tiles: int, world: int, data, order: str) -> None:
    rank = data.draw(st.integers(0, world - 1))
    steps = np.arange(num_tiles)
    shift = data.draw(st.integers(0, 10**6))
    assert np.array_equal(np.sort(mp.rotate_tile(steps, num_tiles, shift)), steps)
    # a program outside the tiles (before the first: a kernel whose grid starts at tile -1; past the last) stays idle
    # where it is, never sent onto a tile another program computes
    outside = np.concatenate([np.arange(-num_tiles - 2, 0), np.arange(num_tiles, 2 * num_tiles + 2)])
    assert np.array_equal(mp.rotate_tile(outside, num_tiles, shift), outside)
    seen = [mp.remap_tile(t, num_tiles, rank, world, order) for t in range(min(num_tiles, 300))]
    assert len(set(seen)) == len(seen) and all(0 <= t < num_tiles for t in seen)
    if num_tiles <= 300:
        assert sorted(seen) == list(range(num_tiles))
    if order == "mesh":
        assert seen == list(range(len(seen)))


@FAST
@given(shardings(), tiles, st.data(), st.sampled_from(mp.ORDERS))
def test_remap_tile_rows_starts_at_the_ranks_first_row(s: RowSharding, tile: int, data, order: str) -> None:
    rank = data.draw(st.integers(0, s.world - 1))
    n = s.num_tiles(tile)
    shift = mp.tile_shift(rank, s.rows_per_rank, tile)
    assert np.array_equal(np.sort(mp.rotate_tile(np.arange(n), n, shift)), np.arange(n))
    first = mp.remap_tile_rows(0, n, rank, s.rows_per_rank, tile, order)
    if order == "mesh":
        assert first == 0
    elif rank * s.rows_per_rank < s.size:  # a rank holding rows starts with the tile of its first row
        lo, hi = s.tile_range(first, tile)
        assert lo <= rank * s.rows_per_rank < hi


def test_from_comm_block_bounds_rows_per_channel() -> None:
    for size in (1, 7, 1000, 4097, 100_000):
        for world in (1, 3, 8):
            for block in (1, 16, 128, 10**6):
                s = RowSharding.from_comm_block(size, world, block)
                assert s.rows_per_channel <= block
                assert s.channels_per_rank == -(-s.rows_per_rank // block)


def test_worked_example_with_empty_channels() -> None:
    """rpr = 9, C = 4 -> rpc = 3: the 4th channel of every rank is empty and sits inside spans."""
    s = RowSharding(36, 4, 4)
    assert (s.rows_per_rank, s.rows_per_channel, s.num_channels) == (9, 3, 16)
    assert s.channel_range(3) == (9, 9) and s.channel_rows(3) == 0
    assert s.channels_of_rows(8, 12) == (2, 3)  # channels 2, 3 (empty), 4
    assert s.channels_overlapping(8, 12) == [2, 4]
    assert s.producer_notifies(2, 4) == [(2, 1), (4, 3)]
    assert s.channels_of_rows(36, 40) == (0, 0) and s.channels_of_rows(-5, 0) == (0, 0)
    assert s.channels_of_rows(-5, 100) == (0, 15)
    # M < R: ranks without rows
    small = RowSharding(3, 8, 1)
    assert [small.rank_range(r) for r in range(8)] == [(0, 1), (1, 2), (2, 3)] + [(3, 3)] * 5
