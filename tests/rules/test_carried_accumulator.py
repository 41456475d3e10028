"""Under a reduction each rank runs the K loop over its own slice of K. An accumulator scaled inside that loop
(`acc = tl.dot(a, b, acc * 0.5)`) weighs a term by its place in the rank's slice, so the ranks' sum is not the full
problem's: refused, however the scale is written. Adding scaled terms (`acc += tl.dot(a, b) * s`), converting the
accumulator, or scaling it in an outer loop that starts it again on every pass (a persistent kernel's tile loop)
carries the sums unscaled: rewritten, and equal to torch on the race-exposing schedule."""

from __future__ import annotations

import textwrap

import pytest

import tilelink
from tests.rules.cases import _rs_gemm, module_at
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

KERNEL = '''
@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        {update}
    {after}
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''

PERSISTENT = '''
@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    grid_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * grid_n
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        rm = (tile // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tile % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
            b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a, b)
        acc = acc * 0.5
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc * 2.0,
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


def _generate(text: str):
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


def _source(update: str, after: str = "", rule: str = "reduce_scatter") -> str:
    return HEAD + textwrap.dedent(KERNEL).format(rule=rule, update=update, after=after or "pass")


@pytest.mark.parametrize("update", [
    "acc = tl.dot(a, b, acc * 0.5)",
    "acc = acc * 0.5 + tl.dot(a, b)",
    "acc *= 0.5\n        acc += tl.dot(a, b)",
    "half = acc * 0.5\n        acc = tl.dot(a, b, half)",
    "acc = tl.dot(a, b, acc)\n        acc = acc + acc",
    "acc = tl.dot(a, b, acc) + acc * 0.5",
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_an_accumulator_scaled_in_its_own_loop_is_refused(rule: str, update: str) -> None:
    with pytest.raises(AnnotationError, match="carried through its loop at line 16 other than by adding") as err:
        _generate(_source(update, rule=rule))
    assert "its own slice of K" in str(err.value), err.value
    assert "scale the sum once after the loop" in err.value.hint, err.value.hint


@pytest.mark.parametrize("update, after", [
    ("acc += tl.dot(a, b) * 0.5", ""),
    ("acc = tl.dot(a, b, acc.to(tl.float32))", "acc = acc * 0.5"),
    ("acc = tl.dot(a, b, acc=acc)", "acc = acc.to(tl.float32) * 2.0"),
    ("acc = acc - tl.dot(-a, b)", ""),
])
def test_terms_added_unscaled_are_rewritten(update: str, after: str) -> None:
    body = _generate(_source(update, after)).rewritten["matmul"]
    assert "tll.producer_tile_notify" in body, body


def test_a_scale_in_a_compile_time_branch_refuses_only_the_launches_that_take_it() -> None:
    source = _source("if DECAY:\n            acc = acc * 0.5\n        acc += tl.dot(a, b)").replace(
        "BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, DECAY: tl.constexpr):")
    body = _generate(source).rewritten["matmul"]
    assert "tl.static_assert(False" in body and "carried through its loop" in body, body


def _scattered(path: str) -> float:
    return _rs_gemm(module_at(path).matmul, tilelink.rank(), tilelink.world_size(), BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


def test_a_persistent_kernel_scaling_after_its_k_loop_equals_torch(tmp_path, monkeypatch) -> None:
    """The tile loop scales the accumulator, and starts it again at the top of every pass: nothing scaled is
    carried from one K slice to the next."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "persistent_scaled.py"
    path.write_text(HEAD + textwrap.dedent(PERSISTENT))
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


def test_a_scale_carried_from_the_previous_tile_is_refused() -> None:
    """Without the start at the top of the tile loop, the scale after the K loop reaches the next tile's sums."""
    source = HEAD + textwrap.dedent(PERSISTENT).replace(
        "        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n        for k", "        for k").replace(
        "    for tile in", "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n    for tile in")
    with pytest.raises(AnnotationError, match="carried through its loop at line 13"):
        _generate(source)


def test_an_accumulator_started_again_on_each_side_of_a_branch_is_not_carried() -> None:
    """Each side of the `if` at the top of the tile loop starts the accumulator again: the scale after the K loop
    reaches no later tile. With one side only, it does."""
    both = HEAD + textwrap.dedent(PERSISTENT).replace(
        "        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n",
        "        if BLOCK_K > 1:\n            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n"
        "        else:\n            acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)\n")
    body = _generate(both).rewritten["matmul"]
    assert "tll.producer_tile_notify" in body, body
    with pytest.raises(AnnotationError, match="carried through its loop at line 12"):
        _generate(both.replace("        else:\n            acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)\n",
                               ""))


def test_a_value_made_again_from_the_sums_before_its_own_update_is_not_carried(tmp_path, monkeypatch) -> None:
    """The persistent tutorial's subtiled epilogue: `out = tl.reshape(acc, ...)` then `out = tl.permute(out, ...)`
    in one block of the tile loop. The first starts `out` on every pass that runs the second: built without a
    refusal, and equal to torch."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    store = "        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc * 2.0,\n"
    assert store in PERSISTENT
    source = HEAD + textwrap.dedent(PERSISTENT.replace(
        "        acc = acc * 0.5\n" + store,
        "        if BLOCK_N > 1:\n"
        "            out = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2))\n"
        "            out = tl.permute(out, (0, 2, 1))\n"
        "            out = tl.reshape(tl.permute(out, (0, 2, 1)), (BLOCK_M, BLOCK_N))\n"
        "        else:\n"
        "            out = acc\n"
        "        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, out,\n"))
    assert "tl.permute(out" in source
    body = _generate(source).rewritten["matmul"]
    assert "tl.static_assert" not in body and "tll.producer_tile_notify" in body, body
    path = tmp_path / "persistent_subtiled.py"
    path.write_text(source)
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors
