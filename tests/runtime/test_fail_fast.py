"""A rank failure ends the world in seconds and the report names the rank that failed first (``tilelink.spawn``);
every host wait for a peer, first call included, is bounded and says which rank did not come.

Elapsed-time bounds are generous (a slow 2-core machine starts two ranks in 10-20 s); each is well below what
the fault took before (a hang, or the 300 s spawn timeout), which ``timeout=`` turns into a failure here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import tilelink
from tests.runtime import fail_fast_worlds as worlds
from tilelink import runtime
from tilelink.runtime.diagnostics import (
    KIND_HANDSHAKE_CALL,
    HandshakeTimeout,
    PeerFailedError,
    is_consequence,
    recorded_timeout,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _spawn(fn, *args, timeout: float = 150.0):
    start = time.monotonic()
    try:
        return tilelink.spawn(fn, 2, *args, timeout=timeout), None, time.monotonic() - start
    except tilelink.TileLinkError as exc:
        return None, exc, time.monotonic() - start


# -- messages (no world) ----------------------------------------------------------------------------------------
def test_handshake_timeout_names_the_rank_and_the_call_and_the_variable(monkeypatch):
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    exc = HandshakeTimeout(rank=0, peer=1, call=3, seen=2, budget_s=30.0, what="ag_gemm_kernel")
    text = str(exc)
    assert text.startswith("rank 0: rank 1 has not reached call 3 of ag_gemm_kernel after 30 s "
                           "(30 x TILELINK_WAIT_TIMEOUT=1); it last reached call 2."), text
    assert "channel/tile" not in text and (exc.peer, exc.call, exc.seen) == (1, 3, 2)
    assert isinstance(exc, tilelink.WaitTimeout)
    # a GPU's handshake kernel's record (kind KIND_HANDSHAKE_CALL: the peer, the call, the call it last reached) reads
    # the same; another kind stays a plain wait's
    recorded = recorded_timeout([1, KIND_HANDSHAKE_CALL, 1, 4, 3, 0, 0, 0], 0, "gemm_rs_kernel", 1.0)
    assert isinstance(recorded, HandshakeTimeout) and (recorded.peer, recorded.call, recorded.seen) == (1, 4, 3)
    assert str(recorded).startswith("rank 0: rank 1 has not reached call 4 of gemm_rs_kernel after 30 s (30 x "
                                    "TILELINK_WAIT_TIMEOUT=1); it last reached call 3."), str(recorded)
    plain = recorded_timeout([1, 4, 1, 4, 3, 0, 0, 0], 0, "gemm_rs_kernel", 1.0)
    assert type(plain) is tilelink.WaitTimeout and plain.primitive == "rank_wait" and plain.budget_s == 1.0


def test_consequences_are_told_from_causes():
    assert is_consequence(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:31924"))
    assert is_consequence(PeerFailedError("rank 1 failed", rank=0, peer=1))
    assert not is_consequence(PeerFailedError("rank 1 finished", rank=0, peer=1, consequence=False))
    assert not is_consequence(ValueError("Connection closed by peer"))  # a rank's own error, whatever it says
    assert not is_consequence(tilelink.WaitTimeout(rank=0, primitive="rank_wait", index=0, expected=1, seen=0,
                                                   budget_s=1.0))


# -- a rank fails ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("ctx", [False, True], ids=["exchange", "handshake"])
def test_a_rank_raising_during_an_operator_is_reported_first(ctx):
    """Rank 1 raises while rank 0 waits for it in ag_gemm (the shard-size exchange; with a TPContext, the call's
    handshake): rank 1's ValueError is reported, not rank 0's wait, and the world ends at once."""
    _, exc, elapsed = _spawn(worlds.raise_in_op, ctx)
    assert isinstance(exc, ValueError) and isinstance(exc, runtime.RankFailedError), exc
    assert exc.rank == 1 and "deliberate failure of rank 1" in str(exc)
    assert "later failures: rank 0: PeerFailedError: rank 0: rank 1 failed (ValueError" in str(exc), str(exc)
    assert elapsed < 90, elapsed


@pytest.mark.slow
def test_a_rank_killed_during_an_operator_is_named_with_its_signal():
    """Rank 1 SIGKILLed while rank 0 is in ag_gemm without a TPContext: the kill is named, not rank 0's
    lost connection."""
    _, exc, elapsed = _spawn(worlds.killed_in_op, False)
    assert isinstance(exc, runtime.RankFailedError), exc
    assert exc.rank == 1 and str(exc).startswith("rank 1 was killed by signal SIGKILL"), str(exc)
    assert "Connection closed" not in str(exc).splitlines()[0]
    assert elapsed < 90, elapsed


@pytest.mark.slow
@pytest.mark.parametrize("ctx", [False, True], ids=["exchange", "handshake"])
def test_a_rank_that_skips_a_call_is_named_at_once(monkeypatch, ctx):
    """Rank 1 makes one ag_gemm call fewer and finishes: rank 0 learns it at once (the handshake's budget here is
    60 s, the spawn timeout used to report it after 300 s)."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")
    _, exc, elapsed = _spawn(worlds.skip_a_call, ctx)
    assert exc is not None and getattr(exc, "rank_failed", None) == 0, exc
    text = str(exc).split("--- traceback")[0]
    if ctx:
        assert isinstance(exc, PeerFailedError), text
        assert ("rank 1 finished its work (called tilelink.finalize) without reaching call 2 of ag_gemm_kernel"
                in text), text
    else:  # the exchange sees rank 1 at finalize's release, or that it finished
        finished = "rank 1 finished its work (called tilelink.finalize) without reaching call 2 of ag_gemm"
        diverged = "rank 0 is at call 2 of ag_gemm, but rank 1 at call 1 of tilelink.finalize"
        assert diverged in text or finished in text, text
    assert elapsed < 50, elapsed


@pytest.mark.slow
@pytest.mark.parametrize("ctx", [False, True], ids=["exchange", "handshake"])
def test_the_first_call_waits_at_most_30_budgets_for_a_late_peer(monkeypatch, ctx):
    """TILELINK_WAIT_TIMEOUT=1 and rank 1 60 s late for the first call: rank 0 gives up after 30 s (the budget
    of a call's wait for its peers), naming rank 1 and the call, instead of waiting the whole 60 s."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    _, exc, elapsed = _spawn(worlds.late_first_call, 60.0, ctx)
    assert isinstance(exc, HandshakeTimeout), exc
    text = str(exc)
    assert exc.rank_failed == 0 and exc.peer == 1 and exc.call == 1
    assert "rank 0: rank 1 has not reached call 1 of " in text and "after 30 s (30 x TILELINK_WAIT_TIMEOUT=1)" in text
    # without a context the exchange of the shard sizes comes first, with one the path's (TILELINK_PATH and the
    # calibration are checked alike on every rank)
    assert ("of ag_gemm after" in text) if not ctx else ("of ag_gemm path after" in text), text
    assert elapsed < 58, elapsed


@pytest.mark.slow
def test_a_handshake_timeout_names_the_late_rank_and_its_last_call(monkeypatch):
    """With a TPContext rank 1 is 60 s late for the second call: rank 0's handshake gives up after 30 budgets,
    saying rank 1 has not reached call 2 and last reached call 1 (it said "channel/tile 1", "waited 30 s")."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    _, exc, elapsed = _spawn(worlds.late_second_call, 60.0)
    assert isinstance(exc, HandshakeTimeout), exc
    assert str(exc).startswith("rank 0 failed with HandshakeTimeout: rank 0: rank 1 has not reached call 2 of "
                               "ag_gemm_kernel after 30 s (30 x TILELINK_WAIT_TIMEOUT=1); it last reached call 1."), exc
    assert "channel/tile" not in str(exc).split("--- traceback")[0]
    assert elapsed < 58, elapsed


@pytest.mark.slow
def test_a_peer_late_within_the_bound_is_waited_for(monkeypatch):
    """The exchange of the first call is not bounded by one budget: a peer 3 s late with a 1 s budget is waited
    for, and the product is right."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "1")
    results, exc, _ = _spawn(worlds.late_first_call, 3.0, False)
    assert exc is None, exc
    assert results[0] > 2.0  # rank 0 waited for rank 1


@pytest.mark.slow
def test_finalize_while_handling_an_exception_waits_for_nobody():
    """Rank 1 calls finalize() in an except clause with a buffer live while rank 0 is busy for 6 s: rank 1
    leaves at once (no collective release), and rank 0's finalize then learns it and does not wait either."""
    results, exc, _ = _spawn(worlds.finalize_in_except, 6.0)
    assert exc is None, exc
    assert results[1] < 2.0, results
    assert results[0] < 2.0, results


# -- targets the ranks cannot import ---------------------------------------------------------------------------
def test_a_target_from_a_script_on_stdin_is_refused_at_once():
    script = textwrap.dedent("""
        import tilelink
        def work():
            return tilelink.rank()
        if __name__ == "__main__":
            try:
                tilelink.spawn(work, 2)
            except tilelink.TileLinkError as exc:
                print("REFUSED", exc)
    """)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "REFUSED spawn: work is defined in a script read from stdin" in done.stdout, done.stdout + done.stderr
    assert "importable .py file" in done.stdout
    assert "FileNotFoundError" not in done.stderr
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_a_script_on_stdin_may_spawn_an_importable_function():
    script = textwrap.dedent("""
        import tilelink
        from tests.runtime import fail_fast_worlds
        if __name__ == "__main__":
            print("RESULT", tilelink.spawn(fail_fast_worlds.late_first_call, 2, 0.0, True))
    """)
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=ROOT, timeout=150)
    assert "RESULT [" in done.stdout, done.stdout + done.stderr[-3000:]


@pytest.mark.slow
def test_a_rank_that_cannot_import_the_target_is_named(tmp_path, monkeypatch):
    """The function's module imports here but not in the ranks (its file is gone): the rank could not start,
    and the report says the function must live in an importable file."""
    module = tmp_path / "vanishing_target.py"
    module.write_text("def work():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    target = importlib.import_module("vanishing_target")
    module.unlink()
    for cached in (tmp_path / "__pycache__").glob("vanishing_target*"):
        cached.unlink()
    try:
        _, exc, elapsed = _spawn(target.work)
    finally:
        sys.modules.pop("vanishing_target", None)
    assert isinstance(exc, runtime.RankFailedError), exc
    assert "could not start" in str(exc) and "importable .py file" in str(exc), str(exc)
    assert "killed by a signal, out of memory" not in str(exc)
    assert elapsed < 60, elapsed


# -- operators: empty calls, wrong shards ------------------------------------------------------------------------
@pytest.mark.slow
def test_empty_calls_and_the_whole_a_on_every_rank():
    for rank, out in enumerate(tilelink.spawn(worlds.empty_and_wrong_shards, 2)):
        assert out["rank"] == rank
        assert out["ag_gemm"] == out["ag_gemm_ctx"] == (0, 8) and out["gemm_rs"] == (0, 8)
        assert out["ag_moe"] == (0, 4) and out["moe_rs"] == (0, 16)
        assert out["sp_attention"] == out["sp_attention_ctx"] == (1, 2, 0, 16)
        lo, hi = (0, 4) if rank == 0 else (4, 8)
        assert out["full_a"].startswith(f"ag_gemm: rank {rank} got 8 rows of A, but must hold rows [{lo}, {hi})")
        assert "TPContext.M=8" in out["full_a"] and f"a[{lo}:{hi}]" in out["full_a"], out["full_a"]
