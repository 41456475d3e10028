"""``tlxform bench model --calibrate`` on the GPU: every part it can measure here comes out measured and in a
plausible range for a Hopper GPU (small sizes: a check of the measurements, not a calibration to ship)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def test_calibrate_measures_this_gpu() -> None:
    from tilelink import cost
    from tilelink.benchmarks import model

    lines = []
    env = {"copy_bytes": 256 << 20, "attention_shape": (1024, 4096, 8), "operator_gemm": (4096, 4096, 4096),
           "nccl_bytes": (4 << 20, 32 << 20)}
    cal = model.calibrate(cost.load(cost.SHIPPED), env, echo=lines.append)
    measured = set(cal.machine["measured"])
    expect = {"gemm_tflops", "gemm_epilogue_gb_s", "hbm_gb_s", "kernel_launch_us", "attention_tflops",
              "tile_ratio.ag_gemm", "tile_ratio.gemm_rs", "tile_ratio.sp_attention", "host_ms.ag_gemm",
              "host_ms.gemm_rs", "host_ms.plain", "host_ms.sp_attention"}
    if torch.cuda.device_count() >= 2:
        expect |= {"copy_engine_gb_s", "nccl_all_gather_gb_s", "nccl_all_gather_latency_us",
                   "nccl_reduce_scatter_gb_s", "nccl_reduce_scatter_latency_us"}
    assert expect <= measured, (sorted(expect - measured), lines)
    assert 100 < cal.parts["gemm_tflops"] < 2000, lines
    assert 500 < cal.parts["hbm_gb_s"] < 10000, lines
    assert 0.3 < cal.parts["tile_ratio.ag_gemm"] < 1.5 and 0.3 < cal.parts["tile_ratio.gemm_rs"] < 1.5, lines
    assert 0 < cal.parts["kernel_launch_us"] < 100, lines
    if "copy_engine_gb_s" in measured:
        assert 20 < cal.parts["copy_engine_gb_s"] < 2000, lines
