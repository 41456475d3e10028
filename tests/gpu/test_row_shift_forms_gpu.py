"""The address terms along dim 0 checked at the launch, compiled and run on the GPU with several ranks sharing it
through NVSHMEM: an alias bound two ways in the branches of a compile-time `if`, a column vector made from another
one, a column vector at a program's position bounded by its mask, a shift only an autotuning configuration sets, and
a row start made from the program id itself (run in the kernel's own tile order); a shift past the row refused at the
call, before anything is launched."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules import test_row_shift_forms as forms
from tilelink.errors import LaunchError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_the_forms_checked_at_the_launch_equal_torch_on_the_gpu(world: int, tmp_path) -> None:
    cases = [
        (forms._tail_sums, forms._written(tmp_path, forms.BRANCHED, "branched_sum"), (3, True)),
        (forms._tail_sums, forms._written(tmp_path, forms.BRANCHED, "branched_sum"), (3, False)),
        (forms._tail_sums, forms._written(tmp_path, forms.SHIFTED_COLUMNS, "columns_sum"), (3, True)),
        (forms._block_sums, forms._written(tmp_path, forms.COLUMN_BLOCKS.replace("BOUND", "D"), "block_sum"), ()),
        (forms._tuned_sums, forms._written(tmp_path, forms.TUNED.format(configs='triton.Config({"SHIFT": 3})'),
                                           "tuned_sum"), (3,)),
        (forms._row_sums, forms._written(tmp_path, forms.OWN_START, "own_start_sum"), ()),
    ]
    for fn, path, args in cases:
        errors = tilelink.spawn(fn, world, path, *args, backend="nvshmem")
        assert all(e < 1e-4 for e in errors), (path, errors)


def test_a_shift_past_the_row_is_refused_on_the_gpu(tmp_path) -> None:
    path = forms._written(tmp_path, forms.TUNED.format(configs=forms.TWO_CONFIGS), "tuned_sum")
    with pytest.raises(LaunchError, match="under the autotuning configuration SHIFT=8"):
        tilelink.spawn(forms._tuned_sums, 2, path, 3, backend="nvshmem")
    path = forms._written(tmp_path, forms.BRANCHED, "branched_sum")
    with pytest.raises(LaunchError, match=r"adds 8 elements \(SHIFT=8\)"):
        tilelink.spawn(forms._tail_sums, 2, path, forms.D, True, backend="nvshmem")
