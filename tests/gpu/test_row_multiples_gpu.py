"""The form whose tile= proof takes a divisibility fact (tests/rules/forms/chunked_rows_whole_descriptor.py: blocks
stepping through a chunk, read through one descriptor over every row where the chunks are whole numbers of blocks,
else through a descriptor per chunk) compiled and run on the GPU, several ranks sharing it through NVSHMEM: float16
inputs, each rank's column sums against torch in float32; a chunk that is no whole number of blocks is refused at the
call, before any kernel runs."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.test_row_multiples import FORM, _col_sums
from tilelink.errors import LaunchError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_both_branches_equal_torch_on_the_gpu(world: int) -> None:
    for chunk, even in ((16, True), (8, True), (12, False), (7, False)):
        errors = tilelink.spawn(_col_sums, world, str(FORM), chunk, even, backend="nvshmem")
        assert all(e < 2e-3 for e in errors), (chunk, even, errors)


def test_a_chunk_of_no_whole_number_of_blocks_is_refused_on_the_gpu() -> None:
    with pytest.raises(LaunchError, match="CHUNK a multiple of BLOCK_S"):
        tilelink.spawn(_col_sums, 2, str(FORM), 12, True, backend="nvshmem")
