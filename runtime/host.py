"""Host-side primitives (paper Table 3): the copy engine moves data and flags on a side stream.

``rank_copy_data`` is ``cudaMemcpyAsync`` between (peer) symmetric views; ``rank_notify`` and
``rank_wait`` write and wait on barrier words with stream memory operations. In the emulated world
they are a memcpy, a store and a host poll that raises :class:`tilelink.WaitTimeout`.
"""

from __future__ import annotations

import torch

from tilelink.errors import LaunchError, WaitTimeout
from tilelink.runtime import heap
from tilelink.runtime.channel import Channel
from tilelink.runtime.diagnostics import HandshakeTimeout, wait_timeout_s
from tilelink.runtime.world import current_world


def _barrier_array(barriers: torch.Tensor | Channel, index: int, what: str) -> torch.Tensor:
    tensor = barriers.barriers if isinstance(barriers, Channel) else barriers
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.dim() != 1:
        raise LaunchError(f"{what}: expected a Channel or a 1-D int64 barrier array on the symmetric "
                          f"heap, got {tensor!r:.80}")
    if not 0 <= index < tensor.numel():
        raise LaunchError(f"{what}: barrier index {index} out of range for {tensor.numel()} channels")
    return tensor


def rank_copy_data(src: torch.Tensor, dst: torch.Tensor, stream: torch.cuda.Stream | None = None) -> None:
    """Copy ``src`` into ``dst`` with the copy engine (either may be a peer's view,
    ``tilelink.runtime.peer_tensor``): pull when ``src`` is a peer's, push when ``dst`` is."""
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise LaunchError(f"rank_copy_data: src is {src.dtype} {list(src.shape)} but dst is "
                          f"{dst.dtype} {list(dst.shape)}; they must match")
    current_world().impl.copy(src, dst, stream)


def _word_address(barriers: torch.Tensor | Channel, index: int, rank: int, what: str) -> int:
    """Where word ``index`` of ``rank``'s copy of the barrier array is mapped in this process."""
    if isinstance(barriers, Channel):
        return barriers.word_address(index, rank, what)
    tensor = _barrier_array(barriers, index, what)
    world = current_world()
    offset = 8 * index * tensor.stride(0)  # the word's, in bytes: no view of it made (each cost microseconds)
    if rank == world.rank:  # this rank's own word: any int64 array on its device will do
        if tensor.device.type != world.device.type:
            raise LaunchError(f"{what}: the barrier array is on {tensor.device}, but this rank's words are on "
                              f"{world.device}; move it there (or allocate it with tilelink.runtime.symmetric_zeros)")
        return tensor.data_ptr() + offset
    return heap.peer_tensor(tensor, rank).data_ptr() + offset


def rank_notify(barriers: torch.Tensor | Channel, index: int, value: int, rank: int,
                stream: torch.cuda.Stream | None = None) -> None:
    """Set barrier word ``index`` of ``rank``'s barrier array to ``value`` after the work issued
    before on ``stream`` (release): tells ``rank`` that the data of that channel is ready."""
    address = _word_address(barriers, index, rank, "rank_notify")
    current_world().impl.write_value_at(address, int(value), stream)


def rank_wait(barriers: torch.Tensor | Channel, index: int, value: int,
              stream: torch.cuda.Stream | None = None, timeout_s: float | None = None, block: bool = True,
              chained: bool = False) -> None:
    """Make ``stream`` (emulated: the host) wait until the local barrier word ``index`` is
    ``>= value`` (acquire). The emulated backend raises :class:`tilelink.WaitTimeout` after
    ``timeout_s`` (default ``TILELINK_WAIT_TIMEOUT``). On a GPU the host checks the wait before
    returning; with ``block=False`` it returns at once (the host keeps enqueueing) and a wait still
    pending after ``timeout_s`` (from when the stream reaches it) is released by a watcher thread,
    printed at once and raised by the next ``current_world().impl.check_waits()`` (each launch's finish).
    ``chained`` (with ``block=False``): only copies and flags were enqueued on ``stream`` since the last wait
    watched on it, so the budget starts when that one passed (one event less to record on the stream)."""
    world = current_world()
    address = _word_address(barriers, index, world.rank, "rank_wait")
    budget = wait_timeout_s(world.backend == "emulated") if timeout_s is None else timeout_s
    rank_wait_at(world, address, index, value, stream, budget, block, chained)


def rank_wait_at(world, address: int, index: int, value: int, stream: torch.cuda.Stream | None, budget: float,
                 block: bool = True, chained: bool = False) -> None:
    """:func:`rank_wait` on the word at ``address`` (this rank's word ``index``, its address read once by a caller
    that waits on it every call), with a budget of ``budget`` seconds."""
    try:
        world.impl.wait_value_at(address, int(value), stream, budget, block=block, index=index, chained=chained)
    except WaitTimeout as exc:
        if isinstance(exc, HandshakeTimeout):  # already says which call of which operator
            raise
        raise WaitTimeout(rank=world.rank, primitive="rank_wait", index=index, expected=int(value),
                          seen=exc.seen, budget_s=budget) from None
