"""The hand-written AG+GEMM example (examples/handwritten_ag_gemm.py) on emulated worlds of 1-4
ranks: spawned for 1, 3 and 4 ranks, through ``tlxform run -n 2 --emulate`` for 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import tilelink
from examples import handwritten_ag_gemm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("world_size", [1, *(pytest.param(n, marks=pytest.mark.slow) for n in (3, 4))])
def test_handwritten_ag_gemm_matches_torch(world_size):
    errors = tilelink.spawn(handwritten_ag_gemm.run_check, world_size, 50, 24, 40, 3)
    assert len(errors) == world_size and all(e < 1e-3 for e in errors), errors


@pytest.mark.slow
def test_handwritten_ag_gemm_under_tlxform_run():
    result = subprocess.run(
        [sys.executable, "-m", "tilelink.cli.main", "run", "-n", "2", "--emulate", "--timeout", "120",
         os.path.join(ROOT, "examples", "handwritten_ag_gemm.py")],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, TRITON_INTERPRET="0"))
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"[rank {rank}] rank {rank}/2: AG+GEMM M=50 N=24 K=40 matches torch" in result.stdout
