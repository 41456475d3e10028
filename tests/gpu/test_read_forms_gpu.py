"""Forms the rewriter reads, compiled and run on the GPU with several ranks sharing it through NVSHMEM: a descriptor
made from a tensor gathered along an inner dim (its axes before the rows checked at each call against the gathered
buffer: the shard's stride refused, the full tensor's equal to the tensor), a 1-D mask local made a column of the
block (`k_mask[None, :]`), an index widened where it is loaded, and token rows bound on each side of a compile-time
`if` (vLLM's one-slot blocks, run with no index at all), the matmul template as later torch releases spell it, and
tiles that start at rows loaded through an index (Liger's grouped GEMM)."""

from __future__ import annotations

import textwrap

import pytest
import torch

import tilelink
from tests.rules import test_descriptor_rows as descriptors
from tests.rules import test_index_per_side as sides
from tests.rules import test_inductor_template as inductor
from tests.rules import test_loaded_tile_start as loaded
from tests.rules import test_mask_spellings as masks
from tests.rules import test_scattered_index_rows as scattered

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("form, full", [("batched_copy", 640), ("column_copy", 64)])
def test_a_descriptors_axes_before_the_rows_on_the_gpu(form: str, full: int, tmp_path) -> None:
    path = tmp_path / f"{form}.py"
    path.write_text(descriptors.BATCHED if form == "batched_copy" else descriptors.COLUMNS)
    for said in tilelink.spawn(descriptors._copied, 2, str(path), form, False, backend="nvshmem"):
        assert isinstance(said, str) and f"pass the full tensor's stride of dim 0 ({full} here)" in said, said
    for world in (2, 3):
        assert tilelink.spawn(descriptors._copied, world, str(path), form, True, backend="nvshmem") == [0.0] * world


@pytest.mark.parametrize("rule", ['reduce_scatter("c_ptr")', 'all_gather("a_ptr")'], ids=["reduce", "gather"])
def test_a_column_mask_through_a_local_on_the_gpu(rule: str, tmp_path) -> None:
    path = tmp_path / "local_mask.py"
    path.write_text(masks.LOCAL_MASK.format(rule=rule, k_mask="ks < K"))
    errors = tilelink.spawn(masks._multiply, 2, str(path), rule.startswith("reduce"), backend="nvshmem")
    assert all(e < 1e-2 for e in errors), errors


def test_an_index_widened_where_it_is_loaded_on_the_gpu(tmp_path) -> None:
    loaded = "rows = tl.load(src_ptr + offs_i, mask=offs_i < L, other=0)"
    path = tmp_path / "gather_mm_widened.py"
    path.write_text(textwrap.dedent(scattered.KERNEL).replace(loaded, loaded + ".to(tl.int64)"))
    for world in (2, 3):
        errors = tilelink.spawn(scattered._run, world, str(path), backend="nvshmem")
        assert all(e < 5e-2 for e in errors), (world, errors)  # tf32 dots


@pytest.mark.parametrize("naive", [False, True], ids=["sorted", "one-slot-blocks"])
@pytest.mark.parametrize("rule", ["gather", "reduce"])
def test_tokens_bound_on_each_side_of_an_if_on_the_gpu(rule: str, naive: bool, tmp_path) -> None:
    path = tmp_path / f"moe_{rule}.py"
    path.write_text(textwrap.dedent(sides.UP if rule == "gather" else sides.DOWN))
    run = sides._up if rule == "gather" else sides._down
    for world in (2, 3):
        errors = tilelink.spawn(run, world, str(path), naive, backend="nvshmem")
        assert all(e < 5e-2 for e in errors), (world, errors)  # tf32 dots


def test_later_torch_template_spellings_on_the_gpu(tmp_path) -> None:
    path = tmp_path / "spelled.py"
    path.write_text(inductor.SPELLED)
    for world in (2, 3):
        errors = tilelink.spawn(inductor._spelled, world, str(path), backend="nvshmem")
        assert all(e < 5e-2 for e in errors), (world, errors)  # tf32 dots


@pytest.mark.parametrize("rule", ["all_gather", "reduce_scatter"])
def test_the_later_torch_template_on_the_gpu(rule: str, tmp_path) -> None:
    path = tmp_path / f"later_{rule}.py"
    path.write_text(inductor.LATER.format(rule=rule, tensor=inductor.TENSORS[rule], head=inductor.ONE_TILE))
    for world in (2, 3):
        errors = tilelink.spawn(inductor._later, world, str(path), rule, False, backend="nvshmem")
        assert all(e < 5e-2 for e in errors), (world, errors)  # tf32 dots


@pytest.mark.parametrize("rule", sorted(loaded.RULES))
def test_tiles_started_at_loaded_rows_on_the_gpu(rule: str, tmp_path) -> None:
    path = tmp_path / f"grouped_{rule}.py"
    path.write_text(textwrap.dedent(loaded.KERNEL).replace("{rule}", loaded.RULES[rule]))
    for world in (2, 3):
        errors = tilelink.spawn(loaded._run, world, str(path), rule, backend="nvshmem")
        assert all(e < 5e-2 for e in errors), (world, errors)  # tf32 dots
