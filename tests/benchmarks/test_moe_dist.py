"""The MoE benchmark's dist mode on emulated ranks, on a tiny MoE: every method it times (the torch loop,
our non-overlapped grouped GEMM with NCCL-style collectives, the overlapped operators) computes the same
result, and the non-overlapped baselines launch the kernel and tile the operators take."""

from __future__ import annotations

import os
import sys

import torch

import tilelink

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _tiny_dist() -> dict:
    from benchmarks.moe import MoEShape, measure_dist
    from tilelink.runtime import current_world

    return measure_dist(MoEShape("tiny", 16, 32, 16, 4, 2), current_world(), torch.float32, 1, None)


def test_every_method_agrees() -> None:
    for row in tilelink.spawn(_tiny_dist, 2):
        assert set(row["rel_err"]) == {"tilelink_ag", "fused_ag", "tilelink_rs", "fused_rs"}
        assert all(err < 1e-5 for err in row["rel_err"].values()), row["rel_err"]
        assert set(row["speedup"]) == {"tilelink_ag_vs_torch", "tilelink_ag_vs_fused", "tilelink_rs_vs_torch",
                                       "tilelink_rs_vs_fused"}
        assert all(t > 0 for times in row["times_ms"].values() for t in times)
