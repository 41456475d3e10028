"""The rewrite keeps the compiled kernel's memory instructions: compiled for sm_90 on this CPU
machine, a rewritten GEMM and MoE grouped GEMMs (dynamic mappings) issue the same 16-byte asynchronous
copies as the plain ones, and the flash-attention kernel the same bulk-tensor (TMA) loads (a wait token
that hid the guarded pointers' alignment made them fall back to 2-byte loads, 2.4x slower on an H200)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_rewritten_kernels_keep_wide_loads() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, os.path.join(HERE, "compile_rewritten.py")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    profiles = {}
    for line in result.stdout.splitlines():
        kernel, variant, rest = line.split(" ", 2)
        profiles[(kernel, variant)] = ast.literal_eval(rest)
    for kernel in ("gemm", "moe_ag", "moe_rs"):
        plain, rewritten = profiles[(kernel, "plain")], profiles[(kernel, "rewritten")]
        assert plain["cp.async 16B"] > 0, plain
        assert rewritten == plain, (kernel, plain, rewritten)
    # flash attention: K and V by bulk-tensor (TMA) loads through the descriptors made once over every key (EVEN_N) or
    # per chunk, Q by 16-byte vectors, alike once rewritten (the wait's token goes into the chunk's start, not into an
    # address)
    for kernel in ("attention", "attention_chunks"):
        plain, rewritten = profiles[(kernel, "plain")], profiles[(kernel, "rewritten")]
        assert plain["tma 2d"] > 0 and plain["ld.global.v4"] > 0 and plain["ld.global scalar"] == 0, (kernel, plain)
        assert rewritten == plain, (kernel, plain, rewritten)
    # the partners move rows as 16-byte vectors, a peer's too (2-byte loads made a pull a load per element):
    # the pull consumer four sources at a time (and each top-k slot)
    for key, vectors in ((("rs_pull_consumer", "TOPK=1"), 4), (("rs_pull_consumer", "TOPK=2"), 8),
                         (("ag_pull_producer", "compiled"), 1), (("rs_reduce_received", "compiled"), 2),
                         (("rs_topk_reduce", "TOPK=2"), 2), (("rs_topk_reduce", "TOPK=5"), 5),  # MoE: each slot
                         (("rs_ring_consumer", "compiled"), 2), (("ag_push_producer", "compiled"), 1)):
        assert profiles[key]["ld.global.v4"] == vectors and profiles[key]["ld.global scalar"] == 0, (key, profiles[key])
        # and stores, a peer's too (the ring's running sums, the push producer's rows)
        assert profiles[key]["st.global.v4"] == 1 and profiles[key]["st.global scalar"] == 0, (key, profiles[key])
    # the persistent kernels: the same bulk-tensor (TMA) loads once rewritten; the MoE weights by a 3-D
    # descriptor (one expert at a time); the reduce-scatter's notify a releasing reduction
    for kernel, tma in (("persistent_ag_gemm", "tma 2d"), ("persistent_gemm_rs", "tma 2d"),
                        ("persistent_moe_ag", "tma 3d")):
        plain, rewritten = profiles[(kernel, "plain")], profiles[(kernel, "rewritten")]
        assert plain[tma] > 0 and rewritten[tma] == plain[tma], (kernel, plain, rewritten)
    assert profiles[("moe_routing", "i64")] == profiles[("moe_routing", "i32")] == {
        "stats ptx": True, "fixed stats ptx": True, "align ptx": True}
    assert profiles[("persistent_gemm_rs", "rewritten")]["sys release"] > 0
    assert profiles[("persistent_gemm_rs", "plain")]["sys release"] == 0
    # GEMM+RS stores C by TMA; its notify waits for the bulk store first and adds no loop, so the
    # flattened tile loop stays one loop nest of the same shape
    plain, rewritten = profiles[("persistent_gemm_rs", "plain")], profiles[("persistent_gemm_rs", "rewritten")]
    assert plain["tma store"] > 0 and rewritten["tma store"] == plain["tma store"], (plain, rewritten)
    assert plain["store wait"] == 0 and rewritten["store wait"] > 0, (plain, rewritten)
    assert rewritten["loops"] == plain["loops"], (plain, rewritten)
    # moe_rs's column sweep keeps its TMA loads of w once rewritten, and adds no notify (the hybrid's top-k
    # reduce follows it on its stream)
    for kernel in ("sweep_moe_rs_k1", "sweep_moe_rs_kn"):
        plain, rewritten = profiles[(kernel, "plain")], profiles[(kernel, "rewritten")]
        assert plain["tma 3d"] > 0 and rewritten == plain, (kernel, plain, rewritten)
