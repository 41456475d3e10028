"""Epilogues of serving kernels, annotated and nothing else, under reduce_scatter and all_reduce: a bias added under a
run-time `if bias_ptr:` (vLLM's scaled matmul; the other ranks are passed zeros in its place, so the sum adds it
once), a bias added inside a persistent kernel's tile loop after its K loop (that loop starts the accumulator afresh
for each tile: it does not sum over K), and offsets widened in place (`offs_cn = offs_cn.to(tl.int64)`, also under a
compile-time `if C_LARGE:`). Each equals the plain kernel on the race-exposing schedule at world 2."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.cases import module_at, plain_module, rows_of, worst
from tests.rules.test_carried_accumulator import _generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

SCALED = HEAD + '''
@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def kernel(a_ptr, b_ptr, c_ptr, bias_ptr, scale_ptr, M, N, K, NUM_SMS,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, C_LARGE: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offsets_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offsets_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offsets_k = tl.arange(0, BLOCK_K).to(tl.int64)
    a_ptrs = a_ptr + (K * offsets_am[:, None] + offsets_k[None, :])
    b_ptrs = b_ptr + (N * offsets_k[:, None] + offsets_bn[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offsets_am[:, None] < M) & (offsets_k[None, :] < K - k * BLOCK_K))
        b = tl.load(b_ptrs, mask=(offsets_k[:, None] < K - k * BLOCK_K) & (offsets_bn[None, :] < N))
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * N
    scale = tl.load(scale_ptr + offsets_am, mask=offsets_am < M)
    c = scale[:, None] * acc
    if bias_ptr:
        bias = tl.load(bias_ptr + offsets_bn, mask=offsets_bn < N)
        c += bias[None, :]
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if C_LARGE:
        offs_cm = offs_cm.to(tl.int64)
        offs_cn = offs_cn.to(tl.int64)
    offs_cn = offs_cn.to(tl.int64)
    tl.store(c_ptr + N * offs_cm[:, None] + offs_cn[None, :], c,
             mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
'''

PERSISTENT = HEAD + '''
@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def kernel(a_ptr, b_ptr, c_ptr, bias_ptr, scale_ptr, M, N, K, NUM_SMS,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, C_LARGE: tl.constexpr):
    start_pid = tl.program_id(axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k_for_mask = tl.arange(0, BLOCK_K)
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m = tile_id // num_pid_n
        pid_n = tile_id % num_pid_n
        offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            offs_k = ki * BLOCK_K + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + (offs_am[:, None] * K + offs_k[None, :]),
                        mask=(offs_am[:, None] < M) & (offs_k_for_mask[None, :] < K - ki * BLOCK_K), other=0.0)
            b = tl.load(b_ptr + (offs_k[:, None] * N + offs_bn[None, :]),
                        mask=(offs_k_for_mask[:, None] < K - ki * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
        offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if C_LARGE:
            offs_cm = offs_cm.to(tl.int64)
            offs_cn = offs_cn.to(tl.int64)
        bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0)
        acc += bias[None, :]
        tl.store(c_ptr + offs_cm[:, None] * N + offs_cn[None, :], acc,
                 mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
'''

M, N, K = 50, 24, 40
META = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


def _launch(kernel, a, b, c, bias, scale, k: int, programs: int, large: bool) -> None:
    kernel[(programs,)](a, b, c, bias, scale, M, N, k, programs, C_LARGE=large, **META)


def _against_plain(path: str, rule: str, programs: int, with_bias: bool, large: bool) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(11)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    bias = torch.randn(N, generator=g) if with_bias else None
    scale = torch.rand(M, generator=g) + 0.5
    want = torch.full((M, N), float("nan"))
    _launch(plain_module(path).kernel, a, b, want, bias, scale, K, programs, large)
    kernel = module_at(path).kernel
    lo, hi = rows_of(rank, world, M)
    klo, khi = rows_of(rank, world, K)
    error = 0.0
    for _ in range(2):
        got = torch.full((hi - lo if rule == "reduce_scatter" else M, N), float("nan"))
        _launch(kernel, a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), got, bias, scale, khi - klo, programs,
                large)
        error = worst(error, (got - (want[lo:hi] if rule == "reduce_scatter" else want)).abs().max().item())
    return error


@pytest.mark.parametrize("form, programs", [(SCALED, 8), (PERSISTENT, 3)], ids=["scaled", "persistent"])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_the_bias_is_added_once_and_the_rest_equals_the_plain_kernel(tmp_path, monkeypatch, form: str,
                                                                      programs: int, rule: str) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = form.format(rule=rule)
    generated = _generate(source)
    assert "producer_tile_notify" in generated.rewritten["kernel"]
    assert [plan.launch.first_rank_only for plan in generated.plans] == [("bias_ptr",)]
    path = tmp_path / f"epilogue_{rule}.py"
    path.write_text(source)
    # the scaled form without its bias too (None: its `if` not taken), the persistent one always adds it
    for with_bias, large in ((True, False), (form is PERSISTENT, True)):
        errors = tilelink.spawn(_against_plain, 2, str(path), rule, programs, with_bias, large)
        assert all(e < 1e-4 for e in errors), (with_bias, large, errors)


def test_a_run_time_test_of_the_bias_pointer_other_than_its_presence_is_refused() -> None:
    # a test of what the pointer points at would read zeros on the other ranks: not a presence test
    source = SCALED.format(rule="reduce_scatter").replace("    if bias_ptr:\n",
                                                          "    if tl.load(bias_ptr) > 0:\n")
    with pytest.raises(AnnotationError, match="decided at run time"):
        _generate(source)
