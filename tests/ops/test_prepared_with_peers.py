"""A kept form of ``ag_gemm`` and ``gemm_rs`` with peers launches again through the launch prepared for it
(``rules.all_gather.launcher.GatherLaunch``, ``rules.reduce_scatter.launcher.ScatterLaunch``): the steps of an
uncaptured call without the kernel's launch path. Emulated, it serves the schedule of the launch path only when the
race-exposing one is off (that one is the launch path's); the GPU's test is
``tests/gpu/test_uncaptured_handshake_gpu.py``."""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.peer_launch_worlds import prepared_calls_with_peers


@pytest.mark.slow  # two ranks of interpreted GEMMs, five calls of three forms
@pytest.mark.parametrize("races", ["0", "1"])
def test_kept_forms_with_peers_launch_through_their_prepared_launches(races: str, monkeypatch) -> None:
    """Five calls of each form with new data: without the race-exposing schedule the first takes the kernel's
    launch path and the others the prepared launch; with it, every call takes the launch path, which runs it.
    Every product right either way."""
    monkeypatch.setenv("TILELINK_RACES", races)
    for rank, per_rank in enumerate(tilelink.spawn(prepared_calls_with_peers, 2, 37, 24, 48, 5)):
        for label, (err, paths, kinds) in per_rank.items():
            assert err < 1e-5, (rank, label, per_rank)
            want = "GatherLaunch" if label.startswith("ag_gemm") else "ScatterLaunch"
            assert kinds == [want] and paths == (1 if races == "0" else 5), (rank, label, per_rank)
