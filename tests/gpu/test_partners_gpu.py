"""The SM pull partners at the launch settings a GPU uses (large steps, many warps, 16-byte loads from a
peer's copy), compiled, on ranks sharing the GPU through NVSHMEM: every setting of
``benchmarks.pull_bandwidth`` sums (top-k 1 and 2) and gathers right. Rows of 1000 x 136 elements: channels
end inside a step, and a step spans several channels' worth of a short row."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 4])
def test_pull_partners_right_at_gpu_settings(world: int) -> None:
    from tilelink.benchmarks import pull_bandwidth

    rows = pull_bandwidth.run(world, 1000 if world == 2 else 1024, 136, 4, None, backend="nvshmem")
    assert any(r["taken"] for r in rows)
    for r in rows:
        limit = 1e-2 if r["kernel"] == "rs_pull_consumer" else 0.0  # the sums' bf16 rounding
        assert r["max_rel_error"] <= limit, r
