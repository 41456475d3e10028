"""Bounded waits and bad input: every failure names the rank and what to do."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.runtime import runtime_worlds
from tilelink import runtime
from tilelink.runtime import world as world_module


def test_use_before_init():
    assert not tilelink.is_initialized()
    for call in (tilelink.rank, tilelink.world_size, runtime.current_world,
                 lambda: runtime.symmetric_empty((4,), torch.float32), runtime.Diagnostics,
                 lambda: runtime.Channel(2)):
        with pytest.raises(tilelink.NotInitializedError, match=r"tilelink\.init\(\).*tilelink\.spawn"):
            call()
    tilelink.finalize()  # harmless when not initialised


def test_world_size_mismatch_in_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(tilelink.WorldMismatchError, match="RANK=3"):
        world_module.init(backend="emulated")
    assert not tilelink.is_initialized()


def test_unknown_backend():
    with pytest.raises(tilelink.TileLinkError, match="unknown TileLink backend"):
        tilelink.init(backend="mpi")


@pytest.mark.slow
def test_wait_timeouts_name_rank_channel_expected_seen(monkeypatch):
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "0.3")
    with pytest.raises(tilelink.WaitTimeout) as info:
        tilelink.spawn(runtime_worlds.timeouts, 2)
    e = info.value
    assert (e.rank, e.primitive, e.index, e.expected, e.seen) == (1, "consumer_tile_wait", 1, 1, 0)
    assert e.kernel == "consume_kernel"
    assert "rank 1" in str(e) and "traceback of rank 1" in str(e)
    assert e.rank_failed == 1


@pytest.mark.slow
def test_bad_input():
    messages = tilelink.spawn(runtime_worlds.bad_input, 2)[0]
    assert "symmetric_empty" in messages["foreign"]
    assert "rank 2 is not a rank" in messages["bad_rank"]
    assert "already freed" in messages["double_free"]
    assert "rank 0: shape [4]" in messages["mismatch"] and "rank 1: shape [5]" in messages["mismatch"]
    assert messages["init_again_same"]
    assert messages["notify_index"] == "rank_notify: barrier index 2 out of range for 2 channels"
    assert messages["notify_rank"] == "rank_notify: rank 2 is not a rank of this world of 2"
    assert "rank_wait: this Channel was freed" in messages["freed_channel"]


@pytest.mark.slow
def test_failing_rank_raises_in_parent_with_its_traceback():
    with pytest.raises(AssertionError, match="deliberate failure on rank 1") as info:
        tilelink.spawn(runtime_worlds.raise_on, 3, 1, "assert")
    assert isinstance(info.value, runtime.RankFailedError)
    assert info.value.rank == 1 and "raise_on" in info.value.rank_traceback
    with pytest.raises(tilelink.LaunchError, match="rank 0 failed"):
        tilelink.spawn(runtime_worlds.raise_on, 1, 0, "launch")
    # an exception type whose str() shows only its own field still shows the rank and where it was raised
    from triton.runtime.errors import InterpreterError

    with pytest.raises(InterpreterError) as info:
        tilelink.spawn(runtime_worlds.raise_on, 2, 1, "interpreter")
    assert "rank 1 failed" in str(info.value) and "in raise_on" in str(info.value), str(info.value)


@pytest.mark.slow
def test_spawn_timeout_names_pending_ranks(capfd):
    with pytest.raises(runtime.SpawnTimeout, match=r"ranks \[0\]") as info:
        tilelink.spawn(runtime_worlds.hang, 1, 60.0, timeout=8)
    assert info.value.pending == [0]
    assert "printed its Python stack" in str(info.value)
    # the stuck rank said where it was before it was stopped
    err = capfd.readouterr().err
    assert "Thread" in err and 'in hang' in err, err[-2000:]


def test_ranks_share_one_gpu_when_a_host_has_too_few():
    """One GPU per rank while there are enough; else all on GPU 0 (NVSHMEM hung in init with 3 ranks
    spread over 2 GPUs)."""
    from tilelink.runtime.nvshmem import rank_device_index

    assert [rank_device_index(r, 2, 2) for r in range(2)] == [0, 1]
    assert [rank_device_index(r, 2, 8) for r in range(2)] == [0, 1]
    assert [rank_device_index(r, 3, 2) for r in range(3)] == [0, 0, 0]
    assert [rank_device_index(r, 8, 1) for r in range(8)] == [0] * 8
    with pytest.raises(tilelink.TileLinkError, match="needs a CUDA GPU"):
        rank_device_index(0, 1, 0)


def test_a_slow_start_up_says_what_it_waits_for(capfd):
    import time

    from tilelink.runtime.nvshmem import warn_if_slow

    with warn_if_slow(0.05, "init is slow"):
        time.sleep(0.3)
    with warn_if_slow(5.0, "not printed"):
        pass
    err = capfd.readouterr().err
    assert "tilelink: init is slow" in err and "not printed" not in err


@pytest.mark.slow
def test_a_world_started_again_does_not_reuse_freed_buffers():
    assert tilelink.spawn(runtime_worlds.world_again_after_finalize, 2) == [0.0, 0.0]


@pytest.mark.slow
def test_an_operator_whose_wait_timed_out_refuses_the_next_call():
    (out,) = tilelink.spawn(runtime_worlds.timed_out_operator_refuses, 1)
    assert out["first"] == "WaitTimeout"
    assert "an earlier call on this rank had a wait time out" in out["second"]
    assert "consumer_tile_wait" in out["second"] and "tilelink.finalize()" in out["second"]
    assert out["new_world"] < 1e-5


def test_master_ports_come_from_outside_the_ephemeral_range():
    """spawn's MASTER_PORT is checked free, then bound by rank 0 seconds later: a port of the ephemeral range
    could be taken in between by any socket's automatic port (EADDRINUSE, seen on the GPU machine)."""
    import socket

    from tilelink.runtime.launch import PORT_RANGE, free_port

    ports = {free_port() for _ in range(20)}
    assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] for p in ports), ports
    assert len(ports) > 1  # not one fixed port for every world
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))  # and free


def test_a_wait_that_saw_part_of_its_count_says_what_leaves_a_channel_short():
    short = tilelink.WaitTimeout(rank=1, primitive="consumer_tile_wait", index=2, expected=1200, seen=1000,
                                 budget_s=20.0)
    assert "saw 1000" in str(short) and "It saw part of the count" in str(short), short
    assert "an output wider than the columns the kernel stores (a padded row)" in str(short), short
    none = tilelink.WaitTimeout(rank=1, primitive="consumer_tile_wait", index=2, expected=1200, seen=0, budget_s=20.0)
    assert "It saw part of the count" not in str(none), none
