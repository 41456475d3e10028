"""Symmetric heap, channels and every device and host primitive in emulated worlds of 1-4 ranks."""

from __future__ import annotations

import pytest

import tilelink
from tests.runtime import runtime_worlds


@pytest.mark.parametrize("world_size", [1, *(pytest.param(n, marks=pytest.mark.slow) for n in (2, 3, 4))])
def test_heap_and_primitives(world_size):
    calls = 3
    reports = tilelink.spawn(runtime_worlds.heap_and_primitives, world_size, calls)
    assert [r["rank"] for r in reports] == list(range(world_size))
    for rank, report in enumerate(reports):
        assert report["backend"] == "emulated"
        assert (report["tilelink_rank"], report["tilelink_world_size"]) == (rank, world_size)
        assert report["world_size"] == world_size
        assert report["peer_values"] == [float(r) for r in range(world_size)]
        assert report["peer_view_values"] == [float(r) for r in range(world_size)]
        assert report["table_ok"]
        assert report["is_symmetric"] == (True, True, False)
        for pattern, results in report["seen"].items():
            assert results == [True] * calls, f"rank {rank}: {pattern} wrong in calls {results}"
        assert set(report["epochs"].values()) == {calls}
        assert report["local_barrier_word"] == calls
        assert report["flag"] == 5
