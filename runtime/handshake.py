"""The handshake of an uncaptured call on a GPU, as one small kernel.

An operator's call with peers starts by telling every peer that this rank reached it and waiting until every
peer has said the same (``Launcher.handshake``, docs/ARCHITECTURE.md "Launch order"). On a GPU that was a
``cuStreamWriteValue64`` per peer and, per peer, a ``cuStreamWaitValue64`` with two events for the host thread
that watches it: some 100 µs of the launching thread's time a call. :func:`handshake_kernel` does both in one
launch on the stream: it stores the call's number into this rank's word of every peer's ``ready`` array
(release, system scope: the stream's work before it, the shard's copy, is visible to whoever acquires the value),
then spins until every peer's word in this rank's array reaches it (acquire), each for at most the handshake's
budget. A peer that does not come is recorded in the context's diagnostics array as ``KIND_HANDSHAKE_CALL``
(its rank as the index, the call as the target, the call it last reached as the value seen), which the host reads
as :class:`tilelink.runtime.diagnostics.HandshakeTimeout`; the kernel returns then, as every device wait does. No
host thread watches it.

An all-gather's call also puts its shard into its place in the gathered set before it tells the peers;
:func:`shard_handshake_kernel` makes that copy part of the same launch (``Launcher.handshake`` with ``copy=``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tilelink.runtime.diagnostics import KIND_HANDSHAKE_CALL
from tilelink.runtime.language import _spin, peer_ptr

__all__ = ["handshake_kernel", "shard_handshake_kernel"]

_KIND: tl.constexpr = tl.constexpr(KIND_HANDSHAKE_CALL)  # a jit function sees constexpr globals only


@triton.jit
def _handshake(ready_table, ready_ptr, rank, world, call, diag_ptr, budget, flags_ptr, first_flag, flags, flag_value):
    for i in range(first_flag, first_flag + flags):
        tl.store(flags_ptr + i, tl.full((), 0, tl.int64) + flag_value)
    value = tl.full((), 0, tl.int64) + call
    for step in range(1, world):
        dst = (rank + step) % world
        tl.atomic_xchg(peer_ptr(ready_table, ready_ptr, dst) + rank, value, sem="release", scope="sys")
    for step in range(1, world):
        src = (rank + step) % world
        if tl.load(diag_ptr, volatile=True) == 0:  # a timeout recorded by an earlier wait of this kernel
            _spin(ready_ptr + src, value, diag_ptr, budget, _KIND, src)


@triton.jit(do_not_specialize=["rank", "world", "call", "budget", "first_flag", "flags", "flag_value"])
def handshake_kernel(ready_table, ready_ptr, rank, world, call, diag_ptr, budget, flags_ptr, first_flag, flags,
                     flag_value):
    """Word ``rank`` of every other rank's copy of ``ready_ptr`` (its peer table ``ready_table``) := ``call``; then
    wait until every other rank's word of the local copy is ``>= call``, each for at most ``budget`` ns (ring order:
    the next rank first). Once a wait recorded a timeout (``diag_ptr[0]``, this call's or an earlier one's), the
    later ones do not spend their budgets too: the call's results are void. Words ``first_flag`` to ``first_flag +
    flags - 1`` of the local array ``flags_ptr`` := ``flag_value`` as well (the copy-engine gather's flags of this
    rank's own rows, in place since the shard's copy before this kernel: a driver call each on the host): the
    kernels that read them run behind this one on its stream."""
    _handshake(ready_table, ready_ptr, rank, world, call, diag_ptr, budget, flags_ptr, first_flag, flags, flag_value)


@triton.jit(do_not_specialize=["n", "rank", "world", "call", "budget", "first_flag", "flags", "flag_value"])
def shard_handshake_kernel(src_ptr, dst_ptr, n, count_ptr, ready_table, ready_ptr, rank, world, call, diag_ptr,
                           budget, flags_ptr, first_flag, flags, flag_value, BLOCK: tl.constexpr):
    """The shard's copy into its place in the gathered set (``n`` elements of ``src_ptr`` into ``dst_ptr``, every
    program a stride of blocks), then :func:`handshake_kernel`'s work, done by the program that finishes its copy
    last: each program counts itself in ``count_ptr`` (acquire and release, GPU scope: the last one sees every
    program's rows), and the last resets the word for the next call and tells the peers (release, system scope:
    the rows are visible to whoever acquires the call's number). One launch where the copy was a driver call of its
    own, the most expensive of a call's (a ``cuMemcpyAsync`` cost the host 8-15 µs, a launch 5-10); no program
    waits for another, so none holds an SM while the others have none."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    for start in range(pid * BLOCK, n, programs * BLOCK):
        idx = start + offs
        tl.store(dst_ptr + idx, tl.load(src_ptr + idx, mask=idx < n), mask=idx < n)
    tl.debug_barrier()  # every thread's rows stored before the program counts itself
    if tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == programs - 1:
        tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")
        _handshake(ready_table, ready_ptr, rank, world, call, diag_ptr, budget, flags_ptr, first_flag, flags,
                   flag_value)
