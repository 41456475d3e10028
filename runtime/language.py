"""``tilelink.language``: the device-side tile-centric primitives (paper Table 3, §3.2).

Every primitive is a ``@triton.jit`` function, called from user kernels and from the kernels the
rewriter generates. One source serves two implementations, picked when this module is imported:

- interpreted (``TRITON_INTERPRET=1``, the emulated backend): acquire/release atomics on shared
  memory; a wait's budget (ns) becomes a number of polls, counted generously so it never times out
  early (the interpreter polls a few thousand times per second);
- compiled (GPU): acquire atomic polling bounded by ``%globaltimer``; the wait's token comes out of
  inline PTX fed with the polled value, so LLVM cannot fold it and the guarded loads stay behind the
  wait through software pipelining (paper §4.2).

Notifies add with release semantics, waits spin until ``value >= target`` with acquire semantics
(barrier words are epoch counters, see ``docs/ARCHITECTURE.md``). A wait that runs out of budget
records ``[1, kind, index, target, seen]`` in the diagnostics array (first timeout wins) and returns:
kernels never hang; the host raises :class:`tilelink.WaitTimeout` from the record.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

import tilelink.mapping as tlm
from tilelink.runtime import races as _races

__all__ = [
    "INTERPRETED",
    "EPOCH_WORD",
    "call_target",
    "channels_ready",
    "KIND_CONSUMER_TILE_WAIT",
    "KIND_PEER_TILE_WAIT",
    "KIND_WAIT_VALUE",
    "MODE_LOCAL",
    "MODE_P2P",
    "MODE_BROADCAST",
    "wait_value",
    "notify_value",
    "bulk_store_wait",
    "consumer_tile_wait",
    "consumer_tile_wait_rows",
    "consumer_tile_wait_channels",
    "producer_tile_notify",
    "producer_tile_notify_channels",
    "producer_tile_notify_rows",
    "producer_tile_notify_rows_grouped",
    "producer_tile_notify_flush",
    "no_pending_tiles",
    "NOTIFY_EVERY",
    "READY_CHANNELS",
    "peer_tile_notify",
    "peer_tile_wait",
    "peer_ptr",
    "peer_ptr_aligned",
    "tile_pull_data",
    "tile_push_data",
]

INTERPRETED: bool = os.environ.get("TRITON_INTERPRET") == "1"

# diagnostics kinds (tilelink.runtime.diagnostics.KIND_NAMES)
KIND_CONSUMER_TILE_WAIT: tl.constexpr = tl.constexpr(1)
KIND_PEER_TILE_WAIT: tl.constexpr = tl.constexpr(2)
KIND_WAIT_VALUE: tl.constexpr = tl.constexpr(3)

# producer_tile_notify modes
MODE_LOCAL: tl.constexpr = tl.constexpr(0)
MODE_P2P: tl.constexpr = tl.constexpr(1)
MODE_BROADCAST: tl.constexpr = tl.constexpr(2)
#: tiles per notify of :func:`producer_tile_notify_rows_grouped` (its state holds the other three)
NOTIFY_EVERY: tl.constexpr = tl.constexpr(4)
#: the most channels :func:`channels_ready` reads (one vector, a lane each); with more, it reads none and answers 0
READY_CHANNELS: tl.constexpr = tl.constexpr(128)

# The interpreter polls roughly 4000-6000 times a second; assuming 12000 makes a budget last at
# least its nominal time (a late timeout is harmless, an early one is a false alarm).
_NS_PER_POLL: tl.constexpr = tl.constexpr(1_000_000_000 // 12_000)


@triton.jit
def _record_timeout(diag_ptr, kind, index, target, seen):
    """First timeout wins: claim word 0, then fill the record."""
    zero = tl.full((), 0, tl.int64)
    old = tl.atomic_cas(diag_ptr, zero, zero + 1, sem="relaxed", scope="sys")
    if old == 0:
        tl.store(diag_ptr + 1, (zero + kind).to(tl.int64))
        tl.store(diag_ptr + 2, (zero + index).to(tl.int64))
        tl.store(diag_ptr + 3, (zero + target).to(tl.int64))
        tl.store(diag_ptr + 4, (zero + seen).to(tl.int64))


# ----------------------------------------------------------------------------------------------
# interpreted implementation (TRITON_INTERPRET=1)


@triton.jit
def _token_of_interpreted(seen):
    return (seen * 0).to(tl.int32)


@triton.jit
def _spin_interpreted(flag_ptr, target, diag_ptr, budget, kind, index):
    _races.waiting(flag_ptr)  # the race-exposing world delivers this channel only now
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    polls = budget // _NS_PER_POLL + 1
    n = 0
    while (seen < target) & (n < polls):
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        n += 1
    if seen < target:
        _record_timeout(diag_ptr, kind, index, target, seen)
    return _token_of_interpreted(seen)


@triton.jit
def _poll_lanes_interpreted(ptrs, need):
    _races.waiting(ptrs, need)  # as each lane's own wait would: the race-exposing world delivers them only now
    return tl.atomic_add(ptrs, tl.zeros((32,), tl.int64), mask=need, sem="acquire", scope="sys")


@triton.jit
def _channels_ready_interpreted(barrier_ptr, count, target):
    # as compiled (no read past READY_CHANNELS); the race-exposing schedule decides whether the read finds the
    # channels (each delivered now, as a wait of the program would have it) or none (the program takes its waits)
    ready = tl.full((), 0, tl.int32)
    if _races.start_read_finds_channels():
        if count <= READY_CHANNELS:
            ready = tl.full((), 1, tl.int32)
            for c in range(0, count):
                _races.waiting(barrier_ptr + c)
                seen = tl.atomic_add(barrier_ptr + c, 0, sem="acquire", scope="sys")
                if seen < target:
                    ready = tl.full((), 0, tl.int32)
    return ready


@triton.jit
def _add_release_interpreted(flag_ptr, value, mask=None):
    # one flag, or a vector of flags (the lanes of a 32-channel word)
    tl.atomic_add(flag_ptr, value, mask=mask, sem="release", scope="sys")
    _races.released(flag_ptr, mask)  # the race-exposing world reads a completed channel at once


@triton.jit
def _after_acquire_interpreted():
    pass


@triton.jit
def _add_release_span_interpreted(first_ptr, at_first, last_ptr, at_last, middle_ptrs, at_middle, inside):
    _add_release_interpreted(first_ptr, at_first)
    _add_release_interpreted(last_ptr, at_last)
    _add_release_interpreted(middle_ptrs, at_middle, inside)


@triton.jit
def _add_release_group_interpreted(sync, fire, base, pending, first, at_first, last, at_last):
    if fire:
        for i in tl.static_range(NOTIFY_EVERY - 1):
            _add_release_interpreted(base + pending[1 + 4 * i], pending[2 + 4 * i])
            _add_release_interpreted(base + pending[3 + 4 * i], pending[4 + 4 * i])
        _add_release_interpreted(base + first, at_first)
        _add_release_interpreted(base + last, at_last)


@triton.jit
def _bulk_store_wait_interpreted():
    pass  # the interpreter's descriptor stores are done when they return


# ----------------------------------------------------------------------------------------------
# compiled implementation (GPU)


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _token_of(seen):
    # an int32 zero computed by opaque asm from the polled value: nothing after the wait can be
    # hoisted above it once guarded pointers are offset by it. Times 16, so that the compiler still
    # knows a guarded pointer's alignment (an opaque offset would make it assume none and drop
    # vectorised loads)
    return tl.inline_asm_elementwise("and.b32 $0, $1, 0;", "=r,r", [seen.to(tl.int32)],
                                     dtype=tl.int32, is_pure=False, pack=1) * 16


@triton.jit
def _spin_compiled(flag_ptr, target, diag_ptr, budget, kind, index):
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    if seen < target:
        start = _globaltimer()
        now = start
        while (seen < target) & (now - start < budget):
            seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
            now = _globaltimer()
        if seen < target:
            _record_timeout(diag_ptr, kind, index, target, seen)
    # the program's other threads read after this point only once the acquire above is done
    tl.debug_barrier()
    return _token_of(seen)


@triton.jit
def _channels_ready_compiled(barrier_ptr, count, target):
    # One vector of acquire reads over the channels (the lanes a program's threads hold run in parallel, so the
    # program waits for one read's latency, not one per channel), then a barrier: the program's other threads read
    # the rows after it. More channels than one vector holds are not read at all (0: every wait polls), so that no
    # program's start pays for several rounds.
    fits = count <= READY_CHANNELS
    lane = tl.arange(0, READY_CHANNELS)
    live = (lane < count) & fits
    seen = tl.atomic_add(barrier_ptr + lane, tl.zeros((READY_CHANNELS,), tl.int64), mask=live, sem="acquire",
                         scope="sys")
    ready = tl.min(tl.where(live & (seen < target), 0, 1)) & fits.to(tl.int32)
    _after_acquire_compiled()
    return ready


@triton.jit
def _cta_barrier():
    # Every thread of the program meets here, with the memory ordering of a CTA barrier: the named
    # barrier 15, in inline PTX. Not tl.debug_barrier(): the compiler treats its barrier as a point that
    # every asynchronous copy and MMA in flight must reach first, and in a software-pipelined tile loop
    # (`tl.range(..., flatten=True)`) that serialised the loop: a GEMM+RS with a barrier per tile ran at
    # 0.40 of cuBLAS, with this one at 0.97 (on an H200). As with any barrier, every
    # thread must reach it: not inside one partition of a warp-specialised loop.
    tl.inline_asm_elementwise("bar.sync 15; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _add_release_compiled(flag_ptr, value):
    # Every thread's stores of the tile happen before one releasing reduction, issued by thread 0 (the
    # barrier makes the others' stores part of what its release publishes). A `red`, not an atomic that
    # returns the old value: nothing waits for the add itself, and no result is broadcast to the program's
    # threads afterwards (1.5-2% of a short-K GEMM+RS tile on an H200).
    tl.static_assert(flag_ptr.numel == 1, "a notify adds one value to one flag (thread 0 issues it)")
    _cta_barrier()
    tl.inline_asm_elementwise(
        "{ .reg .pred %tlk_first; .reg .b32 %tlk_tid; mov.u32 %tlk_tid, %tid.x; "
        "setp.eq.u32 %tlk_first, %tlk_tid, 0; @%tlk_first red.release.sys.global.add.u64 [$1], $2; "
        "mov.u32 $0, 0; }",
        "=r,l,l", [flag_ptr, tl.full((), 0, tl.int64) + value], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _add_release_lanes_now_compiled(flag_ptrs, values, mask):
    # as _add_release_lanes_compiled, when the program's barrier has just been taken
    tl.atomic_add(flag_ptrs, values, mask=mask, sem="release", scope="sys")


@triton.jit
def _add_release_lanes_compiled(flag_ptrs, values, mask):
    # as _add_release_compiled, for a vector of flags: each lane's atomic is issued by its own thread
    _cta_barrier()
    tl.atomic_add(flag_ptrs, values, mask=mask, sem="release", scope="sys")


@triton.jit
def _add_release_span_compiled(first_ptr, at_first, last_ptr, at_last, middle_ptrs, at_middle, inside):
    # One barrier; then thread 0 issues one release fence and the first flag's add, and the last flag's
    # add when it is not 0 (a fence followed by the adds releases both: one system-scope fence per tile,
    # 2-3% of a short-K GEMM+RS against two releasing adds, on an H200); the lanes inside, if
    # any, release their own flags.
    _cta_barrier()
    tl.inline_asm_elementwise(
        "{ .reg .pred %tlk_first, %tlk_two; .reg .b32 %tlk_tid; mov.u32 %tlk_tid, %tid.x; "
        "setp.eq.u32 %tlk_first, %tlk_tid, 0; setp.ne.u64 %tlk_two, $4, 0; "
        "and.pred %tlk_two, %tlk_two, %tlk_first; @%tlk_first fence.acq_rel.sys; "
        "@%tlk_first red.relaxed.sys.global.add.u64 [$1], $2; @%tlk_two red.relaxed.sys.global.add.u64 [$3], $4; "
        "mov.u32 $0, 0; }",
        "=r,l,l,l,l", [first_ptr, tl.full((), 0, tl.int64) + at_first, last_ptr, tl.full((), 0, tl.int64) + at_last],
        dtype=tl.int32, is_pure=False, pack=1)
    tl.atomic_add(middle_ptrs, at_middle, mask=inside, sem="release", scope="sys")


def _group_release_asm(pairs: int) -> str:
    # operands: $0 out, $1 sync, $2 fire, then (address, add) for each pair
    adds = " ".join(f"setp.ne.and.u64 %tlk_p, ${4 + 2 * i}, 0, %tlk_t0; "
                    f"@%tlk_p red.relaxed.sys.global.add.u64 [${3 + 2 * i}], ${4 + 2 * i};" for i in range(pairs))
    return ("{ .reg .pred %tlk_sync, %tlk_t0, %tlk_p; .reg .b32 %tlk_tid; setp.ne.u32 %tlk_sync, $1, 0; "
            "mov.u32 %tlk_tid, %tid.x; setp.eq.u32 %tlk_t0, %tlk_tid, 0; setp.ne.and.u32 %tlk_t0, $2, 0, %tlk_t0; "
            "@%tlk_sync cp.async.bulk.wait_group 0; @%tlk_sync fence.proxy.async.global; @%tlk_sync bar.sync 15; "
            f"@%tlk_t0 fence.acq_rel.sys; {adds} mov.u32 $0, 0; }}")


#: a grouped notify releases two adds (first and last channel) per tile of the group
_GROUP_ASM: tl.constexpr = tl.constexpr(_group_release_asm(2 * NOTIFY_EVERY))
_GROUP_CONSTRAINTS: tl.constexpr = tl.constexpr("=r,r,r" + ",l,l" * (2 * NOTIFY_EVERY))


@triton.jit
def _add_release_group_compiled(sync, fire, base, pending, first, at_first, last, at_last):
    # When ``sync`` (the same on every thread, so the predicated barrier is met by all or none): the
    # program's bulk stores have written memory and every thread meets; when also ``fire``, thread 0 issues
    # one release fence and the non-zero adds of the pending tiles and of this one (first and last channel
    # each). No loop, no branch: a flattened tile loop stays flattened.
    wide = tl.full((), 0, tl.int64)
    tl.inline_asm_elementwise(
        _GROUP_ASM, _GROUP_CONSTRAINTS,
        [sync.to(tl.int32), fire.to(tl.int32),
         base + pending[1], wide + pending[2], base + pending[3], wide + pending[4],
         base + pending[5], wide + pending[6], base + pending[7], wide + pending[8],
         base + pending[9], wide + pending[10], base + pending[11], wide + pending[12],
         base + first, wide + at_first, base + last, wide + at_last],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _bulk_store_wait_compiled():
    # The program's bulk-tensor (TMA) stores have written global memory, not only read shared memory (each
    # thread waits for the groups it issued); then a proxy fence orders those async-proxy writes before the
    # generic-proxy release that follows (a conservative fence, not timed on its own).
    tl.inline_asm_elementwise("cp.async.bulk.wait_group 0; fence.proxy.async.global; mov.u32 $0, 0;", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _poll_lanes_compiled(ptrs, need):
    # one vector of acquire reads: the lanes a program's threads hold run in parallel
    return tl.atomic_add(ptrs, tl.zeros((32,), tl.int64), mask=need, sem="acquire", scope="sys")


@triton.jit
def _after_acquire_compiled():
    # the threads that did not poll read after this point only once the acquires are done
    tl.debug_barrier()


if INTERPRETED:
    _spin = _spin_interpreted
    _poll_lanes = _poll_lanes_interpreted
    _channels_ready = _channels_ready_interpreted
    _add_release = _add_release_interpreted
    _add_release_lanes = _add_release_interpreted
    _add_release_lanes_now = _add_release_interpreted
    _after_acquire = _after_acquire_interpreted
    _zero_token = _token_of_interpreted
    _bulk_store_wait = _bulk_store_wait_interpreted
    _add_release_span = _add_release_span_interpreted
    _add_release_group = _add_release_group_interpreted
else:
    _spin = _spin_compiled
    _poll_lanes = _poll_lanes_compiled
    _channels_ready = _channels_ready_compiled
    _add_release = _add_release_compiled
    _add_release_lanes = _add_release_lanes_compiled
    _add_release_lanes_now = _add_release_lanes_now_compiled
    _after_acquire = _after_acquire_compiled
    _zero_token = _token_of
    _bulk_store_wait = _bulk_store_wait_compiled
    _add_release_span = _add_release_span_compiled
    _add_release_group = _add_release_group_compiled


# ----------------------------------------------------------------------------------------------
# primitives

#: word of the diagnostics array that holds a captured context's call count (``tilelink.runtime.graphs``); 0 on
#: every other diagnostics array
EPOCH_WORD: tl.constexpr = tl.constexpr(5)


@triton.jit
def call_target(target, diag_ptr):
    """``target`` for this call: times the call count in word ``EPOCH_WORD`` of the diagnostics array when a
    captured call (a CUDA graph's replay) advanced it on the device, else ``target`` itself (the word is 0 and
    the host passed the count in ``target``). One scalar load; the word is fixed for the length of a launch, so
    a program may read it once and pass the result to its waits with ``scaled=True`` (what generated code does:
    a load before each wait delays that wait's first poll)."""
    return target * tl.maximum(tl.load(diag_ptr + EPOCH_WORD), 1)


@triton.jit
def channels_ready(barrier_ptr, count, target):
    """1 when every one of channels ``0 .. count-1`` of the local barrier array is already ``>= target``, else 0:
    one acquire read of them all (a vector, a lane each), made once at a program's start (``target`` as
    :func:`call_target` gives it). A program that found every channel there passes each of its waits without
    polling (``consumer_tile_wait(..., ready=...)``): its reads come after this acquire and the barrier that ends it.
    A program that started before every channel of the gather had arrived polls at each wait, as without it; so
    does every program when there are more than ``READY_CHANNELS`` (128) channels, which are not read. Each wait of
    a program that polls costs it the latency of its acquire and a barrier before the tile's first loads (3-7% of a
    sequence-parallel attention whose program waits for eight chunks of keys, on an H200)."""
    return _channels_ready(barrier_ptr, count, target)


@triton.jit
def wait_value(flag_ptr, target, diag_ptr, budget, kind, index):
    """Acquire-spin until ``*flag_ptr >= target`` for at most ``budget`` ns.

    On timeout records ``(kind, index, target, seen)`` in ``diag_ptr`` and returns anyway.
    Returns an int32 zero token; offset the pointers the wait guards by it.
    """
    return _spin(flag_ptr, call_target(target, diag_ptr), diag_ptr, budget, kind, index)


@triton.jit
def notify_value(flag_ptr, value):
    """Release ``atomic_add(*flag_ptr, value)``: everything this program stored before is visible to
    whoever acquires the new value."""
    _add_release(flag_ptr, value)


@triton.jit
def bulk_store_wait():
    """Wait until this program's tensor-descriptor (TMA) stores have reached global memory. A descriptor
    store is asynchronous: a notify that publishes its tile must come after this (the reduce-scatter
    rewrite inserts it after a descriptor store)."""
    _bulk_store_wait()


@triton.jit
def peer_ptr(peer_table, like_ptr, rank):
    """``rank``'s copy of a symmetric buffer, typed like ``like_ptr`` (the local copy).

    ``peer_table`` is ``tilelink.runtime.peer_table(buffer)``: int64 addresses in this process.
    """
    return tl.load(peer_table + rank).to(tl.pointer_type(like_ptr.dtype.element_ty))


@triton.jit
def peer_ptr_aligned(peer_table, like_ptr, rank):
    """:func:`peer_ptr` declared 16-byte aligned, so that contiguous accesses through it are vectors (a
    pointer loaded from a table has no known alignment: without this, 2-byte accesses). Only for a table
    of whole symmetric buffers (``tilelink.rules.launch.vector_peer_table`` checks the alignment). The
    hint is made here, on the cast: ``tl.multiple_of`` on a helper's result is lost when it is inlined."""
    return tl.multiple_of(tl.load(peer_table + rank).to(tl.pointer_type(like_ptr.dtype.element_ty)), 16)


@triton.jit
def consumer_tile_wait(barrier_ptr, first, count, target, diag_ptr, budget, scaled: tl.constexpr = False,
                       ready=0):
    """A consumer tile waits until channels ``first .. first+count-1`` of the local barrier array
    are each ``>= target`` (acquire). Returns the token. ``scaled``: ``target`` is this call's already
    (:func:`call_target`); otherwise it is scaled here. ``ready``: :func:`channels_ready` of the program's start,
    read with this call's target (``call_target``, also when ``scaled`` is False); when 1, every channel was there
    then, and the wait passes without reading."""
    token = tl.full((), 0, tl.int32)
    if not scaled:
        target = call_target(target, diag_ptr)
    # no channel to poll when ready: a loop of no iterations, not a branch around it (a branch there keeps a
    # flattened tile loop, `tl.range(..., flatten=True)`, from being flattened and its K loop from being pipelined)
    for channel in range(first, first + count * (1 - ready)):
        token += _spin(barrier_ptr + channel, target, diag_ptr, budget, KIND_CONSUMER_TILE_WAIT,
                       channel)
    return token * 16  # a multiple of 16 whatever the loop did: guarded pointers keep their alignment


@triton.jit
def consumer_tile_wait_rows(barrier_ptr, row_start, row_end, rows_per_rank, rows_per_channel,
                            channels_per_rank, target, diag_ptr, budget):
    """A consumer tile reading rows ``[row_start, row_end)`` of the gathered dimension waits for
    every channel holding one of them (the static affine mapping of :mod:`tilelink.mapping`). An
    empty range waits for nothing. Returns the token."""
    token = tl.full((), 0, tl.int32)
    if row_end > row_start:
        first = tlm.tl_channel_of_row(row_start, rows_per_rank, rows_per_channel, channels_per_rank)
        last = tlm.tl_channel_of_row(row_end - 1, rows_per_rank, rows_per_channel, channels_per_rank)
        token = consumer_tile_wait(barrier_ptr, first, last - first + 1, target, diag_ptr, budget)
    return token


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _channel_span(channels):
    """The valid entries (>= 0) of a channel vector and the smallest and largest of them (an empty
    vector gives first > last)."""
    valid = channels >= 0
    return valid, tl.min(tl.where(valid, channels, 2147483647)), tl.max(tl.where(valid, channels, -1))


@triton.jit
def _channel_lanes(channels, valid, word):
    """(BLOCK, 32) membership: entry ``[i, b]`` is set where ``channels[i]`` is channel
    ``word * 32 + b``. One 2-D reduction then finds a tile's distinct channels, whatever its size."""
    lane = tl.arange(0, 32)
    return valid[:, None] & (channels[:, None] == word * 32 + lane[None, :])


#: a tile whose channels span at most this many consecutive channels polls each of them with one scalar
#: acquire (rows gathered in sorted order, as MoE slots sorted by expert are, span one or two)
SCALAR_SPAN: tl.constexpr = tl.constexpr(4)


@triton.jit
def consumer_tile_wait_channels(barrier_ptr, channels, target, diag_ptr, budget, scaled: tl.constexpr = False,
                                ready=0):
    """Dynamic mapping: a consumer tile whose rows come from a run-time index (the MoE gather) waits
    for every distinct channel in the vector ``channels`` (entries < 0, e.g. padding, are ignored),
    each ``>= target``. Returns the token.

    When the valid channels span at most ``SCALAR_SPAN`` consecutive channels, each channel of the span
    is polled with one scalar acquire (a channel of the span that no row needs is waited for too: an
    all-gather's channels arrive whatever its consumers do). Otherwise each 32-channel word is polled
    once with one vector of acquire reads (the lanes a program's threads hold run in parallel) and only
    the channels not there yet are spun on one by one. ``scaled`` and ``ready`` as for :func:`consumer_tile_wait`."""
    token = tl.full((), 0, tl.int32)
    if not scaled:
        target = call_target(target, diag_ptr)
    valid, first, last = _channel_span(channels)
    last = last - ready * (last - first + 1)  # when ready, an empty span: nothing polled (no branch, as above)
    if last - first < SCALAR_SPAN:
        for c in range(first, last + 1):
            token += _spin(barrier_ptr + c, target, diag_ptr, budget, KIND_CONSUMER_TILE_WAIT, c)
    else:
        lane = tl.arange(0, 32)
        for word in range(first // 32, last // 32 + 1):
            need = tl.max(_channel_lanes(channels, valid, word).to(tl.int32), axis=0) > 0
            seen = _poll_lanes(barrier_ptr + word * 32 + lane, need)
            seen = tl.where(need, seen, target)
            token += _zero_token(tl.min(seen))
            late = tl.reduce(tl.where(seen < target, 1 << lane, 0), 0, _bit_or)
            for b in range(0, 32):
                if ((late >> b) & 1) != 0:
                    token += _spin(barrier_ptr + word * 32 + b, target, diag_ptr, budget, KIND_CONSUMER_TILE_WAIT,
                                   word * 32 + b)
        _after_acquire()
    return token


@triton.jit
def producer_tile_notify_channels(barrier_ptr, channels, counts):
    """Dynamic mapping: a producer tile whose rows go to run-time channels (the MoE scatter) adds, to
    each distinct channel in the vector ``channels`` (entries < 0 ignored), the sum of ``counts`` of
    its rows (release, local barrier array): one vector of releasing atomics per 32-channel word."""
    valid, first, last = _channel_span(channels)
    lane = tl.arange(0, 32)
    for word in range(first // 32, last // 32 + 1):
        member = _channel_lanes(channels, valid, word)
        sums = tl.sum(tl.where(member, counts[:, None], 0), axis=0)
        hit = tl.max(member.to(tl.int32), axis=0) > 0
        _add_release_lanes(barrier_ptr + word * 32 + lane, sums.to(tl.int64), hit)


@triton.jit
def _channel_at(row, rows, rows_per_rank, rows_per_channel, channels_per_rank):
    # the channel holding ``row`` and its rows [lo, hi): two integer divisions (the mapping's
    # channel_of_row then channel_range would take five; this runs once per tile of a producer loop)
    rank = row // rows_per_rank
    j = (row - rank * rows_per_rank) // rows_per_channel
    lo = rank * rows_per_rank + j * rows_per_channel
    hi = tl.minimum(tl.minimum(lo + rows_per_channel, (rank + 1) * rows_per_rank), rows)
    return rank * channels_per_rank + j, lo, hi


@triton.jit
def _row_span(row_lo, row_hi, row_elems, rows, rows_per_rank, rows_per_channel, channels_per_rank,
              MAX_ROWS: tl.constexpr):
    # What a tile of rows [row_lo, row_hi) adds: (first channel, its add, last channel, its add (0 when it
    # is the first), each row's channel, what its channel gets, whether the row releases a middle channel)
    a = tl.maximum(row_lo, 0)
    b = tl.minimum(row_hi, rows)
    nonempty = b > a
    a = tl.minimum(a, rows - 1)
    first, first_lo, first_hi = _channel_at(a, rows, rows_per_rank, rows_per_channel, channels_per_rank)
    last, last_lo, last_hi = _channel_at(tl.maximum(b - 1, a), rows, rows_per_rank, rows_per_channel,
                                         channels_per_rank)
    first = tl.where(nonempty, first, 0)  # no rows (rows == 0 included): one add of 0 to channel 0
    last = tl.where(nonempty, last, 0)
    at_first = tl.where(nonempty,
                        row_elems * tl.maximum(tl.minimum(row_hi, first_hi) - tl.maximum(row_lo, first_lo), 0), 0)
    at_last = tl.where(nonempty & (last > first),
                       row_elems * tl.maximum(tl.minimum(row_hi, last_hi) - tl.maximum(row_lo, last_lo), 0), 0)
    row = row_lo + tl.arange(0, MAX_ROWS)
    in_range = (row < row_hi) & (row < rows) & (row >= 0)
    channel, channel_lo, channel_hi = _channel_at(tl.where(in_range, row, a), rows, rows_per_rank, rows_per_channel,
                                                  channels_per_rank)
    leads = in_range & (row == tl.maximum(channel_lo, row_lo)) & (channel > first) & (channel < last)
    at_middle = row_elems * (tl.minimum(row_hi, channel_hi) - tl.maximum(row_lo, channel_lo))
    return first, at_first, last, at_last, channel, at_middle.to(tl.int64), leads


@triton.jit
def producer_tile_notify_rows(barrier_ptr, row_lo, row_hi, row_elems, rows, rows_per_rank, rows_per_channel,
                              channels_per_rank, MAX_ROWS: tl.constexpr):
    """A producer tile that stored ``row_elems`` elements of each row in ``[row_lo, row_hi)`` (rows past
    ``rows`` ignored) adds, to each channel holding some of them, ``row_elems`` times its rows in the
    range (release, local barrier array). ``MAX_ROWS`` (a power of two) is at least ``row_hi - row_lo``.

    Straight-line code (no loop, no branch), so that a flattened tile loop (``tl.range(..., flatten=True)``)
    stays one software pipeline: after one barrier, thread 0 releases the first and the last channel
    with one fence (the last one only when the range spans more than one channel). Any channel between
    them (only when channels are shorter than the tile) is released by the lane of its first row in the
    range, one masked vector of atomics over the rows: empty channels inside the span take no lane.
    The same sums as :func:`tilelink.mapping.channel_overlap` over the mapping's channels, with six
    integer divisions per tile instead of about twenty (each is tens of instructions on every thread: on
    an H200 the mapping's form cost a short-K GEMM+RS about 3%)."""
    first, at_first, last, at_last, channel, at_middle, leads = _row_span(
        row_lo, row_hi, row_elems, rows, rows_per_rank, rows_per_channel, channels_per_rank, MAX_ROWS)
    _add_release_span(barrier_ptr + first, at_first, barrier_ptr + last, at_last, barrier_ptr + channel, at_middle,
                      leads)


@triton.jit
def no_pending_tiles():
    """The state of :func:`producer_tile_notify_rows_grouped` before a tile loop's first tile: ``(step,
    then for each of the ``NOTIFY_EVERY - 1`` tiles a group may hold back: first channel, its add, last
    channel, its add)``, typed as the loop carries them (int32 channels and step, int64 adds)."""
    z = tl.full((), 0, tl.int32)
    w = z.to(tl.int64)
    return (z, z, w, z, w, z, w, z, w, z, w, z, w)


@triton.jit
def _held(send, here, value, kept):
    # a pending field after this tile: cleared when the group went out, this tile's in its own slot
    return tl.where(send, 0, tl.where(here, value, kept))


@triton.jit
def producer_tile_notify_rows_grouped(barrier_ptr, pending, row_lo, row_hi, row_elems, rows, rows_per_rank,
                                      rows_per_channel, channels_per_rank, MAX_ROWS: tl.constexpr):
    """:func:`producer_tile_notify_rows` for the tiles of a loop, ``NOTIFY_EVERY`` (4) at a time: a tile's
    first and last channel adds are held in ``pending`` until the group's last tile, then the group's adds
    go out together after one wait for the program's bulk (TMA) stores, one barrier and one system fence.
    Returns the state for the next tile; before the first, :func:`no_pending_tiles`; after the loop,
    :func:`producer_tile_notify_flush` sends what is still held. A tile's channels between its first and
    last (channels shorter than the tile) are released at once, with a barrier of their own.

    Each channel's adds come at most three of the program's tiles late (a channel's tiles are spread over
    every program, so it completes at most three tiles after its last tile). On an H200 the notify of
    every tile cost a short-K GEMM+RS (K = 1376..1792) about 5% and one per two tiles 3-4%; one per four
    about 2%. Straight-line code, so a flattened loop stays flattened. The producer
    must not wait for anything its consumer sends before the loop ends (adds still held)."""
    step = pending[0]
    slot = step % NOTIFY_EVERY
    send = slot == NOTIFY_EVERY - 1
    first, at_first, last, at_last, channel, at_middle, leads = _row_span(
        row_lo, row_hi, row_elems, rows, rows_per_rank, rows_per_channel, channels_per_rank, MAX_ROWS)
    middle = last > first + 1  # some channel may lie between the first and the last
    _add_release_group(send | middle, send, barrier_ptr, pending, first, at_first, last, at_last)
    # after the barrier above (taken whenever a lane leads a middle channel), each by its lane's thread
    _add_release_lanes_now(barrier_ptr + channel, at_middle, leads)
    c = first.to(tl.int32)
    d = last.to(tl.int32)
    a = at_first.to(tl.int64)
    b = at_last.to(tl.int64)
    return ((step + 1).to(tl.int32),
            _held(send, slot == 0, c, pending[1]), _held(send, slot == 0, a, pending[2]),
            _held(send, slot == 0, d, pending[3]), _held(send, slot == 0, b, pending[4]),
            _held(send, slot == 1, c, pending[5]), _held(send, slot == 1, a, pending[6]),
            _held(send, slot == 1, d, pending[7]), _held(send, slot == 1, b, pending[8]),
            _held(send, slot == 2, c, pending[9]), _held(send, slot == 2, a, pending[10]),
            _held(send, slot == 2, d, pending[11]), _held(send, slot == 2, b, pending[12]))


@triton.jit
def producer_tile_notify_flush(barrier_ptr, pending):
    """After a loop of :func:`producer_tile_notify_rows_grouped`: wait for the program's bulk stores, then
    send the adds still held (none, and nothing is done, when every held add is 0)."""
    some = ((pending[2] | pending[4] | pending[6] | pending[8] | pending[10] | pending[12]) != 0)
    _add_release_group(some, some, barrier_ptr, pending, 0, 0, 0, 0)


@triton.jit
def producer_tile_notify(barrier_ptr, channel, value, peer_table, rank, world, MODE: tl.constexpr):
    """A producer tile is done: release-add ``value`` to barrier ``channel``.

    ``MODE`` 0 (local): this rank's barrier array at ``barrier_ptr``; 1 (p2p): ``rank``'s copy,
    through ``peer_table`` (the barrier array's); 2 (broadcast): every one of the ``world`` ranks.
    """
    if MODE == 0:
        _add_release(barrier_ptr + channel, value)
    elif MODE == 1:
        _add_release(peer_ptr(peer_table, barrier_ptr, rank) + channel, value)
    else:
        for peer in range(0, world):
            _add_release(peer_ptr(peer_table, barrier_ptr, peer) + channel, value)


@triton.jit
def peer_tile_notify(peer_table, like_ptr, index, rank, value):
    """Release-add ``value`` to barrier ``index`` of ``rank``'s copy of the barrier array
    (``like_ptr`` is the local copy, ``peer_table`` its table)."""
    _add_release(peer_ptr(peer_table, like_ptr, rank) + index, value)


@triton.jit
def peer_tile_wait(barrier_ptr, index, target, diag_ptr, budget):
    """Acquire-spin until the local barrier ``index`` is ``>= target`` (a peer's tile is done).
    Returns the token."""
    return _spin(barrier_ptr + index, call_target(target, diag_ptr), diag_ptr, budget, KIND_PEER_TILE_WAIT, index)


@triton.jit
def tile_pull_data(peer_table, like_ptr, rank, offsets, mask):
    """Load a tile (element ``offsets``, masked lanes read 0) from ``rank``'s copy of the buffer."""
    return tl.load(peer_ptr(peer_table, like_ptr, rank) + offsets, mask=mask, other=0)


@triton.jit
def tile_push_data(peer_table, like_ptr, rank, offsets, data, mask):
    """Store a tile ``data`` at element ``offsets`` of ``rank``'s copy of the buffer."""
    tl.store(peer_ptr(peer_table, like_ptr, rank) + offsets, data, mask=mask)
