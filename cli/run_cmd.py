"""``tlxform run``: start a world of local ranks running a script, like ``torchrun``.

Each rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (and, with
``--emulate``, ``TRITON_INTERPRET=1`` and ``TILELINK_BACKEND=emulated``) and calls ``tilelink.init()``
itself. Output is streamed line by line, prefixed ``[rank i]``. If a rank fails, the others are
stopped and the command exits with that rank's code; ``--timeout`` stops everything after so long.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import click

_GRACE_S = 2.0


def _pump(rank: int, stream, lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            click.echo(f"[rank {rank}] {line}")
    stream.close()


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + _GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
    session = f"{uuid.uuid4().hex[:12]}-{os.getpid()}"
    base_env = dict(os.environ)
    base_env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                     "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                     "TILELINK_SESSION": session, "PYTHONUNBUFFERED": "1"})
    if emulate:
        base_env.update({"TRITON_INTERPRET": "1", "TILELINK_BACKEND": "emulated"})
    lock = threading.Lock()
    processes: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    failed: tuple[int, int] | None = None
    timed_out = False
    try:
        for rank in range(nproc):
            env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
            process = subprocess.Popen([sys.executable, script, *script_args], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            processes.append(process)
            pump = threading.Thread(target=_pump, args=(rank, process.stdout, lock), daemon=True)
            pump.start()
            pumps.append(pump)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in processes]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(processes)
        raise
    finally:
        _stop(processes)
        for pump in pumps:
            pump.join(timeout=2)
        remove_session_files(session)
    if timed_out:
        pending = [r for r, p in enumerate(processes) if p.returncode not in (0,)]
        click.echo(f"tlxform run: timed out after {timeout:g} s; ranks {pending} had not finished "
                   f"and were stopped", err=True)
        sys.exit(124)
    if failed is not None:
        rank, code = failed
        how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        click.echo(f"tlxform run: rank {rank} {how}; the other ranks were stopped", err=True)
        sys.exit(code if code > 0 else 1)
