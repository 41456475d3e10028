"""Every golden case, launched per the contract in emulated worlds of 1-4 ranks (non-divisible
sizes: M=50, K=40, 37 KV rows, 77 elements ...), equals torch on the full problem; also after the GPU's
first-call warm-up (every kernel run once against scratch channels), which must change nothing."""

from __future__ import annotations

import pytest
from cases import CASES, run_cases, run_cases_warmed_up

import tilelink


@pytest.mark.parametrize(("world", "warm_up"), [(1, False), (2, False), (3, False), (4, False), (2, True)])
def test_every_case_matches_torch(world: int, warm_up: bool) -> None:
    names = sorted(CASES)
    results = tilelink.spawn(run_cases_warmed_up if warm_up else run_cases, world, names)
    failures = []
    for name in names:
        for rank, per_rank in enumerate(results):
            value = per_rank[name]
            if not isinstance(value, float):
                failures.append(f"{name} rank {rank} raised:\n{value}")
            elif not value < 1e-3:
                failures.append(f"{name} rank {rank}: max error {value}")
    assert not failures, "\n".join(failures)
