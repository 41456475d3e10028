"""torch Inductor's matmul template, annotated and nothing else, builds under each rule and equals the plain kernel on
the race-exposing schedule. What it takes: the pointer made in two steps (`A = arg_A`, then `A = A + (ram[:, None] *
stride_am + ...)`), the row offsets bound alike on both sides of a run-time `if` (a contiguity test around the compiler
hints), rows wrapped `% M`, K counted down from K under an `EVEN_K` constexpr, and the epilogue's indices through
names and `tl.broadcast_to` (`xindex = idx_n + N * idx_m`, `tl.store(out_ptr0 + tl.broadcast_to(xindex, mask.shape),
acc, mask)`)."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.cases import module_at, plain_module, rows_of, worst
from tests.rules.test_carried_accumulator import _generate
from tilelink.errors import AnnotationError

TEMPLATE = '''\
import triton
import triton.language as tl
import tilelink
from tilelink.errors import AnnotationError


@tilelink.overlap(tilelink.{rule}({tensor}))
@triton.jit
def mm_template(arg_A, arg_B, out_ptr0, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    A = arg_A
    B = arg_B
    if M * N == 0:
        return
    pid = tl.program_id(0)
    grid_m = (M + BLOCK_M - 1) // BLOCK_M
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    width = GROUP_M * grid_n
    group_id = pid // width
    group_size = min(grid_m - group_id * GROUP_M, GROUP_M)
    pid_m = group_id * GROUP_M + (pid % group_size)
    pid_n = (pid % width) // (group_size)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
{rows}    rk = tl.arange(0, BLOCK_K)
    A = A + (ram[:, None] * stride_am + rk[None, :] * stride_ak)
    B = B + (rk[:, None] * stride_bk + rbn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(K, 0, -BLOCK_K):
        if EVEN_K:
            a = tl.load(A)
            b = tl.load(B)
        else:
            a = tl.load(A, mask=rk[None, :] < k, other=0.)
            b = tl.load(B, mask=rk[:, None] < k, other=0.)
        acc += tl.dot(a, b)
        A += BLOCK_K * stride_ak
        B += BLOCK_K * stride_bk
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    idx_m = rm[:, None]
    idx_n = rn[None, :]
    mask = (idx_m < M) & (idx_n < N)
    xindex = idx_n + N * idx_m
    tl.store(out_ptr0 + (tl.broadcast_to(xindex, mask.shape)), acc, mask)
'''

#: the rows and columns behind the compiler's hints, wrapped at the sizes
HINTED = '''\
    ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
'''
#: the same, with the hints only where a run-time test finds the layout contiguous
TESTED = '''\
    if (stride_am == 1 and stride_ak == M) or (stride_am == K and stride_ak == 1):
        ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    else:
        ram = rm % M
    if (stride_bk == 1 and stride_bn == K) or (stride_bk == N and stride_bn == 1):
        rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    else:
        rbn = rn % N
'''
TENSORS = {"all_gather": '"arg_A", dim=0', "reduce_scatter": '"out_ptr0"', "all_reduce": '"out_ptr0"'}
M, N, K = 50, 24, 40
META = dict(GROUP_M=2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


def _source(rule: str, rows: str) -> str:
    return TEMPLATE.format(rule=rule, tensor=TENSORS[rule], rows=rows)


def _launch(kernel, a, b, out, m: int, k: int) -> None:
    grid = (triton_cdiv(m, META["BLOCK_M"]) * triton_cdiv(N, META["BLOCK_N"]),)
    kernel[grid](a, b, out, m, N, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                 EVEN_K=k % META["BLOCK_K"] == 0, **META)


def triton_cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _against_plain(path: str, rule: str) -> float:
    """The rewrite on this rank's part against the plain kernel on the whole problem."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    want = torch.full((M, N), float("nan"))
    _launch(plain_module(path).mm_template, a, b, want, M, K)
    kernel = module_at(path).mm_template
    lo, hi = rows_of(rank, world, M)
    if rule == "all_gather":
        got = torch.full((M, N), float("nan"))
        _launch(kernel, a[lo:hi].contiguous(), b, got, M, K)
        return worst((got - want).abs().max().item())
    klo, khi = rows_of(rank, world, K)
    got = torch.full((hi - lo if rule == "reduce_scatter" else M, N), float("nan"))
    _launch(kernel, a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), got, M, khi - klo)
    return worst((got - (want[lo:hi] if rule == "reduce_scatter" else want)).abs().max().item())


@pytest.mark.parametrize("rows", [HINTED, TESTED], ids=["hinted", "tested"])
@pytest.mark.parametrize("rule", sorted(TENSORS))
def test_the_template_builds_and_equals_the_plain_kernel(tmp_path, monkeypatch, rule: str, rows: str) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source(rule, rows)
    body = _generate(source).rewritten["mm_template"]
    assert ("consumer_tile_wait" if rule == "all_gather" else "producer_tile_notify") in body, body
    if rule == "all_gather":  # the wrapped rows of the last tile are waited for too
        assert "the rows its offsets wrap to" in body, body
    path = tmp_path / f"inductor_{rule}.py"
    path.write_text(source)
    errors = tilelink.spawn(_against_plain, 2, str(path), rule)
    assert all(e < 1e-4 for e in errors), errors


def test_a_pointer_made_in_two_steps_reads_the_first_only_once() -> None:
    # the first value read between the two steps: the pointer is no longer made once, and its advance is judged
    source = _source("all_gather", HINTED).replace("    if M * N == 0:\n", "    if arg_A == A:\n", 1)
    assert source != _source("all_gather", HINTED)
    with pytest.raises(AnnotationError, match="is advanced at line"):
        _generate(source)


def test_rows_bound_on_both_sides_of_an_if_to_values_that_differ_are_refused() -> None:
    # the same text on both sides, but `rm` bound again on one side first: the sides hold other rows
    source = _source("all_gather", TESTED).replace(
        "        ram = rm % M\n", "        rm = rm + BLOCK_M\n        ram = rm % M\n", 1)
    with pytest.raises(AnnotationError, match="row offsets"):
        _generate(source)
