"""The matmul tutorial's form with its activation under a compile-time string, reduce-scattered on the GPU by ranks
sharing it through NVSHMEM: the launches without the activation equal torch, and Triton's code generator refuses the
one with it at compile time, with TileLink's message, before anything of the call runs."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.activation_cases import linear_launches, refused_launch
from tests.rules.test_constexpr_epilogue import FORM, _line_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def test_the_launches_without_the_activation_equal_torch_on_the_gpu() -> None:
    errors = tilelink.spawn(linear_launches, 2, backend="nvshmem")
    assert all(err < 2e-2 for err in errors), errors


def test_the_launch_with_the_activation_is_refused_saying_where_and_why() -> None:
    epilogue = _line_of(FORM.read_text(), "accumulator = leaky_relu(accumulator)")
    for rank, result in enumerate(tilelink.spawn(refused_launch, 2, backend="nvshmem")):
        raised = result["raised"]
        assert raised is not None, f"rank {rank}: the launch with ACTIVATION='leaky_relu' ran"
        assert f"gemm_rs_activation.py:{epilogue}: the value stored to 'c_ptr' goes through the helper " \
               "`leaky_relu`" in raised, raised
        assert result["kept"], f"rank {rank}: the refused launch wrote its output shard"
        # refused before the call enqueues anything: the kernel stays usable
        assert result["after"] < 2e-2, f"rank {rank}: a launch after the refused one is off by {result['after']}"
