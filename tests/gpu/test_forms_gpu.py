"""The kernel forms of tests/rules/forms (only their annotation added) compiled and run on the GPU, several
ranks sharing it through NVSHMEM: float16 inputs, each rank's result against torch in float32."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.forms_cases import RUNS, run_forms

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_forms_on_the_gpu(world: int) -> None:
    names = sorted(RUNS)
    failures = [f"{name}, rank {rank}: {value}"
                for rank, results in enumerate(tilelink.spawn(run_forms, world, names, backend="nvshmem"))
                for name, value in results.items() if not (isinstance(value, float) and value < 2e-2)]
    assert not failures, "\n".join(failures)


#: the split-K, host-descriptor and persistent forms at the sizes a GPU runs them with: tensor-core tiles, 128-row
#: bulk tensor boxes, a program per SM, several row tiles per rank's shard (uneven at 3 ranks) and K slices of 512
TILE_SIZES = {"M": 1000, "N": 384, "K": 1536, "blocks": (128, 128, 64), "programs": 132}


@pytest.mark.parametrize("world", [2, 3])
def test_split_k_and_host_descriptor_forms_at_tensor_core_tile_sizes(world: int) -> None:
    names = ["gemm_rs_split_k", "gemm_ar_split_k", "gemm_host_descriptor_ag", "gemm_host_descriptor_rs",
             "gemm_rs_persistent_grouped", "gemm_persistent_counter", "gemm_columns_beside"]
    failures = [f"{name}, rank {rank}: {value}"
                for rank, results in enumerate(tilelink.spawn(run_forms, world, names, TILE_SIZES, backend="nvshmem"))
                for name, value in results.items() if not (isinstance(value, float) and value < 2e-2)]
    assert not failures, "\n".join(failures)
