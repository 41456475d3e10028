"""The MoE benchmark's compute mode on the CPU (Triton's interpreter), on a tiny MoE: the routings of
``--expert-routing`` are what they say, and every kernel it times computes the grouped product."""

from __future__ import annotations

import pytest
import torch

from tilelink.benchmarks.moe import EXPERT_ROUTINGS, MoEShape, expert_routing, main, measure_compute


@pytest.mark.parametrize("kind", EXPERT_ROUTINGS)
def test_each_routing_picks_distinct_experts_per_token(kind: str) -> None:
    S, E, topk = 96, 8, 3
    ids, weights = expert_routing(kind, S, E, topk, "cpu")
    assert ids.shape == weights.shape == (S, topk)
    assert int(ids.min()) >= 0 and int(ids.max()) < E
    assert all(len(set(row)) == topk for row in ids.tolist())
    assert torch.allclose(weights.sum(-1), torch.ones(S))
    counts = torch.bincount(ids.flatten(), minlength=E)
    if kind == "random":
        assert len(set(counts.tolist())) > 1  # uneven experts: what the other two take away
    else:
        assert counts.tolist() == [S * topk // E] * E


def test_equal_routing_shuffles_the_tokens_of_the_balanced_one() -> None:
    balanced, _ = expert_routing("balanced", 64, 4, 2, "cpu")
    equal, _ = expert_routing("equal", 64, 4, 2, "cpu")
    assert balanced[:, 1].tolist() == ((balanced[:, 0] + 1) % 4).tolist()  # a token's experts are neighbours
    assert not torch.equal(equal, balanced)
    assert sorted(map(tuple, equal.tolist())) == sorted(map(tuple, balanced.tolist()))


def test_grouped_mm_baseline_takes_the_slots_in_expert_order() -> None:
    from tilelink.benchmarks.moe import grouped_mm, grouped_mm_inputs, torch_loop

    g = torch.Generator().manual_seed(0)
    ids, _ = expert_routing("random", 9, 4, 2, "cpu")
    w = torch.randn(4, 16, 8, generator=g)
    for gather in (True, False):  # tokens gathered into slots (ag_moe), or slot rows as they are (moe_rs)
        x = torch.randn(9 if gather else 18, 16, generator=g)
        rows, layouts, offs, order = grouped_mm_inputs(x, w, ids, gather)
        assert offs.tolist() == torch.cumsum(torch.bincount(ids.flatten(), minlength=4), 0).tolist()
        ref = torch_loop(x, w, ids, None, gather)[order]
        for wl in layouts.values():
            assert torch.allclose(grouped_mm(rows, wl, offs), ref, atol=1e-5)
        assert not layouts["nk"].is_contiguous() and torch.equal(layouts["nk"], w)


def test_an_unknown_routing_is_refused() -> None:
    with pytest.raises(ValueError, match="expert routing must be one of random, balanced, equal"):
        expert_routing("skewed", 8, 4, 2, "cpu")
    with pytest.raises(SystemExit, match="--expert-routing is for --mode compute"):
        main(["--mode", "dist", "--world", "1", "--shapes", "1", "--expert-routing", "equal"])


def test_the_cli_takes_the_routing_and_refuses_it_where_it_does_not_apply() -> None:
    from click.testing import CliRunner

    from tilelink.cli.main import main as tlxform

    result = CliRunner().invoke(tlxform, ["bench", "moe", "--mode", "dist", "--world", "1", "--shapes", "1",
                                          "--expert-routing", "balanced"])
    assert result.exit_code != 0 and "--expert-routing is for --mode compute" in result.output, result.output
    result = CliRunner().invoke(tlxform, ["bench", "moe", "--expert-routing", "skewed"])
    assert result.exit_code == 2 and "'skewed' is not one of 'random', 'balanced', 'equal'" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("routing", ["random", "equal"])
@pytest.mark.parametrize("part", ["ag_moe", "moe_rs"])
def test_compute_mode_times_kernels_that_agree(part: str, routing: str) -> None:
    shape = MoEShape("tiny", 32, 32, 32, 4, 2)  # 64 slots, 16 per expert when the counts are equal
    row = measure_compute(shape, part, 2, torch.float32, 1, False, True, device="cpu", routing=routing)
    assert row["routing"] == routing
    assert set(row["rel_err_vs_fp32_loop"]) == {"plain", "persistent", "rewritten", "persistent_rewritten",
                                                "grouped_mm_kn", "grouped_mm_nk"}
    assert all(err < 1e-5 for err in row["rel_err_vs_fp32_loop"].values()), row["rel_err_vs_fp32_loop"]
    assert {"cublas_dense", "triton_dense", "torch_loop", "grouped_mm_kn", "grouped_mm_nk"} <= set(row["ms"])
    assert row["grouped_mm_baseline"] == min(("grouped_mm_kn", "grouped_mm_nk"), key=row["ms"].get)
    assert set(row["speedup_vs_grouped_mm"]) == {"plain", "persistent", "rewritten", "persistent_rewritten"}
    gap = row["gap_to_cublas"]["plain"]
    assert gap["padding_share"] == row["padded_rows"]["plain"] / (64 + row["padded_rows"]["plain"])
    block = row["config"]["BLOCK_M"]
    assert 64 % block == 0  # so that equal counts need no padding
    assert (row["padded_rows"]["plain"] == 0) == (routing == "equal"), row["padded_rows"]
