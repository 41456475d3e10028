"""Sequence-parallel attention on the GPU: NVSHMEM ranks sharing one H200, bf16, against SDPA.

The same rank function as the emulated tests (``tests/ops/attention_worlds.py``) on CUDA tensors with
the compiled kernel; K/V gathered by the copy engine and read through the kernel's tensor descriptors
(TMA). Plus the plain kernel against SDPA on one device, also on views a descriptor cannot describe as they
are (the operator copies them) and on views it reads in place.
"""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.attention_worlds import inputs, reference, sp_attention_matches_sdpa, sp_attention_views

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_bf16_single_device(causal: bool) -> None:
    from tilelink.ops.attention import flash_attention

    q, k, v = inputs(1, 8, 2, 1500, 128, torch.bfloat16, "cuda")
    o = flash_attention(q[:, :, 1000:], k, v, causal=causal, q_offset=1000)
    ref = reference(q, k, v, causal)[:, :, 1000:]
    assert ((o.double().cpu() - ref).norm() / ref.norm()).item() < 2e-2


@pytest.mark.parametrize(("dtype", "D"), [(torch.bfloat16, 128), (torch.float16, 16), (torch.float32, 64)])
def test_flash_attention_views(dtype: torch.dtype, D: int) -> None:
    """K and V with rows of an odd byte count, or at a base off a 16-byte boundary (copied for the descriptors),
    and head slices of one K/V tensor (read in place), against SDPA."""
    from tilelink.ops.attention import _descriptor_ready, flash_attention

    q, k, v = inputs(2, 4, 2, 1001, D, dtype, "cuda")
    ref = reference(q, k, v, True)
    tol = 5e-3 if dtype == torch.float32 else 2e-2  # fp32 products in tf32
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    odd = [torch.cat([t, t[..., :1]], dim=3)[..., :D] for t in (k, v)]  # rows of D + 1 elements
    step = 4 // k.element_size()
    unaligned = []
    for t in (k, v):
        flat = torch.empty(t.numel() + step, dtype=dtype, device="cuda")
        unaligned.append(flat[step:].view(t.shape))
        unaligned[-1].copy_(t)
    kv = torch.cat([k, v], dim=1)
    in_place = (kv[:, :2], kv[:, 2:])
    assert _descriptor_ready(*in_place) == in_place
    for k_in, v_in in (odd, unaligned, in_place):
        o = flash_attention(q_view, k_in, v_in, causal=True)
        assert ((o.double().cpu() - ref).norm() / ref.norm()).item() < tol


@pytest.mark.parametrize(("world", "B", "H", "Hkv", "S", "D", "causal"), [
    (2, 1, 4, 2, 1001, 128, True),  # GQA 2:1, odd S, two calls on one context
    (4, 2, 4, 4, 777, 64, False),  # batch 2, ranks of 195, 195, 195, 192 rows
    # whole numbers of key blocks (EVEN_N): K and V through one pair of descriptors over every key
    (2, 1, 4, 2, 2048, 128, True),  # ranks of 1024 rows, 128-key blocks
    (3, 1, 8, 2, 768, 128, True),
    (4, 2, 4, 4, 1024, 64, False),  # ranks of 256 rows, 64-key blocks
])
def test_sp_attention_bf16(world: int, B: int, H: int, Hkv: int, S: int, D: int, causal: bool) -> None:
    for err in tilelink.spawn(sp_attention_matches_sdpa, world, B, H, Hkv, S, D, "bfloat16", causal, 2,
                              backend="nvshmem"):
        assert err < 2e-2, err


@pytest.mark.parametrize("world", [1, 2])
def test_sp_attention_views_bf16(world: int) -> None:
    """q shards that are views, k and v shards contiguous at a base off a 16-byte boundary."""
    for err in tilelink.spawn(sp_attention_views, world, 1001, True, 128, "bfloat16", backend="nvshmem"):
        assert err < 2e-2, err
