"""Under a reduction each rank passes its own slice's K extent. In the loop that sums, the terms may read it only where
they are read: a load's address and a mask bounding the K offsets. A term weighed or chosen by it (`a * (2.0 if K > 25
else 1.0)`, `tl.where(K > 25, a * 2, a)`, a heuristic's `BIG` of K, a helper TileLink does not read handed `K`, two
loads of different data on the two sides of a test of it) is weighed by each rank's own slice: refused at the update.
What is allowed is checked against the kernel run on the whole of K, on the race-exposing schedule."""

from __future__ import annotations

import pytest

import tilelink
from tests.rules.test_carried_accumulator import _generate, _scattered_on, _source
from tests.rules.test_k_masks import _heuristic
from tilelink.errors import AnnotationError

A_LOAD = ("a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,\n"
          "                mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)")
HELPER = '''
@triton.jit
def twice_if(x, n):
    if n > 25:
        x = x * 2
    return x

'''


def _with(body: str, rule: str = "reduce_scatter", heuristic: str | None = None, param: str = "BIG") -> str:
    """The test GEMM with ``body`` before its update, and a heuristic computing ``param`` if asked."""
    source = _source("acc += tl.dot(a, b)", rule=rule).replace("        acc += tl.dot(a, b)",
                                                                 f"        {body}\n        acc += tl.dot(a, b)", 1)
    if heuristic is not None:
        source = _heuristic(source, heuristic, param)
    return source.replace("\n\n@tilelink.overlap", f"\n{HELPER}\n@tilelink.overlap", 1)


@pytest.mark.parametrize("body, heuristic, says", [
    ("a = a * (2.0 if K > 25 else 1.0)", None, r"reads `K`, the K extent of the loop that sums, which each rank "
                                               r"passes as its own slice's, through `a = a \* \(2.0 if K > 25"),
    ("a = tl.where(K > 25, a * 2, a)", None, r"through `a = tl.where\(K > 25, a \* 2, a\)` at line 28"),
    ("a = a * (1 + BIG)", "{'BIG': lambda args: args['K'] > 25}",
     r"reads `BIG`, computed by the `@triton.heuristics` at line 14 from `K`"),
    ("a = a * BIG", "{'BIG': lambda args: args['K']}", r"reads `BIG`, computed by the `@triton.heuristics`"),
    ("a = twice_if(a, K)", None, r"through `a = twice_if\(a, K\)` at line 28"),
    ("a = a * tl.full((1, 1), K, tl.float32)", None, r"reads `K`"),
    ("a = a * (K > 25)", None, r"reads `K`"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_term_weighed_by_the_k_extent_is_refused(rule: str, body: str, heuristic: str | None, says: str) -> None:
    """Each of these built, and at world 2 (a slice of 20 of K = 40) weighed the ranks' terms as K = 20 would."""
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(_with(body, rule, heuristic))
    line = 29 + (heuristic is not None)  # the heuristic's decorator, a line more above
    assert f"what the update at line {line} adds to `acc` (`tl.dot(a, b)`)" in str(err.value), err.value
    assert err.value.line == line and "the same on every rank" in err.value.hint


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_loads_of_other_data_on_the_sides_of_a_test_of_the_extent_are_refused(rule: str) -> None:
    """`if K > 25: a = tl.load(p)` / `else: a = tl.load(p + 1)` chose the data by each rank's slice (an error of 27
    at world 2, before)."""
    other = A_LOAD.replace("tl.load(a_ptr + ", "tl.load(a_ptr + 1 + ")
    body = f"if K > 25:\n            {A_LOAD}\n        else:\n            {other}"
    body = body.replace("\n                mask=", "\n                    mask=")
    with pytest.raises(AnnotationError, match=r"the `if` at line 28 in the loop that sums \(`K > 25`\) reads `K`"):
        _generate(_with(body, rule))


@pytest.mark.parametrize("after", [False, True])
def test_a_heuristics_decorator_bound_to_a_name_is_read(after: bool) -> None:
    """`BIGK = triton.heuristics(...)`, then `@BIGK`: read as the decorator it names (it was taken for an argument
    the same on every rank)."""
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2" if after else ""),
                        "{'BIG': lambda args: args['K'] > 25}", "BIG")
    if not after:
        source = source.replace("        acc += tl.dot(a, b)", "        if BIG:\n            a = a * 2\n"
                                                              "        acc += tl.dot(a, b)")
    source = source.replace("@triton.heuristics({'BIG': lambda args: args['K'] > 25})\n", "@BIGK\n").replace(
        "\n\n@tilelink.overlap", "\nBIGK = triton.heuristics({'BIG': lambda args: args['K'] > 25})\n\n\n"
                                 "@tilelink.overlap", 1)
    with pytest.raises(AnnotationError, match=r"reads `BIG`, computed by the `@triton.heuristics` at line 9 from `K`"):
        _generate(source)


def test_a_wrapper_tilelink_cannot_read_may_compute_any_argument() -> None:
    source = _source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2").replace(
        "BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, BIG: tl.constexpr = 0):").replace(
        "@triton.jit\ndef matmul(", "@set_big\n@triton.jit\ndef matmul(").replace(
        "\n\n@tilelink.overlap", "\nfrom somewhere import set_big\n\n\n@tilelink.overlap", 1)
    with pytest.raises(AnnotationError, match=r"reads `BIG`, a parameter that the `@triton.heuristics` at line 9 may"):
        _generate(source)


ROW_STRIDE = ("a = tl.load(a_ptr + rm[:, None] * K + (k * BLOCK_K + rk)[None, :],\n"
              "                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)")


@pytest.mark.parametrize("body, heuristic", [
    # the extent in a load's address: each rank's A is laid out by its own slice
    (ROW_STRIDE, None),
    # a test of it choosing how the same data is read
    ("if EVEN_K:\n            a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak)",
     "{'EVEN_K': lambda args: args['K'] % args['BLOCK_K'] == 0}"),
])
def test_the_extent_read_where_the_data_is_read_equals_the_kernel(body: str, heuristic: str | None, tmp_path,
                                                                  monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _with(body, heuristic=heuristic, param="EVEN_K")
    path = tmp_path / "extent_read.py"
    path.write_text(source)
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]
    errors = tilelink.spawn(_scattered_on, 2, str(path), 8)
    assert all(e < 1e-4 for e in errors), errors
