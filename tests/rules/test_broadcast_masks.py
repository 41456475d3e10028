"""Masks written as the broadcast of a comparison (``(rm < M)[:, None] & (rn < N)[None, :]``, as ``triton.ops.matmul``
and its split-K GEMM write them) bound a tile's rows and columns as ``rm[:, None] < M`` does: such kernels are
rewritten, and equal torch on the race-exposing schedule."""

from __future__ import annotations

import textwrap

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of, worst
from tilelink.annotations import requests_in
from tilelink.codegen import generate

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

#: a split-K GEMM in the form of triton.ops.matmul: K split over grid axis 1, the tiles added into C
SPLIT_K = '''
@tilelink.overlap(tilelink.reduce_scatter("C", dim=0))
@triton.jit
def matmul_split_k(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid = tl.program_id(0)
    pid_z = tl.program_id(1)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // grid_n
    pid_n = pid % grid_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_z * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = A + (rm[:, None] * stride_am + rk[None, :] * stride_ak)
    b_ptrs = B + (rk[:, None] * stride_bk + rn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        k_remaining = K - k * (BLOCK_K * SPLIT_K)
        a = tl.load(a_ptrs, mask=(rm < M)[:, None] & (rk < k_remaining)[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=(rk < k_remaining)[:, None] & (rn < N)[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * SPLIT_K * stride_ak
        b_ptrs += BLOCK_K * SPLIT_K * stride_bk
    acc = acc.to(C.dtype.element_ty)
    c_ptrs = C + (rm[:, None] * stride_cm + rn[None, :] * stride_cn)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.atomic_add(c_ptrs, acc, mask=mask)
'''

#: the same masks on the rows of a gathered A
GATHERED = '''
@tilelink.overlap(tilelink.all_gather("A", dim=0))
@triton.jit
def matmul(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // grid_n
    pid_n = pid % grid_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(A + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=(rm < M)[:, None] & ((k * BLOCK_K + rk) < K)[None, :], other=0.0)
        b = tl.load(B + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k * BLOCK_K + rk) < K)[:, None] & (rn < N)[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(C + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=(rm < M)[:, None] & (rn < N)[None, :])
'''


def _module(path: str):
    from tests.rules.cases import module_at

    return module_at(path)


def _split_k(path: str, split: int) -> float:
    kernel = _module(path).matmul_split_k
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 50, 24, 72
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    klo, khi = rows_of(rank, world, K)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    lo, hi = rows_of(rank, world, M)
    err = 0.0
    for _ in range(2):
        c = torch.full((hi - lo, N), float("nan"))
        kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16), split)](
            ar, br, c, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), c.stride(0),
            c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT_K=split)
        err = worst(err, (c - (a @ b)[lo:hi]).abs().max().item())
    return err


def _gathered(path: str) -> float:
    from tests.rules.cases import _ag_gemm

    return _ag_gemm(_module(path).matmul, tilelink.rank(), tilelink.world_size(), BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


@pytest.mark.parametrize("source, kernel", [(SPLIT_K, "matmul_split_k"), (GATHERED, "matmul")],
                         ids=["split_k", "gathered"])
def test_broadcast_comparison_masks_are_rewritten(source: str, kernel: str) -> None:
    text = HEAD + textwrap.dedent(source)
    body = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).rewritten[kernel]
    assert "tll.producer_tile_notify" in body or "tll.consumer_tile_wait" in body, body


@pytest.mark.parametrize("split", [1, 3])
def test_a_split_k_gemm_of_triton_ops_form_equals_torch_on_the_race_exposing_schedule(split: int, tmp_path,
                                                                                       monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "split_k.py"
    path.write_text(HEAD + textwrap.dedent(SPLIT_K))
    errors = tilelink.spawn(_split_k, 2, str(path), split)
    assert all(e < 1e-4 for e in errors), errors


def test_a_gathered_gemm_with_broadcast_masks_equals_torch_on_the_race_exposing_schedule(tmp_path,
                                                                                          monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "gathered.py"
    path.write_text(HEAD + textwrap.dedent(GATHERED))
    errors = tilelink.spawn(_gathered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


#: a gathered GEMM whose mask on A's columns is a comparison with another vector (an outer comparison), spelled
#: both ways or through a local, or a comparison made a row (`[:, None]`): none of them bounds the columns, so a
#: block of columns wider than A's rows reads the next rows, which the call must refuse rather than read unwaited
UNBOUNDED = '''
@tilelink.overlap(tilelink.all_gather("A", dim=0))
@triton.jit
def matmul(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // grid_n
    pid_n = pid % grid_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    lim = rm
    a = tl.load(A + rm[:, None] * stride_am + rk[None, :] * stride_ak, mask=(rm < M)[:, None] & {columns},
                other=0.0)
    b = tl.load(B + rk[:, None] * stride_bk + rn[None, :] * stride_bn, mask=(rk < K)[:, None] & (rn < N)[None, :],
                other=0.0)
    tl.store(C + rm[:, None] * stride_cm + rn[None, :] * stride_cn, tl.dot(a, b),
             mask=(rm < M)[:, None] & (rn < N)[None, :])
'''


def _unbounded(path: str) -> str:
    kernel = _module(path).matmul
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 64, 16, 8  # rows of 8 elements, a block of 16 columns
    a, b = torch.randn(M, K), torch.randn(K, N)
    lo, hi = rows_of(rank, world, M)
    c = torch.zeros(M, N)
    try:
        kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](a[lo:hi].contiguous(), b, c, M, N, K, K, 1, N, 1, N, 1,
                                                            BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    except tilelink.LaunchError as exc:
        return str(exc)
    return f"ran: {int(torch.isnan(c).sum())} NaN"


@pytest.mark.parametrize("columns", ["(rk < rm)[None, :]", "(rk[None, :] < rm)", "(rk < K)[:, None]",
                                     "(rk[None, :] < lim)"],
                         ids=["broadcast_vectors", "outer_comparison", "row_made", "vector_through_a_local"])
def test_a_mask_that_bounds_no_column_is_not_read_as_a_bound(columns: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "unbounded.py"
    path.write_text(HEAD + textwrap.dedent(UNBOUNDED.format(columns=columns)))
    outcomes = tilelink.spawn(_unbounded, 2, str(path))
    assert all("touches other rows than those its wait or notify covers" in o for o in outcomes), outcomes


def test_a_one_dimensional_row_comparison_in_a_block_mask_bounds_no_row() -> None:
    """In a load of a block of rows and columns, `offs_s < s_hi` (1-D) broadcasts along the columns: it bounds no
    row, so a tile whose rows only it would keep inside is refused at the build, as one with no row mask is."""
    from pathlib import Path

    from tilelink.errors import AnnotationError

    path = Path(__file__).parent / "forms" / "chunked_rows_pointer.py"
    text = path.read_text()
    assert "mask=(offs_s[:, None] < s_hi)" in text
    generate(text, str(path), requests_in(text, str(path)))  # as written: rewritten
    changed = text.replace("mask=(offs_s[:, None] < s_hi)", "mask=(offs_s < s_hi)")
    with pytest.raises(AnnotationError, match="may run past the tile's end"):
        generate(changed, str(path), requests_in(changed, str(path)))
