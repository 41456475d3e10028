"""An `if` whose sides bind the same values up to casts to int64, read as one binding (``tilelink.branches``), compiled
by Triton and run on the GPU by two ranks sharing it through NVSHMEM: unsloth's `LONG_INDEXING` form of an
elementwise kernel with either side taken, and a tile index bound on both sides, its rotation after the `if`, under
both rules."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.test_alike_branches import ELEMENTWISE, NARROW, TWO, elementwise, gemm, multiply

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("long_indexing", [True, False], ids=["long", "short"])
def test_the_long_indexing_twin_on_the_gpu(long_indexing: bool, tmp_path) -> None:
    path = tmp_path / "fg.py"
    path.write_text(ELEMENTWISE.format(narrow=NARROW))
    errors = tilelink.spawn(elementwise, 2, str(path), long_indexing, backend="nvshmem")
    assert all(e < 1e-5 for e in errors), errors


@pytest.mark.parametrize("wide", [True, False], ids=["wide", "narrow"])
@pytest.mark.parametrize("rule", ['reduce_scatter("c_ptr")', 'all_gather("a_ptr")'], ids=["reduce", "gather"])
def test_a_tile_index_bound_alike_on_both_sides_on_the_gpu(rule: str, wide: bool, tmp_path) -> None:
    path = gemm(tmp_path, rule, TWO)
    errors = tilelink.spawn(multiply, 2, path, rule.startswith("reduce"), wide, backend="nvshmem")
    assert errors == [0.0, 0.0], errors
