"""The hybrid reduce-scatter's SM kernel on its own (``rs_reduce_received``, interpreter): every block of every
channel summed exactly once over several programs, rows cut in several pieces with a masked tail, one to
three top-k slots, several channels per rank, uneven ranks. The barriers are set far above their targets, so
every wait passes; the operators' tests run the waits."""

from __future__ import annotations

import pytest
import torch

from tilelink.mapping import RowSharding
from tilelink.rules.reduce_scatter import rs_reduce_received


@pytest.mark.parametrize(("size", "world", "rank", "channels", "row_elems", "topk", "block", "programs"), [
    (13, 3, 1, 2, 7, 1, 4, 3),  # 1-D blocks across rows
    (13, 3, 2, 2, 7, 2, 4, 5),  # the last rank's short slice; rows in two pieces, the second masked
    (20, 2, 0, 3, 20, 3, 8, 7),
    (9, 2, 1, 1, 5, 2, 32, 2),  # one piece per row, most lanes masked
])
def test_every_block_summed_once(size, world, rank, channels, row_elems, topk, block, programs):
    sh = RowSharding(size, world, channels)
    g = torch.Generator().manual_seed(size * 100 + topk)
    partial = torch.randn(size * topk, row_elems, generator=g)
    recv = torch.randn(world, sh.rows_per_rank * topk, row_elems, generator=g)
    lo, hi = sh.rank_range(rank)
    out = torch.full((hi - lo, row_elems), float("nan"))
    high = torch.full((sh.num_channels,), 1 << 40, dtype=torch.int64)
    diag = torch.zeros(8, dtype=torch.int64)
    rs_reduce_received[(programs,)](recv, partial, out, high.clone(), high.clone(), 1, rank, world, size,
                                    sh.rows_per_rank, sh.rows_per_channel, sh.channels_per_rank, row_elems, diag,
                                    10**9, TOPK=topk, BLOCK=block)
    own = partial.view(size, topk, row_elems)[lo:hi].sum(1)
    peers = sum(recv[src].view(sh.rows_per_rank, topk, row_elems)[:hi - lo].sum(1)
                for src in range(world) if src != rank)
    assert torch.allclose(out, own + peers, atol=1e-5), (out - own - peers).abs().max()
    assert int(diag.abs().sum()) == 0  # no wait timed out
