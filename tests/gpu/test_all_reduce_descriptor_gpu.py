"""all_reduce on a host `TensorDescriptor` output compiled and run on the GPU, several ranks sharing it through
NVSHMEM: the persistent descriptor GEMM of the kernel forms with its C all-reduced, at tensor-core tiles (128-row
bulk tensor boxes, a program per SM, K slices of 512), float16 inputs, every rank's whole product against torch."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.test_all_reduce_host_descriptor import all_reduced_form, run_all_reduced_descriptor

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_an_all_reduced_host_descriptor_on_the_gpu(world: int, tmp_path) -> None:
    errors = tilelink.spawn(run_all_reduced_descriptor, world, str(all_reduced_form(tmp_path)), 1000, 384, 1536,
                            (128, 128, 64), 132, backend="nvshmem")
    assert all(isinstance(e, float) and e < 2e-2 for e in errors), errors
