"""Pointers bound in one statement from a tuple of as many values (`a_ptrs, b_ptrs = a_ptr + ..., b_ptr + ...`)
are read as if each were bound on its own: the all-gathered matmul advancing them is rewritten and equals torch on
the race-exposing schedule. An unpacking whose values read the names it binds (`p, q = q, p`, which takes the
values from before it) is not split so; one that reads its own name (`a_ptrs, b_ptrs = a_ptrs + da, b_ptrs + db`)
is."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

import tilelink
from tests.rules.cases import _ag_gemm, module_at
from tilelink.analysis import _elementwise

KERNEL = '''
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    offs_am, offs_bn = ((pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M),
                        (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N))
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs, b_ptrs = (a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak,
                      b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_am[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs, b_ptrs = a_ptrs + BLOCK_K * stride_ak, b_ptrs + BLOCK_K * stride_bk
    tl.store(c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn, acc,
             mask=(offs_am[:, None] < M) & (offs_bn[None, :] < N))
'''


def _gathered(path: str) -> float:
    return _ag_gemm(module_at(path).matmul, tilelink.rank(), tilelink.world_size(), BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


def test_pointers_bound_in_one_tuple_equal_torch_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "tuple_matmul.py"
    path.write_text(textwrap.dedent(KERNEL))
    errors = tilelink.spawn(_gathered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("statement, split", [
    ("a, b = x + 1, y", {"a": "x + 1", "b": "y"}),
    ("a, b = (x, y)", {"a": "x", "b": "y"}),
    ("a, b = b, a", {}),  # the values from before the statement
    ("a, b = a + 1, a", {}),
    ("a, b = a + 1, b * 2", {"a": "a + 1", "b": "b * 2"}),
    ("a, b = f(x)", {}),
    ("a, b = x, y, z", {}),
    ("a, a = x, y", {}),
])
def test_an_unpacking_is_split_only_where_each_name_takes_a_value_of_its_own(statement: str, split: dict) -> None:
    assign = cst.parse_statement(statement).body[0]
    found = _elementwise(assign.targets[0].target, assign.value)
    assert {n: cst.Module([]).code_for_node(v) for n, v in found.items()} == split
