"""Compiled by Triton and run through NVSHMEM with several ranks sharing the GPU: a reduce-scatter kernel whose two
`@triton.jit` helper calls store the halves of each tile (every element stored and counted once), and an all-gather
kernel reading blocks through a tensor descriptor at the target of the loop around its wait (the target carries the
wait's token), and a persistent reduce-scatter kernel launched with more programs than its tile loop's step, refused
before it runs."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules import test_descriptor_loop_tokens as loop_tokens
from tests.rules import test_stored_once as stored_once
from tests.rules import test_stored_once_over_the_grid as over_the_grid

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_helper_halves_and_loop_target_blocks_equal_torch_on_the_gpu(world: int) -> None:
    errors = tilelink.spawn(stored_once._halves, world, str(stored_once.HALVES), backend="nvshmem")
    assert all(e < 1e-5 for e in errors), errors
    errors = tilelink.spawn(loop_tokens._sums, world, str(loop_tokens.FORM), backend="nvshmem")
    assert all(e < 1e-5 for e in errors), errors


def test_a_persistent_kernel_with_more_programs_than_its_step_is_refused_on_the_gpu() -> None:
    over_the_grid.persistent_launches(backend="nvshmem")
