"""A mask written over several lines inside the call's own brackets (`mask=token_mask[:, None] &\n (offs_k[None, :] <
K - k * BLOCK_K)`, as vLLM writes its loads) is no expression on its own: TileLink reads it as if it were in
parentheses. It stopped the build with a parser's traceback before."""

from __future__ import annotations

from pathlib import Path

import pytest

import tilelink
from tests.rules.cases import _ag_gemm, _rs_gemm, module_at
from tests.rules.test_carried_accumulator import _generate, _source

HERE = Path(__file__).parent
A_MASK = "mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K)"
STORE_MASK = "mask=(rm[:, None] < M) & (rn[None, :] < N))"


def _gathered(path: str) -> float:
    return _ag_gemm(module_at(path).matmul_kernel, tilelink.rank(), tilelink.world_size(), BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16, GROUP_M=2)


def _scattered(path: str) -> float:
    return _rs_gemm(module_at(path).matmul, tilelink.rank(), tilelink.world_size(), BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


@pytest.mark.parametrize("world", [2, 3])
def test_a_wrapped_mask_of_the_gathered_load_equals_torch(world: int, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = (HERE / "all_gather" / "pointer_gemm.before.py").read_text()
    one_line = "mask=(offs_am[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K)"
    assert one_line in source
    source = source.replace(one_line, "mask=(offs_am[:, None] < M) &\n                    (offs_k[None, :] < K - k * "
                                      "BLOCK_K)")
    path = tmp_path / "wrapped_gather.py"
    path.write_text(source)
    assert "tll.consumer_tile_wait" in _generate(source).rewritten["matmul_kernel"]
    errors = tilelink.spawn(_gathered, world, str(path))
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("world", [2, 3])
def test_wrapped_masks_of_the_summed_load_and_the_reduced_store_equal_torch(world: int, tmp_path,
                                                                           monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source("acc += tl.dot(a, b)")
    assert A_MASK in source and STORE_MASK in source
    source = source.replace(A_MASK, "mask=(rm[:, None] < M) &\n                    ((k * BLOCK_K + rk)[None, :] < K)")
    source = source.replace(STORE_MASK, "mask=(rm[:, None] < M) &\n             (rn[None, :] < N))")
    path = tmp_path / "wrapped_scatter.py"
    path.write_text(source)
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]
    errors = tilelink.spawn(_scattered, world, str(path))
    assert all(e < 1e-4 for e in errors), errors
