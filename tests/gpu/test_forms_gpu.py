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
