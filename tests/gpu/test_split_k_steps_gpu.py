"""Split-K steps and block pointers (moved by `tl.advance` or made on each step) read under a reduction, compiled and
run on the GPU with several ranks sharing it (the interpreter has no block pointers): the forms that tile K equal
torch at worlds 2 and 3, and a grid with another split count than the step's is refused at the call, before anything
is enqueued."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import launch_refusal, module_at, rows_of
from tests.rules.forms_cases import _error, _exact, _placed
from tests.rules.test_block_pointer_steps import BLOCK_POINTERS
from tests.rules.test_k_columns_read import AFRESH, PARAMS_ADVANCED
from tests.rules.test_split_k_steps import COLUMNS, POINTERS, SPLIT, TILES

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def _gemm_on(path: str, name: str, splits: int, split_k: int) -> float | str:
    """The kernel ``name`` of ``path`` at this rank's slice of K against torch: float16 inputs, 1024 x 512 x 1536,
    128 x 128 x 64 tiles, ``splits`` programs along the grid's third axis."""
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 1024, 512, 1536
    g = torch.Generator().manual_seed(5)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    klo, khi = rows_of(rank, world, K)
    ar, br = _placed(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    lo, hi = rows_of(rank, world, M)
    out = torch.full((hi - lo, N), float("nan"), dtype=torch.float32, device=ar.device)
    kernel = getattr(module_at(path), name)
    grid = (triton.cdiv(M, 128), triton.cdiv(N, 128), splits)
    refused = launch_refusal(lambda: kernel[grid](ar, br, out, M, N, khi - klo, ar.stride(0), 1, N, 1, N, 1,
                                                  BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=split_k))
    if refused != "ran":
        return refused
    torch.cuda.synchronize()
    return _error(out, (a @ b)[lo:hi])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("form", ["pointers", "columns", "tiles", "block-pointers", "split-block-pointers",
                                  "block-pointers-afresh", "split-block-pointers-afresh", "block-pointers-in-load",
                                  "parameters-advanced"])
def test_forms_that_tile_k_equal_torch(form: str, world: int, tmp_path) -> None:
    source, name = {
        "pointers": (SPLIT.format(loop=POINTERS.format(start="BLOCK_K", advance="BLOCK_K * SPLIT_K")), "mm_split"),
        "columns": (SPLIT.format(loop=COLUMNS.format(start="pid_k * BLOCK_K", step="BLOCK_K * SPLIT_K")), "mm_split"),
        "tiles": (SPLIT.format(loop=TILES.format(step="SPLIT_K")), "mm_split"),
        "block-pointers": (BLOCK_POINTERS.format(start="0", step="BLOCK_K", advance="BLOCK_K"), "mm_blocks"),
        "split-block-pointers": (BLOCK_POINTERS.format(start="pid_k * BLOCK_K", step="BLOCK_K * SPLIT_K",
                                                       advance="BLOCK_K * SPLIT_K"), "mm_blocks"),
        "block-pointers-afresh": (SPLIT.replace("tl.atomic_add(", "tl.store(").format(loop=AFRESH.format(
            range="0, K, BLOCK_K", a_at="pid_m * BLOCK_M, k", b_at="k, pid_n * BLOCK_N")), "mm_split"),
        "split-block-pointers-afresh": (SPLIT.format(loop=AFRESH.format(
            range="pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K", a_at="pid_m * BLOCK_M, k", b_at="k, pid_n * BLOCK_N")),
            "mm_split"),
        "block-pointers-in-load": (SPLIT.replace("tl.atomic_add(", "tl.store(").format(loop=AFRESH.format(
            range="0, K, BLOCK_K", a_at="pid_m * BLOCK_M, k", b_at="k, pid_n * BLOCK_N").replace(
            "        a_bp = tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BLOCK_M, k), (BLOCK_M, "
            "BLOCK_K), (1, 0))\n", "").replace(
            "tl.load(a_bp,", "tl.load(tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BLOCK_M, k), "
                             "(BLOCK_M, BLOCK_K), (1, 0)),")), "mm_split"),
        "parameters-advanced": (SPLIT.replace("tl.atomic_add(", "tl.store(").format(
            loop=PARAMS_ADVANCED.format(advance="BLOCK_K")), "mm_split"),
    }[form]
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    splits = 3 if form in ("pointers", "columns", "tiles", "split-block-pointers", "split-block-pointers-afresh") else 1
    errors = tilelink.spawn(_gemm_on, world, str(path), name, splits, splits, backend="nvshmem")
    assert all(isinstance(e, float) and e < 2e-2 for e in errors), errors


def test_a_grid_with_another_split_count_is_refused_at_the_call(tmp_path) -> None:
    path = tmp_path / "mm_split.py"
    path.write_text(SPLIT.format(loop=POINTERS.format(start="BLOCK_K", advance="BLOCK_K * SPLIT_K")))
    said = tilelink.spawn(_gemm_on, 2, str(path), "mm_split", 4, 2, backend="nvshmem")
    assert all(isinstance(s, str) and "the grid has 4 programs along axis 2" in s for s in said), said
