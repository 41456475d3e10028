"""An autotuned split-K write-back on the GPU, several ranks sharing it through NVSHMEM: two configurations of the
same split count (the autotuner benchmarks them in the warm-up, against the scratch channels), the grid reading it
with `META.get("SPLIT_K", 1)`; and configurations that split differently, refused before anything is launched."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.test_split_k_autotuned import _multiply, _written
from tilelink.errors import LaunchError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_an_autotuned_split_count_is_counted_on_the_gpu(world: int, tmp_path) -> None:
    path = _written(tmp_path, 'triton.Config({"SPLIT_K": 2}, num_warps=4), triton.Config({"SPLIT_K": 2}, num_warps=8)')
    errors = tilelink.spawn(_multiply, world, path, backend="nvshmem")
    assert all(e == 0.0 for e in errors), errors


def test_configurations_that_split_differently_are_refused_on_the_gpu(tmp_path) -> None:
    path = _written(tmp_path, 'triton.Config({"SPLIT_K": 2}), triton.Config({"SPLIT_K": 4})')
    with pytest.raises(LaunchError, match="give every configuration the same split count"):
        tilelink.spawn(_multiply, 2, path, backend="nvshmem")
