"""The partner kernels of the all_reduce rule."""

from __future__ import annotations

import triton
import triton.language as tl

import tilelink.language as tll
import tilelink.mapping as tlm


@triton.jit(do_not_specialize=["tlk_epoch", "first_channel", "num_channels"])  # one variant for every call
def ar_pull_reduce(partial_ptr, peer_table, out_ptr, share_ptr, share_flags, tlk_barriers, barrier_table, tlk_epoch,
                   tlk_rank, tlk_world, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank,
                   row_elems, first_channel, num_channels, tlk_diag, tlk_budget, SHARE: tl.constexpr,
                   BLOCK: tl.constexpr):
    """Sum every rank's partial rows of channels ``first_channel .. first_channel + num_channels - 1`` (taken
    modulo the channel count, so a range may wrap) into the same rows of ``out_ptr`` (the whole (rows,
    row_elems) result).

    The one-shot all-reduce runs it over every channel, starting at this rank's own; the two-shot one over this
    rank's channels, with ``SHARE``: the sums also go to the same rows of ``share_ptr`` (this rank's copy of a
    symmetric buffer), and each program adds the elements it wrote there to ``share_flags[ch]`` (release), so a
    channel of ``n`` elements is shared once its flag reaches ``epoch * n`` (:func:`ar_gather_rows`).

    The ranks' rows are summed in rank order, 0 first, whatever this rank is: every rank computes the same
    result to the bit. Channel by channel, the blocks of a channel are dealt round-robin over the programs; a
    program waits once per channel and rank, before its first block of the channel (a channel of ``n``
    elements is complete on a rank once its barrier word reaches ``epoch * n``)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblocks = tl.cdiv(tlk_rows_per_channel * row_elems, BLOCK)
    total = tlk_world * tlk_channels_per_rank
    for j in range(0, num_channels):
        ch = (first_channel + j) % total
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                      tlk_channels_per_rank)
        n = (hi - lo) * row_elems
        first = (pid + nprog - (j * nblocks) % nprog) % nprog  # blocks dealt round-robin across the channels
        if first < tl.cdiv(n, BLOCK):
            # once per channel and source (not per block): each wait polls a peer's flag over the link
            token = tl.zeros((), dtype=tl.int32)
            for p in range(0, tlk_world):
                src = (tlk_rank + 1 + p) % tlk_world
                src_barriers = tll.peer_ptr(barrier_table, tlk_barriers, src)
                # once a wait timed out (a peer that does not come, or a replay it skipped) the result is void:
                # the later waits do not spend their budgets too, one after the other
                if tl.load(tlk_diag) == 0:
                    token += tll.consumer_tile_wait(src_barriers, ch, 1, n.to(tl.int64) * tlk_epoch, tlk_diag,
                                                    tlk_budget)
            written = 0
            for off in range(first * BLOCK, n, nprog * BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < n
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                # four sources at a time, unrolled: their loads are in flight together (a pull is a round trip
                # over the link); summed in rank order
                for p0 in range(0, tlk_world, 4):
                    for q in tl.static_range(4):
                        live = mask & (tl.full([BLOCK], p0 + q, tl.int32) < tlk_world)
                        # whole symmetric buffers (checked at launch): a peer's rows load as vectors
                        peer = tll.peer_ptr_aligned(peer_table, partial_ptr, (p0 + q) % tlk_world)
                        x = tl.load(peer + lo * row_elems + idx + token, mask=live, other=0)
                        acc += x.to(tl.float32)
                value = acc.to(out_ptr.dtype.element_ty)
                tl.store(out_ptr + lo * row_elems + idx, value, mask=mask)
                if SHARE:
                    tl.store(share_ptr + lo * row_elems + idx, value, mask=mask)
                    written += tl.sum(mask.to(tl.int32))
            if SHARE:
                if written > 0:
                    tll.notify_value(share_flags + ch, written.to(tl.int64))


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def ar_gather_rows(share_ptr, share_table, out_ptr, share_flags, flag_table, tlk_epoch, tlk_rank, tlk_world, tlk_rows,
                   tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems, tlk_diag, tlk_budget,
                   BLOCK: tl.constexpr):
    """The two-shot all-reduce's second half: copy every other rank's reduced rows from its copy of the shared
    buffer into ``out_ptr``, channel by channel as the owner's flag says it is complete (``share_flags[ch]`` of
    the owner at ``epoch * n`` for ``n`` elements, :func:`ar_pull_reduce` with ``SHARE``); the next rank's
    channels first. This rank's own rows are in ``out_ptr`` already."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblocks = tl.cdiv(tlk_rows_per_channel * row_elems, BLOCK)
    for s in range(1, tlk_world):
        src = (tlk_rank + s) % tlk_world
        src_flags = tll.peer_ptr(flag_table, share_flags, src)
        src_share = tll.peer_ptr_aligned(share_table, share_ptr, src)
        for j in range(0, tlk_channels_per_rank):
            ch = src * tlk_channels_per_rank + j
            lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                          tlk_channels_per_rank)
            n = (hi - lo) * row_elems
            step = (s - 1) * tlk_channels_per_rank + j
            first = (pid + nprog - (step * nblocks) % nprog) % nprog
            if first < tl.cdiv(n, BLOCK):
                token = tl.zeros((), dtype=tl.int32)
                if tl.load(tlk_diag) == 0:  # after a timed-out wait, as in ar_pull_reduce
                    token += tll.consumer_tile_wait(src_flags, ch, 1, n.to(tl.int64) * tlk_epoch, tlk_diag,
                                                    tlk_budget)
                for off in range(first * BLOCK, n, nprog * BLOCK):
                    idx = off + tl.arange(0, BLOCK)
                    mask = idx < n
                    x = tl.load(src_share + lo * row_elems + idx + token, mask=mask)
                    tl.store(out_ptr + lo * row_elems + idx, x, mask=mask)
