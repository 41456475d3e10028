"""Sequence-parallel attention on the GPU: NVSHMEM ranks sharing one H200, bf16, against SDPA.

The same rank function as the emulated tests (``tests/ops/attention_worlds.py``) on CUDA tensors with
the compiled kernel; K/V gathered by the copy engine. Plus the plain kernel against SDPA on one device.
"""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.attention_worlds import inputs, reference, sp_attention_matches_sdpa

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_bf16_single_device(causal: bool) -> None:
    from tilelink.ops.attention import flash_attention

    q, k, v = inputs(1, 8, 2, 1500, 128, torch.bfloat16, "cuda")
    o = flash_attention(q[:, :, 1000:], k, v, causal=causal, q_offset=1000)
    ref = reference(q, k, v, causal)[:, :, 1000:]
    assert ((o.double().cpu() - ref).norm() / ref.norm()).item() < 2e-2


@pytest.mark.parametrize(("world", "B", "H", "Hkv", "S", "D", "causal"), [
    (2, 1, 4, 2, 1001, 128, True),  # GQA 2:1, odd S, two calls on one context
    (4, 2, 4, 4, 777, 64, False),  # batch 2, ranks of 195, 195, 195, 192 rows
])
def test_sp_attention_bf16(world: int, B: int, H: int, Hkv: int, S: int, D: int, causal: bool) -> None:
    for err in tilelink.spawn(sp_attention_matches_sdpa, world, B, H, Hkv, S, D, "bfloat16", causal, 2,
                              backend="nvshmem"):
        assert err < 2e-2, err
