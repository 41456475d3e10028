"""A bias added to the partial sums of a reduction, on the GPU, several ranks sharing it through NVSHMEM: every rank
but the first is launched with zeros in place of the bias (a broadcast view, stride 0 along the rows), on the SM
pull, the all-reduce and the copy engine's hybrid reduce-scatter, over calls that take the launch kept for them."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules import test_first_rank_terms as first

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("form, rule, via", [("addmm", "reduce_scatter", ""), ("started", "all_reduce", ""),
                                             ("epilogue", "reduce_scatter", "copy_engine")])
def test_a_bias_added_once_on_the_gpu(form: str, rule: str, via: str, world: int, tmp_path) -> None:
    path = tmp_path / f"bias_{form}_{rule}_{via or 'sm'}.py"
    path.write_text(first._source(form, rule, via))
    errors = tilelink.spawn(first._run, world, str(path), rule, form, backend="nvshmem")
    assert all(e < 5e-2 for e in errors), errors  # tf32 products on the GPU
