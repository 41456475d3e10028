"""The all-reduce's kernels compile for sm_90 on this CPU machine: the rewritten GEMM of ``tilelink.ops.gemm_ar``
issues the same 16-byte copies as the plain one, and the partners move a peer's rows as 16-byte vectors (four
sources' loads at a time in the reduction), on the launch settings a GPU uses."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_all_reduce_kernels_compile_with_wide_accesses() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, "-m", "tests.rules.compile_all_reduce"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    profiles = {}
    for line in result.stdout.splitlines():
        kernel, variant, rest = line.split(" ", 2)
        profiles[(kernel, variant)] = ast.literal_eval(rest)
    assert profiles[("gemm", "rewritten")] == profiles[("gemm", "plain")]
    assert profiles[("gemm", "plain")]["cp.async 16B"] > 0 and profiles[("gemm", "plain")]["cp.async <16B"] == 0
    for share, stores in (("share=False", 1), ("share=True", 2)):  # the sums go to the share buffer too
        p = profiles[("ar_pull_reduce", share)]
        assert p["ld.global.v4"] == 4 and p["ld.global scalar"] == 0, (share, p)
        assert p["st.global.v4"] == stores and p["st.global scalar"] == 0, (share, p)
    p = profiles[("ar_gather_rows", "-")]
    assert p["ld.global.v4"] == 1 and p["st.global.v4"] == 1 and p["ld.global scalar"] == 0, p
