"""Forms the analysis bounds or keeps in the kernel's own order, compiled and run on the GPU with several ranks sharing
it through NVSHMEM: a pointer advanced in a loop along the columns under the matmul form's mask, the tile mapping's
pairs (rotated) and the pairs that only print alike (kept in order), and a descriptor made in the kernel whose shape
stays within the row; a descriptor shape past the row refused at the call, before anything is launched."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules import test_descriptor_rows as descriptor_rows
from tests.rules import test_loop_advances as loop_advances
from tests.rules import test_tile_mapping_pairs as pairs
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_the_bounded_and_ordered_forms_equal_torch_on_the_gpu(world: int, tmp_path) -> None:
    strided = tmp_path / "strip_sum.py"
    strided.write_text(loop_advances.STRIDED)
    errors = tilelink.spawn(loop_advances._strips, world, str(strided), 4, backend="nvshmem")
    assert all(e < 1e-4 for e in errors), ("strip_sum", errors)
    for form in sorted(pairs.WRONG) + sorted(pairs.RIGHT) + sorted(pairs.HELPERS):
        path = tmp_path / f"parity_{form}.py"
        path.write_text(pairs._form(form if form in pairs.HELPERS else {**pairs.WRONG, **pairs.RIGHT}[form]))
        errors = tilelink.spawn(pairs._parity, world, str(path), form, backend="nvshmem")
        assert all(e < 1e-4 for e in errors), (form, errors)


def _copy(path: str, d: int, col: int) -> float:
    """The descriptor copy with Triton's scratch allocator for descriptors made in the kernel."""
    device = current_world().device
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    return descriptor_rows._copy(path, d, col)


def test_a_descriptor_within_the_row_equals_torch_and_one_past_it_is_refused_on_the_gpu(tmp_path) -> None:
    path = tmp_path / "shifted_copy.py"
    path.write_text(descriptor_rows.SHIFTED)
    d = descriptor_rows.D
    errors = tilelink.spawn(_copy, 2, str(path), d - 4, 4, backend="nvshmem")
    assert all(e < 1e-4 for e in errors), errors
    with pytest.raises(LaunchError, match="adds 11 elements"):
        tilelink.spawn(_copy, 2, str(path), d, 4, backend="nvshmem")
