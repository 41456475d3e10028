"""The chunked forms whose loads stay inside tile= (tests/rules/forms/chunked_rows_pointer.py and
chunked_rows_descriptor.py: a chunk's wait before the loop over its blocks, rows masked at the chunk's end or read
through a descriptor made per chunk) compiled and run on the GPU, several ranks sharing it through NVSHMEM: float16
inputs, each rank's column sums against torch in float32."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tests.rules.test_tile_rows import DESCRIPTOR, POINTER, _col_sums, _load
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("world", [2, 3])
def test_the_chunked_forms_equal_torch_on_the_gpu(world: int) -> None:
    for path, name in ((POINTER, "chunked_col_sum"), (DESCRIPTOR, "chunked_col_sum_desc")):
        for chunk in (7, 13):  # a chunk spans two ranks' rows, or one rank's and part of the next
            errors = tilelink.spawn(_col_sums, world, str(path), name, chunk, backend="nvshmem")
            assert all(e < 2e-3 for e in errors), (name, chunk, errors)


def _shard_stride_sums(path: str, name: str) -> float:
    """The descriptor form called with the shard's batch stride, ``shard.stride(0)``, not the full tensor's."""
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = _load(path, name)
    B, S, D = 3, 37, 16
    device = current_world().device
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    lo, hi = rows_of(rank, world, S)
    shard = torch.randn(B, hi - lo, D, generator=torch.Generator().manual_seed(21)).half().to(device)
    y = torch.full((B, D), float("nan"), device=device)
    kernel[(B,)](shard, y, S, D, 8, shard.stride(0), D, BLOCK_S=8, BLOCK_D=D)
    return (y.cpu() - shard.float().cpu().sum(1)).abs().max().item()


def test_the_descriptor_forms_shard_stride_is_refused_on_the_gpu() -> None:
    # `b * stride_xb` in the descriptor's base: a batch step of the shard's stride lands in another batch's rows
    with pytest.raises(LaunchError, match="adds a value the kernel computes times stride_xb="):
        tilelink.spawn(_shard_stride_sums, 2, str(DESCRIPTOR), "chunked_col_sum_desc", backend="nvshmem")
