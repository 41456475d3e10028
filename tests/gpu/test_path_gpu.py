"""``path=`` of ag_gemm and gemm_rs on the GPU: the plain path (cuBLAS + NCCL, or gloo on host copies for ranks
sharing one GPU) against torch, and the automatic choice taken alike on every rank with the shipped H200
calibration (a decode-sized call goes to the plain path; a calibration where the overlap wins sends the same
call to the kernels)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import tilelink
from tests.ops.path_worlds import (
    attention_plain_matches_sdpa,
    chosen_paths,
    moe_plain_matches_torch,
    plain_matches_torch,
)
from tilelink import cost

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plain_path_matches_torch(world: int, dtype: str) -> None:
    bound = 5e-3 if dtype == "float32" else 2e-2  # cuBLAS fp32 may use TF32
    for per_rank in tilelink.spawn(plain_matches_torch, world, 1000, 256, 333, dtype, backend="nvshmem"):
        assert all(err < bound for err in per_rank.values()), per_rank


def test_auto_follows_the_calibration_on_every_rank(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TILELINK_PATH", raising=False)
    runs = {"auto": tilelink.spawn(chosen_paths, 2, 16, 256, 512, backend="nvshmem"),
            "overlap": tilelink.spawn(chosen_paths, 2, 16, 256, 512, "overlap", backend="nvshmem")}
    data = json.loads(cost.SHIPPED.read_text())
    data["parts"].update({k: 0.0 for k in data["parts"] if k.startswith(("host_ms.", "host_peer_ms."))})
    data["parts"]["nccl_all_gather_latency_us"] = data["parts"]["nccl_reduce_scatter_latency_us"] = 1e4
    mine = tmp_path / "calibration.json"
    mine.write_text(json.dumps(data))
    monkeypatch.setenv("TILELINK_CALIBRATION", str(mine))
    runs["overlap wins"] = tilelink.spawn(chosen_paths, 2, 16, 256, 512, backend="nvshmem")
    for label, per_rank in runs.items():
        for got in per_rank:
            assert all(e < 2e-2 for e in got["errors"]), (label, got)  # fp32 on TF32
        picks = [re.findall(r"ranks: (\w+)", " ".join(got["log"])) for got in per_rank]
        assert len(picks[0]) == 2 and all(p == picks[0] for p in picks), (label, picks)  # alike on every rank
    assert all(got["plain_calls"] == ["ag_gemm", "gemm_rs"] for got in runs["auto"])
    assert all(got["plain_calls"] == [] for got in runs["overlap"] + runs["overlap wins"])


@pytest.mark.parametrize("world", [2, 3])
def test_plain_sp_attention_matches_sdpa(world: int) -> None:
    for per_rank in tilelink.spawn(attention_plain_matches_sdpa, world, 2, 8, 2, 1000, 128, "bfloat16",
                                   backend="nvshmem"):
        assert all(err < 2e-2 for err in per_rank.values()), per_rank


@pytest.mark.parametrize("world", [2, 3])
def test_plain_moe_matches_torch(world: int) -> None:
    for per_rank in tilelink.spawn(moe_plain_matches_torch, world, 300, 256, 512, 8, 2, "bfloat16",
                                   backend="nvshmem"):
        assert all(err < 2e-2 for err in per_rank.values()), per_rank
