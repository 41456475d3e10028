"""The partner kernels of the reduce_scatter rule."""

from __future__ import annotations

import triton
import triton.language as tl

import tilelink.language as tll
import tilelink.mapping as tlm


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def rs_pull_consumer(partial_ptr, peer_table, out_ptr, tlk_barriers, barrier_table, tlk_epoch, tlk_rank, tlk_world,
                     tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems, tlk_diag,
                     tlk_budget, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """Sum every rank's partial rows of this rank's channels into ``out_ptr`` (this rank's shard).

    ``partial_ptr`` is the local copy of the symmetric partial buffer: (rows, row_elems), or with
    ``TOPK > 1`` (MoE: GroupGEMM -> top-k reduce -> reduce-scatter, paper §7.2) (rows * TOPK,
    row_elems) whose rows ``t * TOPK + k`` are token ``t``'s expert slots, summed too. Channel by
    channel, the blocks of a channel are dealt round-robin over the programs; a program waits once per
    channel and rank, before its first block of the channel (a channel of ``n`` output elements is
    complete on a rank once its barrier word reaches ``epoch * n * TOPK``). Waiting per block instead
    polled a peer's flag over the link for every 1024 elements.
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblocks = tl.cdiv(tlk_rows_per_channel * row_elems, BLOCK)
    rank_lo = tlk_rank * tlk_rows_per_rank
    for j in range(0, tlk_channels_per_rank):
        ch = tlk_rank * tlk_channels_per_rank + j
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                      tlk_channels_per_rank)
        n = (hi - lo) * row_elems
        # this program's first block of the channel: blocks are dealt round-robin across the channels
        first = (pid + nprog - (j * nblocks) % nprog) % nprog
        if first < tl.cdiv(n, BLOCK):
            # once per channel and source (not per block): each wait polls a peer's flag over the link
            token = tl.zeros((), dtype=tl.int32)
            for p in range(0, tlk_world):
                src = (tlk_rank + 1 + p) % tlk_world
                src_barriers = tll.peer_ptr(barrier_table, tlk_barriers, src)
                token += tll.consumer_tile_wait(src_barriers, ch, 1, n.to(tl.int64) * TOPK * tlk_epoch, tlk_diag,
                                                tlk_budget)
            for off in range(first * BLOCK, n, nprog * BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < n
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                # four sources (and every top-k slot) at a time, unrolled: their loads are in flight
                # together; a pull is a round trip over the link, and one load at a time per thread
                # left the consumer latency-bound
                for p0 in range(0, tlk_world, 4):
                    for q in tl.static_range(4):
                        src = (tlk_rank + 1 + p0 + q) % tlk_world
                        live = mask & (tl.full([BLOCK], p0 + q, tl.int32) < tlk_world)
                        # whole symmetric buffers (checked at launch): a peer's rows load as vectors
                        peer = tll.peer_ptr_aligned(peer_table, partial_ptr, src)
                        if TOPK == 1:
                            x = tl.load(peer + lo * row_elems + idx + token, mask=live, other=0)
                            acc += x.to(tl.float32)
                        else:
                            row = lo + idx // row_elems
                            col = idx % row_elems
                            for k in tl.static_range(TOPK):
                                x = tl.load(peer + (row * TOPK + k) * row_elems + col + token, mask=live, other=0)
                                acc += x.to(tl.float32)
                tl.store(out_ptr + (lo - rank_lo) * row_elems + idx, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def rs_ring_consumer(partial_ptr, out_ptr, recv_ptr, recv_table, tlk_barriers, recv_flags, flag_table, tlk_epoch,
                     tlk_rank, tlk_world, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank,
                     row_elems, tlk_diag, tlk_budget, BLOCK: tl.constexpr):
    """Ring reduce-scatter (paper Fig. 4). For each channel ``j`` of every rank's rows, in ``world``
    steps: at step ``s`` this rank takes segment ``d = rank + s + 1`` (mod world), waits for its own
    partial rows of channel ``(d, j)`` (producer_tile_wait on the local barrier) and, after the first
    step, for the running sum the next rank pushed (peer_tile_wait), adds them, and pushes the sum to
    the previous rank (a store into its landing buffer + peer_tile_notify) -- or, at the last step (``d == rank``),
    writes it to this rank's output. ``recv_ptr`` is the symmetric (world, rows_per_rank, row_elems)
    landing buffer, slot ``d`` for segment ``d``; running sums travel in the output's dtype.
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    prev = (tlk_rank + tlk_world - 1) % tlk_world
    slot_elems = tlk_rows_per_rank * row_elems
    # the previous rank's landing buffer, a whole symmetric buffer (checked at launch): the running sums
    # are stored there as vectors
    prev_recv = tll.peer_ptr_aligned(recv_table, recv_ptr, prev)
    for j in range(pid, tlk_channels_per_rank, nprog):
        for s in range(0, tlk_world):
            d = (tlk_rank + s + 1) % tlk_world
            ch = d * tlk_channels_per_rank + j
            lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                          tlk_channels_per_rank)
            n = (hi - lo) * row_elems
            at = d * slot_elems + (lo - d * tlk_rows_per_rank) * row_elems
            token = tll.consumer_tile_wait(tlk_barriers, ch, 1, n.to(tl.int64) * tlk_epoch, tlk_diag, tlk_budget)
            if s > 0:
                token += tll.peer_tile_wait(recv_flags, ch, tlk_epoch, tlk_diag, tlk_budget)
            for off in range(0, n, BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < n
                acc = tl.load(partial_ptr + lo * row_elems + idx + token, mask=mask).to(tl.float32)
                if s > 0:
                    acc += tl.load(recv_ptr + at + idx + token, mask=mask).to(tl.float32)
                if s == tlk_world - 1:
                    tl.store(out_ptr + (lo - d * tlk_rows_per_rank) * row_elems + idx,
                             acc.to(out_ptr.dtype.element_ty), mask=mask)
                else:
                    tl.store(prev_recv + at + idx, acc.to(recv_ptr.dtype.element_ty), mask=mask)
            if s < tlk_world - 1:
                tll.peer_tile_notify(flag_table, recv_flags, ch, prev, 1)


@triton.jit
def rs_topk_reduce(partial_ptr, reduced_ptr, reduced_barriers, tlk_rank, tlk_world, tlk_rows, tlk_rows_per_rank,
                   tlk_rows_per_channel, tlk_channels_per_rank, row_elems, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """Hybrid reduce-scatter with ``topk=`` (MoE), the SM stage between the GEMM and the copy engine
    (GroupGEMM -> top-k reduce -> reduce-scatter, paper §7.2): sum each token's ``TOPK`` expert slot rows
    (rows ``t * TOPK + k`` of ``partial_ptr``, as the GEMM stored them) into its row ``t`` of ``reduced_ptr``,
    in fp32. Launched behind the GEMM on its stream (a rank's tokens are spread over every expert, so no
    channel is complete before the GEMM's last tiles). Channels go in the order the copy engine sends them
    (the next rank's first, this rank's own last); each program adds the elements it wrote to
    ``reduced_barriers[ch]`` once per channel (release), so a channel of ``n`` rows is complete at
    ``epoch * n * row_elems`` and the copy engine moves it, ``1 / TOPK`` of the slot rows' bytes, while the
    next channel is being summed."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    row_blocks = tl.cdiv(row_elems, BLOCK)  # a block: a piece of one token row
    dealt = 0  # blocks of the channels before: each channel's first block goes to the next program in turn
    for step in range(1, tlk_world + 1):
        dst = (tlk_rank + step) % tlk_world
        for j in range(0, tlk_channels_per_rank):
            ch = dst * tlk_channels_per_rank + j
            lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                          tlk_channels_per_rank)
            count = (hi - lo) * row_blocks
            written = 0
            for b in range((pid + nprog - dealt % nprog) % nprog, count, nprog):
                row = lo + b // row_blocks
                col = (b % row_blocks) * BLOCK + tl.arange(0, BLOCK)
                mask = col < row_elems
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                for k in tl.static_range(TOPK):  # the slots' loads in flight together
                    x = tl.load(partial_ptr + (row * TOPK + k) * row_elems + col, mask=mask)
                    acc += x.to(tl.float32)
                tl.store(reduced_ptr + row * row_elems + col, acc.to(reduced_ptr.dtype.element_ty), mask=mask)
                written += tl.sum(mask.to(tl.int32))
            if written > 0:
                tll.notify_value(reduced_barriers + ch, written.to(tl.int64))
            dealt += count


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def rs_reduce_received(recv_ptr, partial_ptr, out_ptr, recv_barriers, tlk_barriers, tlk_epoch, tlk_rank, tlk_world,
                       tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems, tlk_diag,
                       tlk_budget, BLOCK: tl.constexpr):
    """Hybrid reduce-scatter, SM half: into ``out_ptr``, sum this rank's own partial rows where they were
    written (``partial_ptr``, (rows, row_elems): complete once ``tlk_barriers[ch]`` reaches ``epoch * n``
    for a channel of ``n`` elements; no copy) and the partial rows every peer's copy engine delivered into
    the receive buffer ``recv_ptr`` (world, rows_per_rank, row_elems), slot ``p`` from rank ``p``, announced
    on ``recv_barriers[p * channels_per_rank + j]``. With ``topk=`` (MoE) these are the rows
    :func:`rs_topk_reduce` summed over each token's expert slots, and its channels."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rank_lo = tlk_rank * tlk_rows_per_rank
    slot_elems = tlk_rows_per_rank * row_elems
    nblocks = tl.cdiv(tlk_rows_per_channel * row_elems, BLOCK)  # a channel's rows are one range
    for j in range(0, tlk_channels_per_rank):
        ch = tlk_rank * tlk_channels_per_rank + j
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank)
        n = (hi - lo) * row_elems
        first = (pid + nprog - (j * nblocks) % nprog) % nprog  # blocks dealt round-robin across the channels
        if first < tl.cdiv(n, BLOCK):
            # once per channel and source, not per block (each wait is a poll and a barrier)
            token = tll.consumer_tile_wait(tlk_barriers, ch, 1, n.to(tl.int64) * tlk_epoch, tlk_diag, tlk_budget)
            for p in range(0, tlk_world - 1):
                src = (tlk_rank + 1 + p) % tlk_world
                token += tll.consumer_tile_wait(recv_barriers, src * tlk_channels_per_rank + j, 1, tlk_epoch,
                                                tlk_diag, tlk_budget)
            for off in range(first * BLOCK, n, nprog * BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < n
                acc = tl.load(partial_ptr + lo * row_elems + idx + token, mask=mask).to(tl.float32)
                for p in range(0, tlk_world - 1):
                    src = (tlk_rank + 1 + p) % tlk_world
                    x = tl.load(recv_ptr + src * slot_elems + (lo - rank_lo) * row_elems + idx + token, mask=mask)
                    acc += x.to(tl.float32)
                tl.store(out_ptr + (lo - rank_lo) * row_elems + idx, acc.to(out_ptr.dtype.element_ty), mask=mask)
