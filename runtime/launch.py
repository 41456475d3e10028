"""``tilelink.spawn``: run a function on every rank of a fresh world of local processes.

Each rank is a fresh process (see :func:`_start_context`), given the torchrun variables (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), initialised with
``tilelink.init(backend)``; it runs ``fn(*args, **kwargs)`` and sends back the result or its
exception. No silent hangs: a failing rank fails the whole call (the others are stopped after a
short grace), and an overall timeout stops every rank and names the ones that had not finished.

The failure reported is the rank that failed FIRST: an exception raised by the rank's own work, by
the time it was raised, before one that only follows from another rank's failure (a peer's socket
closed, a wait whose peer announced its failure); a rank killed by a signal, or whose process could not
start (``fn`` not importable there), is named as such.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import multiprocessing as mp
import os
import pickle
import queue as queue_module
import random
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from multiprocessing import reduction
from multiprocessing.reduction import ForkingPickler
from typing import Any

from tilelink.errors import TileLinkError

DEFAULT_SPAWN_TIMEOUT_S = 300.0
STACK_DUMP_MARGIN_S = 5.0  # a rank prints its stack this long before the parent stops it
#: after a failure that only follows from another's (a peer's socket closed), how long to wait for the cause
FAILURE_GRACE_S = 3.0
#: after a failure of a rank's own, how long to collect the others (one that failed at the same moment may
#: have failed first)
SETTLE_S = 0.5

_environ_lock = threading.Lock()


class RankFailedError(TileLinkError):
    """A rank of a spawned world raised. ``rank``, ``exc_type`` (qualified name) and
    ``rank_traceback`` (the text) say where; the message holds the rank's traceback."""

    rank: int = -1
    exc_type: str = ""
    rank_traceback: str = ""


class SpawnTimeout(TileLinkError):
    """A spawned world did not finish in time; ``pending`` lists the ranks still running."""

    def __init__(self, message: str, pending: list[int]) -> None:
        super().__init__(message)
        self.pending = pending


#: ``MASTER_PORT`` candidates: below Linux's ephemeral range (32768-60999), so that no socket's automatic
#: port takes one between the check here and rank 0's bind, seconds later (EADDRINUSE)
PORT_RANGE = (20000, 32000)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for ``MASTER_PORT``), outside the ephemeral range."""
    rng = random.Random()  # not the global generator, which callers may have seeded alike in every process
    for _ in range(200):
        port = rng.randrange(*PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range: any free port
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _describe_exception(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    info: dict[str, Any] = {
        "module": cls.__module__,
        "qualname": cls.__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(cls, exc, exc.__traceback__)),
        "pickled": None,
        "args": None,
        "attrs": {},
    }
    with contextlib.suppress(Exception):
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt (keyword-only __init__)
        info["pickled"] = blob
    with contextlib.suppress(Exception):
        info["args"] = pickle.dumps(exc.args)
    for key, value in vars(exc).items():
        with contextlib.suppress(Exception):
            info["attrs"][key] = pickle.dumps(value)
    return info


def _rebuild_exception(rank: int, info: dict[str, Any], note: str = "") -> BaseException:
    """The rank's exception, re-created in this process with the rank and its traceback in the
    message; always a :class:`TileLinkError` (non-TileLink types are mixed with RankFailedError)."""
    header = f"rank {rank} failed with {info['qualname']}: {info['message']}{note}"
    message = f"{header}\n\n--- traceback of rank {rank} ---\n{info['traceback'].rstrip()}"
    cls: type | None = None
    with contextlib.suppress(Exception):
        cls = importlib.import_module(info["module"])
        for part in info["qualname"].split("."):
            cls = getattr(cls, part)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = None

    exc: BaseException | None = None
    if cls is not None and not issubclass(cls, TileLinkError):
        with contextlib.suppress(TypeError):
            # its message is the rank's header and traceback, whatever the original type's __str__ shows
            cls = type(cls.__name__, (RankFailedError, cls), {"__module__": cls.__module__,
                                                               "__str__": BaseException.__str__})
    if cls is not None and issubclass(cls, TileLinkError):
        with contextlib.suppress(Exception):
            exc = cls.__new__(cls)
            for key, blob in info["attrs"].items():
                with contextlib.suppress(Exception):
                    setattr(exc, key, pickle.loads(blob))
            BaseException.__init__(exc, message)
    if exc is None:
        exc = RankFailedError(message)
    exc.rank_failed = rank  # the spawned rank (WaitTimeout.rank is the rank that waited)
    exc.exc_type = f"{info['module']}.{info['qualname']}"
    exc.rank_traceback = info["traceback"]
    if isinstance(exc, RankFailedError):
        exc.rank = rank
    return exc


def _join_groups(backend: str, rank: int, world_size: int, groups: tuple[tuple[int, ...], ...]) -> None:
    """Bring up ``torch.distributed`` over every rank, make every group (collective: each rank makes each, in
    one order) and join TileLink with the one holding ``rank``."""
    import torch.distributed as dist

    from tilelink.runtime import world

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    mine = None
    for ranks in groups:
        group = dist.new_group(list(ranks))
        if rank in ranks:
            mine = group
    world.init(backend, group=mine)


def _leave_groups() -> None:
    """After a world of groups: wait for every rank of the job before leaving, since rank 0's process hosts the
    store another group may still be using, then take ``torch.distributed`` down."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _rank_main(rank: int, environ: dict[str, str], backend: str, work: bytes, results,
               deadline: float | None = None, groups: tuple[tuple[int, ...], ...] | None = None,
               stdio: tuple[int, ...] = (), main: dict[str, str] | None = None) -> None:
    """Body of one rank's process. ``environ`` is the caller's environment with the rank's variables: a rank
    forked by the server inherits the server's, from when it started. ``work`` is ``(fn, args, kwargs)``
    pickled, loaded only once the environment is the caller's (loading imports ``fn``'s module, whose kernels
    read ``TRITON_INTERPRET`` when they are defined). A rank still running shortly before the parent gives up
    on it (``deadline``, wall-clock seconds) prints every thread's Python stack to stderr, so a hang says
    where it is. ``groups``: TileLink's worlds are these groups of the job's ranks (see :func:`spawn`). ``stdio``:
    descriptors to take as stdout and stderr (see :class:`_ParentFd`); ``main``: the caller's ``__main__`` to import
    here (see :func:`_startable_main`)."""
    for target, fd in zip((1, 2)[:len(stdio)], stdio, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(environ)
    try:
        if main:  # the caller's __main__, left to this point by the start (see _startable_main)
            from multiprocessing import spawn as mp_spawn

            mp.current_process()._inheriting = True  # as multiprocessing imports it: a spawn there is refused
            try:
                mp_spawn.prepare(main)
            finally:
                del mp.current_process()._inheriting
        fn, args, kwargs = pickle.loads(work)
    except BaseException:  # noqa: BLE001 - the parent names this rank as one that could not start
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    results.put((rank, "started", None, time.time()))  # fn and its arguments were unpickled: importable here
    if deadline is not None:
        faulthandler.dump_traceback_later(max(deadline - time.time() - STACK_DUMP_MARGIN_S, 1.0), exit=False)
    import torch

    torch.set_num_threads(1)  # ranks share the host's cores
    from tilelink.runtime import world
    from tilelink.runtime.diagnostics import is_consequence

    try:
        if backend == "nvshmem" and torch.cuda.is_available():
            from tilelink.runtime.nvshmem import rank_device_index

            torch.cuda.set_device(rank_device_index(int(environ["LOCAL_RANK"]), int(environ["LOCAL_WORLD_SIZE"]),
                                                    torch.cuda.device_count()))
        if groups is None:
            world.init(backend)
        else:
            _join_groups(backend, rank, int(environ["WORLD_SIZE"]), groups)
        result = fn(*args, **kwargs)
        payload = pickle.dumps(result)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        when = time.time()
        world.report_failure(exc)  # first: a peer waiting for this rank stops now, not after its budget
        info = _describe_exception(exc)
        info["consequence"] = is_consequence(exc)
        results.put((rank, "error", info, when))
        world.abandon()  # no collective teardown: the other ranks may be stuck or gone
        return
    results.put((rank, "ok", payload, time.time()))
    faulthandler.cancel_dump_traceback_later()
    try:
        world.finalize()
        if groups is not None:
            _leave_groups()
    except Exception:  # the result is delivered; a teardown failure is only worth a note
        traceback.print_exc()


def _check_target(fn) -> None:
    """Refuse, before starting anything, a ``fn`` the ranks could not import: they are fresh processes (a new
    interpreter, or a fork of a server that has imported only torch and Triton) that find ``fn`` by its module and
    name."""
    import __main__

    name = getattr(fn, "__qualname__", repr(fn))
    main_file = getattr(__main__, "__file__", None)
    if getattr(fn, "__module__", None) == "__main__" and (main_file is None or not os.path.isfile(main_file)):
        source = "a script read from stdin" if main_file == "<stdin>" else "python -c or an interactive session"
        raise TileLinkError(
            f"spawn: {name} is defined in {source}, which the ranks cannot import: they are fresh processes that "
            f"import the function from its file. Put it in an importable .py file (a module, or a script run as "
            f"`python file.py`) and pass that")
    try:
        pickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - reported with what to do
        raise TileLinkError(
            f"spawn: {name} cannot be sent to the ranks ({type(exc).__name__}: {exc}): it must be a module-level "
            f"function of an importable .py file (not a lambda or a nested function)") from None


#: what the emulated ranks' fork server imports once, so that each rank starts in a fraction of a second
#: instead of importing torch and Triton again (seconds a rank, on every call), and libcst, which a rank's
#: decorated kernels import with the rewriter even where they read their rewrites back (a second)
_FORKSERVER_PRELOAD = ["torch", "triton", "triton.language", "libcst", "libcst.matchers", "libcst.metadata"]
_server_lock = threading.Lock()
_own_fork_server = False  # the fork server runs because TileLink started it


def _start_context(backend: str):
    """How the ranks start. On Linux, emulated ranks fork from multiprocessing's fork server, which TileLink starts
    with torch, Triton and libcst imported (and nothing of TileLink or the caller's, which each rank imports afresh, as
    with ``spawn``), in the caller's environment of then; the process's own later use of the fork server shares
    it. Where the fork server already runs, started by someone else (its imports and environment unknown), where
    forking after such imports is not safe (macOS) or there is none (Windows), and for NVSHMEM ranks, each rank
    starts with ``spawn``: a new interpreter."""
    global _own_fork_server
    if backend != "emulated" or not sys.platform.startswith("linux"):
        return mp.get_context("spawn")
    from multiprocessing import forkserver

    with _server_lock:
        running = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None) is not None
        if running and not _own_fork_server:
            return mp.get_context("spawn")
        ctx = mp.get_context("forkserver")
        if not running:
            ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)
        with _environ_lock:
            # (re)started here, in the caller's environment: not inside a start, with the ranks' TRITON_INTERPRET
            # set (each rank sets its own), nor while another thread's start has it set
            forkserver.ensure_running()
        _own_fork_server = True
        return ctx


class _Pickled:
    """``(fn, args, kwargs)``, pickled as each rank starts (so that a tensor's descriptor or a queue travels with
    that start, as the process's own arguments would) and loaded by the rank only once its environment and
    ``__main__`` are the caller's (:func:`_rank_main`)."""

    def __init__(self, work: tuple) -> None:
        self.work = work

    def __reduce__(self):
        try:
            blob = bytes(ForkingPickler.dumps(self.work))
        except Exception as exc:  # noqa: BLE001 - reported with what to do
            fn = self.work[0]
            raise TileLinkError(f"spawn: the arguments of {getattr(fn, '__qualname__', repr(fn))} cannot be sent to "
                                f"the ranks ({type(exc).__name__}: {exc}): pass picklable values") from exc
        return bytes, (blob,)


class _ParentFd:
    """The caller's file descriptor ``fd``, received by a forked rank as a descriptor of its own. A fork server's
    ranks write where the server's stdout and stderr went when it started (in a test, an earlier test's
    capture); each rank points its own at the caller's current ones instead, as a new interpreter would."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _received_fd, (reduction.DupFd(self.fd),)


def _received_fd(dup) -> int:
    return dup.detach()


def _parent_stdio() -> tuple:
    """``(stdout, stderr)`` for ranks forked from the fork server to take over: they do not inherit the caller's
    (see :class:`_ParentFd`)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    fds = []
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:  # closed here: the rank keeps the server's
            return ()
        fds.append(_ParentFd(fd))
    return tuple(fds)


@contextlib.contextmanager
def _startable_main(deferred: bool = False):
    """While the ranks start: a ``__main__`` whose ``__file__`` is not a file (a script read from stdin) is
    not re-run by them (multiprocessing's spawn would, and fail with FileNotFoundError). With ``deferred`` (ranks
    forked from the fork server), ``__main__`` is hidden from the start too and yielded as what each rank imports
    itself once its environment is the caller's (:func:`_rank_main`): a script's kernels read ``TRITON_INTERPRET``
    as they are defined, and the server's environment is not the caller's. Yields ``{}`` otherwise."""
    from multiprocessing import spawn as mp_spawn

    import __main__

    main_file = getattr(__main__, "__file__", None)
    unreadable = main_file is not None and getattr(__main__, "__spec__", None) is None and not os.path.isfile(main_file)
    main: dict[str, str] = {}
    if deferred and not unreadable:
        data = mp_spawn.get_preparation_data("tilelink-rank")
        main = {key: data[key] for key in ("init_main_from_name", "init_main_from_path") if key in data}
    saved = {key: getattr(__main__, key) for key in ("__file__", "__spec__") if hasattr(__main__, key)}
    if unreadable or main:
        if "__file__" in saved:
            del __main__.__file__
        if "__spec__" in saved:
            __main__.__spec__ = None
    try:
        yield main
    finally:
        for key, value in saved.items():
            setattr(__main__, key, value)


def _check_groups(groups, world_size: int) -> tuple[tuple[int, ...], ...]:
    """``groups`` as tuples of ranks, if they split ``range(world_size)`` into disjoint groups; raises otherwise."""
    try:
        split = tuple(tuple(int(r) for r in ranks) for ranks in groups)
    except TypeError:
        raise TileLinkError(f"spawn: groups must be a list of lists of ranks, such as [[0, 1], [2, 3]], got "
                            f"{groups!r}") from None
    seen = sorted(r for ranks in split for r in ranks)
    if seen != list(range(world_size)) or any(not ranks for ranks in split):
        raise TileLinkError(f"spawn: groups {[list(g) for g in split]} must hold each rank of the {world_size} "
                            f"once (a partition of 0..{world_size - 1}): every process belongs to one TileLink world")
    return split


def spawn(fn, world_size: int, *args, backend: str = "emulated", groups=None, timeout: float | None = None,
          **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh local ranks; returns the results by rank.

    ``fn`` must be picklable (a module-level function) and so must its arguments and results.
    ``backend="emulated"`` runs the kernels under ``TRITON_INTERPRET=1`` on CPU processes;
    ``"nvshmem"`` puts rank ``r`` on GPU ``r`` when there are GPUs enough, else every rank on GPU 0
    (ranks spread unevenly over several GPUs hung NVSHMEM's init).
    ``groups`` (a list of lists of ranks splitting ``range(world_size)``, e.g. ``[[0, 1], [2, 3]]``): the job
    is ``world_size`` ranks of ``torch.distributed`` and each group is a TileLink world of its own, as with
    ``tilelink.init(group=...)`` (data parallel over tensor-parallel groups); ``fn`` sees its group's
    ``tilelink.rank()`` and ``world_size()``, and the results still come back by the job's rank.
    If a rank raises, the same exception type is raised here (always a ``TileLinkError``; other
    types are mixed with :class:`RankFailedError`) naming the rank and carrying its traceback.
    ``timeout`` (default ``TILELINK_SPAWN_TIMEOUT`` or 300 s) bounds the whole run.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        raise TileLinkError("spawn: called while a rank imports the caller's script, which calls spawn as it is "
                            "imported: put the call under `if __name__ == \"__main__\":`")
    if world_size < 1:
        raise TileLinkError(f"spawn: world_size must be at least 1, got {world_size}")
    if backend not in ("emulated", "nvshmem"):
        raise TileLinkError(f"spawn: unknown backend {backend!r}: use 'emulated' or 'nvshmem'")
    if timeout is None:
        timeout = float(os.environ.get("TILELINK_SPAWN_TIMEOUT", DEFAULT_SPAWN_TIMEOUT_S))
    _check_target(fn)
    if groups is not None:
        groups = _check_groups(groups, world_size)
    session = f"{uuid.uuid4().hex[:12]}-{os.getpid()}"
    port = free_port()
    work = _Pickled((fn, args, kwargs))
    ctx = _start_context(backend)
    forked = ctx.get_start_method() == "forkserver"
    stdio = _parent_stdio() if forked else ()
    results = ctx.Queue()
    processes = []
    child_environ = {"TRITON_INTERPRET": "1" if backend == "emulated" else None}
    try:
        with _environ_lock, _startable_main(deferred=forked) as main:
            saved = {key: os.environ.get(key) for key in child_environ}
            try:
                for key, value in child_environ.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
                for rank in range(world_size):
                    environ = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size),
                               "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TILELINK_SESSION": session,
                               "TILELINK_BACKEND": backend}
                    process = ctx.Process(target=_rank_main, name=f"tilelink-rank-{rank}",
                                          args=(rank, environ, backend, work, results, time.time() + timeout, groups,
                                                stdio, main),
                                          daemon=True)
                    process.start()
                    processes.append(process)
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        return _collect(processes, results, timeout, getattr(fn, '__qualname__', repr(fn)))
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        for process in processes:
            process.join(timeout=5)
        results.close()
        from tilelink.runtime.emulated import remove_session_files

        remove_session_files(session)


def _primary(status: str, payload) -> bool:
    """A failure of the rank's own (not one that only follows from another rank's)."""
    return status == "died" or not payload.get("consequence", False)


def _describe_death(rank: int, exitcode: int | None, started: bool, fn_name: str) -> str:
    if exitcode is not None and exitcode < 0:
        with contextlib.suppress(ValueError):
            return (f"rank {rank} was killed by signal {signal.Signals(-exitcode).name} before reporting a result "
                    f"(from outside the program, or by the out-of-memory killer)")
        return f"rank {rank} was killed by signal {-exitcode} before reporting a result"
    if not started:
        return (f"rank {rank} could not start: its process exited with code {exitcode} before running {fn_name}, "
                f"unable to import the function or unpickle its arguments (its traceback is on stderr above). "
                f"spawn's ranks are fresh processes: the function must live in an importable .py file, and its "
                f"arguments must be picklable")
    return (f"rank {rank} died with exit code {exitcode} before reporting a result (os._exit, or a crash of the "
            f"interpreter)")


def _summary(rank: int, status: str, payload, fn_name: str) -> str:
    if status == "died":
        return _describe_death(rank, *payload, fn_name)
    first = payload["message"].strip().splitlines()[0] if payload["message"].strip() else ""
    return f"rank {rank}: {payload['qualname']}: {first}"[:300]


def _collect(processes: list, results, timeout: float, fn_name: str = "fn") -> list:
    world_size = len(processes)
    outcome: dict[int, tuple[str, Any, float]] = {}  # rank -> (status, payload, when)
    started: set[int] = set()
    deadline = time.monotonic() + timeout
    settle: float | None = None  # after a failure: stop collecting then

    def take(message) -> None:
        rank, status, payload, when = message
        if status == "started":
            started.add(rank)
        else:
            outcome[rank] = (status, payload, when)

    while len(outcome) < world_size:
        now = time.monotonic()
        if settle is not None and now > settle:
            break
        if settle is None and now > deadline:
            pending = [r for r in range(world_size) if r not in outcome]
            raise SpawnTimeout(
                f"spawn: ranks {pending} of {world_size} had not finished after {timeout:g} s and "
                f"were stopped (raise TILELINK_SPAWN_TIMEOUT or the timeout argument if they are "
                f"just slow; a rank stuck in a collective or a wait means ranks diverged; each stuck rank "
                f"printed its Python stack to stderr {STACK_DUMP_MARGIN_S:g} s before)", pending)
        try:
            take(results.get(timeout=0.05))
        except queue_module.Empty:
            for rank, process in enumerate(processes):
                if rank in outcome or process.exitcode is None:
                    continue
                with contextlib.suppress(queue_module.Empty):  # what it sent before it exited may be in flight
                    while rank not in outcome:
                        take(results.get(timeout=0.5))
                if rank not in outcome:
                    outcome[rank] = ("died", (process.exitcode, rank in started), time.time())
        failures = {r: o for r, o in outcome.items() if o[0] != "ok"}
        if failures:
            own = any(_primary(status, payload) for status, payload, _ in failures.values())
            wait = SETTLE_S if own else FAILURE_GRACE_S
            settle = min(settle, time.monotonic() + wait) if settle is not None else time.monotonic() + wait

    failures = {r: o for r, o in outcome.items() if o[0] != "ok"}
    if not failures:
        return [pickle.loads(outcome[r][1]) for r in range(world_size)]
    own = [(when, r) for r, (status, payload, when) in failures.items() if _primary(status, payload)]
    first = min(own or [(when, r) for r, (_, _, when) in failures.items()])[1]
    status, payload, _ = failures[first]
    others = [_summary(r, s, p, fn_name) for r, (s, p, _) in sorted(failures.items(), key=lambda i: i[1][2])
              if r != first]
    note = ""
    if others:
        more = f"; and {len(others) - 4} more" if len(others) > 4 else ""
        note = "\nlater failures: " + "; ".join(others[:4]) + more
    if status == "died":
        exc = RankFailedError(_describe_death(first, *payload, fn_name) + note)
        exc.rank = first
        exc.rank_failed = first
        exc.exitcode = payload[0]
        raise exc
    raise _rebuild_exception(first, payload, note)
