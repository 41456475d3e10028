"""Row offsets made 64-bit so that their products with strides do not wrap (`(pid_m * BLOCK_M +
tl.arange(0, BLOCK_M)).to(tl.int64)`, or `offs[:, None].to(tl.int64) * stride` at the access), as kernels over
large tensors write them: the cast keeps every row, so the kernel is rewritten, and equals torch on the
race-exposing schedule."""

from __future__ import annotations

import textwrap

import pytest

import tilelink
from tests.rules.cases import _ag_gemm, _rs_gemm, module_at

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

KERNEL = '''
@tilelink.overlap(tilelink.{rule})
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // grid_n
    pid_n = pid % grid_n
    rm = {rows}
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + {term} * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + {term} * stride_cm + rn[None, :] * stride_cn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''
FORMS = {"vector": ("(pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)", "rm[:, None]"),
         "term": ("pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", "rm[:, None].to(tl.int64)")}
RULES = {"all_gather": 'all_gather("a_ptr", dim=0)', "reduce_scatter": 'reduce_scatter("c_ptr", dim=0)'}


def _scattered(path: str) -> float:
    return _rs_gemm(module_at(path).matmul, tilelink.rank(), tilelink.world_size(), BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


def _gathered(path: str) -> float:
    return _ag_gemm(module_at(path).matmul, tilelink.rank(), tilelink.world_size(), BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("rule", sorted(RULES))
def test_rows_made_64_bit_equal_torch_on_the_race_exposing_schedule(rule: str, form: str, tmp_path,
                                                                    monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    rows, term = FORMS[form]
    path = tmp_path / f"wide_{rule}_{form}.py"
    path.write_text(HEAD + textwrap.dedent(KERNEL).format(rule=RULES[rule], rows=rows, term=term))
    for world in (1, 3):
        errors = tilelink.spawn(_gathered if rule == "all_gather" else _scattered, world, str(path))
        assert all(e < 1e-4 for e in errors), (world, errors)
