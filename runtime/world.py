"""The world of ranks: bootstrap from the ``torchrun`` environment, backend selection, teardown.

``init()`` brings up ``torch.distributed`` (gloo, for host control) and one backend; every other
runtime module reaches the backend through :func:`current_world`. ``init(group=...)`` (or ``mesh=``,
``mesh_dim=``) makes the world one ``torch.distributed`` group of an existing job (the tensor-parallel
group of a data x tensor parallel job): its ranks, its symmetric heap, its own namespace in the store.

A rank that fails tells the others at once and leaves without waiting for them: ``init()`` installs an
exception hook that announces an uncaught exception to the peers (:mod:`tilelink.runtime.control`) and,
under ``tlxform run``, leaves the launcher a record of it (``TILELINK_FAILURE_DIR``); ``finalize()`` after
an exception (at exit, or in an ``except``/``finally``) drops the world without a collective.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tilelink.errors import NotInitializedError, TileLinkError, WorldMismatchError
from tilelink.runtime.backend import Backend
from tilelink.runtime.control import Control
from tilelink.runtime.diagnostics import (
    HandshakeTimeout,
    PeerFailedError,
    is_consequence,
    skew_timeout_s,
)
from tilelink.runtime.settings import setting

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
    control: Control | None = field(default=None, repr=False)  # bounded exchanges, the peers' states
    #: the ``torch.distributed`` process group given to :func:`init` (its ranks are this world's), or None: the job
    group: object | None = field(default=None, repr=False)
    #: the job's (``torch.distributed``) rank of each rank of this world, by rank
    ranks: tuple[int, ...] = ()

    @property
    def global_rank(self) -> int:
        """This process's rank in the whole job (``torch.distributed``'s); :attr:`rank` is its rank in this world."""
        return self.ranks[self.rank] if self.ranks else self.rank

    def barrier(self) -> None:
        """Host-synchronous barrier of all ranks."""
        self.impl.barrier()

    def stream_barrier(self, stream: torch.cuda.Stream | None = None) -> None:
        """Barrier ordered on ``stream`` (emulated: a host barrier, kernels being synchronous)."""
        self.impl.stream_barrier(stream)


_world: World | None = None
_control: Control | None = None  # the world's, also while finalize() tears it down
_owns_process_group = False
_atexit_registered = False
_generation = 0  # worlds this process joined: keys of an earlier one in a store that outlived it are not read
_uncaught: BaseException | None = None  # what ended the program (the exception hook saw it)
_reported = False
_previous_excepthook = None


def interpreting() -> bool:
    """Kernels of this process run in Triton's interpreter (``TRITON_INTERPRET=1``: the emulated
    world, CPU tests)."""
    return setting("TRITON_INTERPRET") == "1"


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


def _default_store():
    """The key-value store the default process group rendezvoused on (the TCP store of MASTER_ADDR:MASTER_PORT)."""
    return dist.distributed_c10d._get_default_store()


def _session_id(store) -> str:
    """One id for the whole world, agreed through rank 0 (names the emulated shared-memory files)."""
    session = os.environ.get("TILELINK_SESSION")
    if session:
        return session
    # under torchrun the agent's store outlives a restarted worker group: a restart's ranks must not read the last one's
    key = f"tilelink/session/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_generation}"
    if dist.get_rank() == 0:
        store.set(key, f"{uuid.uuid4().hex[:12]}-{os.getpid()}")
    return store.get(key).decode()


def _make_backend(name: str, session: str, control: Control) -> Backend:
    if name == "emulated":
        from tilelink.runtime.emulated import EmulatedBackend

        return EmulatedBackend(session=session, control=control)
    if name == "nvshmem":
        from tilelink.runtime.nvshmem import NvshmemBackend

        return NvshmemBackend(control=control)
    raise TileLinkError(f"unknown TileLink backend {name!r}: use one of {', '.join(BACKENDS)}")


def _no_gpu_message() -> str:
    return ("no GPU here (torch.cuda.is_available() is False) and Triton's interpreter is off (TRITON_INTERPRET is "
            "not 1), so no Triton kernel can run in this process. On a CPU, run the script as an emulated world of "
            "CPU processes: `tlxform run -n N --emulate script.py` (or set TRITON_INTERPRET=1 before anything "
            "imports triton)")


def _is_device_mesh(obj) -> bool:
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # pragma: no cover - a torch without DeviceMesh
        return False
    return isinstance(obj, DeviceMesh)


def _mesh_group(mesh, mesh_dim):
    """The process group of this rank along ``mesh_dim`` (a name or an index) of a DeviceMesh."""
    names = tuple(mesh.mesh_dim_names or ())
    if mesh_dim is None:
        if mesh.ndim != 1:
            described = f"dimensions {list(names)}" if names else f"shape {list(mesh.mesh.shape)}"
            raise TileLinkError(
                f"tilelink.init: the DeviceMesh has {mesh.ndim} dimensions ({described}): pass the one whose groups "
                f"are TileLink's worlds, tilelink.init(mesh=mesh, mesh_dim={names[-1] if names else mesh.ndim - 1!r}) "
                f"(the tensor-parallel one), or a 1-D mesh such as group=mesh['tp']")
        mesh_dim = 0
    if isinstance(mesh_dim, str):
        if mesh_dim not in names:
            raise TileLinkError(f"tilelink.init: mesh_dim={mesh_dim!r} is not a dimension of the DeviceMesh; its "
                                f"dimensions are {list(names) if names else 'unnamed (pass an index)'}")
    elif not isinstance(mesh_dim, int) or isinstance(mesh_dim, bool) or not 0 <= mesh_dim < mesh.ndim:
        raise TileLinkError(f"tilelink.init: mesh_dim={mesh_dim!r} is neither a dimension name of the DeviceMesh "
                            f"({list(names)}) nor an index below its {mesh.ndim} dimensions")
    return mesh.get_group(mesh_dim)


def _resolve_group(group, mesh, mesh_dim):
    """What :func:`init` was asked to join: ``(process group, the job's rank of each of its ranks)``, or
    ``(None, None)`` for the whole job. Raises, saying what to pass, on anything else."""
    if mesh is not None:
        if group is not None:
            raise TileLinkError("tilelink.init: pass either group= or mesh= (with mesh_dim=), not both")
        if not _is_device_mesh(mesh):
            raise TileLinkError(f"tilelink.init(mesh=...): expected a torch.distributed DeviceMesh, got "
                                f"{type(mesh).__name__}")
        group = _mesh_group(mesh, mesh_dim)
    elif mesh_dim is not None:
        raise TileLinkError(f"tilelink.init(mesh_dim={mesh_dim!r}) needs the DeviceMesh too: "
                            f"tilelink.init(mesh=mesh, mesh_dim={mesh_dim!r})")
    elif _is_device_mesh(group):
        group = _mesh_group(group, None)
    if group is None:
        return None, None
    outside = isinstance(group, int) and not isinstance(group, bool) and group == dist.GroupMember.NON_GROUP_MEMBER
    if not outside and not isinstance(group, dist.ProcessGroup):
        raise TileLinkError(f"tilelink.init(group=...): expected a torch.distributed ProcessGroup or a 1-D "
                            f"DeviceMesh, got {type(group).__name__}")
    if not dist.is_initialized():
        raise NotInitializedError(
            "tilelink.init(group=...): torch.distributed is not initialised in this process, so the group cannot "
            "be one of its groups: call torch.distributed.init_process_group() (or init_device_mesh) first, make "
            "the group, then pass it")
    if outside:
        raise TileLinkError(
            f"tilelink.init(group=...): this process (rank {dist.get_rank()} of the job) is not a member of the "
            f"group: torch.distributed.new_group returns a placeholder on the ranks outside it. Pass each process "
            f"the group it belongs to (every process makes every group, and keeps the one holding its rank)")
    if group is dist.group.WORLD:
        return None, None
    ranks = tuple(dist.get_process_group_ranks(group))
    if dist.get_rank() not in ranks:
        raise TileLinkError(
            f"tilelink.init(group=...): this process (rank {dist.get_rank()} of the job) is not a member of the "
            f"group (ranks {list(ranks)}): pass each process the group it belongs to")
    return group, ranks


def _namespace(ranks: tuple[int, ...]) -> str:
    """The name of a group in the store and in file names: its ranks, or a digest of them for a large group."""
    if len(ranks) <= 16:
        return "g" + ".".join(map(str, ranks))
    digest = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]
    return f"g{len(ranks)}x{digest}"


def _describe_namespace(namespace: str) -> str:
    if "x" in namespace:
        return f"a group of {namespace[1:].split('x')[0]} ranks"
    return f"ranks {[int(r) for r in namespace[1:].split('.')]}"


def _join_group(store, ranks: tuple[int, ...], rank: int, emulated: bool) -> str:
    """Meet the other ranks of the group in the store; returns the group's session id (its store prefix and
    file names).

    Each process says which group it joins at this point (its ``init`` count) and waits, bounded, until every
    rank of its group has said so: a member that joined another group (passed another mesh dimension, or another
    rank's group) is named at once instead of leaving this one to wait out its budget."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    namespace = _namespace(ranks)
    me = ranks[rank]

    def declared(job_rank: int) -> str:
        return f"tilelink/join/{restart}/{_generation}/{job_rank}"

    key = f"tilelink/session/{restart}/{namespace}/{_generation}"
    if rank == 0:  # before its declaration: a peer that has seen the declaration finds the session
        base = os.environ.get("TILELINK_SESSION") or f"{uuid.uuid4().hex[:12]}-{os.getpid()}"
        store.set(key, f"{base}-{namespace}")
    store.set(declared(me), namespace)
    budget = skew_timeout_s(emulated)
    deadline = time.monotonic() + budget
    pending = [r for r in ranks if r != me]
    pause = 1e-4
    while pending:
        arrived = [r for r in pending if store.check([declared(r)])]
        for job_rank in arrived:
            other = store.get(declared(job_rank)).decode()
            if other != namespace:
                raise WorldMismatchError(
                    f"rank {me} of the job joins TileLink with the group of ranks {list(ranks)}, but rank {job_rank}, "
                    f"a member of it, joined another group ({_describe_namespace(other)}): every rank of a group must "
                    f"pass that same group (the same mesh dimension) to tilelink.init")
        pending = [r for r in pending if r not in arrived]
        if not pending:
            break
        if time.monotonic() > deadline:
            raise HandshakeTimeout(rank=rank, peer=ranks.index(pending[0]), call=_generation, seen=-1,
                                   budget_s=budget, what=f"tilelink.init(group=ranks {list(ranks)})",
                                   others=[ranks.index(r) for r in pending[1:]])
        time.sleep(pause)
        pause = min(pause * 2, 5e-3)
    return store.get(key).decode()


def init(backend: str | None = None, *, group=None, mesh=None, mesh_dim=None) -> World:
    """Join the world described by the ``torchrun`` environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); a world of one without them.

    ``backend`` is ``"emulated"`` or ``"nvshmem"``; by default ``TILELINK_BACKEND``, else emulated
    under ``TRITON_INTERPRET=1`` or without CUDA, else nvshmem. Idempotent. Without a GPU and without
    ``TRITON_INTERPRET=1``, the default backend refuses (no kernel could run) and says how to emulate.

    ``group``: the ``torch.distributed`` ProcessGroup this process belongs to, or a 1-D DeviceMesh
    (``mesh["tp"]``); ``mesh`` and ``mesh_dim``: a DeviceMesh and the name (or index) of the dimension whose
    groups are TileLink's worlds (``mesh_dim="tp"``). The world is then this process's group: :func:`rank` and
    :func:`world_size` are the group's, symmetric buffers and operators belong to it, and its host coordination
    never meets another group's. ``torch.distributed`` must be up already (it made the group). A process
    belongs to one world at a time: ``finalize()`` before joining another; ``init()`` without a group returns
    the world already joined.
    """
    global _world, _control, _atexit_registered, _generation
    name = backend or default_backend()
    if name not in BACKENDS:
        raise TileLinkError(f"unknown TileLink backend {name!r}: use one of {', '.join(BACKENDS)}")
    asked = group is not None or mesh is not None or mesh_dim is not None
    if _world is not None:
        if _world.backend != name:
            raise TileLinkError(
                f"tilelink is already initialised with backend {_world.backend!r}; call "
                f"tilelink.finalize() before init(backend={name!r})"
            )
        if not asked:
            return _world
        group, ranks = _resolve_group(group, mesh, mesh_dim)
        if group is _world.group or (group is not None and _world.group is not None and ranks == _world.ranks):
            return _world
        joined = (f"the group of ranks {list(_world.ranks)}" if _world.group is not None
                  else f"the whole job ({_world.world_size} ranks)")
        asked_for = f"the group of ranks {list(ranks)}" if group is not None else "the whole job"
        raise TileLinkError(
            f"tilelink is already initialised on {joined}, and init was called again for {asked_for}: a process "
            f"belongs to one TileLink world at a time. Pass the group to the first tilelink.init, or call "
            f"tilelink.finalize() before joining another")
    if backend is None and name == "emulated" and not interpreting() and not torch.cuda.is_available():
        raise TileLinkError(_no_gpu_message())
    group, ranks = _resolve_group(group, mesh, mesh_dim) if asked else (None, None)
    _bootstrap_process_group()
    _generation += 1
    store = _default_store()
    emulated = name == "emulated"
    if group is None:
        session = _session_id(store)
        rank, size = dist.get_rank(), dist.get_world_size()
        ranks = tuple(range(size))
    else:
        rank, size = ranks.index(dist.get_rank()), len(ranks)
        session = _join_group(store, ranks, rank, emulated)
    control = Control(store, rank, size, f"tilelink/{session}/{_generation}", emulated=emulated,
                      ranks=ranks if group is not None else None)
    _control = control
    impl = _make_backend(name, session, control)
    _world = World(rank=impl.rank, world_size=impl.world_size, local_rank=impl.local_rank,
                   backend=impl.name, device=impl.device, impl=impl, session=session, control=control,
                   group=group, ranks=ranks)
    _install_excepthook()
    if not _atexit_registered:
        atexit.register(finalize)
        _atexit_registered = True
    return _world


def control() -> Control:
    """The current world's :class:`~tilelink.runtime.control.Control` (also while ``finalize()`` runs)."""
    if _control is None:
        current_world()  # raises NotInitializedError
    return _control


def _install_excepthook() -> None:
    global _previous_excepthook
    if _previous_excepthook is not None:
        return
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook


def _excepthook(exc_type, exc, tb) -> None:
    """An exception ended the program: tell the peers first (their waits for this rank stop), then print it;
    ``finalize()`` at exit then leaves without a collective."""
    global _uncaught
    _uncaught = exc
    with contextlib.suppress(Exception):
        report_failure(exc)
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def report_failure(exc: BaseException) -> None:
    """This rank fails with ``exc``: announce it to the peers (a wait of theirs for this rank stops at once with
    :class:`~tilelink.runtime.diagnostics.PeerFailedError`) and, under ``tlxform run`` (``TILELINK_FAILURE_DIR``),
    leave a record for the launcher to name the rank that failed first. Once per process; never raises."""
    global _reported
    if _reported:
        return
    _reported = True
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if _control is not None:
        _control.announce("failed", f"{type(exc).__name__}: {first_line}"[:500])
    folder = os.environ.get("TILELINK_FAILURE_DIR")
    if not folder:
        return
    # the launcher's rank (the job's): in a world of a group, two groups have a rank 0 each
    rank = _world.global_rank if _world is not None else _env_int("RANK", 0)
    cls = type(exc)
    record = {"rank": rank, "time": time.time(), "pid": os.getpid(), "type": f"{cls.__module__}.{cls.__qualname__}",
              "name": cls.__name__, "message": str(exc)[:4000], "consequence": is_consequence(exc),
              "traceback": "".join(traceback.format_exception(cls, exc, exc.__traceback__))[-20000:]}
    with contextlib.suppress(Exception):
        path = os.path.join(folder, f"rank{rank}.json")
        with open(path + ".tmp", "w") as out:
            json.dump(record, out)
        os.replace(path + ".tmp", path)


def _failing() -> bool:
    """Whether this process is failing: an uncaught exception ended it, or one is being handled (``finalize()``
    called from an ``except`` or a ``finally`` clause). A ``sys.exit(0)`` is not a failure."""
    if _uncaught is not None:
        return True
    exc = sys.exc_info()[1]
    if exc is None:
        return False
    if isinstance(exc, SystemExit):
        return exc.code not in (None, 0)
    return True


def finalize() -> None:
    """Free every symmetric buffer, tear the backend down and leave the control group. Idempotent;
    also runs at exit.

    After an exception (at exit, or called from an ``except``/``finally`` clause) it only drops the world
    (:func:`abandon`): the peers may be stuck or gone, and a collective would wait for them. Otherwise it tells
    the peers this rank finished (one still waiting for it at an operator's call stops with a message naming
    this rank) and tears down together with them; if a peer failed meanwhile, or does not come within the
    budget of a call's wait, it leaves without the collective teardown and says so on stderr."""
    global _world, _control, _owns_process_group
    if _world is None:
        return
    if _failing():
        abandon()
        return
    world, _world = _world, None
    control = world.control
    if control is not None:
        control.finalizing = True
        control.announce("finished", "called tilelink.finalize")
    destroy = True
    try:
        from tilelink.runtime import diagnostics, graphs, heap

        # read while the records exist (a captured call's from its replays, then every other call's that no check
        # has read yet); raised once torn down
        replayed = graphs.replay_timeout(world) or diagnostics.unread_timeout(world)
        recorded = graphs.replay_records()  # an MoE replay's expert ids out of range, which no later call read
        heap.release_all(world)
        world.impl.finalize()
        if _owns_process_group and world.world_size > 1 and control is not None:
            # Leave together: the store's barrier (bounded, watching the peers) says every rank is here, then a
            # gloo barrier wakes them all at once. A rank leaving on its own poll of the store went on to init()
            # again while rank 0 still served the old store on the same MASTER_PORT, and met the old world there.
            control.barrier("tilelink.finalize (leaving)")
            try:
                dist.barrier()
            except RuntimeError as exc:  # a peer died in between
                raise PeerFailedError(f"rank {world.rank}: a peer was lost in finalize's last barrier ({exc})",
                                      rank=world.rank) from None
        if replayed is not None:
            raise replayed
        if recorded is not None:
            raise recorded
    except (PeerFailedError, HandshakeTimeout, WorldMismatchError) as exc:
        # a peer failed or went elsewhere: nothing left to tear down together, and nothing this rank did wrong
        sys.stderr.write(f"tilelink.finalize: rank {world.rank} left without the collective teardown: {exc}\n")
        destroy = False
        _drop(world)
    finally:
        _control = None
        if control is not None:
            control.store = None  # the old world (a launcher may still hold it) keeps no connection to its store
        if destroy and _owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        _owns_process_group = False


def _drop(world: World) -> None:
    from tilelink.runtime import heap

    heap.forget_all()
    abandon_backend = getattr(world.impl, "abandon", None)
    if abandon_backend is not None:
        abandon_backend()


def abandon() -> None:
    """Forget the world without collective teardown (a rank that failed: its peers may be stuck or
    gone). Memory goes with the process; the emulated backend removes its leftover files. The peers are
    told this rank failed."""
    global _world, _control, _owns_process_group
    if _world is None:
        return
    world, _world = _world, None
    if world.control is not None:
        exc = _uncaught or sys.exc_info()[1]
        world.control.announce("failed", f"{type(exc).__name__}: {str(exc).strip()[:300]}" if exc is not None
                               else "left the world without tilelink.finalize (tilelink.runtime.world.abandon)")
    try:
        _drop(world)
    finally:
        _control = None
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
