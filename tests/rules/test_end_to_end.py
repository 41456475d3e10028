"""Every golden case, launched per the contract in emulated worlds of 1-4 ranks (non-divisible
sizes: M=50, K=40, 37 KV rows, 77 elements ...), equals torch on the full problem."""

from __future__ import annotations

import pytest
from cases import CASES, run_cases

import tilelink


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_case_matches_torch(world: int) -> None:
    names = sorted(CASES)
    results = tilelink.spawn(run_cases, world, names)
    failures = []
    for name in names:
        for rank, per_rank in enumerate(results):
            value = per_rank[name]
            if not isinstance(value, float):
                failures.append(f"{name} rank {rank} raised:\n{value}")
            elif not value < 1e-3:
                failures.append(f"{name} rank {rank}: max error {value}")
    assert not failures, "\n".join(failures)
