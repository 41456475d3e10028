"""FP8 (e4m3) ``ag_gemm``, ``gemm_rs`` and ``TPMLP(fp8=True)`` on the GPU: ranks sharing one GPU through NVSHMEM,
the compiled kernels (the persistent TMA ones where the rows are 16-byte multiples, the pointer ones otherwise),
against the dequantised float64 reference; and the FP8 compute benchmark's kernels against
``torch._scaled_mm`` on a scaled-down MLP shape.

The same rank functions as the emulated tests (``tests/ops/fp8_worlds.py``). Each operator compiles, loads and
runs its kernels dry at its first call of a shape, before any of them waits for a peer.
"""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.fp8_worlds import fp8_mlp_matches_reference, fp8_ops_match_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


needs_fp8 = pytest.mark.skipif(not _fp8_gpu(), reason="FP8 MMA needs compute capability 8.9 or newer")


@needs_fp8
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("scaling", ["rowwise", "tensor"])
def test_fp8_ops_persistent_kernels(world: int, scaling: str, heap_for_ranks) -> None:
    """M not divisible by the world size; K and N 16-byte rows: the persistent TMA kernels (128 x 256 x 128
    tiles), the copy engine's gather and the hybrid reduce-scatter; B the transpose of an (N, K) weight."""
    heap_for_ranks(world)
    for per_rank in tilelink.spawn(fp8_ops_match_reference, world, 1000, 2 * 1376 // world, 512, scaling, None,
                                   "bfloat16", "nk", backend="nvshmem"):
        assert all(err < 1e-2 for err in per_rank.values()), per_rank


@needs_fp8
@pytest.mark.parametrize("world", [2, 3])
def test_fp8_ops_pointer_kernels_and_a_row_major_b(world: int, heap_for_ranks) -> None:
    """K = 120 (the AG's rows are not 16-byte multiples: the pointer kernel and the SM pull) and N = 77 (the RS's
    bf16 rows neither: the pointer kernel and the SM reduce-scatter); B row-major."""
    heap_for_ranks(world)
    for per_rank in tilelink.spawn(fp8_ops_match_reference, world, 333, 77, 120, "rowwise", None, "bfloat16", "kn",
                                   backend="nvshmem"):
        assert all(err < 1e-2 for err in per_rank.values()), per_rank


@needs_fp8
def test_fp8_ops_fp32_out_and_uneven_k(heap_for_ranks) -> None:
    """fp32 out, K = 200: the AG on the pointer kernel (K is no 16-byte multiple), the RS on the persistent one
    with each rank's K (67, 67, 66) padded to 16 bytes."""
    heap_for_ranks(3)
    for per_rank in tilelink.spawn(fp8_ops_match_reference, 3, 259, 96, 200, "tensor", None, "float32", "nk",
                                   backend="nvshmem"):
        assert all(err < 1e-3 for err in per_rank.values()), per_rank


@needs_fp8
def test_fp8_tp_mlp_two_ranks(heap_for_ranks) -> None:
    heap_for_ranks(2)
    for err in tilelink.spawn(fp8_mlp_matches_reference, 2, 300, 256, 704, backend="nvshmem"):
        assert err < 2e-2


@needs_fp8
def test_fp8_compute_benchmark_runs_against_scaled_mm() -> None:
    """The compute mode's FP8 kernels on MLP-1 scaled down 4 times at world 8 (per rank: AG 2048 x 688 x 1024,
    RS 2048 x 1024 x 344): every method agrees with the dequantised reference, and every ratio is recorded."""
    from tilelink.benchmarks.common import select_shapes
    from tilelink.benchmarks.mlp import run_compute_fp8, summarize_compute_fp8

    record = run_compute_fp8(select_shapes("1"), 8, 2, scale=4)
    print(summarize_compute_fp8(record))
    for row in record["results"]:
        assert row["errors"] == {}, row["errors"]
        assert len(row["ratio"]) == 4 and all(r > 0 for r in row["ratio"].values()), row["ratio"]
