"""``tlxform run`` when things go wrong: a failing rank ends the run in seconds and is named first, with how it
failed; SIGTERM and SIGINT reach the ranks and nothing is left running or in /dev/shm; first mistakes (no GPU,
too many emulated ranks, a benchmark that measured nothing) say what to do.

The runs are real processes (``python -m tilelink.cli.main``): signals, exit codes and leftovers are the point.
Time bounds are generous for a slow 2-core machine and well below what each fault took before (a hang, stopped
here by ``--timeout``)."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from click.testing import CliRunner

from tilelink.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TLXFORM = [sys.executable, "-m", "tilelink.cli.main"]

#: rank 1 fails after the first ag_gemm call (how: argv[1]), while rank 0 goes on into the second one
FAILING_RANK = """
    import os, signal, sys, time
    import torch, tilelink
    from tilelink.ops import TPContext, ag_gemm

    how = sys.argv[1]
    ctx = TPContext(M=8) if "--ctx" in sys.argv else None
    world = tilelink.init()
    a, b = torch.randn(4, 16), torch.randn(16, 8)
    ag_gemm(a, b, ctx)
    print("first call done", flush=True)
    if world.rank == 1:
        time.sleep(0.5)
        if how == "raise":
            raise ValueError("boom on rank 1")
        os.kill(os.getpid(), signal.SIGKILL)
    ag_gemm(a, b, ctx)
"""


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TILELINK_WAIT_TIMEOUT", "TRITON_INTERPRET",
                                                           "TILELINK_BACKEND", "TILELINK_RUN_TIMEOUT")}
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run(args, env, timeout=200):
    start = time.monotonic()
    done = subprocess.run([*TLXFORM, "run", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    return done, time.monotonic() - start


def _rank_pids(text: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"tlxform run: rank \d+ of \d+ started \(pid (\d+)\)", text)]


def _assert_nothing_left(pids: list[int], launcher_pid: int) -> None:
    assert pids, "the ranks' start lines are missing"
    for pid in pids:
        alive = os.path.exists(f"/proc/{pid}")
        if alive:  # a zombie not yet reaped by init is gone for every purpose
            with open(f"/proc/{pid}/stat") as stat:
                alive = stat.read().split(")")[-1].split()[0] != "Z"
        assert not alive, f"rank process {pid} is still running"
    assert not glob.glob(f"/dev/shm/tilelink-*-{launcher_pid}-*"), "files left in /dev/shm"


@pytest.mark.slow
@pytest.mark.parametrize(("budget", "ctx"), [(None, False), ("2", True)], ids=["exchange", "handshake-budget-2"])
def test_a_rank_raising_ends_the_run_and_is_named_first(tmp_path, budget, ctx):
    """Rank 1 raises while rank 0 waits for it inside ag_gemm: both exit within seconds (rank 1 used to wait in
    its at-exit finalize for rank 0, which waited for rank 1), and rank 1's ValueError is the failure reported,
    not rank 0's wait (``TILELINK_WAIT_TIMEOUT=2`` once reported "rank 0 exited with code 1")."""
    script = _script(tmp_path, FAILING_RANK)
    args = ["-n", "2", "--emulate", "--timeout", "150", script, "raise"] + (["--ctx"] if ctx else [])
    done, elapsed = _run(args, _env(TILELINK_WAIT_TIMEOUT=budget))
    err = done.stderr
    assert done.returncode == 1, done.stdout[-2000:] + err[-3000:]
    first = "tlxform run: the first failure: rank 1 failed with ValueError: boom on rank 1 (its traceback is above)"
    assert first in err, err[-3000:]
    assert re.search(r"\[rank 1\] .*ValueError: boom on rank 1", done.stdout), done.stdout[-3000:]
    assert "timed out" not in err
    assert elapsed < 90, elapsed


@pytest.mark.slow
def test_under_torchrun_a_raising_rank_ends_the_world_in_seconds(tmp_path):
    """torchrun stops the world when a rank exits non-zero: the raising rank exits at once (no collective at exit)
    and the rank waiting for it inside ag_gemm stops too, saying why."""
    from tilelink.runtime.launch import free_port

    script = _script(tmp_path, FAILING_RANK)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), script, "raise"], capture_output=True, text=True, cwd=ROOT, timeout=200,
                          env=_env(TRITON_INTERPRET="1", TILELINK_BACKEND="emulated"))
    elapsed = time.monotonic() - start
    text = done.stdout + done.stderr
    assert done.returncode != 0, text[-3000:]
    assert "ValueError: boom on rank 1" in text
    assert "PeerFailedError: rank 0: rank 1 failed (ValueError: boom on rank 1)" in text, text[-3000:]
    assert elapsed < 90, elapsed


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named_with_it(tmp_path):
    """Rank 1 SIGKILLed during an op without a TPContext: the kill is the failure named, not rank 0's lost peer."""
    script = _script(tmp_path, FAILING_RANK)
    done, elapsed = _run(["-n", "2", "--emulate", "--timeout", "150", script, "kill"], _env())
    assert done.returncode == 1, done.stderr[-3000:]
    assert "tlxform run: the first failure: rank 1 was killed by signal SIGKILL" in done.stderr, done.stderr[-3000:]
    assert elapsed < 90, elapsed


@pytest.mark.slow
def test_a_rank_that_raised_but_hangs_at_exit_is_named_before_the_timeout(tmp_path):
    """Rank 1 raised but its process hangs at exit (a handler of the script's own); rank 0 is busy: the run
    ends in seconds naming rank 1's exception (``--timeout 40`` used to say "ranks [0, 1] had not finished")."""
    script = _script(tmp_path, """
        import atexit, time
        atexit.register(time.sleep, 600)  # runs after tilelink's own at-exit finalize
        import tilelink
        world = tilelink.init()
        print("initialised", flush=True)
        if world.rank == 1:
            raise ValueError("boom on rank 1")
        time.sleep(600)
    """)
    done, elapsed = _run(["-n", "2", "--emulate", "--timeout", "100", script], _env())
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the first failure: rank 1 failed with ValueError: boom on rank 1" in done.stderr, done.stderr[-3000:]
    assert "timed out" not in done.stderr
    assert elapsed < 60, elapsed


SLEEPER = """
    import time
    import tilelink
    tilelink.init()
    tilelink.runtime.symmetric_zeros((16,), __import__("torch").float32)
    print("ready", flush=True)
    time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_reaches_every_rank(tmp_path, signum):
    script = _script(tmp_path, SLEEPER)
    launcher = subprocess.Popen([*TLXFORM, "run", "-n", "2", "--emulate", "--timeout", "150", script],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(launcher.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while sum("] ready" in line for line in lines) < 2 and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.1)
    assert sum("] ready" in line for line in lines) == 2, "".join(lines)[-3000:]
    sent = time.monotonic()
    launcher.send_signal(signum)
    code = launcher.wait(timeout=60)
    elapsed = time.monotonic() - sent
    reader.join(timeout=5)
    text = "".join(lines)
    name = signal.Signals(signum).name
    assert code == 128 + signum, text[-3000:]
    assert f"tlxform run: got {name}: forwarded it to ranks [0, 1] and stopped them" in text, text[-3000:]
    assert elapsed < 15, elapsed
    _assert_nothing_left(_rank_pids(text), launcher.pid)


@pytest.mark.slow
def test_a_failed_run_leaves_nothing_behind(tmp_path):
    script = _script(tmp_path, FAILING_RANK)
    launcher = subprocess.Popen([*TLXFORM, "run", "-n", "2", "--emulate", "--timeout", "150", script, "raise"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT)
    text, _ = launcher.communicate(timeout=200)
    assert launcher.returncode == 1, text[-3000:]
    assert re.search(r"tlxform run: rank 1 exited with code 1 after [\d.]+ s", text), text[-3000:]
    _assert_nothing_left(_rank_pids(text), launcher.pid)


# -- first mistakes ----------------------------------------------------------------------------------------------
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")


@needs_no_gpu
def test_run_without_emulate_on_a_machine_without_gpu_says_so():
    done, elapsed = _run(["-n", "2", os.path.join(ROOT, "examples", "ag_gemm.py")], _env(), timeout=120)
    assert done.returncode == 2, done.stderr
    assert "no GPU here" in done.stderr and "add --emulate" in done.stderr, done.stderr
    assert "active drivers" not in done.stderr + done.stdout
    assert "started" not in done.stderr  # refused before any rank started


@needs_no_gpu
def test_plain_python_without_the_interpreter_on_a_machine_without_gpu_says_so():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ag_gemm.py")], capture_output=True,
                          text=True, env=_env(), cwd=ROOT, timeout=120)
    assert done.returncode == 1
    assert "no GPU here" in done.stderr and "tlxform run -n N --emulate script.py" in done.stderr, done.stderr[-2000:]
    assert "active drivers" not in done.stderr


def test_many_emulated_ranks_on_few_cores_are_warned_about_and_each_rank_says_when_it_starts_and_ends(
        tmp_path, monkeypatch):
    script = _script(tmp_path, "print('hello')\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    result = CliRunner().invoke(main, ["run", "-n", "5", "--emulate", script])
    assert result.exit_code == 0, result.output
    assert "tlxform run: warning: 5 emulated ranks on 1 CPU core(s)" in result.output
    for rank in range(5):
        assert f"tlxform run: rank {rank} of 5 started (pid " in result.output
        assert re.search(rf"tlxform run: rank {rank} finished after [\d.]+ s", result.output), result.output
        assert f"[rank {rank}] hello" in result.output
    result = CliRunner().invoke(main, ["run", "-n", "4", "--emulate", script])
    assert result.exit_code == 0 and "warning" not in result.output, result.output


@needs_no_gpu
def test_a_benchmark_that_measured_nothing_fails(tmp_path):
    done = subprocess.run([*TLXFORM, "bench", "mlp", "--shapes", "1", "--scale", "64", "--rounds", "1", "--out",
                           str(tmp_path)], capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nothing ran: every TileLink measurement of 2 shape/part(s) failed" in done.stderr, done.stderr
    assert "no GPU here" in done.stderr
