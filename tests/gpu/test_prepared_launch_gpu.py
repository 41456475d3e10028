"""On the GPU, in a world of one: ``ag_gemm`` and ``gemm_rs`` launch a kept form through the launch prepared for it
(``rules.launch.AloneLaunch`` over a ``rules.direct.Bound``), with the same rank function as the emulated test
(no emulated capture here: ``tests/gpu/test_graphs_gpu.py`` captures the operators; and no second world, as the
GPU tests of the kept plans)."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.plan_worlds import prepared_launches

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def test_a_world_of_one_launches_a_kept_form_through_its_bound_launch_on_the_gpu() -> None:
    (out,) = tilelink.spawn(prepared_launches, 1, False, False, backend="nvshmem")
    assert max(out["errors"].values()) < 1e-2, out["errors"]
    seen = out["seen"]
    assert seen["new form"] == (1, 1, 2), seen
    assert seen["again"][:2] == seen["odd"][:2] == seen["float again"][:2] == (1, 1), seen
    assert "an earlier call on this rank had a wait time out" in out["raised"]["ag after"], out["raised"]
    # every prepared launch is a Bound that kept the compiled kernel of the variants it launched
    assert out["kinds"] and all(kind == "Bound" and compiled >= 1 for kind, compiled in out["kinds"]), out["kinds"]
