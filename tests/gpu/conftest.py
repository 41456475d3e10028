"""GPU tests: collected everywhere, skipped only where torch sees no CUDA device."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def overlapped_kernels(monkeypatch):
    """The GPU tests check the overlapped kernels: the cost model would send their small shapes to the plain path
    (tests/gpu/test_path_gpu.py unsets it to test the choice). Set for each of them only, not at collection: the
    whole session's other tests would inherit it; every rank a test spawns does."""
    if "TILELINK_PATH" not in os.environ:
        monkeypatch.setenv("TILELINK_PATH", "overlap")


#: the symmetric heap of each rank when many ranks share one GPU (NVSHMEM's default is 1 GiB; a larger
#: NVSHMEM_SYMMETRIC_SIZE exported for the benchmarks, e.g. 16G, times 8 ranks would not fit next to them)
SHARED_GPU_HEAP = 2 << 30


@pytest.fixture
def heap_for_ranks(monkeypatch):
    """Call with the world size before spawning: caps each rank's NVSHMEM_SYMMETRIC_SIZE so that all the
    ranks' heaps fit on one GPU when they share it."""
    def cap(world: int) -> None:
        if torch.cuda.device_count() >= world:
            return  # one GPU per rank
        size = os.environ.get("NVSHMEM_SYMMETRIC_SIZE")
        if size is None or _bytes(size) > SHARED_GPU_HEAP:
            monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", str(SHARED_GPU_HEAP))
    return cap


def _bytes(size: str) -> int:
    """NVSHMEM_SYMMETRIC_SIZE in bytes ("1073741824", "16G", "512M", "2g")."""
    size = size.strip()
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(size[-1:].lower(), 1)
    return int(float(size[:-1] if scale > 1 else size) * scale)
