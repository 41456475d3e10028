"""The handshake an uncaptured call with peers starts with on a GPU (``tilelink.runtime.handshake``, launched by
``Launcher.handshake``): one kernel that tells every peer the call's number and waits for theirs, bounded by the
handshake's budget (``SKEW_FACTOR`` wait budgets). Run by Triton's interpreter between emulated ranks: a rank late
between two calls by far more than a wait's budget is waited for, and a rank that never comes is read back from the
diagnostics record as a ``HandshakeTimeout`` naming it and the call, as the host's wait for a peer names them."""

from __future__ import annotations

import pytest

import tilelink
from tests.runtime.handshake_worlds import handshake_calls, shard_handshake_calls


@pytest.mark.slow  # two ranks of interpreted kernels, the late rank's second of sleep
def test_a_rank_late_between_calls_is_waited_for(monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "0.2")  # a handshake waits 6 s, a wait 0.2 s: rank 1 is 1 s late
    for rank, seen in enumerate(tilelink.spawn(handshake_calls, 2, 3, 1, 2, 1.0, False)):
        assert seen == ["ok", "ok", "ok"], (rank, seen)


@pytest.mark.slow  # two ranks of interpreted kernels, a handshake's budget spent
def test_a_rank_that_does_not_come_is_named_with_the_call(monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "0.05")  # a handshake waits 1.5 s (the interpreter's polls: more)
    rank0, rank1 = tilelink.spawn(handshake_calls, 2, 2, 1, 2, 0.0, True)
    assert rank1 == ["ok"]
    assert rank0[0] == "ok" and rank0[1].startswith("HandshakeTimeout peer=1 call=2 seen=1: "), rank0
    assert "rank 0: rank 1 has not reached call 2 of ag_gemm_kernel after 1.5 s (30 x TILELINK_WAIT_TIMEOUT=0.05); " \
           "it last reached call 1." in rank0[1], rank0


@pytest.mark.parametrize(("n", "block", "programs"), [(1000, 128, 3), (64, 128, 4), (256, 128, 2)])
def test_the_copying_handshake_copies_the_shard_and_hands_shakes_at_each_call(n, block, programs) -> None:
    """The all-gather's handshake with the shard's copy (``shard_handshake_kernel``): programs striding over blocks
    (more blocks than programs, fewer, as many) copy every element and none past the place, the last one hand shakes
    and resets the count for the next call; three calls on two ranks. (The interpreter runs the programs one after
    another: the order of the copy and the notify across programs is the compiled kernel's, tested on the GPU by the
    operators' gathers.)"""
    for rank, seen in enumerate(tilelink.spawn(shard_handshake_calls, 2, 3, n, block, programs)):
        assert seen == ["ok", "ok", "ok"], (rank, seen)


def test_the_handshake_copies_a_shard_only_where_its_kernel_can() -> None:
    """A plain contiguous shard of the place's shape, dtype and device at a 16-byte aligned address; any other is
    copied as before (torch, or the driver's one copy on a GPU)."""
    import torch

    from tilelink.rules.all_gather.launcher import copied_by_handshake

    place = torch.zeros(64, 8)[8:16]
    assert copied_by_handshake(torch.ones(8, 8), place)
    assert not copied_by_handshake(torch.ones(8, 8, dtype=torch.float64), place)
    assert not copied_by_handshake(torch.ones(16, 8)[::2], place)  # strided
    assert not copied_by_handshake(torch.ones(65)[1:].view(8, 8), place)  # 4 bytes past an aligned address
    assert not copied_by_handshake(torch.ones(8, 8), torch.zeros(8, 9)[:, :8])  # a strided place
    assert not copied_by_handshake(torch.ones(0, 8), torch.zeros(0, 8))
    assert not copied_by_handshake(torch.ones(8, 8, device="meta"), place)
