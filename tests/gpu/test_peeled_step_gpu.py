"""A GEMM whose last K step is peeled after the loop (FlagGems' general form) under a reduction, compiled and run on
the GPU with several ranks sharing it: float16 inputs, tensor-core tiles, each rank's slice of K a whole number of
blocks or not, against torch."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of
from tests.rules.forms_cases import _error, _exact, _placed
from tests.rules.test_k_offsets import PEELED
from tests.rules.test_peeled_step import _peel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def _peeled_gpu(path: str, K: int, rule: str) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N = 1000, 384
    g = torch.Generator().manual_seed(9)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    klo, khi = rows_of(rank, world, K)
    ar, br = _placed(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    lo, hi = rows_of(rank, world, M) if rule == "reduce_scatter" else (0, M)  # all_reduce: every row
    out = torch.full((hi - lo, N), float("nan"), dtype=torch.float32, device=ar.device)
    grid = (triton.cdiv(M, 128), triton.cdiv(N, 128))
    module_at(path).mm_peeled[grid](ar, br, out, M, N, khi - klo, khi - klo, 1, N, 1, N, 1,
                                    BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)
    torch.cuda.synchronize()
    return _error(out, (a @ b)[lo:hi])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_peeled_last_step_equals_torch(rule: str, world: int, tmp_path) -> None:
    path = tmp_path / "mm_peeled.py"
    path.write_text(PEELED.format(rule=rule, loop=_peel()))
    for K in (1536, 1000):  # slices of 768 / 512 (whole blocks) and 500 / 334 (not)
        errors = tilelink.spawn(_peeled_gpu, world, str(path), K, rule, backend="nvshmem")
        assert all(e < 2e-2 for e in errors), (K, errors)
