"""The partner kernels of the all_gather rule."""

from __future__ import annotations

import triton
import triton.language as tl

import tilelink.language as tll
import tilelink.mapping as tlm


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def ag_pull_producer(full_ptr, peer_table, tlk_barriers, tlk_epoch, tlk_rank, tlk_world, tlk_rows,
                     tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems, outer,
                     outer_stride, BLOCK: tl.constexpr):
    """Pull every peer's channels into this rank's copy of the gathered buffer, ring order.

    ``full_ptr`` is the local (outer, rows, row_elems) contiguous buffer; rank ``r``'s rows are
    already in place on every rank's copy (the launcher copies the shard before this runs).
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    num_channels = tlk_world * tlk_channels_per_rank
    for i in range(pid, num_channels, nprog):
        # this rank's own channels first, then the next rank's: ring order over sources
        ch = (i + tlk_rank * tlk_channels_per_rank) % num_channels
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                      tlk_channels_per_rank)
        src = ch // tlk_channels_per_rank
        if src != tlk_rank:
            n = (hi - lo) * row_elems
            # whole symmetric buffers (checked at launch): the rows move as vectors
            peer = tll.peer_ptr_aligned(peer_table, full_ptr, src)
            for o in range(0, outer):
                base = o * outer_stride + lo * row_elems
                for off in range(0, n, BLOCK):
                    idx = off + tl.arange(0, BLOCK)
                    mask = idx < n
                    # no other=: what the mask leaves out is never stored (and an int 0 cannot be cast to fp8)
                    x = tl.load(peer + base + idx, mask=mask)
                    tl.store(full_ptr + base + idx, x, mask=mask)
        tll.producer_tile_notify(tlk_barriers, ch, 1, tlk_barriers, tlk_rank, tlk_world, 0)


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def ag_push_producer(full_ptr, peer_table, tlk_barriers, barrier_table, tlk_epoch, tlk_rank, tlk_world,
                     tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems,
                     outer, outer_stride, BLOCK: tl.constexpr):
    """Push this rank's channels into every peer's copy and notify the peer's barrier (p2p)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for i in range(pid, tlk_channels_per_rank * tlk_world, nprog):
        j = i % tlk_channels_per_rank
        dst = (tlk_rank + i // tlk_channels_per_rank) % tlk_world
        ch = tlk_rank * tlk_channels_per_rank + j
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                      tlk_channels_per_rank)
        if dst != tlk_rank:
            n = (hi - lo) * row_elems
            # whole symmetric buffers (checked at launch): the rows are stored as vectors
            peer = tll.peer_ptr_aligned(peer_table, full_ptr, dst)
            for o in range(0, outer):
                base = o * outer_stride + lo * row_elems
                for off in range(0, n, BLOCK):
                    idx = off + tl.arange(0, BLOCK)
                    mask = idx < n
                    x = tl.load(full_ptr + base + idx, mask=mask)
                    tl.store(peer + base + idx, x, mask=mask)
        tll.producer_tile_notify(tlk_barriers, ch, 1, barrier_table, dst, tlk_world, 1)
