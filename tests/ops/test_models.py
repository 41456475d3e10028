"""The end-to-end decoders (tilelink.ops.models; dense, and MoE: Mixtral style and Qwen1.5-MoE style
with a shared expert) in an emulated world of 2 ranks against the PyTorch TP baseline and a
single-process unsharded model; tiny shapes (the interpreter is slow), 3 to 13 tokens."""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.models_worlds import bad_model_inputs, decoder_matches_references, dp_tp_baseline


@pytest.mark.slow
def test_two_layer_decoder_matches_torch_tp_and_unsharded() -> None:
    results = tilelink.spawn(decoder_matches_references, 2, "tiny", 1, 13, "float32")
    assert [r["rows"] for r in results] == [(0, 7), (7, 13)]
    for r in results:
        assert r["shape"] == (r["rows"][1] - r["rows"][0], 32) and r["dtype"] == "torch.float32", r
        assert r["same_mlp"], r
        assert r["tl_vs_torch"] < 1e-5 and r["shared_vs_torch"] == 0.0, r
        assert r["tl_vs_unsharded"] < 1e-5 and r["torch_vs_unsharded"] < 1e-5, r


@pytest.mark.slow
def test_multi_query_without_rope_two_sequences() -> None:
    """One KV head replicated on both ranks (R % kv_heads == 0), no RoPE, batch 2 (causal per sequence)."""
    results = tilelink.spawn(decoder_matches_references, 2, "tiny", 2, 5, "float32", 1, kv_heads=1, rope=False)
    assert [r["rows"] for r in results] == [(0, 5), (5, 10)]
    for r in results:
        assert r["tl_vs_torch"] < 1e-5 and r["tl_vs_unsharded"] < 1e-5, r


@pytest.mark.slow
def test_bad_inputs_raise_launch_error() -> None:
    for messages in tilelink.spawn(bad_model_inputs, 2):
        assert "NO ERROR" not in messages, messages
        assert "hidden=32" in messages[1] and "must hold rows" in messages[2], messages
        assert "3 heads cannot be split over 2 ranks" in messages[3] and "over 2 ranks" in messages[4]
        assert "unknown model" in messages[5] and "dtype" in messages[6], messages
        assert "top_k=9 must be between 1 and the 8 experts" in messages[7], messages
        assert "need experts > 0" in messages[8], messages


@pytest.mark.slow
def test_data_parallel_groups_with_tp_inside() -> None:
    """4 ranks = 2 DP replicas x TP 2: the baseline inside each TP group matches the unsharded model."""
    results = tilelink.spawn(dp_tp_baseline, 4, 2)
    assert [(r["dp_rank"], r["tp_rank"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in results:
        assert r["tp_size"] == 2 and r["dp_size"] == 2 and r["err"] < 1e-5, r


@pytest.mark.slow
def test_two_layer_moe_decoder_matches_torch_tp_and_unsharded() -> None:
    """Mixtral style (8 experts, top-2, renormalised), 13 tokens."""
    results = tilelink.spawn(decoder_matches_references, 2, "tiny-moe", 1, 13, "float32")
    assert [r["rows"] for r in results] == [(0, 7), (7, 13)]
    for r in results:
        assert r["shape"] == (r["rows"][1] - r["rows"][0], 32) and r["same_mlp"], r
        assert [sum(counts) for counts in r["expert_tokens"]] == [26, 26], r
        assert r["tl_vs_torch"] < 1e-5 and r["shared_vs_torch"] == 0.0, r
        assert r["tl_vs_unsharded"] < 1e-5 and r["torch_vs_unsharded"] < 1e-5, r


@pytest.mark.slow
def test_moe_experts_without_tokens() -> None:
    """3 tokens x top-2 = 6 slots for 8 experts: at least two experts receive no token in every layer
    (rank 1 holds a single row)."""
    results = tilelink.spawn(decoder_matches_references, 2, "tiny-moe", 1, 3, "float32")
    assert [r["rows"] for r in results] == [(0, 2), (2, 3)]
    for r in results:
        assert all(counts.count(0) >= 2 for counts in r["expert_tokens"]), r
        assert r["tl_vs_torch"] < 1e-5 and r["tl_vs_unsharded"] < 1e-5 and r["torch_vs_unsharded"] < 1e-5, r


@pytest.mark.slow
def test_qwen_style_moe_with_shared_expert() -> None:
    """Qwen1.5-MoE style: 6 experts, top-4 not renormalised, a sigmoid-gated shared expert; batch 2."""
    results = tilelink.spawn(decoder_matches_references, 2, "tiny-qwen-moe", 2, 5, "float32")
    assert [r["rows"] for r in results] == [(0, 5), (5, 10)]
    for r in results:
        assert r["same_mlp"] and r["shared_vs_torch"] == 0.0, r
        assert r["tl_vs_torch"] < 1e-5 and r["tl_vs_unsharded"] < 1e-5 and r["torch_vs_unsharded"] < 1e-5, r


def test_bench_e2e_offers_every_model() -> None:
    from tilelink.cli.bench_e2e import MODEL_NAMES
    from tilelink.ops.models import MODELS

    assert set(MODEL_NAMES) == set(MODELS)
