"""``tlxform bench decode``'s plumbing on the CPU: the decode shapes of the models, and the records of both modes
(tiny shapes, emulated ranks, Triton's interpreter: the structure and the results' correctness, not the speed)."""

from __future__ import annotations

import json

import click
import pytest

from tilelink.benchmarks import decode


def test_the_shapes_are_the_models_row_parallel_linears() -> None:
    shapes = decode.decode_shapes(("llama-3.1-70b", "gemma-2-27b"), (1, 256))
    got = {(s.model, s.linear, s.tokens): (s.N, s.K) for s in shapes}
    assert got == {("llama-3.1-70b", "o_proj", 1): (8192, 8192), ("llama-3.1-70b", "o_proj", 256): (8192, 8192),
                   ("llama-3.1-70b", "down_proj", 1): (8192, 28672),
                   ("llama-3.1-70b", "down_proj", 256): (8192, 28672),
                   ("gemma-2-27b", "o_proj", 1): (4608, 4096), ("gemma-2-27b", "o_proj", 256): (4608, 4096),
                   ("gemma-2-27b", "down_proj", 1): (4608, 36864), ("gemma-2-27b", "down_proj", 256): (4608, 36864)}
    assert [s.K for s in decode.decode_shapes(("llama-3.1-70b",), (1,), scale=64)] == [128, 448]
    with pytest.raises(click.BadParameter, match="mixture of experts"):
        decode.decode_shapes(("mixtral-8x7b",), (1,))


def _files(tmp_path, stem: str) -> tuple[dict, str]:
    record = json.loads((tmp_path / f"{stem}.json").read_text())
    return record, (tmp_path / f"{stem}.md").read_text()


@pytest.mark.slow
def test_compute_mode_record(tmp_path) -> None:
    decode.run(models=("tiny",), tokens=(3,), world=2, dtype="fp32", mode="compute", rounds=1, out=tmp_path)
    record, table = _files(tmp_path, "decode_compute_w2_fp32")
    assert record["benchmark"] == "decode" and record["mode"] == "compute" and record["world"] == 2
    assert [(r["linear"], r["tokens"], r["N"], r["K_per_rank"]) for r in record["results"]] == [
        ("o_proj", 3, 32, 16), ("down_proj", 3, 32, 24)]  # tiny: 4 heads of 8, intermediate 48, over 2 ranks
    for r in record["results"]:
        assert set(r["median_ms"]) == {"torch.matmul", "TileLink"} and all(t > 0 for t in r["median_ms"].values())
        assert r["rel_err"] < 1e-5 and r["ratio"] == pytest.approx(r["median_ms"]["torch.matmul"] /
                                                                  r["median_ms"]["TileLink"])
    assert table.count("\n| tiny |") == 2 and "TileLink ms" in table


@pytest.mark.slow
def test_dist_mode_record_on_emulated_ranks(tmp_path) -> None:
    """Two emulated ranks (no GPU): every method runs, every TileLink result equals the gloo baseline's."""
    decode.run(models=("tiny",), tokens=(1,), world=2, dtype="fp32", mode="dist", rounds=1, out=tmp_path)
    record, table = _files(tmp_path, "decode_dist_w2_fp32")
    assert record["mode"] == "dist" and record["backend"] == "emulated" and len(record["results"]) == 2
    for r in record["results"]:
        assert not r["errors"], r["errors"]
        assert set(r["median_ms"]) == {decode.BASELINE, "comp", "comm", *decode.TILELINK}
        assert set(r["rel_err"]) == set(decode.TILELINK) and max(r["rel_err"].values()) < 1e-5, r["rel_err"]
        assert set(r["speedup"]) == set(decode.TILELINK)
        assert r["speedup"]["TileLink"] == pytest.approx(r["median_ms"][decode.BASELINE] / r["median_ms"]["TileLink"])
    assert table.count("\n| tiny |") == 2 and "cuBLAS+NCCL ms" in table and record["command"] in table
