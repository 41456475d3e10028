"""The emulated backend: one CPU process per rank, symmetric buffers in shared memory.

Each symmetric allocation is one file per rank in ``/dev/shm``, named from the world session, the
allocation's sequence number (allocation is collective, so every rank agrees on it) and the rank.
Every rank maps every rank's file, so a peer's buffer is plain memory at an address of this process:
kernels under ``TRITON_INTERPRET=1`` reach it through int64 -> pointer casts, and interpreter atomics
on it are real atomics across processes. A file is unlinked as soon as every rank has mapped it, so
the memory goes away with the last process that maps it, even if a rank dies.
"""

from __future__ import annotations

import ctypes
import glob
import os
import time

import torch
import torch.distributed as dist

from tilelink.errors import SymmetricHeapError, WaitTimeout

SHM_DIR = "/dev/shm"
FILE_PREFIX = "tilelink-"


def session_files(session: str, rank: int | None = None) -> list[str]:
    """Shared-memory files of a world session (of one rank), left behind only by a crash."""
    who = "*" if rank is None else str(rank)
    return glob.glob(os.path.join(SHM_DIR, f"{FILE_PREFIX}{session}-*-r{who}"))


def remove_session_files(session: str, rank: int | None = None) -> None:
    """Remove leftover files of a session (the launcher calls this after its ranks exit)."""
    for path in session_files(session, rank):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class EmulatedBackend:
    """A rank of an emulated world (see the module docstring)."""

    name = "emulated"

    def __init__(self, session: str, control=None) -> None:
        if not dist.is_initialized():
            raise SymmetricHeapError("EmulatedBackend needs torch.distributed: use tilelink.init()")
        self.session = session
        # the world's ranks: a group's when tilelink.init was given one (its control knows them), else the job's
        self.rank = control.rank if control is not None else dist.get_rank()
        self.world_size = control.world_size if control is not None else dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        self.device = torch.device("cpu")
        # barriers go through the world's store (tilelink.runtime.control), bounded and watching the peers: a
        # gloo barrier waited 30 minutes for a peer that had failed or gone elsewhere
        self._control = control
        self._sequence = 0
        self._live: dict[int, list[torch.Tensor]] = {}  # local data_ptr -> every rank's mapping

    def _path(self, sequence: int, rank: int) -> str:
        return os.path.join(SHM_DIR, f"{FILE_PREFIX}{self.session}-{sequence}-r{rank}")

    def allocate(self, nbytes: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Collective: create this rank's file, map every rank's, unlink this rank's."""
        sequence = self._sequence
        self._sequence += 1
        size = max(int(nbytes), 1)
        own = self._path(sequence, self.rank)
        fd = os.open(own, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        try:
            self.barrier("tilelink.runtime.symmetric_empty", count=False)  # every rank's file exists
            peers = [torch.from_file(self._path(sequence, r), shared=True, size=size, dtype=torch.uint8)
                     for r in range(self.world_size)]
            self.barrier("tilelink.runtime.symmetric_empty", count=False)  # every rank mapped every file
        finally:
            os.unlink(own)
        peers = [p[:nbytes] for p in peers]
        self._live[peers[self.rank].data_ptr()] = peers
        return peers[self.rank], peers

    def release(self, local: torch.Tensor) -> None:
        """Collective: wait until no rank uses the buffer any more, then drop the mappings."""
        control = self._control
        self.barrier("tilelink.finalize" if control is not None and control.finalizing else "tilelink.runtime.free")
        self._live.pop(local.data_ptr(), None)

    def barrier(self, point: str = "World.barrier", count: bool = True) -> None:
        """Every rank has reached ``point`` (see :meth:`tilelink.runtime.control.Control.exchange`)."""
        control = self._control
        if control is None:
            from tilelink.runtime.world import control as world_control

            control = world_control()
        control.barrier(point, count=count)

    def stream_barrier(self, stream: torch.cuda.Stream | None) -> None:
        self.barrier("World.stream_barrier")  # kernels are synchronous here: everything issued before is complete

    def write_value(self, word: torch.Tensor, value: int, stream: torch.cuda.Stream | None) -> None:
        self.write_value_at(word.data_ptr(), value, stream)

    def write_value_at(self, address: int, value: int, stream: torch.cuda.Stream | None) -> None:
        # one aligned 8-byte store; x86 keeps it after the earlier stores (release)
        ctypes.c_int64.from_address(address).value = int(value)

    def check_waits(self) -> None:
        return None  # every wait here is a host poll that raises itself

    def wait_value(self, word: torch.Tensor, value: int, stream: torch.cuda.Stream | None,
                   timeout_s: float, block: bool = True, index: int = -1) -> None:
        self.wait_value_at(word.data_ptr(), value, stream, timeout_s, block, index)

    def wait_value_at(self, address: int, value: int, stream: torch.cuda.Stream | None, timeout_s: float,
                      block: bool = True, index: int = -1, chained: bool = False) -> None:
        # kernels are synchronous here: a wait that returned before the data arrived would gain nothing
        deadline = time.monotonic() + timeout_s
        pause = 1e-5
        word = ctypes.c_int64.from_address(address)
        while True:
            seen = word.value
            if seen >= value:
                return
            if time.monotonic() > deadline:
                raise WaitTimeout(rank=self.rank, primitive="rank_wait", index=-1, expected=int(value),
                                  seen=seen, budget_s=timeout_s)
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def copy(self, src: torch.Tensor, dst: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
        dst.copy_(src)

    def copy_at(self, dst: int, src: int, nbytes: int, stream: torch.cuda.Stream | None) -> None:
        ctypes.memmove(dst, src, nbytes)

    def abandon(self) -> None:
        """Non-collective teardown of a failed rank: forget the mappings, remove own files."""
        self._live.clear()
        remove_session_files(self.session, self.rank)

    def finalize(self) -> None:
        self._live.clear()
        remove_session_files(self.session, self.rank)
