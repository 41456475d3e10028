"""Every example runs as its docstring says: ``tlxform run -n 2 --emulate examples/<name>.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["ag_gemm", "gemm_rs", "moe", "sp_attention"]


@pytest.mark.slow  # 5-11 s each on two cores
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_on_an_emulated_world(name: str) -> None:
    cmd = [sys.executable, "-m", "tilelink.cli.main", "run", "-n", "2", "--emulate", f"examples/{name}.py"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "equals" in line]
    assert len(lines) == 2 and {line.split("]")[0] for line in lines} == {"[rank 0", "[rank 1"}, result.stdout
