"""The rewriter's soundness checks on the GPU, several ranks sharing it through NVSHMEM: an autotuned split-K
write-back (two configurations of one split count, benchmarked in the warm-up against the scratch channels, the grid
reading it with `META.get("SPLIT_K", 1)`; configurations that split differently refused before anything is
launched; an untuned split count left to its constexpr default), rows scaled by the row stride of a view (and a
scale that is not, refused at the call, also when it is a constexpr default), and a kernel that reads its position
directly, run in its own tile order; rows gathered through an index whose columns pass the row's end, refused at
the call; triton.ops.matmul's split-K walk of whole blocks without a column mask, checked over the grid; a split
count a heuristic reads from the reduced tensor, and a grid that counts its rows, evaluated on the partial sums the
kernel is given."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules import test_row_scales as scales
from tests.rules import test_scattered_index_rows as index_rows
from tests.rules import test_tile_order_bypass as bypass
from tests.rules import test_whole_blocks as whole
from tests.rules.test_split_k_autotuned import _multiply, _written, written_with_a_default, written_with_a_heuristic
from tilelink.errors import LaunchError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_an_autotuned_split_count_is_counted_on_the_gpu(world: int, tmp_path) -> None:
    path = _written(tmp_path, 'triton.Config({"SPLIT_K": 2}, num_warps=4), triton.Config({"SPLIT_K": 2}, num_warps=8)')
    errors = tilelink.spawn(_multiply, world, path, backend="nvshmem")
    assert all(e == 0.0 for e in errors), errors


def test_configurations_that_split_differently_are_refused_on_the_gpu(tmp_path) -> None:
    path = _written(tmp_path, 'triton.Config({"SPLIT_K": 2}), triton.Config({"SPLIT_K": 4})')
    with pytest.raises(LaunchError, match="give every configuration the same split count"):
        tilelink.spawn(_multiply, 2, path, backend="nvshmem")


def test_a_split_count_left_to_its_default_is_counted_on_the_gpu(tmp_path) -> None:
    errors = tilelink.spawn(_multiply, 2, written_with_a_default(tmp_path), backend="nvshmem")
    assert all(e == 0.0 for e in errors), errors


def test_a_split_count_a_heuristic_reads_from_the_reduced_tensor_is_counted_on_the_gpu(tmp_path) -> None:
    errors = tilelink.spawn(_multiply, 2, written_with_a_heuristic(tmp_path), backend="nvshmem")
    assert all(e == 0.0 for e in errors), errors


@pytest.mark.parametrize("world", [2, 3])
def test_a_grid_that_counts_the_rows_of_the_reduced_tensor_is_checked_on_the_tiles_launched(world: int,
                                                                                          tmp_path) -> None:
    # Triton gives the grid function the partial sums (all M rows), not the caller's rows of the output: the checks
    # that no row is left unstored and none stored twice evaluate it on the same
    errors = tilelink.spawn(_multiply, world, written_with_a_default(tmp_path), rows_from_output=True,
                            backend="nvshmem")
    assert all(e == 0.0 for e in errors), errors


def test_a_scale_left_to_its_default_is_refused_on_the_gpu(tmp_path) -> None:
    path = scales._written(tmp_path, scales.EVERY_OTHER, "every_other")
    with pytest.raises(LaunchError, match="addressed 2 elements apart"):
        tilelink.spawn(scales._every_other, 2, path, backend="nvshmem")


@pytest.mark.parametrize("world", [2, 3])
def test_rows_scaled_by_the_row_stride_of_a_view_on_the_gpu(world: int, tmp_path) -> None:
    path = scales._written(tmp_path, scales.PAIRS, "pair_sum")
    errors = tilelink.spawn(scales._pairs, world, path, "pairs", backend="nvshmem")
    assert all(e < 1e-6 for e in errors), errors
    with pytest.raises(LaunchError, match="addressed 2 elements apart"):
        tilelink.spawn(scales._pairs, world, path, "flat", backend="nvshmem")


@pytest.mark.parametrize("form", sorted(bypass.FORMS))
def test_a_kernel_reading_its_position_directly_on_the_gpu(form: str, tmp_path) -> None:
    path = tmp_path / f"bypass_{form}.py"
    path.write_text(bypass.HEAD + bypass.textwrap.dedent(bypass.FORMS[form]))
    errors = tilelink.spawn(bypass._double, 2, str(path), form, backend="nvshmem")
    assert all(e < 1e-3 for e in errors), errors


def test_gathered_rows_whose_columns_pass_the_row_s_end_are_refused_on_the_gpu(tmp_path) -> None:
    masked, unmasked = tmp_path / "masked.py", tmp_path / "unmasked.py"
    masked.write_text(index_rows.textwrap.dedent(index_rows.ONE_STEP).replace("{columns}", " & (offs_k[None, :] < K)"))
    unmasked.write_text(index_rows.textwrap.dedent(index_rows.ONE_STEP).replace("{columns}", ""))
    errors = tilelink.spawn(index_rows._run, 2, str(masked), 64, backend="nvshmem")
    assert all(e < 5e-2 for e in errors), errors  # tf32 products on the GPU
    with pytest.raises(LaunchError, match=r"adds 63 elements .* whose rows are 40 elements long"):
        tilelink.spawn(index_rows._run, 2, str(unmasked), 64, backend="nvshmem")


@pytest.mark.parametrize("world", [2, 3])
def test_triton_ops_split_k_walks_whole_blocks_on_the_gpu(world: int, tmp_path) -> None:
    """triton.ops.matmul's split-K kernel under all_gather: its unmasked `EVEN_K` side (K = 128, two splits of
    BLOCK_K = 16) and its masked side (K = 120) equal torch; three programs along the split axis for two splits would
    read past the row on the unmasked side, and are refused before the launch."""
    path = tmp_path / "split_whole_blocks.py"
    path.write_text(whole.SPLIT)
    for K in (128, 120):
        errors = tilelink.spawn(whole._split, world, str(path), K, 2, 2, backend="nvshmem")
        assert all(e < 1e-2 for e in errors), (K, errors)
    with pytest.raises(LaunchError, match="the start reaches 32, so that program's columns end at 48"):
        tilelink.spawn(whole._split, world, str(path), 128, 2, 3, backend="nvshmem")
