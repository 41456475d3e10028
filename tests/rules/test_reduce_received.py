"""The hybrid reduce-scatter's SM kernels on their own (interpreter).

``rs_reduce_received``: every block of every channel summed exactly once over several programs, several
channels per rank, uneven ranks. ``rs_topk_reduce`` (MoE): every token's top-k slots summed into its row,
rows cut in pieces with a masked tail, and each channel's flag raised by exactly its element count, however
the blocks fall on the programs. The barriers of the waits are set far above their targets, so every wait
passes; the operators' tests run the waits."""

from __future__ import annotations

import pytest
import torch

from tilelink.mapping import RowSharding
from tilelink.rules.reduce_scatter.kernels import rs_reduce_received, rs_topk_reduce


@pytest.mark.parametrize(("size", "world", "rank", "channels", "row_elems", "block", "programs"), [
    (13, 3, 1, 2, 7, 4, 3),  # 1-D blocks across rows
    (13, 3, 2, 2, 7, 4, 5),  # the last rank's short slice
    (20, 2, 0, 3, 20, 8, 7),
    (9, 2, 1, 1, 5, 32, 2),  # one block for the channel, most lanes masked
])
def test_every_block_summed_once(size, world, rank, channels, row_elems, block, programs):
    sh = RowSharding(size, world, channels)
    g = torch.Generator().manual_seed(size * 100 + rank)
    partial = torch.randn(size, row_elems, generator=g)
    recv = torch.randn(world, sh.rows_per_rank, row_elems, generator=g)
    lo, hi = sh.rank_range(rank)
    out = torch.full((hi - lo, row_elems), float("nan"))
    high = torch.full((sh.num_channels,), 1 << 40, dtype=torch.int64)
    diag = torch.zeros(8, dtype=torch.int64)
    rs_reduce_received[(programs,)](recv, partial, out, high.clone(), high.clone(), 1, rank, world, size,
                                    sh.rows_per_rank, sh.rows_per_channel, sh.channels_per_rank, row_elems, diag,
                                    10**9, BLOCK=block)
    peers = sum(recv[src, :hi - lo] for src in range(world) if src != rank)
    assert torch.allclose(out, partial[lo:hi] + peers, atol=1e-5), (out - partial[lo:hi] - peers).abs().max()
    assert int(diag.abs().sum()) == 0  # no wait timed out


@pytest.mark.parametrize(("size", "world", "rank", "channels", "row_elems", "topk", "block", "programs"), [
    (13, 3, 1, 2, 7, 2, 4, 5),  # rows in two pieces, the second masked; an empty channel on the last rank
    (20, 2, 0, 3, 20, 3, 8, 7),
    (9, 2, 1, 1, 5, 5, 32, 2),  # one piece per row, most lanes masked
    (6, 1, 0, 1, 16, 2, 16, 40),  # more programs than blocks
])
def test_topk_slots_summed_and_every_channel_flagged_once(size, world, rank, channels, row_elems, topk, block,
                                                         programs):
    sh = RowSharding(size, world, channels)
    g = torch.Generator().manual_seed(size * 10 + topk)
    partial = torch.randn(size * topk, row_elems, generator=g)
    reduced = torch.full((size, row_elems), float("nan"))
    flags = torch.full((sh.num_channels,), 7, dtype=torch.int64)  # a count left from earlier calls
    rs_topk_reduce[(programs,)](partial, reduced, flags, rank, world, size, sh.rows_per_rank, sh.rows_per_channel,
                                sh.channels_per_rank, row_elems, TOPK=topk, BLOCK=block)
    assert torch.allclose(reduced, partial.view(size, topk, row_elems).sum(1), atol=1e-5)
    elements = [(hi - lo) * row_elems for lo, hi in map(sh.channel_range, range(sh.num_channels))]
    assert flags.tolist() == [7 + n for n in elements], (flags.tolist(), elements)
