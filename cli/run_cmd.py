"""``tlxform run``: start a world of local ranks running a script, like ``torchrun``.

Each rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (and, with
``--emulate``, ``TRITON_INTERPRET=1`` and ``TILELINK_BACKEND=emulated``) and calls ``tilelink.init()``
itself. Output is streamed line by line, prefixed ``[rank i]``, with a line when each rank starts and
ends. If a rank fails, the others are stopped within seconds and the command names the rank that failed
FIRST and how (its exception, from the record ``tilelink.init``'s exception hook leaves in
``TILELINK_FAILURE_DIR``; a signal; an exit code), exiting with that rank's code; ``--timeout`` stops
everything after so long. SIGTERM, SIGINT and SIGHUP are forwarded to the ranks, which are then reaped:
nothing is left running, nothing left in ``/dev/shm``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import click

_GRACE_S = 2.0  # a rank asked to stop (forwarded signal, or the world failed) gets this long before SIGKILL
_POLL_S = 0.05
#: after a rank failed on its own (its exception, a signal, an exit code): how long the others get to exit by
#: themselves before they are stopped. They learn of the failure within a fraction of a second (the world's
#: store) and fail in turn; a Python process with torch and Triton loaded takes about a second to exit.
_SETTLE_S = 3.0
#: after a failure that only follows from another rank's (a peer's socket closed, a peer announced its failure):
#: how long to wait for the rank that caused it to report
_CONSEQUENCE_GRACE_S = 5.0
#: emulated ranks per CPU core beyond which the run is warned about (each is a Python process running Triton's
#: interpreter); and what one such rank takes in memory
_OVERSUBSCRIBED = 4
_RANK_MEMORY_MB = 160
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _pump(rank: int, stream, lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            click.echo(f"[rank {rank}] {line}")
    stream.close()


def _say(lock: threading.Lock, message: str) -> None:
    with lock:
        click.echo(f"tlxform run: {message}", err=True)


def _stop(processes: list[subprocess.Popen], signum: int = signal.SIGTERM) -> list[int]:
    """Send ``signum`` to every rank still running, SIGKILL the ones still there after the grace; returns the
    ranks that were still running."""
    running = [rank for rank, process in enumerate(processes) if process.poll() is None]
    for rank in running:
        with contextlib.suppress(ProcessLookupError):
            processes[rank].send_signal(signum)
    deadline = time.monotonic() + _GRACE_S
    for rank in running:
        process = processes[rank]
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return running


def _die_with_launcher():
    """``preexec_fn`` of a rank: it gets SIGKILL if the launcher dies (even by SIGKILL, which no handler sees)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl = getattr(libc, "prctl", None)
    if prctl is None:
        return None

    def child() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return child


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _records(folder: str) -> dict[int, dict]:
    """The failure records the ranks left (``tilelink.runtime.world.report_failure``), by rank."""
    found = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith("rank") and name.endswith(".json"):
                with contextlib.suppress(OSError, ValueError):
                    with open(os.path.join(folder, name)) as handle:
                        record = json.load(handle)
                    found[int(record["rank"])] = record
    return found


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0][:400] if text else ""


def _failures(ended: dict[int, tuple[int, float]], records: dict[int, dict], stopped: set[int]):
    """Every failure so far, ``[(own, when, rank, text, code)]``: ``own`` when it is the rank's own failure (not
    one that only follows from another's), ``when`` wall-clock seconds; ranks the launcher stopped are not."""
    out = []
    for rank in sorted(set(records) | {r for r, (code, _) in ended.items() if code != 0}):
        if rank in stopped and rank not in records:
            continue
        code = ended.get(rank, (1, 0.0))[0]
        record = records.get(rank)
        if record is not None:
            text = f"rank {rank} failed with {record.get('name', '?')}: {_first_line(record.get('message', ''))}"
            out.append((not record.get("consequence", False), float(record.get("time", 0.0)), rank, text, code))
        else:
            out.append((True, ended[rank][1], rank, f"rank {rank} {_describe_exit(code)}", code))
    return out


def _first(failures):
    own = [f for f in failures if f[0]]
    return min(own or failures, key=lambda f: f[1])


def _check_machine(nproc: int, emulate: bool, lock: threading.Lock) -> None:
    """Refuse a GPU run without a GPU; warn about an emulated world far larger than the machine."""
    if not emulate:
        import torch

        if not torch.cuda.is_available():
            raise click.UsageError(
                f"no GPU here (torch.cuda.is_available() is False): add --emulate to run the {nproc} rank(s) as CPU "
                f"processes under Triton's interpreter (tlxform run -n {nproc} --emulate ...)")
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    available_mb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available_mb = int(line.split()[1]) // 1024
    need_mb = nproc * _RANK_MEMORY_MB
    short_of_memory = available_mb is not None and need_mb > 0.8 * available_mb
    if nproc > _OVERSUBSCRIBED * cores or short_of_memory:
        memory = f" and {available_mb / 1024:.1f} GB of memory available" if available_mb is not None else ""
        risk = ", and swapping or the out-of-memory killer" if short_of_memory else ""
        _say(lock, f"warning: {nproc} emulated ranks on {cores} CPU core(s){memory}: each rank is a Python process "
                   f"running Triton's interpreter (about {_RANK_MEMORY_MB} MB each, {need_mb / 1024:.1f} GB in all), "
                   f"so expect minutes before the first output{risk}. A few ranks (-n 2 to 4) exercise the same "
                   f"code paths.")


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-n", "--nproc", "nproc", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number of ranks (processes).")
@click.option("--emulate", is_flag=True,
              help="Emulated world of CPU processes: TRITON_INTERPRET=1, TILELINK_BACKEND=emulated.")
@click.option("--timeout", type=float, default=None,
              help="Stop every rank after this many seconds (default: TILELINK_RUN_TIMEOUT, else none).")
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run(nproc: int, emulate: bool, timeout: float | None, script: str, script_args: tuple[str, ...]) -> None:
    """Run SCRIPT on NPROC local ranks (like torchrun), streaming each rank's output."""
    from tilelink.runtime.emulated import remove_session_files
    from tilelink.runtime.launch import free_port

    if timeout is None and os.environ.get("TILELINK_RUN_TIMEOUT"):
        timeout = float(os.environ["TILELINK_RUN_TIMEOUT"])
    lock = threading.Lock()
    _check_machine(nproc, emulate or os.environ.get("TRITON_INTERPRET") == "1", lock)
    session = f"{uuid.uuid4().hex[:12]}-{os.getpid()}"
    failure_dir = tempfile.mkdtemp(prefix="tilelink-run-")
    base_env = dict(os.environ)
    base_env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                     "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                     "TILELINK_SESSION": session, "TILELINK_FAILURE_DIR": failure_dir, "PYTHONUNBUFFERED": "1"})
    if emulate:
        base_env.update({"TRITON_INTERPRET": "1", "TILELINK_BACKEND": "emulated"})
    processes: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    started: list[float] = []
    ended: dict[int, tuple[int, float]] = {}  # rank -> (exit code, wall-clock time it was seen)
    stopped: set[int] = set()  # ranks this launcher stopped
    interrupted: int | None = None
    timed_out = False

    def on_signal(signum, frame):  # noqa: ARG001
        raise _Interrupted(signum)

    previous = {}
    with contextlib.suppress(ValueError):  # not the main thread: no handlers (and no forwarding)
        for signum in _FORWARDED:
            previous[signum] = signal.signal(signum, on_signal)

    def note_exits() -> None:
        for rank, process in enumerate(processes):
            code = process.poll()
            if code is None or rank in ended:
                continue
            ended[rank] = (code, time.time())
            if rank not in stopped:
                _say(lock, f"rank {rank} {'finished' if code == 0 else _describe_exit(code)} after "
                           f"{time.monotonic() - started[rank]:.1f} s")

    try:
        try:
            preexec = _die_with_launcher()
            # every rank is started before any pump thread: nothing else runs while a rank's process forks
            for rank in range(nproc):
                env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
                process = subprocess.Popen([sys.executable, script, *script_args], env=env, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                           preexec_fn=preexec)
                processes.append(process)
                started.append(time.monotonic())
                _say(lock, f"rank {rank} of {nproc} started (pid {process.pid})")
            for rank, process in enumerate(processes):
                pump = threading.Thread(target=_pump, args=(rank, process.stdout, lock), daemon=True)
                pump.start()
                pumps.append(pump)
            deadline = None if timeout is None else time.monotonic() + timeout
            settle = None
            while True:
                note_exits()
                if len(ended) == nproc:
                    break
                failures = _failures(ended, _records(failure_dir), stopped)
                if failures:
                    wait = _SETTLE_S if any(f[0] for f in failures) else _CONSEQUENCE_GRACE_S
                    settle = min(settle or float("inf"), time.monotonic() + wait)
                if settle is not None and time.monotonic() > settle:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(_POLL_S)
        except _Interrupted as exc:
            interrupted = exc.signum
        for signum in _FORWARDED:  # the teardown below runs to its end; a second signal only hurries it
            with contextlib.suppress(ValueError):
                signal.signal(signum, signal.SIG_IGN)
        note_exits()
        stopped.update(_stop(processes, interrupted or signal.SIGTERM))
        note_exits()
    finally:
        for process in processes:  # whatever interrupted the above: nothing is left running
            if process.poll() is None:
                process.kill()
                process.wait()
        for pump in pumps:
            pump.join(timeout=2)
        remove_session_files(session)
        records = _records(failure_dir)
        shutil.rmtree(failure_dir, ignore_errors=True)
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)

    failures = _failures(ended, records, stopped)
    if interrupted is not None:
        name = signal.Signals(interrupted).name
        _say(lock, f"got {name}: forwarded it to ranks {sorted(stopped)} and stopped them" if stopped else
             f"got {name}; no rank was running")
        sys.exit(128 + interrupted)
    if timed_out:
        pending = sorted(stopped)
        culprit = ""
        if failures:
            culprit = f" ({_first(failures)[3]} first; its traceback is above)"
        _say(lock, f"timed out after {timeout:g} s; ranks {pending} had not finished and were stopped{culprit}")
        sys.exit(124)
    if failures:
        own, _, rank, text, code = _first(failures)
        tail = " (its traceback is above)" if rank in records else ""
        later = [f[3] for f in sorted(failures, key=lambda f: f[1]) if f[2] != rank]
        others = f"; ranks {sorted(stopped)} were stopped" if stopped else ""
        _say(lock, f"the first failure: {text}{tail}{others}")
        if later:
            _say(lock, "later failures (following from it, or stopped with it): " + "; ".join(later[:4])
                 + (f"; and {len(later) - 4} more" if len(later) > 4 else ""))
        sys.exit(code if code > 0 else 1)
