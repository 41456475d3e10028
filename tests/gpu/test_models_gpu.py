"""The end-to-end decoder on the GPU: 2 NVSHMEM ranks sharing one GPU, bf16, compiled kernels.

The "small" configuration (hidden 512, intermediate 1376, 8 heads, 4 KV heads, head size 64, 2 layers)
on 2 × 257 tokens (each rank 257 rows), against the PyTorch TP baseline (a gloo group through host
memory: NCCL refuses two ranks on one GPU) and the unsharded fp32 model.
"""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.models_worlds import decoder_matches_references

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def test_small_decoder_two_ranks_bf16() -> None:
    results = tilelink.spawn(decoder_matches_references, 2, "small", 2, 257, "bfloat16", backend="nvshmem")
    assert [r["rows"] for r in results] == [(0, 257), (257, 514)]
    for r in results:
        assert r["dtype"] == "torch.bfloat16" and r["same_mlp"], r
        assert r["tl_vs_torch"] < 3e-2 and r["tl_vs_unsharded"] < 5e-2, r
    print(results)
