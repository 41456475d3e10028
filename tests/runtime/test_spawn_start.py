"""How emulated ranks start: forked from a server that has imported torch and Triton once, yet each behaving as a
fresh process of the caller's, with the caller's environment and output streams as they are at the call."""

from __future__ import annotations

import os

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
