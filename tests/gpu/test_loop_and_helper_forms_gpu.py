"""Forms the analysis keeps applied or in the kernel's own order, compiled by Triton and run on the GPU with several
ranks sharing it through NVSHMEM: a pointer advanced in a loop that an outer loop binds afresh on every pass (a
persistent matmul's form), and a tile mapping's helper imported from a module beside the kernel's file, read there
(its first value holds the parity too: the kernel's order)."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules import test_loop_advances as loop_advances
from tests.rules import test_tile_mapping_pairs as pairs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_an_outer_loop_binding_the_pointer_afresh_equals_torch_on_the_gpu(world: int, tmp_path) -> None:
    path = tmp_path / "strip_sum_fresh.py"
    path.write_text(loop_advances.FRESH)
    # two passes of four steps over a row of two blocks: twice the sum of one
    errors = tilelink.spawn(loop_advances._strips, world, str(path), 4, 2, backend="nvshmem")
    assert all(e < 1e-4 for e in errors), errors


def test_an_imported_helpers_pair_equals_torch_on_the_gpu(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    for form in ("helper_whole", "helper_pair"):
        kernel, helpers = pairs._imported(form, f"tile_helpers_{form}")
        (tmp_path / f"tile_helpers_{form}.py").write_text(helpers)
        path = tmp_path / f"parity_imported_{form}.py"
        path.write_text(kernel)
        errors = tilelink.spawn(pairs._parity, 2, str(path), form, backend="nvshmem")
        assert all(e < 1e-4 for e in errors), (form, errors)
