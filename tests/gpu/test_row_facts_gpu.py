"""The row facts the launch checks beyond dim 0, compiled and run on the GPU with several ranks sharing it through
NVSHMEM: a shift within a row along an inner dim, a chunk's first rows skipped and a loop's shifts within the row
equal torch; a shift into the next row along the gathered dim, a batch stride that is the shard's, a negative argument
a tile= proof read, a loop that runs past the row and columns that start at a negative program position are refused at
the call, before anything is launched."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules import test_inner_dim_shifts as inner
from tests.rules import test_loop_shifts as loops
from tests.rules import test_position_starts as starts
from tests.rules import test_row_signs as signs
from tilelink.errors import LaunchError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_the_checked_forms_equal_torch_on_the_gpu(world: int, tmp_path) -> None:
    assert all(e < 1e-4 for e in tilelink.spawn(inner._tail_sums, world, inner._written(tmp_path), 1,
                                                 backend="nvshmem"))
    assert all(e < 1e-4 for e in tilelink.spawn(signs._skipped, world, signs._written(tmp_path), 1,
                                                 backend="nvshmem"))
    path = loops._written(tmp_path, loops.WINDOWS, "window_sum")
    assert all(e < 1e-4 for e in tilelink.spawn(loops._windows, world, path, 3, backend="nvshmem"))


def test_the_rows_moved_off_the_tile_are_refused_on_the_gpu(tmp_path) -> None:
    path = inner._written(tmp_path)
    with pytest.raises(LaunchError, match="moves it 1 row along dim 1"):
        tilelink.spawn(inner._tail_sums, 2, path, 4, backend="nvshmem")
    with pytest.raises(LaunchError, match="stride_xb=24"):
        tilelink.spawn(inner._tail_sums, 2, path, 1, 6 * 4, backend="nvshmem")
    with pytest.raises(LaunchError, match="argument 'SKIP' is -1"):
        tilelink.spawn(signs._skipped, 2, signs._written(tmp_path), -1, backend="nvshmem")
    with pytest.raises(LaunchError, match="SPAN=5"):
        tilelink.spawn(loops._windows, 2, loops._written(tmp_path, loops.WINDOWS, "window_sum"), loops.D + 1,
                       backend="nvshmem")


def test_a_program_position_of_unknown_sign_is_bounded_from_the_grid_on_the_gpu(tmp_path) -> None:
    path = tmp_path / "shifted_column_blocks.py"
    path.write_text(starts.SOURCE)
    assert all(e < 1e-6 for e in tilelink.spawn(starts._copy, 2, str(path), 0, backend="nvshmem"))
    with pytest.raises(LaunchError, match="which is -4 for the program"):
        tilelink.spawn(starts._copy, 2, str(path), 1, backend="nvshmem")
    # a position from `tl.swizzle2d`, written out from the installed Triton's definition and bounded the same way
    swizzled = tmp_path / "swizzled_column_blocks.py"
    swizzled.write_text(starts.SOURCE.replace(starts.POSITION, starts.SWIZZLED))
    for got in tilelink.spawn(starts._copied, 2, str(swizzled), backend="nvshmem"):
        assert torch.equal(got, starts.swizzled_copy())
