"""A persistent GEMM under all_gather (`for tile_id in tl.range(start_pid, num_tiles, NUM_SMS)`, the tile's rows
`pid_m = tile_id // num_pid_n`) has its row tiles rotated, this rank's first. The rotation keeps the kernel's tiles
only where its programs visit every tile: each call reads each program's index at each step of the loop, and refuses
a grid of fewer programs than the loop's step (the plain kernel then leaves tiles out, and rotated ones would be
other tiles). On the grid the loop steps by, or a larger one, the rotated kernel equals torch on the race-exposing
schedule."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.cases import launch_refusal, module_at, rows_of, worst

KERNEL = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
@triton.jit
def matmul_persistent(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_SMS: tl.constexpr):
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS):
        pid_m = tile_id // num_pid_n
        pid_n = tile_id % num_pid_n
        offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptrs, mask=(offs_am[:, None] < M) & (offs_k[None, :] < K - ki * BLOCK_K), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - ki * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
        tl.store(c_ptrs, acc, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
'''

M, N, K, SMS = 37, 24, 40, 4


def _multiply(path: str, programs: int) -> float | str:
    """The rewritten kernel on this rank's rows of A, launched on ``programs`` programs stepping by ``SMS``, against
    torch: the largest error, or what the call is refused with."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(41)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    lo, hi = rows_of(rank, world, M)
    kernel = module_at(path).matmul_persistent
    shard = a[lo:hi].contiguous()
    error = 0.0
    for _ in range(2):
        c = torch.full((M, N), float("nan"))
        said = launch_refusal(lambda c=c: kernel[(programs,)](shard, b, c, M, N, K, K, 1, N, 1, N, 1, BLOCK_M=16,
                                                               BLOCK_N=16, BLOCK_K=16, NUM_SMS=SMS))
        if said != "ran":
            return said
        error = worst(error, (c - a @ b).abs().max().item())
    return error


@pytest.mark.slow
def test_a_persistent_tile_loop_is_rotated_on_its_grid_and_refused_on_a_shorter_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "persistent.py"
    path.write_text(KERNEL)
    for programs in (SMS, SMS + 2):
        errors = tilelink.spawn(_multiply, 2, str(path), programs)
        assert all(isinstance(e, float) and e < 1e-4 for e in errors), (programs, errors)
    # three programs stepping by four leave tiles 3, 7, ... out: rotated, they would compute others
    said = tilelink.spawn(_multiply, 2, str(path), SMS - 1)
    assert all("the tile order rotates the tile index bound at " in s and "persistent.py:16 among its 3 tiles, but "
               "the grid (3, 1, 1) gives it 2 of them over the steps of its tile loops" in s
               and "at least as many programs as its step" in s for s in said), said
