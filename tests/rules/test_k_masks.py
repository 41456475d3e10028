"""Under a reduction each rank runs the K loop over its own slice of K, counting from its start. A load's mask that
bounds the K offsets by the K extent the call passes (`offs_k[None, :] < K - k * BLOCK_K`, through a local of the
loop, or a loop counting down from K) keeps the terms of the rank's slice: rewritten. A mask that relates the step to
the rows (a triangular product), to a literal (`k < 1`: the first block only) or to loaded data picks terms by their
place in the rank's slice, not in the full K: refused at the build, at the load."""

from __future__ import annotations

import textwrap

import pytest

import tilelink
from tests.rules.test_carried_accumulator import HEAD, _generate, _scattered, _source
from tilelink.errors import AnnotationError

A_MASK = "mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K)"


@pytest.mark.parametrize("mask, term", [
    ("mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] <= rm[:, None])",
     "(k * BLOCK_K + rk)[None, :] <= rm[:, None]"),
    ("mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K) & (k < 1)", "k < 1"),
    ("mask=(rm[:, None] < M) & (tl.load(a_ptr + k) > 0.0)", "tl.load(a_ptr + k) > 0.0"),
    # the rows joined to the K offsets, a bound other than the loop's K, less a literal, the step in a loop counting up
    ("mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] - rm[:, None] < BLOCK_K)",
     "(k * BLOCK_K + rk)[None, :] - rm[:, None] < BLOCK_K"),
    ("mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < BLOCK_K)", "(k * BLOCK_K + rk)[None, :] < BLOCK_K"),
    ("mask=(rm[:, None] < M) & (rk[None, :] < K - k * BLOCK_K - 8)", "rk[None, :] < K - k * BLOCK_K - 8"),
    ("mask=(rm[:, None] < M) & (rk[None, :] < k)", "rk[None, :] < k"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_mask_relating_the_step_to_other_than_the_k_extent_is_refused(rule: str, mask: str, term: str) -> None:
    source = _source("acc += tl.dot(a, b)", rule=rule)
    assert A_MASK in source
    with pytest.raises(AnnotationError, match="the mask of the load at line 17 reads the step of the loop at line 16") \
            as err:
        _generate(source.replace(A_MASK, mask))
    assert f"(`{term}`)" in str(err.value) and "its own slice of K" in str(err.value), err.value
    assert "offs_k[None, :] < K - k * BLOCK_K" in err.value.hint, err.value.hint


@pytest.mark.parametrize("mask", [
    "mask=(rm[:, None] < M) & (rk[None, :] < K - k * BLOCK_K)",  # what is left of K
    "mask=(rm[:, None] < M) & (rk[None, :] < left)",  # through a local of the loop (triton.ops' `k_remaining`)
    "mask=a_ok",  # a mask bound once, its terms read through it
    "mask=ok",  # a mask bound again for the other load, each of its values read
    "mask=ka",  # a mask made a row in an update of itself (`ka = ka[None, :]`)
])
def test_a_mask_bounding_the_k_offsets_by_the_k_extent_equals_torch(mask: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source("acc += tl.dot(a, b)").replace(A_MASK, mask).replace(
        "        a = tl.load(", "        left = K - k * BLOCK_K\n"
                               "        a_ok = (rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K)\n"
                               "        ok = a_ok\n"
                               "        ka = (k * BLOCK_K + rk) < K\n"
                               "        ka = (rm[:, None] < M) & ka[None, :]\n"
                               "        a = tl.load(").replace(
        "        b = tl.load(",
        "        ok = ((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N)\n        b = tl.load(")
    body = _generate(source).rewritten["matmul"]
    assert "tll.producer_tile_notify" in body, body
    path = tmp_path / "k_mask.py"
    path.write_text(source)
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


GEMV = '''
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.reduce_scatter("y_ptr"))
@triton.jit
def gemv(a_ptr, x_ptr, y_ptr, M, K, stride_am, stride_ak, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & {columns}, other=0.0)
        x = tl.load(x_ptr + k * BLOCK_K + rk, mask=k * BLOCK_K + rk < K, other=0.0)
        acc += a * x[None, :]
    tl.store(y_ptr + rm, tl.sum(acc, axis=1), mask=rm < M)
'''


@pytest.mark.parametrize("columns, refused", [
    ("((k * BLOCK_K + rk)[None, :] < K)", False),
    ("((k * BLOCK_K + rk)[None, :] <= rm[:, None])", True),
    ("((k * BLOCK_K + rk)[None, :] < K) & (k < 1)", True),
])
def test_a_gemv_summing_its_data_after_the_loop_has_its_masks_checked_too(columns: str, refused: bool) -> None:
    """The K loop adds this step's data (`acc += a * x[None, :]`, summed over K after the loop), not a product: it
    is the loop that sums all the same."""
    source = GEMV.replace("{columns}", columns)
    if not refused:
        assert "tll.producer_tile_notify" in _generate(source).rewritten["gemv"]
        return
    with pytest.raises(AnnotationError, match="the mask of the load at line 14 reads the step of the loop at line 13"):
        _generate(source)


@pytest.mark.parametrize("loop", ["range(0, tl.cdiv(K, BLOCK_K) * 1)", "range(0, 4)", "tl.static_range(4)"])
def test_a_masked_loop_whose_extent_is_not_read_is_refused(loop: str) -> None:
    """TileLink reads the K a loop runs over from its range: a literal count, or one it does not read, could stop
    each rank at other columns of its slice than the mask (`range(0, 4)` sums four blocks of each rank's slice)."""
    source = _source("acc += tl.dot(a, b)").replace("range(0, tl.cdiv(K, BLOCK_K))", loop)
    assert loop in source
    with pytest.raises(AnnotationError, match="the loop at line 16, .* does not read that loop's K extent from its "
                                              "range") as err:
        _generate(source)
    assert f"(`{loop}`)" in str(err.value) and "range(0, tl.cdiv(K, BLOCK_K))" in err.value.hint, err.value


def test_a_while_loop_that_sums_is_refused_for_its_extent() -> None:
    """A `while` loop's step is what its body adds to its counter, which TileLink does not read: refused for that,
    with the `for` loop to write, not for the form of its mask."""
    source = _source("acc += tl.dot(a, b)").replace("    for k in range(0, tl.cdiv(K, BLOCK_K)):\n",
                                                    "    k = 0\n    while k < tl.cdiv(K, BLOCK_K):\n")
    source = source.replace("        acc += tl.dot(a, b)\n", "        acc += tl.dot(a, b)\n        k += 1\n")
    assert "while k <" in source and "k += 1" in source
    with pytest.raises(AnnotationError, match=r"the loop at line 17, .* does not read the K extent of a `while` loop "
                                              r"\(`k < tl.cdiv\(K, BLOCK_K\)`\)") as err:
        _generate(source)
    assert "range(0, tl.cdiv(K, BLOCK_K))" in err.value.hint, err.value


@pytest.mark.parametrize("mask", ["rk[None, :] < K - 2 * k * BLOCK_K", "rk[None, :] < K - k * BLOCK_N",
                                  "rk[None, :] < K - k * k", "(2 * k * BLOCK_K + rk)[None, :] < K"])
def test_a_step_term_of_another_size_than_the_loop_s_is_refused(mask: str) -> None:
    with pytest.raises(AnnotationError, match="reads the step of the loop at line 16"):
        _generate(_source("acc += tl.dot(a, b)").replace(A_MASK, f"mask={mask}"))


@pytest.mark.parametrize("loop, before", [
    ("range(0, tl.cdiv(K, BLOCK_K), 1)", ""),
    ("tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=2)", ""),
    ("range(k_tiles)", "    k_tiles = tl.cdiv(K, BLOCK_K)\n"),  # the persistent tutorial's count, bound once
    ("range(0, (K + BLOCK_K - 1) // BLOCK_K)", ""),  # the ceiling division written out
    ("range((K + (BLOCK_K - 1)) // BLOCK_K)", ""),
    ("range(k_tiles)", "    k_tiles = (K + BLOCK_K - 1) // BLOCK_K\n"),
])
def test_the_loop_s_extent_is_read_through_its_spellings(loop: str, before: str) -> None:
    source = _source("acc += tl.dot(a, b)").replace("    for k in range(0, tl.cdiv(K, BLOCK_K)):\n",
                                                    f"{before}    for k in {loop}:\n")
    assert loop in source
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]


def test_the_first_load_refused_is_the_one_reported_on_every_build() -> None:
    """Both loads of the kernel read the step through a triangular mask: each build (a process of its own, its sets
    ordered by another hash seed) names the first, at line 17."""
    import os
    import subprocess
    import sys

    source = _source("acc += tl.dot(a, b)").replace(A_MASK, "mask=(k * BLOCK_K + rk)[None, :] <= rm[:, None]")
    source = source.replace("mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N)",
                            "mask=(k * BLOCK_K + rk)[:, None] <= rn[None, :]")
    script = ("import sys\nfrom tilelink.annotations import requests_in\nfrom tilelink.codegen import generate\n"
              "text = sys.stdin.read()\ntry:\n    generate(text, 'k.py', requests_in(text, 'k.py'))\n"
              "except Exception as e:\n    print(str(e).split(':')[1])\n")
    lines = {subprocess.run([sys.executable, "-c", script], input=source, capture_output=True, text=True,
                            env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip()
             for seed in range(4)}
    assert lines == {"17"}, lines


#: columns advanced in place (`offs_k += BLOCK_K`), bounded by {bound}
IN_PLACE = '''    offs_k = tl.arange(0, BLOCK_K)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (offs_k[None, :] < {bound}), other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(offs_k[:, None] < {bound}) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        offs_k += BLOCK_K
'''


def _in_place(bound: str, rule: str = "reduce_scatter") -> str:
    source = _source("acc += tl.dot(a, b)", rule=rule)
    start = source.index("    for k in range(")
    end = source.index("        acc += tl.dot(a, b)\n") + len("        acc += tl.dot(a, b)\n")
    return source[:start] + IN_PLACE.format(bound=bound) + source[end:]


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_columns_advanced_in_place_bounded_by_another_parameter_are_refused(rule: str) -> None:
    """`offs_k < N` in a loop over `tl.cdiv(K, BLOCK_K)`: with N = K on the full problem the plain kernel is right,
    but a rank's K is its slice, and the mask would let its loads run past the slice's end."""
    with pytest.raises(AnnotationError, match="the mask of the load at line 18 reads the step of the loop at line 17") \
            as err:
        _generate(_in_place("N", rule))
    assert "(`offs_k[None, :] < N`)" in str(err.value), err.value


def test_columns_advanced_in_place_bounded_by_the_loop_s_extent_equal_torch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _in_place("K")
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]
    path = tmp_path / "in_place.py"
    path.write_text(source)
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


def test_k_offsets_in_a_loop_over_a_passed_count_bounded_by_another_parameter_are_refused() -> None:
    """A loop over a passed count (`range(0, NB)`, a column a step over the extent NB): K offsets bounded by another
    parameter (`offs_k < N`, which reads past a rank's slice when N = K) are refused."""
    source = _in_place("N").replace("for k in range(0, tl.cdiv(K, BLOCK_K)):", "for k in range(0, NB):").replace(
        "M, N, K,", "M, N, K, NB,")
    assert "range(0, NB)" in source and "K, NB," in source
    with pytest.raises(AnnotationError, match=r"other than by bounding the offsets along K by the parameters "
                                              r"\(`offs_k\[None, :\] < N`\)"):
        _generate(source)


def test_a_flattened_loop_s_k_step_is_bounded_by_the_extent_it_cycles_over() -> None:
    """A flattened persistent loop counts its K step by a name of its own (`k = step % k_tiles`, `k_tiles =
    tl.cdiv(K, BLOCK_K)`): its K offsets are bounded by that K, not by another parameter (`< N`)."""
    from tests.rules.test_carried_accumulator import FLATTENED, HEAD

    source = HEAD + textwrap.dedent(FLATTENED)
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]
    wrong = source.replace("mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K)",
                           "mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < N)")
    assert wrong != source
    with pytest.raises(AnnotationError, match=r"\(`\(k \* BLOCK_K \+ rk\)\[None, :\] < N`\)"):
        _generate(wrong)


def test_a_flattened_loop_s_sums_scaled_by_its_k_extent_are_refused() -> None:
    from tests.rules.test_carried_accumulator import FLATTENED, HEAD

    source = HEAD + textwrap.dedent(FLATTENED).replace("acc, \n", "acc, \n")
    scaled = source.replace("tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,",
                            "tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc / K,")
    assert scaled != source
    with pytest.raises(AnnotationError, match="scaled by `K`, the K extent of the loop that sums them"):
        _generate(scaled)


STORE = ("tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, "
         "mask=(rm[:, None] < M) & (rn[None, :] < N))")


@pytest.mark.parametrize("after, store, says", [
    ("if K > 20:\n        acc = acc * 2", STORE, r"the `if` at line 22 around line 23 \(`K > 20`\) reads `K`"),
    ("acc = tl.where(K > 20, acc * 2, acc)", STORE,
     r"the value stored at line 23 \(`acc`\) reads `K`, .* \(`acc` is read from `acc = tl.where\(K > 20, acc \* 2, "
     r"acc\)` at line 22, which reads `K`\)"),
    ("pass", STORE.replace("(rn[None, :] < N))", "(rn[None, :] < K))"), r"the store's mask at line 23 .* reads `K`"),
    ("if K < 16:\n        return", STORE,
     r"the `return` at line 23, before the store at line 24, \(`K < 16`\) reads `K`"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_the_k_extent_read_after_the_loop_that_sums_is_refused(rule: str, after: str, store: str, says: str) -> None:
    """Each rank passes its own slice's K: after the loop, a test, a value or a mask reading it would differ from rank
    to rank (`if K > 20: acc = acc * 2` doubled the sums on the ranks whose slice is longer)."""
    source = _source("acc += tl.dot(a, b)", after=after, rule=rule).replace(STORE, store)
    assert store in source
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(source)
    assert "the K extent of the loop that sums, which each rank passes as its own slice's" in str(err.value)
    assert err.value.hint.startswith("read `K` only in the loop that sums and in its range"), err.value.hint


@pytest.mark.parametrize("update, after, says", [
    ("big = K > 20\n        acc += tl.dot(a, b)", "if big:\n        acc = acc * 2",
     r"reads `big`, bound at line 22 in the loop that sums"),
    ("n += 1\n        acc += tl.dot(a, b)", "if n > 2:\n        acc = acc * 2",
     r"reads `n`, bound at line 22 in the loop that sums"),
    ("acc += tl.dot(a, b)", "if k > 1:\n        acc = acc * 2", r"reads `k`, the target of the loop that sums"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_what_the_loop_that_sums_binds_is_the_rank_s_own_after_it(rule: str, update: str, after: str,
                                                                   says: str) -> None:
    """A flag or a counter bound in the loop, or its target, carries the rank's slice out of the loop (doubled sums
    on the ranks whose slice is longer, before)."""
    source = _source(update, after=after, rule=rule).replace("    acc = tl.zeros(", "    n = 0\n    acc = tl.zeros(")
    with pytest.raises(AnnotationError, match=says):
        _generate(source)


def test_a_persistent_kernel_s_epilogue_reading_the_k_extent_is_refused() -> None:
    from tests.rules.test_carried_accumulator import PERSISTENT

    source = HEAD + textwrap.dedent(PERSISTENT).replace("        acc = acc * 0.5\n",
                                                        "        acc = tl.where(K < 30, acc * 0, acc)\n")
    assert "K < 30" in source
    with pytest.raises(AnnotationError, match=r"reads `K`, the K extent of the loop that sums"):
        _generate(source)


def _heuristic(source: str, values: str, param: str) -> str:
    """``source`` with ``@triton.heuristics(values)`` between the annotation and ``@triton.jit``, computing ``param``
    (a line more above the kernel)."""
    out = source.replace("@triton.jit\ndef matmul(", f"@triton.heuristics({values})\n@triton.jit\ndef matmul(") \
        .replace("BLOCK_K: tl.constexpr):", f"BLOCK_K: tl.constexpr, {param}: tl.constexpr = 0):")
    assert out.count("@triton.heuristics") == 1 and f"{param}: tl.constexpr" in out
    return out


@pytest.mark.parametrize("values, says", [
    ("{'BIG': lambda args: args['K'] > 20}", r"reads `BIG`, computed by the `@triton.heuristics` at line 7 from `K`"),
    ("{'BIG': lambda args: args.get('K', 0) > 20}", r"computed by the `@triton.heuristics` at line 7 from `K`"),
    # what the function reads cannot be told: it may read K
    ("{'BIG': big_k}", r"reads `BIG`, a parameter that the `@triton.heuristics` at line 7 may compute from the K"),
    ("{'BIG': lambda args: sum(args.values()) > 20}", r"may compute from the K extent"),
    ("HEURISTICS", r"reads `BIG`, a parameter that the `@triton.heuristics` at line 7 may compute"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_heuristic_computed_from_the_k_extent_is_the_rank_s_own(rule: str, values: str, says: str) -> None:
    """`@triton.heuristics` runs at each rank's launch on the K slice that rank passes: a flag computed from K and
    tested after the loop doubled the sums on one rank only (an error of 27.75 at worlds 2 and 3, before)."""
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2", rule=rule), values,
                        "BIG")
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(source)
    assert "differs from rank to rank" in str(err.value)
    assert err.value.hint.startswith("write the heuristics' dict in the decorator" if "may compute" in says else
                                     "read `BIG` only"), err.value.hint


@pytest.mark.parametrize("values, says", [
    # Triton runs the heuristics in turn, each seeing the values of those before
    ("{'KT': lambda args: args['K'] // 16, 'BIG': lambda args: args['KT'] > 1}",
     r"reads `BIG`, computed by the `@triton.heuristics` at line 7 from `KT`, which is computed by the "
     r"`@triton.heuristics` at line 7 from `K`"),
    # through a block size, which itself may differ from rank to rank
    ("{'BLOCK_K': lambda args: 32 if args['K'] > 15 else 16, 'BIG': lambda args: args['BLOCK_K'] > 16}",
     r"reads `BIG`, computed by the `@triton.heuristics` at line 7 from `BLOCK_K`"),
    # a tensor's shape along K is the rank's slice's
    ("{'BIG': lambda args: args['b_ptr'].shape[0] > 20}", r"may compute from the K extent"),
])
def test_a_heuristic_read_from_the_k_extent_through_another_is_the_rank_s_own(values: str, says: str) -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2"), values, "BIG")
    source = source.replace("BIG: tl.constexpr = 0):", "BIG: tl.constexpr = 0, KT: tl.constexpr = 0):")
    with pytest.raises(AnnotationError, match=says):
        _generate(source)


def test_a_heuristic_stacked_on_another_reads_its_values() -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2"),
                        "{'BIG': lambda args: args['KT'] > 1}", "BIG").replace(
        "@triton.heuristics(", "@triton.heuristics({'KT': lambda args: args['K'] // 16})\n@triton.heuristics(", 1)
    source = source.replace("BIG: tl.constexpr = 0):", "BIG: tl.constexpr = 0, KT: tl.constexpr = 0):")
    with pytest.raises(AnnotationError, match=r"reads `BIG`, computed by the `@triton.heuristics` at line 8 from `KT`"):
        _generate(source)


def test_a_heuristics_dict_bound_at_the_module_s_top_level_is_read() -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)", after="acc = acc * scale"), "HEURISTICS", "scale")
    source = source.replace("import tilelink\n", "import tilelink\n\nHEURISTICS = {'scale': lambda args: 2.0 if "
                                                 "args['K'] > 25 else 1.0}\n", 1)
    with pytest.raises(AnnotationError, match=r"reads `scale`, computed by the `@triton.heuristics` at line 9 from "
                                              r"`K`") as err:
        _generate(source)
    assert err.value.hint.startswith("read `scale` only")
    # changed after it is bound: not read, and so every constexpr it may compute is taken as the rank's own
    changed = source.replace("HEURISTICS = {", "HEURISTICS = {}\nHEURISTICS.update({", 1).replace(
        "1.0}\n", "1.0})\n", 1)
    with pytest.raises(AnnotationError, match=r"may compute from the K extent"):
        _generate(changed.replace("acc = acc * scale", "if scale:\n        acc = acc * 2"))


def test_heuristics_under_another_module_path_are_read() -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2"),
                        "{'BIG': lambda args: args['K'] > 20}", "BIG").replace("@triton.heuristics(",
                                                                               "@triton.runtime.heuristics(")
    with pytest.raises(AnnotationError, match=r"computed by the `@triton.heuristics` at line 7 from `K`"):
        _generate(source)
    above = _source("acc += tl.dot(a, b)").replace("\n@tilelink.overlap",
                                                   "\n@triton.runtime.autotune([], key=[])\n@tilelink.overlap")
    with pytest.raises(AnnotationError, match=r"`@triton.runtime.autotune` is above @tilelink.overlap"):
        _generate(above)


def test_a_block_size_chosen_from_the_k_extent_equals_torch(tmp_path, monkeypatch) -> None:
    """A tile of another size on each rank stores the same values: a block size computed from K is no value of the
    epilogue's."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _heuristic(_source("acc += tl.dot(a, b)"), "{'BLOCK_M': lambda args: 32 if args['K'] > 15 else 16}",
                        "TAG").replace("BLOCK_M: tl.constexpr, BLOCK_N", "BLOCK_N").replace(
        "TAG: tl.constexpr = 0):", "BLOCK_M: tl.constexpr = 16):")
    path = tmp_path / "block_from_k.py"
    path.write_text(source)
    errors = tilelink.spawn(_launch_with_m, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


def _launch_with_m(path: str) -> float:
    import torch
    import triton

    from tests.rules.cases import module_at, rows_of

    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 50, 24, 31  # K slices of 16 and 15: the ranks take tiles of 32 and 16 rows
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    klo, khi = rows_of(rank, world, K)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    lo, hi = rows_of(rank, world, M)
    out = torch.full((hi - lo, N), float("nan"))
    block_m = 32 if khi - klo > 15 else 16

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, 16),)

    assert grid({"BLOCK_M": block_m})[0] == triton.cdiv(M, block_m) * 2
    module_at(path).matmul[grid](ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1),
                                 N, 1, BLOCK_N=16, BLOCK_K=16)
    return (out - (a @ b)[lo:hi]).abs().max().item()


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_heuristic_of_k_read_only_in_the_loop_that_sums_is_rewritten(rule: str) -> None:
    """An `EVEN_K` flag picks how the loop loads the same data (triton.ops' form): each rank's own slice is what it
    should see there."""
    source = _heuristic(_source("acc += tl.dot(a, b)", rule=rule), "{'EVEN_K': lambda args: args['K'] % 16 == 0}",
                        "EVEN_K")
    unmasked = ("        if EVEN_K:\n            a = tl.load(a_ptr + rm[:, None] * stride_am + "
                "(k * BLOCK_K + rk)[None, :] * stride_ak)\n        else:\n    ")
    source = source.replace("        a = tl.load(a_ptr", unmasked + "        a = tl.load(a_ptr", 1).replace(
        "mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)",
        "mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)".replace("mask", "    mask"), 1)
    assert "if EVEN_K:" in source
    assert "producer_tile_notify" in _generate(source).text


@pytest.mark.parametrize("body, says", [
    ("if K > 25:\n            a = a * 2", r"the `if` at line 23 in the loop that sums \(`K > 25`\) reads `K`"),
    ("if BIG:\n            a = a * 2", r"reads `BIG`, computed by the `@triton.heuristics` at line 7 from `K`"),
    ("if big:\n            a = a * 2", r"reads `big`"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_test_of_the_k_extent_deciding_the_summed_data_is_refused(rule: str, body: str, says: str) -> None:
    """`if K > 25: a = a * 2` in the loop doubled the terms of the ranks whose slice is longer (an error of 27.75 at
    world 2, before)."""
    source = _heuristic(_source("acc += tl.dot(a, b)", rule=rule), "{'BIG': lambda args: args['K'] > 25}", "BIG")
    source = source.replace("        acc += tl.dot(a, b)", f"        {body}\n        acc += tl.dot(a, b)", 1).replace(
        "    acc = tl.zeros(", "    big = K > 25\n    acc = tl.zeros(", 1)
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(source)
    assert "EVEN_K" in err.value.hint


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_triton_wrapper_above_the_annotation_is_refused_where_it_is(rule: str) -> None:
    """Triton's wrappers launch what they wrap through its `run`, which would pass over TileLink's launch."""
    source = _source("acc += tl.dot(a, b)", rule=rule)
    source = source.replace("\n@tilelink.overlap", "\n@triton.heuristics({'BIG': lambda args: 1})\n@tilelink.overlap")
    with pytest.raises(AnnotationError, match=r"`@triton.heuristics` is above @tilelink.overlap") as err:
        _generate(source)
    assert err.value.line == 6 and "@tilelink.overlap, then @triton.autotune / @triton.heuristics" in err.value.hint


def test_a_heuristic_of_other_arguments_in_the_epilogue_equals_torch(tmp_path, monkeypatch) -> None:
    """A heuristic that reads no K extent is the same on every rank: the epilogue may read it, and the launch runs
    the heuristic (its parameter is missing otherwise)."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _heuristic(_source("acc += tl.dot(a, b)", after="acc = acc * FACTOR"),
                        "{'FACTOR': lambda args: 1.0 if args['N'] > 0 else 3.0}", "FACTOR")
    path = tmp_path / "heuristic_epilogue.py"
    path.write_text(source)
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("loop", ["range(0, (K + BLOCK_K - 1) // BLOCK_K)", "range((K + (BLOCK_K - 1)) // BLOCK_K)"])
def test_the_k_extent_of_a_ceiling_division_written_out_is_the_rank_s_own(loop: str) -> None:
    source = _source("acc += tl.dot(a, b)", after="if K > 20:\n        acc = acc * 2").replace(
        "range(0, tl.cdiv(K, BLOCK_K))", loop)
    assert loop in source
    with pytest.raises(AnnotationError, match=r"reads `K`, the K extent of the loop that sums"):
        _generate(source)


def test_a_ceiling_division_written_out_equals_torch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "ceiling_division.py"
    path.write_text(_source("acc += tl.dot(a, b)").replace("range(0, tl.cdiv(K, BLOCK_K))",
                                                           "range(0, (K + BLOCK_K - 1) // BLOCK_K)"))
    errors = tilelink.spawn(_scattered, 3, str(path))
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("branch", [
    # a mask bound on one side, used by the load
    "if EVEN_K:\n            a = tl.load(A_ADDR)\n        else:\n            a_mask = (rm[:, None] < M) & "
    "((k * BLOCK_K + rk)[None, :] < K)\n            a = tl.load(A_ADDR, mask=a_mask, other=0.0)",
    # the fill of the masked load, typed from the pointer
    "if EVEN_K:\n            a = tl.load(A_ADDR)\n        else:\n            fill = tl.zeros((1, 1), dtype=a_ptr.dtype."
    "element_ty)\n            a = tl.load(A_ADDR, mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), "
    "other=fill)",
])
def test_a_test_of_the_k_extent_choosing_how_the_data_is_loaded_is_rewritten(branch: str) -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)"), "{'EVEN_K': lambda args: args['K'] % 16 == 0}", "EVEN_K")
    address = "a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak"
    first = ("        a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,\n"
             "                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)\n")
    assert first in source
    source = source.replace(first, "        " + branch.replace("A_ADDR", address) + "\n", 1)
    assert "producer_tile_notify" in _generate(source).text


def test_the_same_update_on_both_sides_of_a_test_of_the_k_extent_is_rewritten() -> None:
    source = _heuristic(_source("if EVEN_K:\n            acc += tl.dot(a, b)\n        else:\n            acc += "
                                "tl.dot(a, b)"), "{'EVEN_K': lambda args: args['K'] % 16 == 0}", "EVEN_K")
    assert "producer_tile_notify" in _generate(source).text


@pytest.mark.parametrize("module_code", [
    "HEURISTICS: dict = {'BIG': lambda args: args['K'] > 20}",  # annotated: another binding may follow
    "HEURISTICS = {'BIG': lambda args: args['K'] > 20}\nALIAS = HEURISTICS",  # changed through an alias
    "HEURISTICS = {'BIG': lambda args: args['K'] > 20}\nfrom math import pi as HEURISTICS",  # bound again
])
def test_a_module_level_dict_bound_more_than_once_is_not_read(module_code: str) -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2"), "HEURISTICS", "BIG")
    source = source.replace("import tilelink\n", f"import tilelink\n\n{module_code}\n", 1)
    with pytest.raises(AnnotationError, match=r"may compute from the K extent"):
        _generate(source)


@pytest.mark.parametrize("values", ["{'BIG': lambda args: len(args['b_ptr']) > 20}",
                                    "{'BIG': lambda args: getattr(args['b_ptr'], 'shape')[0] > 20}"])
def test_an_argument_handed_to_a_function_by_a_heuristic_is_not_told(values: str) -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2"), values, "BIG")
    with pytest.raises(AnnotationError, match=r"may compute from the K extent"):
        _generate(source)


def test_heuristics_imported_under_another_name_are_read() -> None:
    source = _heuristic(_source("acc += tl.dot(a, b)", after="if BIG:\n        acc = acc * 2"),
                        "{'BIG': lambda args: args['K'] > 20}", "BIG").replace("@triton.heuristics(", "@H(")
    source = source.replace("import tilelink\n", "import tilelink\nfrom triton import heuristics as H\n", 1)
    with pytest.raises(AnnotationError, match=r"computed by the `@triton.heuristics` at line 8 from `K`"):
        _generate(source)


def test_a_flag_of_the_k_extent_bound_in_the_loop_that_sums_is_followed() -> None:
    source = _source("big = K > 25\n        if big:\n            a = a * 2\n        acc += tl.dot(a, b)")
    with pytest.raises(AnnotationError, match=r"the `if` at line 22 in the loop that sums \(`big`\) reads `big`"):
        _generate(source)


def test_a_test_of_the_step_binding_the_slice_s_sums_is_the_step_s() -> None:
    """`if k == k_tiles - 1:` in a flattened loop is the last step of the rank's slice: what it binds from the sums
    (`c = acc.to(...)`, stored there) is judged as a store of the sums, not as a test of the extent."""
    from tests.rules.test_carried_accumulator import FLATTENED, HEAD

    source = HEAD + textwrap.dedent(FLATTENED).replace(
        "            tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,",
        "            c = acc.to(c_ptr.dtype.element_ty)\n"
        "            tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c,")
    assert "c = acc.to(" in source
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]
