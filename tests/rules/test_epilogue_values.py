"""What a reduce-scatter or all-reduce kernel stores is summed over the ranks: a function applied to its partial
sums must be refused however they are written. A GEMV's `tl.sum` over its slice of K is partial sums as a `tl.dot`
is, and a transpose (`.T`) carries the values it transposes."""

from __future__ import annotations

import textwrap

import pytest

from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

GEMV = '''
@tilelink.overlap(tilelink.{rule}("y_ptr"))
@triton.jit
def gemv(w_ptr, x_ptr, y_ptr, M, K, stride_wm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        offs_k = k * BLOCK_K + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + offs_m[:, None] * stride_wm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(y_ptr + offs_m, {value}, mask=offs_m < M)
'''

GEMM = '''
@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.dot(tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :], mask=offs_m[:, None] < M),
                 tl.load(b_ptr + offs_k[:, None] * N + offs_n[None, :]))
    {epilogue}
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], out, mask=offs_m[:, None] < M)
'''


def _generate(text: str):
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_function_of_a_gemv_s_sums_is_refused_and_the_sums_themselves_are_rewritten(rule: str) -> None:
    with pytest.raises(AnnotationError, match="goes through `maximum` applied to the partial sums"):
        _generate(HEAD + textwrap.dedent(GEMV.format(rule=rule, value="tl.maximum(acc, 0.0)")))
    body = _generate(HEAD + textwrap.dedent(GEMV.format(rule=rule, value="acc * 2.0"))).rewritten["gemv"]
    assert "tll.producer_tile_notify" in body, body


@pytest.mark.parametrize("epilogue", ["out = tl.maximum(acc, 0.0).T.T",
                                      "act = tl.maximum(acc, 0.0)\n    out = act.T.T"])
def test_a_function_of_the_sums_through_a_transpose_is_refused(epilogue: str) -> None:
    with pytest.raises(AnnotationError, match="goes through `maximum` applied to the partial sums"):
        _generate(HEAD + textwrap.dedent(GEMM).replace("{epilogue}", epilogue))
    body = _generate(HEAD + textwrap.dedent(GEMM).replace("{epilogue}", "out = acc.T.T")).rewritten["matmul"]
    assert "tll.producer_tile_notify" in body, body


@pytest.mark.parametrize("epilogue, says", [
    ("out, unused = tl.maximum(acc, 0.0), acc", "goes through `maximum` applied to the partial sums"),
    ("out = tl.reshape(tl.join(acc, tl.load(b_ptr + offs_n[None, :] + offs_m[:, None] * 0)), (BLOCK_M, BLOCK_N * 2))"
     "\n    out = tl.reshape(out, (BLOCK_M * 2, BLOCK_N))",
     "a value that is the partial sums on one path and not on another"),
])
def test_values_unpacked_or_joined_are_classified_by_what_they_hold(epilogue: str, says: str) -> None:
    with pytest.raises(AnnotationError, match=says):
        _generate(HEAD + textwrap.dedent(GEMM).replace("{epilogue}", epilogue))
    body = _generate(HEAD + textwrap.dedent(GEMM).replace("{epilogue}", "out, unused = acc * 2.0, tl.maximum(acc, 0.0)")
                     ).rewritten["matmul"]
    assert "tll.producer_tile_notify" in body, body


@pytest.mark.parametrize("mask, says", [
    ("(offs_m[:, None] < M) & (out > 0)", "reads the partial sums"),
    ("(offs_m[:, None] < M) & (tl.load(b_ptr + offs_n)[None, :] != 0)", "reads loaded data"),
])
def test_a_store_mask_that_reads_data_is_refused(mask: str, says: str) -> None:
    """The elements such a mask leaves out are never stored: their channels would wait for them until a timeout."""
    text = HEAD + textwrap.dedent(GEMM).replace("{epilogue}", "out = acc").replace("mask=offs_m[:, None] < M)",
                                                                                  f"mask={mask})")
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(text)
    assert "mask the store by position only" in err.value.hint


RANK_ONE = '''
@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def outer_mm(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K):
        a = tl.load(a_ptr + offs_m * K + k, mask=offs_m < M, other=0.0)
        b = tl.load(b_ptr + k * N + offs_n)
        {update}
    {epilogue}
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=offs_m[:, None] < M)
'''


@pytest.mark.parametrize("update", ["acc += a[:, None] * b[None, :]", "acc = acc + a[:, None] * b[None, :]"])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_data_accumulated_over_the_loop_is_partial_sums(rule: str, update: str) -> None:
    """A GEMM by rank-1 updates (no tl.dot, no tl.sum): a function applied to its accumulator is refused."""
    source = HEAD + textwrap.dedent(RANK_ONE).replace("{rule}", rule).replace("{update}", update)
    with pytest.raises(AnnotationError, match="goes through `maximum` applied to the partial sums"):
        _generate(source.replace("{epilogue}", "acc = tl.maximum(acc, 0.0)"))
    body = _generate(source.replace("{epilogue}", "acc = acc * 0.5")).rewritten["outer_mm"]
    assert "tll.producer_tile_notify" in body, body


@pytest.mark.parametrize("epilogue, says", [
    ("out, z = tl.maximum(acc, 0.0), acc; y = out; z, out = acc, acc\n    out = y",
     "goes through `maximum` applied to the partial sums"),
    ("bacc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n    bacc += tl.load(b_ptr + offs_n[None, :] + "
     "offs_m[:, None] * 0)\n    out = acc + bacc", "a data term added to the partial sums"),
    ("out = tl.max_contiguous(tl.maximum(acc, 0.0), 1)", "goes through `maximum` applied to the partial sums"),
])
def test_values_a_first_reading_took_for_constants_are_classified(epilogue: str, says: str) -> None:
    with pytest.raises(AnnotationError, match=says):
        _generate(HEAD + textwrap.dedent(GEMM).replace("{epilogue}", epilogue))


@pytest.mark.parametrize("flag", ["tl.full((BLOCK_M, BLOCK_N), tl.load(a_ptr), tl.float32) >= 100.0",
                                  "tl.where(tl.load(b_ptr + offs_n)[None, :] > 100.0, True, False)"])
def test_a_store_mask_that_reads_a_load_through_a_constructor_is_refused(flag: str) -> None:
    text = HEAD + textwrap.dedent(GEMM).replace("{epilogue}", "out = acc").replace(
        "mask=offs_m[:, None] < M)", f"mask=(offs_m[:, None] < M) & ({flag}))")
    with pytest.raises(AnnotationError, match="reads loaded data"):
        _generate(text)


def test_data_accumulated_with_the_accumulator_on_the_right_is_partial_sums() -> None:
    source = HEAD + textwrap.dedent(RANK_ONE).replace("{rule}", "reduce_scatter").replace(
        "{update}", "acc = a[:, None] * b[None, :] + acc")
    with pytest.raises(AnnotationError, match="goes through `maximum` applied to the partial sums"):
        _generate(source.replace("{epilogue}", "acc = tl.maximum(acc, 0.0)"))
