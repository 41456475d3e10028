"""The row proofs' launch checks on the GPU path, compiled and run with several ranks sharing one GPU through NVSHMEM:
a matmul-form advance whose columns start at a passed offset, a batch bounded by the grid in a sequence-major buffer,
unmasked columns within the row along an inner dim and a forward step equal torch; a negative start or step, one
program more than the sequence-major row holds blocks and columns past the row are refused at the call, before
anything is launched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import triton

import tilelink
from tests.rules import test_column_starts as starts
from tests.rules import test_inner_dim_columns as columns
from tests.rules import test_sequence_major_steps as sequence
from tests.rules import test_step_signs as signs
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def _written(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _column_sums(path: str, programs: int) -> float:
    """The sequence-major sums with Triton's scratch allocator, for the descriptors the kernel makes."""
    device = current_world().device
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    return sequence._column_sums(path, programs)


@pytest.mark.parametrize("world", [2, 3])
def test_the_bounded_forms_equal_torch_on_the_gpu(world: int, tmp_path) -> None:
    window = _written(tmp_path, "window_strip_sum.py", starts.SOURCE)
    assert all(e < 1e-4 for e in tilelink.spawn(starts._windows, world, window, 2, 3, backend="nvshmem"))
    blocks = _written(tmp_path, "row_block_sums.py", columns.SOURCE)
    assert all(e < 1e-4 for e in tilelink.spawn(columns._sums, world, blocks, 8, 8, backend="nvshmem"))
    stepped = _written(tmp_path, "window_strip_step.py", signs.STEPPED)
    assert all(e < 1e-4 for e in tilelink.spawn(signs._stepped, world, stepped, signs.BLOCK_D, 2, backend="nvshmem"))
    chunked = _written(tmp_path, "chunked_rows_descriptor.py", sequence.FORM.read_text())
    assert all(e < 1e-4 for e in tilelink.spawn(_column_sums, world, chunked, sequence.B,
                                                 backend="nvshmem"))


def test_what_leaves_the_row_is_refused_on_the_gpu(tmp_path) -> None:
    with pytest.raises(LaunchError, match="argument 'OFF' is -2"):
        tilelink.spawn(starts._windows, 2, _written(tmp_path, "window_strip_sum.py", starts.SOURCE), -2, 3,
                       backend="nvshmem")
    with pytest.raises(LaunchError, match="moves it 1 row along dim 1"):
        tilelink.spawn(columns._sums, 2, _written(tmp_path, "row_block_sums.py", columns.SOURCE), 6, 8,
                       backend="nvshmem")
    with pytest.raises(LaunchError, match="argument 'STEP' is -4"):
        tilelink.spawn(signs._stepped, 2, _written(tmp_path, "window_strip_step.py", signs.STEPPED), -signs.BLOCK_D,
                       2, backend="nvshmem")
    with pytest.raises(LaunchError, match="so it reaches element 11 of a row"):
        tilelink.spawn(sequence._column_sums, 2, _written(tmp_path, "chunked_rows_descriptor.py",
                                                          sequence.FORM.read_text()), sequence.B + 1,
                       backend="nvshmem")


def test_masked_columns_and_whole_steps_are_checked_on_the_gpu(tmp_path) -> None:
    from tests.rules import test_row_proof_bounds as bounds

    blocks = _written(tmp_path, "column_block_sums.py", bounds.BLOCKS)
    chunked = _written(tmp_path, "chunked_rows_pointer.py", bounds.CHUNKED)
    assert all(e < 1e-4 for e in tilelink.spawn(bounds._block_sums, 2, blocks, bounds.ROW, bounds.BLOCK_D,
                                                bounds.ROW // bounds.BLOCK_D, backend="nvshmem"))
    assert all(e < 1e-4 for e in tilelink.spawn(bounds._chunked_sums, 2, chunked, bounds.D, bounds.B,
                                                backend="nvshmem"))
    with pytest.raises(LaunchError, match="whose rows are 8 elements long"):
        tilelink.spawn(bounds._block_sums, 2, blocks, 2 * bounds.ROW, bounds.BLOCK_D, 2 * bounds.ROW // bounds.BLOCK_D,
                       backend="nvshmem")
    with pytest.raises(LaunchError, match="argument 'STEP' is -4"):
        tilelink.spawn(bounds._block_sums, 2, blocks, bounds.ROW, -bounds.BLOCK_D, 2, backend="nvshmem")
    with pytest.raises(LaunchError, match="moves it 1 row along dim 1"):
        tilelink.spawn(bounds._chunked_sums, 2, chunked, 2 * bounds.D, bounds.B, backend="nvshmem")
    with pytest.raises(LaunchError, match="so it reaches block 2"):
        tilelink.spawn(bounds._chunked_sums, 2, chunked, bounds.D, bounds.B + 1, backend="nvshmem")
