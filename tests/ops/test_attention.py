"""Sequence-parallel attention (AllGather K/V + flash attention) in emulated worlds of 1-4 ranks,
against torch SDPA on the full sequence: causal and not, grouped-query heads, sequence lengths that
the world size does not divide (down to a rank holding no rows)."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.attention_worlds import (
    bad_inputs,
    inputs,
    reference,
    sp_attention_in_blocks,
    sp_attention_matches_sdpa,
    sp_attention_views,
)


@pytest.mark.parametrize(("world", "B", "H", "Hkv", "S", "causal"), [
    pytest.param(1, 1, 2, 2, 37, False, marks=pytest.mark.slow),
    (2, 1, 4, 2, 45, True),  # GQA 2:1
    pytest.param(3, 2, 3, 1, 50, False, marks=pytest.mark.slow),  # GQA 3:1 (multi-query), batch 2, ranks of 17, 17, 16
    pytest.param(4, 1, 2, 2, 9, True, marks=pytest.mark.slow),  # ranks of 3, 3, 3, 0 rows
])
def test_sp_attention_matches_sdpa(world: int, B: int, H: int, Hkv: int, S: int, causal: bool) -> None:
    for err in tilelink.spawn(sp_attention_matches_sdpa, world, B, H, Hkv, S, 16, "float32", causal):
        assert err < 1e-5, err


@pytest.mark.parametrize(("world", "B", "H", "Hkv", "S", "causal", "block_m"), [
    pytest.param(1, 1, 2, 2, 48, True, 16, marks=pytest.mark.slow),
    (2, 1, 4, 2, 64, True, 8),  # GQA 2:1; a causal chunk ends mid-block: its rows past it are the chunk's, masked
    pytest.param(2, 1, 2, 2, 64, False, 16, marks=pytest.mark.slow),
    pytest.param(3, 2, 3, 1, 96, False, 16, marks=pytest.mark.slow),  # multi-query, batch 2, ranks of 32
    pytest.param(4, 1, 2, 2, 64, True, 8, marks=pytest.mark.slow),  # ranks of 16 rows: one block each
])
def test_whole_blocks_chunks_read_through_one_descriptor_match_sdpa(world: int, B: int, H: int, Hkv: int, S: int,
                                                                    causal: bool, block_m: int) -> None:
    """S and a rank's rows whole numbers of 16-key blocks (EVEN_N): the kernel reads K and V through one pair of
    descriptors over every key, each block within the chunk its wait covers."""
    assert S % 16 == 0 and -(-S // world) % 16 == 0
    for err in tilelink.spawn(sp_attention_in_blocks, world, block_m, 16, B, H, Hkv, S, 16, "float32", causal):
        assert err < 1e-5, err


@pytest.mark.slow
def test_half_precision_and_context_reuse() -> None:
    """fp16 and bf16 (the emulated world computes bf16 in fp32), two calls on one context, SPContext."""
    for dtype in ("float16", "bfloat16"):
        for err in tilelink.spawn(sp_attention_matches_sdpa, 2, 1, 2, 1, 33, 32, dtype, True, 2, True):
            assert err < 2e-2, (dtype, err)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_single_device(causal: bool) -> None:
    """The plain kernel, query rows at a global offset (the last 11 of 29) over every key."""
    from tilelink.ops.attention import flash_attention

    q, k, v = inputs(1, 4, 2, 29, 16, torch.float32, "cpu")
    o = flash_attention(q[:, :, 18:], k, v, causal=causal, q_offset=18)
    ref = reference(q, k, v, causal)[:, :, 18:]
    assert ((o.double() - ref).norm() / ref.norm()).item() < 1e-5


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` whose base is 4 bytes past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_strided_views(causal: bool) -> None:
    """Views a tensor descriptor cannot describe as they are: q of a (batch, rows, heads, D) tensor, k and v of a
    wider head dim (rows of 68 bytes), or contiguous at an unaligned base; the operator still matches SDPA."""
    from tilelink.ops.attention import _descriptor_ready, flash_attention

    q, k, v = inputs(2, 4, 2, 23, 16, torch.float32, "cpu")
    ref = reference(q, k, v, causal)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    wide = [torch.cat([t, torch.zeros(2, 2, 23, 1)], dim=3)[..., :16] for t in (k, v)]
    for k_in, v_in in (wide, (_misaligned(k), _misaligned(v)), (k, wide[1])):
        ready = _descriptor_ready(k_in, v_in)
        assert ready[0] is not k_in and ready[1] is not v_in  # copies: these fail a descriptor's checks
        o = flash_attention(q_view, k_in, v_in, causal=causal)
        assert ((o.double() - ref).norm() / ref.norm()).item() < 1e-5
    # views whose bases and strides suit a descriptor are read in place: a head slice of a larger tensor
    kv = torch.cat([k, v], dim=1)
    k_in, v_in = kv[:, :2], kv[:, 2:]
    assert _descriptor_ready(k_in, v_in) == (k_in, v_in)
    o = flash_attention(q_view, k_in, v_in, causal=causal)
    assert ((o.double() - ref).norm() / ref.norm()).item() < 1e-5


def test_flash_attention_one_key_row_of_an_unaligned_row_stride() -> None:
    """K and V of one row each, views of rows 68 bytes long: the row stride is a descriptor's stride whatever the row
    count (a dim of size 1 elsewhere only moves the base), so both are copied, and the operator matches SDPA."""
    from tilelink.ops.attention import _descriptor_ready, flash_attention

    q, k, v = inputs(1, 1, 1, 5, 16, torch.float32, "cpu")
    k_in, v_in = (torch.cat([t[:, :, :1], torch.zeros(1, 1, 1, 1)], dim=3)[..., :16] for t in (k, v))
    assert k_in.stride(-2) == 17
    ready = _descriptor_ready(k_in, v_in)
    assert ready[0] is not k_in and ready[1] is not v_in
    o = flash_attention(q, k_in, v_in)
    ref = reference(q, k[:, :, :1], v[:, :, :1], False)
    assert ((o.double() - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("world", [1, 2])
def test_sp_attention_views(world: int) -> None:
    """q shards that are views, k and v shards contiguous at an unaligned base (alone, the kernel reads them)."""
    for err in tilelink.spawn(sp_attention_views, world, 23, True):
        assert err < 1e-5, err


def test_bad_inputs_raise_before_running() -> None:
    (messages,) = tilelink.spawn(bad_inputs, 1)
    assert "NO ERROR" not in messages, messages
    expected = ["different dtypes", "not a multiple of 3 kv heads", "4-D", "contiguous", "must hold rows [0, 12)",
                "head dim 24", "not supported", "different shapes"]
    for message, want in zip(messages, expected, strict=True):
        assert want in message, (want, message)


def test_sp_attention_layer_checks_heads() -> None:
    from tilelink.errors import LaunchError
    from tilelink.nn import SPAttention

    layer = SPAttention(num_heads=4, num_kv_heads=2, causal=True)
    with pytest.raises(LaunchError, match="4 query heads"):
        layer(torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16))
    with pytest.raises(LaunchError, match="2 kv heads"):
        layer(torch.randn(1, 4, 8, 16), torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16))
    with pytest.raises(ValueError, match="multiple"):
        SPAttention(num_heads=4, num_kv_heads=3)
