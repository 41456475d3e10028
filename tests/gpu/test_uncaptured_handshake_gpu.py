"""Uncaptured calls with peers on the GPU: the handshake as one kernel that tells every peer the call's number and
waits for theirs (``tilelink.runtime.handshake``, ``Launcher.handshake``), with the copy-engine gather's own flags
set by it, and the launches prepared for a kept form of call (``GatherLaunch``, ``ScatterLaunch``). Ranks sharing one
GPU through NVSHMEM: a rank that never makes a call is named, with the call, as a ``HandshakeTimeout``; a rank late
between calls by more than a wait's budget is waited for; back-to-back calls with new data at four ranks, through
the prepared launches after the first. (Captured, then uncaptured calls on one context: ``test_graphs_gpu.py``.)"""

from __future__ import annotations

import time

import pytest
import torch

import tilelink
from tests.ops.peer_launch_worlds import FORMS, prepared_calls_with_peers
from tests.ops.tp_worlds import ag_gemm_back_to_back, bounds, calls_with_a_late_host

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]

def a_skipped_call_is_named(label: str, M: int, N: int, K: int) -> str:
    """Every rank makes one call of ``label``'s operator; then rank 0 makes a second, which rank 1 never makes (it
    sleeps past rank 0's handshake budget, then finalizes). Rank 0 returns what its check of the operator raised (its
    type and message); rank 1 ``"skipped"``."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs, tp_kernels

    op, persistent = FORMS[label]
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    lo, hi = bounds(M, r, R)
    klo, khi = bounds(K, r, R)
    a, b = torch.randn(M, K).to(torch.bfloat16), torch.randn(K, N).to(torch.bfloat16)

    def call() -> torch.Tensor:
        if op == "ag":
            return ag_gemm(a[lo:hi].contiguous().to(device), b.to(device), TPContext(M), persistent=persistent)
        return gemm_rs(a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device),
                       persistent=persistent)

    kernel = {("ag", True): tp_kernels.ag_gemm_persistent_kernel, ("ag", False): tp_kernels.ag_gemm_kernel,
              ("rs", True): tp_kernels.gemm_rs_persistent_kernel}[(op, persistent)]
    call()
    kernel.check()  # the first call: every rank came
    if r == 1:
        # past rank 0's handshake (30 x 0.2 s), so that its finalize, whose wait for this rank's is bounded by as
        # much, meets this one's
        time.sleep(8.0)
        return "skipped"
    call()
    try:
        kernel.check()
    except tilelink.WaitTimeout as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no timeout"


@pytest.mark.parametrize("label", list(FORMS))
def test_a_rank_that_skips_a_call_is_named_with_the_call(label: str, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "0.2")  # a handshake waits 6 s
    rank0, rank1 = tilelink.spawn(a_skipped_call_is_named, 2, label, 512, 256, 512, backend="nvshmem", timeout=300)
    assert rank1 == "skipped"
    assert rank0.startswith("HandshakeTimeout: rank 0: rank 1 has not reached call 2 of "), rank0
    assert "after 6 s (30 x TILELINK_WAIT_TIMEOUT=0.2); it last reached call 1." in rank0, rank0


def test_ag_gemm_calls_back_to_back_with_a_lagging_rank_at_four_ranks() -> None:
    """Eight calls with new data, rank 1's stream a few ms behind before each, no synchronisation between them: the
    two sets alternate by the call's parity behind the device handshake; every product right."""
    for rank, per_rank in enumerate(tilelink.spawn(ag_gemm_back_to_back, 4, 333, 256, 512, 8, "bfloat16",
                                                   backend="nvshmem")):
        assert all(err < 1e-2 for err in per_rank.values()), (rank, per_rank)


def test_a_rank_late_between_calls_is_waited_for_at_four_ranks(monkeypatch) -> None:
    """Rank 1's host 2.5 s late between two calls, the wait budget 1 s: the gathers and the hybrid reduce-scatter
    wait for it in the handshake kernel (30 budgets), and every result is right."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    for rank, per_rank in enumerate(tilelink.spawn(calls_with_a_late_host, 4, 333, 256, 512, 2.5, "bfloat16",
                                                   backend="nvshmem")):
        assert all(err < 1e-2 for err in per_rank.values()), (rank, per_rank)


@pytest.mark.parametrize("world", [2, 4])
def test_kept_forms_launch_through_their_prepared_launches(world: int) -> None:
    """Eight calls of each form with new data, no synchronisation between them: the first takes the kernel's
    launch path, the others the launch prepared for the form; every product right."""
    for rank, per_rank in enumerate(tilelink.spawn(prepared_calls_with_peers, world, 333, 256, 512, 8, "bfloat16",
                                                   backend="nvshmem")):
        for label, (err, paths, kinds) in per_rank.items():
            assert err < 2e-2, (rank, label, per_rank)
            want = "GatherLaunch" if label.startswith("ag_gemm") else "ScatterLaunch"
            assert paths == 1 and kinds == [want], (rank, label, per_rank)
