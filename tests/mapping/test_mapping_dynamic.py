"""Dynamic mapping (MoE lookup tables): a consumer tile waits exactly on the channels of the rows it reads.

Example budget: ``@settings(max_examples=100, deadline=None, derandomize=True)``; routings of up to
4096 tokens (top-k up to 4 over up to 16 experts), with per-expert padding (-1) to the tile size,
empty experts and all tokens sent to one expert. Each example is checked tile by tile against a
brute-force set computation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilelink.mapping import LookupTables, RowSharding

DYNAMIC = settings(max_examples=100, deadline=None, derandomize=True)


def moe_gather_index(topk_ids: np.ndarray, num_experts: int, tile: int) -> np.ndarray:
    """Sorted-by-expert gather index (token row per slot), each expert's block padded to ``tile`` with -1."""
    tokens = np.repeat(np.arange(topk_ids.shape[0]), topk_ids.shape[1])
    experts = topk_ids.reshape(-1)
    parts = []
    for e in range(num_experts):
        rows = tokens[experts == e]
        pad = (-len(rows)) % tile
        parts.append(np.concatenate([rows, np.full(pad, -1)]))
    return np.concatenate(parts).astype(np.int64)


@st.composite
def routings(draw):
    world = draw(st.integers(1, 16))
    tokens = draw(st.integers(1, 4096))
    rpr = -(-tokens // world)
    sharding = RowSharding(tokens, world, draw(st.integers(1, min(8, rpr))))
    tile = draw(st.sampled_from([16, 32, 64, 128, 256]))
    experts = draw(st.integers(1, 16))
    topk = draw(st.integers(1, min(4, experts)))
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(["random", "empty_experts", "one_expert", "raw_padding"]))
    rng = np.random.default_rng(seed)
    if kind == "raw_padding":  # any gather index: rows in any order, ~1/3 padding
        length = draw(st.integers(0, 3 * tokens))
        index = rng.integers(-1, tokens, size=length)
        index[rng.random(length) < 0.3] = -1
        return sharding, tile, index.astype(np.int64)
    if kind == "one_expert":
        topk_ids = np.zeros((tokens, 1), dtype=np.int64)
    else:
        used = experts if kind == "random" else max(1, experts // 3)
        pool = rng.choice(experts, size=used, replace=False)
        k = min(topk, used)
        topk_ids = np.stack([rng.choice(pool, size=k, replace=False) for _ in range(tokens)]) \
            if tokens <= 256 else pool[np.argsort(rng.random((tokens, used)), axis=1)[:, :k]]
    return sharding, tile, moe_gather_index(topk_ids, experts, tile)


@DYNAMIC
@given(routings())
def test_consumer_tile_waits_exactly_on_channels_of_rows_it_reads(case) -> None:
    sharding, tile, index = case
    tables = LookupTables.build(torch.from_numpy(index), sharding, tile)
    assert tables.num_tiles == -(-len(index) // tile)
    assert tables.wait_ptr[0] == 0 and tables.wait_ptr[-1] == tables.wait_channels.numel()
    assert (torch.diff(tables.wait_ptr) >= 0).all()
    for t in range(tables.num_tiles):
        rows = index[t * tile:(t + 1) * tile]
        rows = rows[rows >= 0]
        expected = sorted({sharding.channel_of_row(int(r)) for r in rows})
        assert tables.waits_of(t) == expected
        assert all(sharding.channel_rows(c) > 0 for c in expected)
        low, high = tables.rows(t)
        assert (low, high) == ((int(rows.min()), int(rows.max()) + 1) if len(rows) else (0, 0))


def test_tables_dtypes_and_shapes() -> None:
    s = RowSharding(100, 4, 2)
    index = torch.tensor([0, 1, -1, 99, 50, 50, -1, -1, 26], dtype=torch.int32)
    t = LookupTables.build(index, s, 4)
    assert t.num_tiles == 3
    assert t.wait_ptr.dtype == torch.int32 and t.wait_channels.dtype == torch.int32
    # rpr 25, rpc 13: row 99 -> channel 7, row 50 -> channel 4, row 26 -> channel 2
    assert t.waits_of(0) == [0, 7] and t.waits_of(1) == [4] and t.waits_of(2) == [2]
    assert t.rows(0) == (0, 100) and t.rows(1) == (50, 51) and t.rows(2) == (26, 27)
    assert t.wait_range(1) == (2, 3)
    empty = LookupTables.build(torch.full((5,), -1), s, 4)
    assert empty.waits_of(0) == [] and empty.rows(1) == (0, 0)
    none = LookupTables.build(torch.zeros(0, dtype=torch.int64), s, 4)
    assert none.num_tiles == 0 and none.wait_ptr.tolist() == [0]


@pytest.mark.parametrize(
    "index, tile, message",
    [
        (torch.tensor([0, 100]), 4, r"source row 100, outside \[0, 100\)"),
        (torch.tensor([0, -2]), 4, "source row -2"),
        (torch.tensor([0.0, 1.0]), 4, "1-D integer tensor"),
        (torch.zeros((2, 2), dtype=torch.int64), 4, "1-D integer tensor"),
        (torch.tensor([0, 1]), 0, "tile must be >= 1"),
    ],
)
def test_bad_index_is_a_clear_error(index, tile, message) -> None:
    with pytest.raises(ValueError, match=message):
        LookupTables.build(index, RowSharding(100, 4, 2), tile)
