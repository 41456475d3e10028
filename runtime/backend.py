"""The interface every runtime backend implements (emulated CPU processes, NVSHMEM on GPUs).

The common layers (world, symmetric heap, channels, host primitives) are written once against this
interface; a backend only knows how to bootstrap, allocate symmetric bytes, synchronise and write or
wait on a flag word from the host side.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Backend(Protocol):
    """One rank's connection to the world."""

    name: str  # "emulated" or "nvshmem"
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    def allocate(self, nbytes: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Collective. Returns this rank's uint8 buffer and a uint8 view of every rank's copy
        (index = rank; entry ``rank`` is the local buffer itself), all usable from this process."""

    def release(self, local: torch.Tensor) -> None:
        """Collective. Frees a buffer returned by :meth:`allocate`."""

    def barrier(self) -> None:
        """Host-synchronous barrier of all ranks (device work issued before it is complete)."""

    def stream_barrier(self, stream: torch.cuda.Stream | None) -> None:
        """Barrier ordered on ``stream``: work after it on the stream starts once every rank's
        work before it has completed. The emulated backend (synchronous kernels) just calls barrier()."""

    def write_value(self, word: torch.Tensor, value: int, stream: torch.cuda.Stream | None) -> None:
        """Store ``value`` into the int64 ``word`` (a one-element view, possibly a peer's) with
        release order after earlier work on ``stream`` (copy-engine side: cuStreamWriteValue64)."""

    def wait_value(self, word: torch.Tensor, value: int, stream: torch.cuda.Stream | None,
                   timeout_s: float, block: bool = True, index: int = -1) -> None:
        """Make ``stream`` wait until the int64 ``word`` is >= ``value`` (cuStreamWaitValue64, GEQ).
        The emulated backend polls on the host and raises WaitTimeout after ``timeout_s``. With
        ``block=False`` a GPU backend returns at once and watches the wait from a host thread: a wait
        still pending after ``timeout_s`` (counted from when the stream reaches it) is released and
        raised as WaitTimeout by the next :meth:`check_waits` (and printed at once)."""

    def write_value_at(self, address: int, value: int, stream: torch.cuda.Stream | None) -> None:
        """:meth:`write_value` on the int64 word at ``address`` (a barrier word of a Channel, this rank's copy
        or a peer's, checked by the caller): the operators' launch path, without a tensor view per word."""

    def wait_value_at(self, address: int, value: int, stream: torch.cuda.Stream | None, timeout_s: float,
                      block: bool = True, index: int = -1, chained: bool = False) -> None:
        """:meth:`wait_value` on this rank's int64 word at ``address`` (checked by the caller). ``chained`` (with
        ``block=False``): the stream reaches this wait as soon as the last wait watched on it passed (only copies
        and flags enqueued between), so its budget may start there: a GPU backend then marks nothing on the
        stream before it."""

    def check_waits(self) -> None:
        """Raise the WaitTimeout of a watched (``block=False``) wait that timed out; never blocks."""

    def copy(self, src: torch.Tensor, dst: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
        """Copy-engine copy of bytes between (peer) symmetric views on ``stream``."""

    def copy_at(self, dst: int, src: int, nbytes: int, stream: torch.cuda.Stream | None) -> None:
        """:meth:`copy` of ``nbytes`` contiguous bytes from address ``src`` to address ``dst`` (both mapped in this
        process, checked by the caller: views of symmetric buffers, once per context)."""

    def finalize(self) -> None:
        """Tear down the world. Buffers are released by the heap before this is called."""
