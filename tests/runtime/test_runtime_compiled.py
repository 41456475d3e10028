"""The compiled (GPU) implementation of ``tilelink.language`` compiles to sm_90 cubin on this CPU
machine (Triton's bundled ptxas): globaltimer-bounded acquire waits, release notifies."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_compiled_primitives_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "tests.runtime.compile_for_gpu"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    for waiting in ("consume_kernel", "ring_kernel", "flag_kernel", "gemm_consumer_kernel"):
        assert "globaltimer=1 acquire=1" in lines[waiting], lines
    for notifying in ("produce_kernel", "pull_kernel", "ring_kernel", "ag_producer_kernel"):
        assert "release=1" in lines[notifying] and "red_by_thread0=1 atom_release=0" in lines[notifying], lines
        assert "named_barrier=1" in lines[notifying], lines
    assert all("cubin=1" in v for v in lines.values())
