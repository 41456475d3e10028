"""``tlxform bench mlp --dtype fp8`` (compute mode) on the CPU, in Triton's interpreter, on a tiny MLP: the FP8
kernels the operators launch, as written and rewritten, against ``torch._scaled_mm`` with both scalings, each
checked against the dequantised reference before it is timed."""

from __future__ import annotations

import pytest

from tilelink.benchmarks.common import MLPShape


@pytest.mark.slow
def test_fp8_compute_mode_times_kernels_that_agree_with_scaled_mm() -> None:
    from tilelink.benchmarks.mlp import run_compute_fp8, summarize_compute_fp8

    record = run_compute_fp8([MLPShape("tiny", 32, 32, 64, "test")], 2, 1, device="cpu")
    assert record["dtype"] == "fp8" and record["variants"] == ["TileLink rowwise", "TileLink tensor"]
    methods = {f"{who} {s}{form}" for s in ("rowwise", "tensor")
               for who, form in (("torch._scaled_mm", ""), ("torch._scaled_mm", " fast_accum"), ("TileLink", ""),
                                 ("TileLink", " (as written)"))}
    parts = {}
    for row in record["results"]:
        parts[row["part"]] = (row["M"], row["N"], row["K"])
        assert row["errors"] == {}, row["errors"]
        assert set(row["median_ms"]) == methods == set(row["rel_err"])
        assert all(err < 2e-2 for err in row["rel_err"].values()), row["rel_err"]
        assert set(row["ratio"]) == set(row["ratio_vs_fast_accum"]) == {m for m in methods if m.startswith("TileLink")}
        # the persistent kernels, as the operators take them for 16-byte rows
        assert {c["kernel"] for c in row["config"].values()} == {f"{row['part']}_fp8_persistent_kernel"}
        assert row["config"]["TileLink tensor"]["B_SCALE_COLS"] is False
        assert row["config"]["TileLink rowwise"]["B_SCALE_COLS"] is True
    assert parts == {"ag_gemm": (32, 64, 32), "gemm_rs": (32, 32, 32)}  # the per-rank shapes of 2 ranks
    text = summarize_compute_fp8(record)
    assert "TileLink rowwise / torch._scaled_mm: min" in text and "TileLink tensor / torch._scaled_mm" in text
    assert "TileLink rowwise / torch._scaled_mm fast_accum: min" in text


def test_fp8_is_refused_in_the_dist_mode() -> None:
    from click.testing import CliRunner

    from tilelink.cli.main import main as tlxform

    result = CliRunner().invoke(tlxform, ["bench", "mlp", "--dtype", "fp8", "--mode", "dist", "--world", "2"])
    assert result.exit_code == 2 and "--dtype fp8 is measured in --mode compute" in result.output, result.output
