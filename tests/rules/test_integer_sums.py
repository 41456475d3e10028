"""A reduction into an integer tensor: each rank stores its partial sums there, and the ranks' stores are added.
Integer sums (an int8 GEMM summing in int32) add up exactly, and run; float sums would be truncated by each rank's
store before the ranks add them (1.6 + 1.6 stored as 1 + 1, not as 3), so a call that stores float sums into an
integer tensor is refused before it runs."""

from __future__ import annotations

import textwrap

import pytest

import tilelink
from tests.rules.cases import module_at, rows_of
from tilelink.errors import LaunchError

KERNEL = '''
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0)
        acc += tl.dot(a, b, out_dtype=ACC)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


def _multiply(path: str, all_reduce: bool, integer: bool) -> int:
    import torch
    import triton
    import triton.language as tl

    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 40, 24, 48
    g = torch.Generator().manual_seed(3)
    if integer:
        a = torch.randint(-100, 100, (M, K), generator=g, dtype=torch.int8)
        b = torch.randint(-100, 100, (K, N), generator=g, dtype=torch.int8)
        want = a.to(torch.int32) @ b.to(torch.int32)
    else:
        a, b = torch.rand(M, K, generator=g) * 4, torch.rand(K, N, generator=g) * 4
        want = (a @ b).to(torch.int32)
    klo, khi = rows_of(rank, world, K)
    lo, hi = (0, M) if all_reduce else rows_of(rank, world, M)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    out = torch.zeros((hi - lo, N), dtype=torch.int32)
    grid = (triton.cdiv(M, 16) * triton.cdiv(N, 8),)
    module_at(path).matmul[grid](ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0),
                                 br.stride(1), N, 1, BLOCK_M=16, BLOCK_N=8, BLOCK_K=16,
                                 ACC=tl.int32 if integer else tl.float32)
    return int((out - want[lo:hi]).abs().max().item())


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_integer_sums_reduce_exactly_and_float_sums_into_integers_are_refused(rule, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "integer_sums.py"
    path.write_text(textwrap.dedent(KERNEL).format(rule=rule))
    errors = tilelink.spawn(_multiply, 2, str(path), rule == "all_reduce", True)
    assert errors == [0, 0], errors
    with pytest.raises(LaunchError, match=r"c_ptr is torch.int32, an integer type, and the partial sums stored into "
                                          r"it are started as `ACC`: if they are float, each rank.s sums would be "
                                          r"truncated"):
        tilelink.spawn(_multiply, 2, str(path), rule == "all_reduce", False)


@pytest.mark.parametrize("stored", ["acc * 0.5", "acc / 2", "acc.to(tl.float32)", "acc * M"])
def test_integer_sums_made_float_before_the_store_are_refused(stored: str, tmp_path, monkeypatch) -> None:
    """`acc * 0.5` of int32 sums is float: each rank's half is truncated where it stores it (1 + 1 for 1.5 + 1.5).
    A factor the call passes (`acc * M`, an int here, a float `alpha` elsewhere) is of a type TileLink does not
    read at the build: refused too."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "made_float.py"
    source = textwrap.dedent(KERNEL).format(rule="reduce_scatter")
    assert "acc.to(c_ptr.dtype.element_ty)" in source
    path.write_text(source.replace("acc.to(c_ptr.dtype.element_ty)", f"({stored}).to(c_ptr.dtype.element_ty)"))
    with pytest.raises(LaunchError, match="TileLink cannot tell the type of the partial sums stored into it"):
        tilelink.spawn(_multiply, 2, str(path), False, True)
