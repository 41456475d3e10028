"""Under a reduction each rank passes its own slice's K extent. In the loop that sums, the terms may read it only where
they are read: a load's address and a mask bounding the K offsets. A term weighed or chosen by it (`a * (2.0 if K > 25
else 1.0)`, `tl.where(K > 25, a * 2, a)`, a heuristic's `BIG` of K, a helper TileLink does not read handed `K`, two
loads of different data on the two sides of a test of it) is weighed by each rank's own slice: refused at the update.
What is allowed is checked against the kernel run on the whole of K, on the race-exposing schedule."""

from __future__ import annotations

import pytest

import tilelink
from tests.rules.test_carried_accumulator import FLATTENED, HEAD, _generate, _scattered_on, _source
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
    # the extent on the right of a comparison, in a tuple, in a descriptor's offsets, beside offsets that it does not
    # bound, and through a name read first where it bounds offsets
    ("a = a * (25 < K)", None, r"reads `K`"),
    ("s = (K > 25, 1)\n        a = a * s[0]", None, r"through `s = \(K > 25, 1\)`"),
    ("a = tl.where(rk[None, :] * 0 + K > 25, a, 0.0)", None, r"reads `K`"),
    (A_LOAD.replace("< K), other", "< K) & (rk[None, :] < 16 * (K > 25)), other"), None, r"reads `K`"),
    ("kk = K\n        " + A_LOAD.replace("((k * BLOCK_K + rk)[None, :] < K)", "(kk > (k * BLOCK_K + rk)[None, :])")
     + "\n        a = a * (kk > 25)", None, r"through `kk = K`"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_term_weighed_by_the_k_extent_is_refused(rule: str, body: str, heuristic: str | None, says: str) -> None:
    """Each of these built, and at world 2 (a slice of 20 of K = 40) weighed the ranks' terms as K = 20 would."""
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(_with(body, rule, heuristic))
    line = 29 + (heuristic is not None) + body.count("\n")  # the heuristic's decorator, a line more above
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


EVEN_K = "{'EVEN_K': lambda args: args['K'] % args['BLOCK_K'] == 0}"


def _two_products() -> str:
    """`if EVEN_K:` choosing how B is read, then a second B read the same way on every step (A @ B + A @ B)."""
    b = "tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn"
    masked = f"{b},\n                         mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)"
    other = masked.replace("(k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn",
                           "rn[None, :] * stride_bn + (k * BLOCK_K + rk)[:, None] * stride_bk")  # another address
    body = (f"if EVEN_K:\n            b2 = {b})\n        else:\n            b2 = {masked}\n"
            f"        acc += tl.dot(a, b2)\n        b2 = {other}\n        acc += tl.dot(a, b2) - tl.dot(a, b)")
    return _with(body, heuristic=EVEN_K, param="EVEN_K")


def _named_dict() -> str:
    """triton.ops' heuristics written as a dict bound to a name, handed to a decorator bound to another name."""
    source = _with(A_LOAD.replace("a = tl.load(", "a2 = tl.load("), heuristic=EVEN_K, param="EVEN_K")
    return source.replace(f"@triton.heuristics({EVEN_K})\n", "@EVENK\n").replace(
        "\n\n@tilelink.overlap", f"\nHEURISTICS = {EVEN_K}\nEVENK = triton.heuristics(HEURISTICS)\n\n\n"
                                  "@tilelink.overlap", 1)


def _library_wrapper() -> str:
    """A library's wrapper under the annotation that computes no argument (a cache in front of the JIT function)."""
    source = _with("a = a + 0.0").replace("@triton.jit\ndef matmul(", "@libentry()\n@triton.jit\ndef matmul(")
    return source.replace("\n\n@tilelink.overlap", "\ndef libentry():\n    return lambda fn: fn\n\n\n"
                                                     "@tilelink.overlap", 1)


@pytest.mark.parametrize("make, programs", [
    (lambda: HEAD + FLATTENED, 3),  # the tile taken from the step over the extent, `step // k_tiles`
    (_two_products, 8),
    (_named_dict, 8),
    (_library_wrapper, 8),
])
def test_forms_reading_the_extent_where_they_may_equal_the_kernel(make, programs: int, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = make()
    path = tmp_path / "extent_form.py"
    path.write_text(source)
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]
    errors = tilelink.spawn(_scattered_on, 2, str(path), programs)
    assert all(e < 1e-4 for e in errors), errors


def test_a_heuristics_decorator_bound_to_a_name_above_the_annotation_is_refused_where_it_is() -> None:
    source = _with("a = a + 0.0", heuristic=EVEN_K, param="EVEN_K")
    source = source.replace(f"@triton.heuristics({EVEN_K})\n", "").replace(
        "\n\n@tilelink.overlap", f"\nEVENK = triton.heuristics({EVEN_K})\n\n\n@EVENK\n@tilelink.overlap", 1)
    with pytest.raises(AnnotationError, match=r"`@EVENK` is above @tilelink.overlap"):
        _generate(source)


def _sides(after_test: str) -> str:
    """A value bound in the loop that sums on one side of a compile-time `if`, read after the loop under
    ``after_test`` (vLLM's MoE kernel binds `b_scale` so on its block-quantised path, and reads it after the loop on
    the others)."""
    source = _source("acc += tl.dot(a, b)", after=f"if {after_test}:\n        acc = acc * w").replace(
        "BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, BLOCKWISE: tl.constexpr = False, "
                                   "AFTER: tl.constexpr = False):").replace(
        "    acc = tl.zeros(", "    w = 1.0\n    acc = tl.zeros(", 1)
    return source.replace("        acc += tl.dot(a, b)", "        if BLOCKWISE:\n            w = k * 1.0\n"
                                                        "        acc += tl.dot(a, b)", 1)


def test_a_value_bound_in_the_loop_on_another_compile_time_side_equals_torch(tmp_path, monkeypatch) -> None:
    """No launch takes both `if BLOCKWISE:` in the loop and `if not BLOCKWISE:` after it: the value read after the
    loop is the one bound before it, the same on every rank."""
    from tests.rules.test_carried_accumulator import _scattered

    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _sides("not BLOCKWISE")
    path = tmp_path / "sides.py"
    path.write_text(source)
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("after_test", ["AFTER and not BLOCKWISE", "not (BLOCKWISE or AFTER)"])
def test_a_side_a_compound_test_excludes_builds(after_test: str) -> None:
    """`A and not BLOCKWISE` taken is `BLOCKWISE` not taken, and so is `not (BLOCKWISE or A)` (vLLM's `elif
    (use_fp8_w8a8 or use_int8_w8a8) and not (group_k > 0 and group_n > 0):` after the loop that binds its scales
    under `if group_k > 0 and group_n > 0:`): no launch takes it with the loop's `if BLOCKWISE:`. It was refused."""
    assert "tll.producer_tile_notify" in _generate(_sides(after_test)).rewritten["matmul"]


@pytest.mark.parametrize("after_test", ["BLOCKWISE", "AFTER", "K > 0", "AFTER or not BLOCKWISE",
                                        "not (BLOCKWISE and AFTER)", "AFTER and BLOCKWISE"])
def test_a_value_bound_in_the_loop_read_on_a_side_a_launch_may_take_with_it_is_refused(after_test: str) -> None:
    """`BLOCKWISE` on both; `AFTER` (another test: a launch may take both) and a run-time test likewise; a compound
    test that does not exclude `BLOCKWISE` too."""
    with pytest.raises(AnnotationError, match=r"reads `w`, bound at line 23 in the loop that sums"):
        _generate(_sides(after_test))


@pytest.mark.parametrize("body, says", [
    # a load of other data before a test of the extent that loads again
    (A_LOAD.replace("tl.load(a_ptr + ", "tl.load(a_ptr + 1 + ") + "\n        if K > 25:\n            "
     + A_LOAD.replace("\n                mask=", "\n                    mask="), r"the `if` at line \d+ in the loop"),
    # a bound that is a part of the slice, not what is left of it
    (A_LOAD.replace("((k * BLOCK_K + rk)[None, :] < K)", "((k * BLOCK_K + rk)[None, :] < K // 4)"), r"< K // 4"),
    ("a = tl.where(rk[None, :] < K // 2, a, 0.0)", r"reads `K`"),
])
def test_other_data_or_a_part_of_the_slice_chosen_by_the_extent_is_refused(body: str, says: str) -> None:
    with pytest.raises(AnnotationError, match=says):
        _generate(_with(body))


def test_a_constexpr_bound_again_is_no_compile_time_side() -> None:
    """`FLAG = not FLAG` between the loop and the read: `if not FLAG:` after it is the loop's `if FLAG:` side."""
    source = _sides("not BLOCKWISE").replace("    if not BLOCKWISE:\n", "    BLOCKWISE = not BLOCKWISE\n"
                                                                      "    if not BLOCKWISE:\n")
    assert "BLOCKWISE = not BLOCKWISE" in source
    with pytest.raises(AnnotationError, match=r"reads `w`, bound at line 23 in the loop that sums"):
        _generate(source)


def test_a_wrapper_tilelink_does_not_read_may_compute_any_argument() -> None:
    source = _source("acc += tl.dot(a, b)", after="if FLAG:\n        acc = acc * 2").replace(
        "BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, FLAG: tl.constexpr = False):").replace(
        "@triton.jit\ndef matmul(", "@libentry()\n@triton.jit\ndef matmul(").replace(
        "\n\n@tilelink.overlap", "\nfrom somewhere import libentry\n\n\n@tilelink.overlap", 1)
    with pytest.raises(AnnotationError, match=r"reads `FLAG`, a parameter that the decorator `@libentry\(\)` at line "
                                              r"9 may compute at the launch") as err:
        _generate(source)
    assert "@triton.autotune" in err.value.hint


def test_a_test_of_a_block_size_computed_from_the_extent_after_the_loop_is_refused() -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BK == 32:\n        acc = acc * 2"),
                        "{'BK': lambda args: 32 if args['K'] > 25 else 16}", "BK").replace(
        "rk = tl.arange(0, BLOCK_K)", "rk = tl.arange(0, BK)").replace(
        "tl.cdiv(K, BLOCK_K)", "tl.cdiv(K, BK)").replace("k * BLOCK_K", "k * BK")  # the steps' own block size
    assert "BLOCK_K" not in source.split("for k in")[1].split("acc +=")[0], source
    with pytest.raises(AnnotationError, match=r"\(`BK == 32`\) reads `BK`, computed by the `@triton.heuristics`"):
        _generate(source)


def test_a_triton_wrapper_imported_from_another_module_above_the_annotation_is_refused(tmp_path, monkeypatch) -> None:
    """The build cannot tell `@SCALEK` (bound in another module) for a Triton wrapper; when it wraps the overlapped
    kernel at the import, it is refused saying what to do (it failed with `'OverlappedKernel' object has no attribute
    'arg_names'`)."""
    from tests.rules.cases import module_at

    (tmp_path / "wrappers_elsewhere.py").write_text(
        "import triton\n\nSCALEK = triton.heuristics({'SCALE': lambda args: 2.0 if args['K'] > 25 else 1.0})\n")
    source = _source("acc += tl.dot(a, b)").replace(
        "\n\n@tilelink.overlap", "\nfrom wrappers_elsewhere import SCALEK\n\n\n@SCALEK\n@tilelink.overlap", 1)
    path = tmp_path / "wrapped_above.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AnnotationError, match=r"a Triton wrapper above @tilelink.overlap reads `arg_names`") as err:
        module_at(path)
    assert err.value.line is not None and "@tilelink.overlap, then @triton.autotune" in err.value.hint
