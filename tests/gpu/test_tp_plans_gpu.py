"""``ag_gemm`` and ``gemm_rs`` keep what their checks and choices computed per form of call (``ops.contract.
CallPlans``): on the GPU, with the persistent kernels, the same rank functions as the emulated tests."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.plan_worlds import kept_forms_hold_no_call_tensor, kept_plans_compute_the_same, refused_after_kept_calls

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [1, 2])
def test_kept_plans_compute_the_same_on_the_gpu(world: int) -> None:
    """New data of a kept form, an operand at an odd address (copied for the descriptors), K and N padded, bf16;
    ranks sharing one GPU at world 2."""
    for out in tilelink.spawn(kept_plans_compute_the_same, world, "bfloat16", False, backend="nvshmem"):
        assert max(out["errors"].values()) < 2e-2, out["errors"]
        assert out["kept"] == {"ag": 2, "rs": 2}, out
        assert out["persistent"] == {"ag": [False, True], "rs": [False, True]}, out
        assert all("TILELINK_PATH='fast'" in m for m in out["path"].values()), out["path"]


def test_a_bad_call_after_kept_calls_is_refused_with_the_same_message_on_the_gpu() -> None:
    """The bad calls' operands are on the CPU here: the device check refuses them after the kept calls too."""
    ((fresh, after),) = tilelink.spawn(refused_after_kept_calls, 1, backend="nvshmem")
    assert "NO ERROR" not in fresh.values(), fresh
    assert after == fresh


@pytest.mark.parametrize("world", [1, 2])
def test_kept_forms_let_go_of_each_calls_tensors_on_the_gpu(world: int, heap_for_ranks) -> None:
    """The bound launches (a world of one's, the all-gather's and the hybrid reduce-scatter's with a peer) keep no
    operand or result of the call they were made from."""
    heap_for_ranks(world)
    for out in tilelink.spawn(kept_forms_hold_no_call_tensor, world, backend="nvshmem"):
        assert out["prepared"] == (["AloneLaunch"] * 2 if world == 1 else ["GatherLaunch", "ScatterLaunch"]), out
        assert not any(any(step) for step in out["alive"]), out
