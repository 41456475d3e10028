"""How emulated ranks start: forked from a server that has imported torch and Triton once, yet each behaving as a
fresh process of the caller's, with the caller's environment and output streams as they are at the call."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import tilelink
from tests.runtime import runtime_worlds


def test_ranks_are_forked_by_a_server_of_their_own():
    parents = tilelink.spawn(runtime_worlds.say, 2, "hello")
    assert parents[0] == parents[1] != os.getpid(), parents


def test_ranks_write_where_the_caller_writes_now(tmp_path):
    tilelink.spawn(runtime_worlds.say, 1, "first")  # the server runs; its streams are the ones it started with
    path = tmp_path / "streams.txt"
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(path, "w") as out:
            for fd in (1, 2):
                os.dup2(out.fileno(), fd)
            tilelink.spawn(runtime_worlds.say, 2, "second")
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
    text = path.read_text()
    for rank in (0, 1):
        assert f"second from rank {rank} on stdout" in text and f"second from rank {rank} on stderr" in text, text


def test_ranks_see_the_environment_of_the_call(monkeypatch):
    tilelink.spawn(runtime_worlds.environ_value, 1, "HOME")  # the server runs with the environment of then
    monkeypatch.setenv("TILELINK_TEST_SPAWN_MARK", "set after the server started")
    monkeypatch.delenv("TILELINK_SPAWN_TIMEOUT", raising=False)
    assert tilelink.spawn(runtime_worlds.environ_value, 2, "TILELINK_TEST_SPAWN_MARK") == \
        ["set after the server started"] * 2
    monkeypatch.delenv("TILELINK_TEST_SPAWN_MARK")
    assert tilelink.spawn(runtime_worlds.environ_value, 1, "TILELINK_TEST_SPAWN_MARK") == [None]
    assert tilelink.spawn(runtime_worlds.environ_value, 1, "TRITON_INTERPRET") == ["1"]


def test_tensor_arguments_reach_every_rank():
    assert tilelink.spawn(runtime_worlds.total, 3, torch.arange(6.0)) == [15.0] * 3


SCRIPT = '''
import multiprocessing, multiprocessing.forkserver, os, sys

import tilelink


def mark():
    return MARK


def interpret_flag(queue):
    queue.put(os.environ.get("TRITON_INTERPRET"))


MARK = os.environ.get("TILELINK_TEST_SPAWN_MARK")

if __name__ == "__main__":
    if sys.argv[1] == "theirs":  # a fork server the program started itself, before TileLink's first call
        multiprocessing.forkserver.ensure_running()
    first = tilelink.spawn(mark, 1)
    os.environ["TILELINK_TEST_SPAWN_MARK"] = "at the call"
    print("marks", first + tilelink.spawn(mark, 2))
    print("ours", tilelink.spawn(os.getppid, 1)[0] != os.getpid())
    ctx = multiprocessing.get_context("forkserver")  # the program's own use of the fork server, after TileLink's
    queue = ctx.Queue()
    process = ctx.Process(target=interpret_flag, args=(queue,))
    process.start()
    print("interpret", queue.get(timeout=60))
    process.join()
'''


@pytest.mark.parametrize("server", ["ours", "theirs"])
def test_a_scripts_module_level_reads_the_environment_of_the_call(server, tmp_path):
    """A script's own module, which each rank imports again (its kernels read TRITON_INTERPRET as they are
    defined), sees the caller's environment at the call; the program's own fork-server children do not see the
    emulated ranks' TRITON_INTERPRET; a fork server the program started itself is left alone (new interpreters)."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("TILELINK_TEST_SPAWN_MARK", "TRITON_INTERPRET")}
    done = subprocess.run([sys.executable, str(script), server], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines["marks"] == "[None, 'at the call', 'at the call']", done.stdout
    assert lines["ours"] == str(server == "ours"), done.stdout
    assert lines["interpret"] == "None", done.stdout


def test_an_argument_that_cannot_be_sent_is_named():
    import threading

    with pytest.raises(tilelink.TileLinkError, match="arguments of total cannot be sent to the ranks"):
        tilelink.spawn(runtime_worlds.total, 2, threading.Lock())


def test_a_script_calling_spawn_as_it_is_imported_is_refused_in_the_rank(tmp_path):
    """Each rank imports the caller's script: one whose spawn is not under the `__main__` guard would start worlds
    without end; the rank refuses it, and the caller names the rank that could not start."""
    script = tmp_path / "unguarded.py"
    script.write_text("import tilelink\n\n\ndef one():\n    return 1\n\n\nprint(tilelink.spawn(one, 1))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert "if __name__" in done.stderr and "could not start" in done.stderr, done.stderr[-3000:]
