"""The chunked forms whose loads stay inside tile= (tests/rules/forms/chunked_rows_pointer.py and
chunked_rows_descriptor.py: a chunk's wait before the loop over its blocks, rows masked at the chunk's end or read
through a descriptor made per chunk) compiled and run on the GPU, several ranks sharing it through NVSHMEM: float16
inputs, each rank's column sums against torch in float32."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.test_tile_rows import DESCRIPTOR, POINTER, _col_sums

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_the_chunked_forms_equal_torch_on_the_gpu(world: int) -> None:
    for path, name in ((POINTER, "chunked_col_sum"), (DESCRIPTOR, "chunked_col_sum_desc")):
        for chunk in (7, 13):  # a chunk spans two ranks' rows, or one rank's and part of the next
            errors = tilelink.spawn(_col_sums, world, str(path), name, chunk, backend="nvshmem")
            assert all(e < 2e-3 for e in errors), (name, chunk, errors)
