"""The symmetric heap: buffers that exist once per rank, at addresses every rank can reach.

Allocation and free are collective (every rank, same order, same shape and dtype). A tensor of the
heap (or a view into one) gives its peers' copies with :func:`peer_tensor` and, for kernels, a table
of their base addresses with :func:`peer_table`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tilelink.errors import SymmetricHeapError, WorldMismatchError
from tilelink.runtime.world import World, current_world


@dataclass(eq=False)
class _Allocation:
    """One collective allocation: this rank's bytes and a view of every rank's copy."""

    local: torch.Tensor
    peers: list[torch.Tensor]
    shape: tuple[int, ...]
    dtype: torch.dtype
    tables: dict[tuple, torch.Tensor] = field(default_factory=dict)
    typed: dict[tuple, torch.Tensor] = field(default_factory=dict)  # (rank, dtype) -> that rank's copy, typed

    def __post_init__(self) -> None:
        # read on every launch's peer lookups: plain ints, not tensor calls
        self.base = self.local.data_ptr()
        self.nbytes = self.local.numel()
        self.end = self.base + max(self.nbytes, 1)
        self.device = self.local.device

    def describe(self) -> str:
        return f"symmetric {self.dtype} buffer of shape {list(self.shape)}"


_live: list[_Allocation] = []
_freed: dict[int, str] = {}  # base address -> description, to tell a double free from a foreign tensor


def _normalise_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    if isinstance(shape, torch.Size):
        return tuple(shape)
    return tuple(int(s) for s in shape)


def _check_agreement(world: World, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if world.world_size == 1:
        return
    mine = (shape, str(dtype))
    # through the world's store: bounded, and it stops at once if a peer failed (a gloo collective waited 30 min)
    everyone = world.control.exchange(mine, "tilelink.runtime.symmetric_empty")
    if any(other != mine for other in everyone):
        listing = "; ".join(f"rank {r}: shape {list(s)} {d}" for r, (s, d) in enumerate(everyone))
        raise WorldMismatchError(
            f"symmetric allocation is collective: every rank must allocate the same shape and dtype "
            f"in the same order, but got {listing}"
        )


def symmetric_empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """Collective: an uninitialised tensor on the symmetric heap (on ``world.device``)."""
    world = current_world()
    shape = _normalise_shape(shape)
    if any(s < 0 for s in shape):
        raise SymmetricHeapError(f"symmetric_empty: negative dimension in shape {list(shape)}")
    _check_agreement(world, shape, dtype)
    itemsize = dtype.itemsize
    nbytes = math.prod(shape) * itemsize
    local, peers = world.impl.allocate(nbytes)
    allocation = _Allocation(local=local, peers=list(peers), shape=shape, dtype=dtype)
    _live.append(allocation)
    _freed.pop(allocation.base, None)
    return local.view(dtype).view(shape)


def symmetric_zeros(shape, dtype: torch.dtype) -> torch.Tensor:
    """Collective: a zeroed tensor on the symmetric heap; no rank returns before every rank's copy
    is zero, so a peer's early notify is never wiped out."""
    tensor = symmetric_empty(shape, dtype)
    tensor.zero_()
    current_world().barrier()
    return tensor


def _find(t: torch.Tensor) -> _Allocation | None:
    ptr = t.data_ptr()
    for allocation in _live:
        if allocation.base <= ptr < allocation.end and allocation.device == t.device:
            return allocation
    return None


def _require(t: torch.Tensor, what: str) -> _Allocation:
    if not isinstance(t, torch.Tensor):
        raise SymmetricHeapError(f"{what}: expected a torch.Tensor on the symmetric heap, got "
                                 f"{type(t).__name__}")
    allocation = _find(t)
    if allocation is None:
        if t.data_ptr() in _freed:
            raise SymmetricHeapError(f"{what}: this {_freed[t.data_ptr()]} was already freed")
        raise SymmetricHeapError(
            f"{what}: the {t.dtype} tensor of shape {list(t.shape)} on {t.device} is not on the "
            f"symmetric heap; allocate it with tilelink.runtime.symmetric_empty/symmetric_zeros "
            f"(on every rank) instead of torch.empty"
        )
    return allocation


def is_symmetric(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in a live symmetric buffer (views included)."""
    return isinstance(t, torch.Tensor) and _find(t) is not None


def peer_tensor(t: torch.Tensor, rank: int) -> torch.Tensor:
    """``rank``'s copy of ``t`` (same shape, strides and offset), usable by torch ops on this rank."""
    allocation = _require(t, "peer_tensor")
    world = current_world()
    if not 0 <= rank < world.world_size:
        raise WorldMismatchError(f"peer_tensor: rank {rank} is not a rank of this world of "
                                 f"{world.world_size}")
    if rank == world.rank:
        return t
    itemsize = t.element_size()
    offset = t.data_ptr() - allocation.base
    if offset % itemsize:
        raise SymmetricHeapError(f"peer_tensor: view at byte offset {offset} is not aligned to {t.dtype}")
    typed = allocation.typed.get((rank, t.dtype))
    if typed is None:
        typed = allocation.peers[rank][: allocation.nbytes - allocation.nbytes % itemsize].view(t.dtype)
        allocation.typed[(rank, t.dtype)] = typed
    return typed.as_strided(t.shape, t.stride(), typed.storage_offset() + offset // itemsize)


def peer_table(t: torch.Tensor) -> torch.Tensor:
    """int64 tensor ``[world]`` on ``world.device``: the address, in this process, of every rank's
    copy of ``t``. Kernels turn an entry into a pointer (``tilelink.language.peer_ptr``). Cached."""
    allocation = _require(t, "peer_table")
    world = current_world()
    key = (t.data_ptr() - allocation.base,)
    table = allocation.tables.get(key)
    if table is None:
        offset = key[0]
        addresses = [p.data_ptr() + offset for p in allocation.peers]
        addresses[world.rank] = t.data_ptr()
        table = torch.tensor(addresses, dtype=torch.int64, device=world.device)
        allocation.tables[key] = table
    return table


def free(t: torch.Tensor) -> None:
    """Collective: release the symmetric buffer ``t`` (the tensor :func:`symmetric_empty` returned)."""
    allocation = _require(t, "free")
    if t.data_ptr() != allocation.base:
        raise SymmetricHeapError("free: pass the tensor symmetric_empty returned, not a view into it")
    world = current_world()
    _live.remove(allocation)
    _freed[allocation.base] = allocation.describe()
    world.impl.release(allocation.local)
    allocation.peers.clear()
    allocation.tables.clear()
    allocation.typed.clear()


def release_all(world: World) -> None:
    """Release every live buffer (``finalize``)."""
    while _live:
        allocation = _live.pop()
        world.impl.release(allocation.local)
        allocation.peers.clear()
        allocation.tables.clear()
        allocation.typed.clear()
    _freed.clear()


def forget_all() -> None:
    """Drop every buffer without the collective release (``tilelink.runtime.world.abandon``)."""
    _live.clear()
    _freed.clear()


def live_buffers() -> int:
    """How many symmetric buffers are allocated (tests, leak checks)."""
    return len(_live)
