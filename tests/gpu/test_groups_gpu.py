"""TileLink worlds of process groups on the GPU: a job of 4 ranks sharing one GPU, two groups of 2, each group an
NVSHMEM world of its own (UID bootstrap over the group), running its operators at the same time as the other.

The same rank functions as the emulated tests (``tests/runtime/group_worlds.py``), on CUDA tensors, compiled."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.runtime import group_worlds as worlds

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize(("groups", "M", "N", "K", "dtype"), [
    ([[0, 1], [2, 3]], 1000, 1376, 512, "bfloat16"),  # the persistent TMA kernels
    ([[0, 2], [1, 3]], 333, 77, 121, "float16"),  # rows not 16-byte aligned: the pointer kernels
], ids=["consecutive-persistent", "interleaved-pointer"])
def test_two_groups_run_their_operators_at_once(groups, M, N, K, dtype, heap_for_ranks) -> None:
    """Each group's ag_gemm and gemm_rs (three calls each, with and without a context) match torch on the group's
    own matrices; the symmetric buffers of a group hold only its members' data."""
    heap_for_ranks(4)
    reports = tilelink.spawn(worlds.group_ops, 4, M, N, K, dtype, 3, groups=groups, backend="nvshmem", timeout=600)
    for job_rank, report in enumerate(reports):
        group = next(g for g in groups if job_rank in g)
        assert (report["rank"], report["world_size"], report["ranks"]) == (group.index(job_rank), 2, group), report
        assert report["peers"] == group, report
        assert all(report[op] < 1e-2 for op in ("ag_gemm", "ag_gemm_ctx", "gemm_rs")), report


def test_device_mesh_dimension_is_the_world(heap_for_ranks) -> None:
    """A 2 x 2 DeviceMesh ("dp", "tp") of a job joined to the groups of its "dp" dimension ({0, 2}, {1, 3}):
    ``tilelink.init(mesh=mesh, mesh_dim="dp")`` is the world joined, the rank its mesh coordinate, and its
    operators run. (Joining one dimension, leaving and joining the other would start NVSHMEM again over other
    processes, which NVSHMEM does not promise; the emulated test does it.)"""
    dim, groups = "dp", [[0, 2], [1, 3]]
    heap_for_ranks(4)
    reports = tilelink.spawn(worlds.mesh_dim_ops, 4, 512, 256, 256, "bfloat16", dim, groups=groups,
                             backend="nvshmem", timeout=600)
    for job_rank, report in enumerate(reports):
        group = next(g for g in groups if job_rank in g)
        assert report["same_world"] and report["rank"] == report["mesh_rank"] == group.index(job_rank), report
        assert report["ranks"] == report["peers"] == group, report
        assert all(report[op] < 1e-2 for op in ("ag_gemm", "ag_gemm_ctx", "gemm_rs")), report
