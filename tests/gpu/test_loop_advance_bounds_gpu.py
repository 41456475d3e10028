"""The column bound of a pointer advanced in a loop in the matmul form, checked at each call and then compiled and
run on the GPU with several ranks sharing it through NVSHMEM: the mask bounded by the row's length equals torch; a
bound one block past the row is refused at the call, before anything is launched."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules import test_loop_advances as loop_advances
from tilelink.errors import LaunchError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def test_a_mask_bound_within_the_row_equals_torch_and_one_past_it_is_refused_on_the_gpu(tmp_path) -> None:
    within = tmp_path / "strip_sum.py"
    within.write_text(loop_advances.STRIDED)
    errors = tilelink.spawn(loop_advances._strips, 2, str(within), 4, backend="nvshmem")
    assert all(e < 1e-4 for e in errors), errors
    past = tmp_path / "strip_sum_past.py"
    past.write_text(loop_advances.PAST)
    with pytest.raises(LaunchError, match="up to the mask's bound D=8 \\+ BLOCK_D=4 = 12"):
        tilelink.spawn(loop_advances._strips, 2, str(past), 4, backend="nvshmem")
