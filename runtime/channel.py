"""Channels (the paper's ``BlockChannel``): one int64 barrier word per channel, on the symmetric heap.

Barrier words are epoch counters and are never reset: a context counts its calls (``epoch``, 1 for
the first) and a channel notified ``k`` times per call is waited for with ``target = epoch * k``.
"""

from __future__ import annotations

import torch

from tilelink.errors import LaunchError, SymmetricHeapError, TileLinkError, WorldMismatchError
from tilelink.runtime import heap
from tilelink.runtime.world import current_world


class Channel:
    """Collective: ``num_channels`` barrier words on every rank, zeroed, and their peer table."""

    def __init__(self, num_channels: int) -> None:
        if int(num_channels) < 1:
            raise TileLinkError(f"Channel needs at least one channel, got {num_channels}")
        world = current_world()
        self._world = world  # its buffers die with it
        self.num_channels = int(num_channels)
        self.rank = world.rank
        self.world_size = world.world_size
        self.barriers: torch.Tensor = heap.symmetric_zeros((self.num_channels,), torch.int64)
        self.peer_table: torch.Tensor = heap.peer_table(self.barriers)
        #: where each rank's copy of the barrier array is mapped in this process (host-side notifies and
        #: waits address a word directly: a tensor view per word cost the launch path microseconds each)
        self.addresses: tuple[int, ...] = tuple(heap.peer_tensor(self.barriers, r).data_ptr()
                                                for r in range(self.world_size))
        self.epoch = 0

    def advance(self) -> int:
        """Start the next call: returns the new epoch (1 for the first call)."""
        self.epoch += 1
        return self.epoch

    def word_address(self, index: int, rank: int, what: str = "word_address") -> int:
        """The address, in this process, of word ``index`` of ``rank``'s copy."""
        if not self.addresses or current_world() is not self._world:
            raise SymmetricHeapError(f"{what}: this Channel was freed (Channel.free, or its world finalized)")
        if not 0 <= index < self.num_channels:
            raise LaunchError(f"{what}: barrier index {index} out of range for {self.num_channels} channels")
        if not 0 <= rank < self.world_size:
            raise WorldMismatchError(f"{what}: rank {rank} is not a rank of this world of {self.world_size}")
        return self.addresses[rank] + 8 * index

    def free(self) -> None:
        """Collective: release the barrier array."""
        self.addresses = ()  # a host-side notify after this would write into whatever the heap puts there next
        heap.free(self.barriers)

    def __repr__(self) -> str:
        return (f"Channel(num_channels={self.num_channels}, rank={self.rank}, "
                f"world_size={self.world_size}, epoch={self.epoch})")
