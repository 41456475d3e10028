"""The world of ranks: bootstrap from the ``torchrun`` environment, backend selection, teardown.

``init()`` brings up ``torch.distributed`` (gloo, for host control) and one backend; every other
runtime module reaches the backend through :func:`current_world`.
"""

from __future__ import annotations

import atexit
import os
import uuid
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tilelink.errors import NotInitializedError, TileLinkError, WorldMismatchError
from tilelink.runtime.backend import Backend

BACKENDS = ("emulated", "nvshmem")


@dataclass
class World:
    """This process's view of the world: its rank, the world size and the backend serving it."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    impl: Backend = field(repr=False)
    session: str = ""

    def barrier(self) -> None:
        """Host-synchronous barrier of all ranks."""
        self.impl.barrier()

    def stream_barrier(self, stream: torch.cuda.Stream | None = None) -> None:
        """Barrier ordered on ``stream`` (emulated: a host barrier, kernels being synchronous)."""
        self.impl.stream_barrier(stream)


_world: World | None = None
_owns_process_group = False
_atexit_registered = False


def interpreting() -> bool:
    """Kernels of this process run in Triton's interpreter (``TRITON_INTERPRET=1``: the emulated
    world, CPU tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def default_backend() -> str:
    """``TILELINK_BACKEND`` if set, else ``emulated`` under the interpreter or without CUDA, else
    ``nvshmem``."""
    name = os.environ.get("TILELINK_BACKEND")
    if name:
        return name
    if interpreting() or not torch.cuda.is_available():
        return "emulated"
    return "nvshmem"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise TileLinkError(f"environment variable {name}={value!r} is not an integer") from None


def _bootstrap_process_group() -> None:
    """Bring up the gloo control group from the torchrun variables (or a world of one)."""
    global _owns_process_group
    if dist.is_initialized():
        env_world = os.environ.get("WORLD_SIZE")
        if env_world is not None and int(env_world) != dist.get_world_size():
            raise WorldMismatchError(
                f"WORLD_SIZE={env_world} but torch.distributed is already initialised with "
                f"{dist.get_world_size()} ranks: launch with a matching -n / --nproc-per-node"
            )
        return
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size < 1 or not 0 <= rank < world_size:
        raise WorldMismatchError(
            f"RANK={rank} is not a rank of a world of WORLD_SIZE={world_size}: launch with "
            f"`tlxform run -n N`, torchrun, or tilelink.spawn"
        )
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    elif world_size == 1:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        raise NotInitializedError(
            f"WORLD_SIZE={world_size} but MASTER_ADDR/MASTER_PORT are not set: launch with "
            f"`tlxform run -n {world_size}`, torchrun, or tilelink.spawn"
        )
    _owns_process_group = True


def _session_id() -> str:
    """One id for the whole world, agreed through rank 0 (names the emulated shared-memory files)."""
    session = os.environ.get("TILELINK_SESSION")
    if session:
        return session
    box = [f"{uuid.uuid4().hex[:12]}-{os.getpid()}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def _make_backend(name: str, session: str) -> Backend:
    if name == "emulated":
        from tilelink.runtime.emulated import EmulatedBackend

        return EmulatedBackend(session=session)
    if name == "nvshmem":
        from tilelink.runtime.nvshmem import NvshmemBackend

        return NvshmemBackend()
    raise TileLinkError(f"unknown TileLink backend {name!r}: use one of {', '.join(BACKENDS)}")


def init(backend: str | None = None) -> World:
    """Join the world described by the ``torchrun`` environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); a world of one without them.

    ``backend`` is ``"emulated"`` or ``"nvshmem"``; by default ``TILELINK_BACKEND``, else emulated
    under ``TRITON_INTERPRET=1`` or without CUDA, else nvshmem. Idempotent.
    """
    global _world, _atexit_registered
    name = backend or default_backend()
    if name not in BACKENDS:
        raise TileLinkError(f"unknown TileLink backend {name!r}: use one of {', '.join(BACKENDS)}")
    if _world is not None:
        if _world.backend != name:
            raise TileLinkError(
                f"tilelink is already initialised with backend {_world.backend!r}; call "
                f"tilelink.finalize() before init(backend={name!r})"
            )
        return _world
    _bootstrap_process_group()
    session = _session_id()
    impl = _make_backend(name, session)
    _world = World(rank=impl.rank, world_size=impl.world_size, local_rank=impl.local_rank,
                   backend=impl.name, device=impl.device, impl=impl, session=session)
    if not _atexit_registered:
        atexit.register(finalize)
        _atexit_registered = True
    return _world


def finalize() -> None:
    """Free every symmetric buffer, tear the backend down and leave the control group. Idempotent;
    also runs at exit."""
    global _world, _owns_process_group
    if _world is None:
        return
    world, _world = _world, None
    try:
        from tilelink.runtime import heap

        heap.release_all(world)
        world.impl.finalize()
    finally:
        if _owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        _owns_process_group = False


def abandon() -> None:
    """Forget the world without collective teardown (a rank that failed: its peers may be stuck or
    gone). Memory goes with the process; the emulated backend removes its leftover files."""
    global _world, _owns_process_group
    if _world is None:
        return
    world, _world = _world, None
    from tilelink.runtime import heap

    heap.forget_all()
    try:
        abandon_backend = getattr(world.impl, "abandon", None)
        if abandon_backend is not None:
            abandon_backend()
    finally:
        _owns_process_group = False  # destroying it would wait for the peers


def is_initialized() -> bool:
    """Whether :func:`init` has run (and :func:`finalize` has not)."""
    return _world is not None


def current_world() -> World:
    """The world this process joined with :func:`init`."""
    if _world is None:
        raise NotInitializedError(
            "TileLink is not initialised in this process: call tilelink.init() first (under "
            "torchrun or `tlxform run -n N script.py`), or run the function with "
            "tilelink.spawn(fn, world_size)"
        )
    return _world


def rank() -> int:
    """This process's rank."""
    return current_world().rank


def world_size() -> int:
    """The number of ranks."""
    return current_world().world_size


def local_rank() -> int:
    """This process's rank on its host (picks the GPU)."""
    return current_world().local_rank
