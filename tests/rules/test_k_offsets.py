"""Under a reduction each rank runs the loop that sums over its own slice of K, whose columns start at 0 and end at its
own extent. A load in that loop may offset the K columns by the step alone (`k * BLOCK_K + tl.arange(0, BLOCK_K)`, a
pointer advanced on each step) and read the extent in an address only as a row stride (`rm[:, None] * K`); a loop
other than the one over K may not count its passes by the extent. Each refused form below built before and gave the
wrong sums at world 2 (errors of 19 to 32 against the kernel on the whole of K); what is allowed is checked against
that kernel on the race-exposing schedule."""

from __future__ import annotations

import re

import pytest

import tilelink
from tests.rules.test_carried_accumulator import FLATTENED, HEAD, _generate, _scattered_on, _source
from tests.rules.test_extent_data import A_LOAD, _with
from tilelink.errors import AnnotationError

#: the update's line in the test GEMM, with one line of body before it (``_with``)
UPDATE = 29
BIG = "{'BIG': lambda args: args['K'] > 25}"


@pytest.mark.parametrize("body, says", [
    # the step's columns turned by half of the rank's own K
    (A_LOAD.replace("(k * BLOCK_K + rk)[None, :] * stride_ak",
                    "((k * BLOCK_K + rk + K // 2) % K)[None, :] * stride_ak"),
     r"the address of the load at line 28, in the loop at line 23 that sums, reads `K`, the K extent .* \(through "
     r"`\(\(k \* BLOCK_K \+ rk \+ K // 2\) % K\) \* stride_ak`\), other than as a row stride"),
    # the last column of the rank's slice, added on every step
    ("a = a + tl.load(a_ptr + rm[:, None] * stride_am + (K - 1) * stride_ak + rk[None, :] * 0, mask=rm[:, None] < M)",
     r"reads `K`, .* \(through `K \* stride_ak`\)"),
    # the step's columns turned through a name bound twice, and wrapped at a part of the extent
    ("offs = k * BLOCK_K + rk\n        offs = (offs + K // 2) % K\n        "
     + A_LOAD.replace("(k * BLOCK_K + rk)[None, :] * stride_ak", "offs[None, :] * stride_ak"),
     r"reads `K`, .* \(through `\(\(offs \+ K // 2\) % K\)"),
    ("offs = (k * BLOCK_K) % (K // 2) + rk\n        "
     + A_LOAD.replace("(k * BLOCK_K + rk)[None, :] * stride_ak", "offs[None, :] * stride_ak"),
     r"reads `K`, .* \(through `\(\(k \* BLOCK_K\) % \(K // 2\)\) \* stride_ak`\)"),
    # the slice's first columns, on every step
    ("a = a + tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * 0, mask=rm[:, None] < M)",
     r"the load at line 28 reads `a_ptr` at the same offsets on every step of the loop at line 23 that sums "
     r"\(`a_ptr \+ rm\[:, None\] \* stride_am \+ rk\[None, :\] \* 0`\), while the load at line 24 steps along its K"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_an_offset_along_k_read_from_the_extent_is_refused(rule: str, body: str, says: str) -> None:
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(_with(body, rule))
    assert err.value.line == 28 + body.split("tl.load(")[0].count("\n"), err.value
    assert "step alone" in err.value.hint or "each step's own columns" in err.value.hint


def test_a_pointer_advanced_by_the_extent_is_refused() -> None:
    source = _source("acc += tl.dot(a, b)").replace(
        "    acc = tl.zeros(", "    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak\n"
                              "    acc = tl.zeros(", 1).replace(
        "        acc += tl.dot(a, b)",
        "        a = tl.load(a_ptrs, mask=rm[:, None] < M)\n        acc += tl.dot(a, b)\n"
        "        a_ptrs += BLOCK_K * stride_ak + K // 4", 1)
    with pytest.raises(AnnotationError, match=r"reads `K`, .* \(through `\(K // 4\)`\), other than as a row stride"):
        _generate(source)
    # the pointer advanced as the second term of the address
    with pytest.raises(AnnotationError, match=r"reads `K`, .* \(through `\(K // 4\)`\), other than as a row stride"):
        _generate(source.replace("tl.load(a_ptrs, mask", "tl.load(rm[:, None] * 0 + a_ptrs, mask"))


FIXED = "a = a + {load}\n        acc += tl.dot(a, b)"


@pytest.mark.parametrize("load, helper", [
    # a term multiplied by 0 does not move the load
    ("tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] + k * 0, mask=rm[:, None] < M, other=0.0)", None),
    # the pointer chosen by a test, or by `tl.where`
    ("tl.load((a_ptr if BLOCK_K > 0 else b_ptr) + rm[:, None] * stride_am + rk[None, :], mask=rm[:, None] < M, "
     "other=0.0)", None),
    ("tl.load(tl.where(rm[:, None] >= 0, a_ptr, b_ptr) + rm[:, None] * stride_am + rk[None, :], "
     "mask=rm[:, None] < M, other=0.0)", None),
    # a load a helper returns
    ("ld(a_ptr + rm[:, None] * stride_am + rk[None, :], rm[:, None] < M)",
     "@triton.jit\ndef ld(p, mask):\n    return tl.load(p, mask=mask, other=0.0)\n"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_stepped_tensor_read_at_fixed_offsets_is_refused(rule: str, load: str, helper: str | None) -> None:
    """Each built and read the first columns of each rank's slice on every step (an error of 21 at world 2)."""
    source = _with("pass", rule).replace("        pass\n        acc += tl.dot(a, b)",
                                         "        " + FIXED.format(load=load), 1)
    if helper:
        source = source.replace("\n\n@tilelink.overlap", f"\n\n{helper}\n\n@tilelink.overlap", 1)
    with pytest.raises(AnnotationError, match=r"reads `a_ptr` at the same offsets on every step of the loop at line "
                                              r"\d+ that sums .* while the load at line \d+ steps along its K"):
        _generate(source)


def test_a_helper_tilelink_does_not_read_handed_a_stepped_tensor_is_refused() -> None:
    helper = ("@triton.jit\ndef ld(p, mask):\n    x = tl.load(p, mask=mask, other=0.0)\n    if x.dtype == tl.float32:"
              "\n        x = x * 1.0\n    return x\n")
    load = "ld(a_ptr + rm[:, None] * 0 + rk[None, :], rm[:, None] < M)"
    source = _with("pass").replace("        pass\n        acc += tl.dot(a, b)", "        " + FIXED.format(load=load), 1)
    source = source.replace("\n\n@tilelink.overlap", f"\n\n{helper}\n\n@tilelink.overlap", 1)
    with pytest.raises(AnnotationError, match=r"the call of `ld` at line \d+, in the loop at line \d+ that sums, is "
                                              r"handed `a_ptr`, which the load at line \d+ steps along K"):
        _generate(source)


@pytest.mark.parametrize("inner", ["tl.static_range(0, 1)", "tl.range(0, 1)", "range(0, 2)"])
def test_a_fixed_loop_around_the_update_keeps_the_extent_checks(inner: str) -> None:
    """A loop around the update that does not move the loads is not the loop over K: before, it was taken for it,
    and none of the extent's checks looked at the loop over K (`a * (K > 25)` built, an error of 20 at world 2)."""
    source = _with("a = a * (K > 25)").replace("        acc += tl.dot(a, b)",
                                               f"        for _r in {inner}:\n            acc += tl.dot(a, b)", 1)
    with pytest.raises(AnnotationError, match=r"what the update at line 30 adds to `acc` \(`tl.dot\(a, b\)`\) "
                                              r"reads `K`"):
        _generate(source)


@pytest.mark.parametrize("loop, heuristic, says", [
    ("for r in range(0, (K > 25) + 1):", None, r"the loop at line 28 runs a number of passes read from `K` "
                                               r"\(`range\(0, \(K > 25\) \+ 1\)`\)"),
    ("for r in range(0, 1 + BIG):", BIG, r"read from `BIG` \(`range\(0, 1 \+ BIG\)`\)"),
    ("for r in tl.static_range(0, 1 + BIG):", BIG, r"read from `BIG` \(`tl.static_range\(0, 1 \+ BIG\)`\)"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_an_inner_loop_counted_by_the_extent_is_refused(rule: str, loop: str, heuristic: str | None,
                                                        says: str) -> None:
    """The loop around the update counted by the extent ran twice on a rank whose slice is over 25 and once on the
    other: the loop over K is the one around it, and this one is refused."""
    source = _with("pass", rule, heuristic).replace("        pass\n        acc += tl.dot(a, b)",
                                                    f"        {loop}\n            acc += tl.dot(a, b)", 1)
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(source)
    assert err.value.line == 28 + (heuristic is not None)


def test_a_while_loop_counted_by_the_extent_is_refused() -> None:
    source = _with("pass").replace("        pass\n        acc += tl.dot(a, b)",
                                   "        r = 0\n        while r < (K > 25) + 1:\n            acc += tl.dot(a, b)\n"
                                   "            r += 1", 1)
    with pytest.raises(AnnotationError, match=r"the loop at line 29 runs a number of passes read from `K` "
                                              r"\(`r < \(K > 25\) \+ 1`\)"):
        _generate(source)


def test_a_loop_counted_by_the_extent_computing_a_weight_is_refused() -> None:
    body = "w = 0.0\n        for r in range(0, (K > 25) + 1):\n            w = w + 1.0\n        a = a * w"
    with pytest.raises(AnnotationError, match=r"the loop at line 29 runs a number of passes read from `K`"):
        _generate(_with(body))


def test_a_lambda_in_the_kernel_is_refused() -> None:
    with pytest.raises(AnnotationError, match=r"the kernel calls a lambda, whose body TileLink does not read") as err:
        _generate(_with("a = a * (lambda: K > 25)()"))
    assert err.value.line == 28 and "@triton.jit helper" in err.value.hint


def test_a_heuristic_of_the_extent_starting_a_range_is_read_as_data() -> None:
    """`tl.arange(S, S + BLOCK_K)` holds the values from `S`: `S` is no block size there."""
    body = "a = a * (tl.arange(S, S + BLOCK_K) - tl.arange(0, BLOCK_K))[None, :]"
    with pytest.raises(AnnotationError, match=r"reads `S`, computed by the `@triton.heuristics` at line 14 from `K`"):
        _generate(_with(body, heuristic="{'S': lambda args: 1 if args['K'] > 25 else 0}", param="S"))


def test_a_heuristic_of_a_row_stride_is_refused() -> None:
    """A rank's own contiguous slice of K has its own K as the row stride of A."""
    with pytest.raises(AnnotationError, match=r"reads `BIG`, computed by the `@triton.heuristics` at line 14 from "
                                              r"`stride_am`, which is the row stride of `a_ptr`"):
        _generate(_with("a = a * (1 + BIG)", heuristic="{'BIG': lambda args: args['stride_am'] > 25}"))


@pytest.mark.parametrize("edit", [
    # through a name of its own that the load's address reads too
    lambda s: s.replace("    acc = tl.zeros(", "    s = stride_am\n    acc = tl.zeros(", 1).replace(
        "rm[:, None] * stride_am + (k * BLOCK_K", "rm[:, None] * s + (k * BLOCK_K", 1).replace("    pass\n",
                                                                                            "    acc = acc * s\n", 1),
    # rows of a bare `tl.arange` (one row tile)
    lambda s: s.replace("a_ptr + rm[:, None] * stride_am", "a_ptr + tl.arange(0, BLOCK_M)[:, None] * stride_am", 1
                        ).replace("    pass\n", "    acc = acc * stride_am\n", 1),
])
def test_a_row_stride_read_as_data_after_the_loop_is_refused(edit) -> None:
    with pytest.raises(AnnotationError, match=r"reads `stride_am`, the row stride of `a_ptr`") as err:
        _generate(edit(_source("acc += tl.dot(a, b)")))
    assert "only in the loads' addresses" in err.value.hint


def test_a_row_stride_read_as_data_in_a_flattened_loop_is_refused() -> None:
    """The rows of a flattened loop's tile read its step (`step // k_tiles`): they are still rows."""
    source = HEAD + FLATTENED.replace("stride_cn, acc,\n", "stride_cn, acc * stride_am,\n", 1)
    assert "acc * stride_am" in source
    with pytest.raises(AnnotationError, match=r"reads `stride_am`, the row stride of `a_ptr`"):
        _generate(source)


ADVANCED = ("    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]\n"
            "    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn\n")


@pytest.mark.parametrize("name, edit", [
    # the extent as A's row stride, and pointers advanced on each step
    ("advanced", lambda s: s.replace("    acc = tl.zeros(", ADVANCED + "    acc = tl.zeros(", 1).replace(
        "        acc += tl.dot(a, b)",
        "        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k * BLOCK_K), other=0.0)\n"
        "        b = tl.load(b_ptrs, mask=(rk[:, None] < K - k * BLOCK_K) & (rn[None, :] < N), other=0.0)\n"
        "        acc += tl.dot(a, b)\n"
        "        a_ptrs += BLOCK_K\n"
        "        b_ptrs += BLOCK_K * stride_bk", 1)),
    # a fixed inner loop around the update, and the step's columns through a name with a hint
    ("inner", lambda s: s.replace(
        "        acc += tl.dot(a, b)",
        "        offs_k = tl.multiple_of(k * BLOCK_K, BLOCK_K) + rk\n"
        "        a = tl.load(a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak,\n"
        "                    mask=(rm[:, None] < M) & (offs_k[None, :] < K), other=0.0)\n"
        "        for r in tl.static_range(0, 2):\n"
        "            acc += tl.dot(a, b) * 0.5", 1)),
    # the step's columns broadcast to the tile's shape at the load
    ("broadcast", lambda s: s.replace(
        "(k * BLOCK_K + rk)[None, :] * stride_ak,",
        "tl.broadcast_to((k * BLOCK_K + rk)[None, :] * stride_ak, (BLOCK_M, BLOCK_K)),", 1)),
])
def test_offsets_along_k_read_from_the_step_equal_the_kernel(name: str, edit, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = edit(_source("acc += tl.dot(a, b)"))
    assert source != _source("acc += tl.dot(a, b)"), name  # the edit applies
    path = tmp_path / f"k_offsets_{name}.py"
    path.write_text(source)
    assert "tll.producer_tile_notify" in _generate(source).rewritten["matmul"]
    errors = tilelink.spawn(_scattered_on, 2, str(path), 8)
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("offs, says", [
    # the step wrapped, or divided, by a count: its place in the rank's slice, not its columns
    ("(k % tl.cdiv(K, 2 * BLOCK_K)) * BLOCK_K + rk", r"reads `K`, .* \(through `BLOCK_K \* \(k % tl.cdiv\(K, 2 \* "
                                                     r"BLOCK_K\)\) \* stride_ak`\)"),
    ("(k % tl.cdiv(N, 32)) * BLOCK_K + rk", r"reads the step of the loop at line 23, which sums, other than as where "
                                            r"the step's columns start \(`BLOCK_K \* \(k % tl.cdiv\(N, 32\)\)"),
    ("(k // tl.cdiv(K, 2 * BLOCK_K)) * BLOCK_K + rk", r"reads `K`"),
    ("(k * k) * BLOCK_K + rk", r"other than as where the step's columns start"),
])
def test_the_step_read_other_than_as_its_columns_is_refused(offs: str, says: str) -> None:
    body = f"offs = {offs}\n        " + A_LOAD.replace("(k * BLOCK_K + rk)[None, :] * stride_ak",
                                                        "offs[None, :] * stride_ak")
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(_with(body))
    assert err.value.line == 29


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_stepped_tensor_read_outside_the_loop_that_sums_is_refused(where: str) -> None:
    """`a0 = tl.load(a_ptr + ...)` before the loop, added on every step, read the first columns of each rank's
    slice (an error of 24 at world 2); after the loop, the last ones."""
    load = "a0 = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak, mask=rm[:, None] < M, other=0.0)"
    source = _source("acc += tl.dot(a, b)")
    if where == "before":
        source = source.replace("    acc = tl.zeros(", f"    {load}\n    acc = tl.zeros(", 1).replace(
            "        acc += tl.dot(a, b)", "        acc += tl.dot(a + a0, b)", 1)
    else:
        source = source.replace("    pass\n", f"    {load}\n    acc += tl.sum(a0)\n", 1)
    with pytest.raises(AnnotationError, match=r"the load at line \d+ reads `a_ptr` outside the loop at line \d+ that "
                                              r"sums, which steps along its K"):
        _generate(source)


@pytest.mark.parametrize("count", ["K // BLOCK_K", "(K + 15) >> 4"])
def test_a_loop_that_sums_over_a_count_tilelink_does_not_read_is_refused(count: str) -> None:
    """Without a mask reading the step, nothing else would look at the extent of such a loop: `range(0, K //
    BLOCK_K)` summed 16 of a rank's 20 columns (an error of 11 at world 2)."""
    source = _source("acc += tl.dot(a, b)").replace("range(0, tl.cdiv(K, BLOCK_K))", f"range(0, {count})", 1)
    source = re.sub(r",\s*mask=[^\n]*other=0\.0\)", ")", source)
    assert "< K" not in source.split("for k in")[1].split("acc +=")[0], source
    with pytest.raises(AnnotationError, match=r"TileLink does not read the K extent of the loop at line 16, which "
                                              r"sums"):
        _generate(source)


def test_a_pointer_bound_by_a_walrus_in_the_address_is_read() -> None:
    body = "a = a + tl.load((p := a_ptr) + rm[:, None] * stride_am + rk[None, :], mask=rm[:, None] < M, other=0.0)"
    with pytest.raises(AnnotationError, match=r"reads `a_ptr` at the same offsets on every step"):
        _generate(_with(body))


#: a GEMM in FlagGems' general form: whole K blocks in the loop, the last (partial) one peeled after it
PEELED = '''import triton
import triton.language as tl
import tilelink


@triton.jit
def prev_multiple_of(a, b):
    return tl.cdiv(a, b) * b - b


@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def mm_peeled(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{loop}
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))
'''
STEP = '''        a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
                    mask=(rm[:, None] < M){k_rows}, other=0.0)
        b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask={k_columns}(rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)'''
WHOLE = STEP.format(k_rows="", k_columns="")  # a step of a whole block: no mask along K
MASKED = STEP.format(k_rows=" & (rk[None, :] < K)", k_columns="(rk[:, None] < K) & ")
PEELED_LOOP = '''    prev_multiple = prev_multiple_of(K, BLOCK_K)
    for start_k in range(0, prev_multiple, BLOCK_K):
        rk = (start_k + tl.arange(0, BLOCK_K)).to(tl.int64)
''' + WHOLE + '''
    rk = (prev_multiple + tl.arange(0, BLOCK_K)).to(tl.int64)
    if True:
''' + MASKED
FOLDED_LOOP = '''    for start_k in range(0, K, BLOCK_K):
        rk = (start_k + tl.arange(0, BLOCK_K)).to(tl.int64)
''' + MASKED


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_last_k_step_peeled_past_the_loop_s_end_is_refused_saying_how_to_fold_it(rule: str, tmp_path) -> None:
    """A peeled step that does not start where the loop stops (here one block later) leaves a block of each rank's
    slice out; the message says what was found, the folded loop, and the peel TileLink reads. The folded loop
    builds (the peel that starts where the loop stops: tests/rules/test_peeled_step.py)."""
    peeled = tmp_path / "mm_peeled.py"
    peeled.write_text(PEELED.format(rule=rule, loop=PEELED_LOOP.replace(
        "rk = (prev_multiple + tl.arange", "rk = (prev_multiple + BLOCK_K + tl.arange")))
    with pytest.raises(AnnotationError, match=r"reads `a_ptr` after the loop at line 19 that sums, as a last step of "
                                              r"K peeled out of it") as err:
        tilelink.build(str(peeled))
    assert "fold the last step into the loop" in err.value.hint and "range(0, prev_multiple, BLOCK_K)" in \
        err.value.hint and "A peeled step TileLink reads" in err.value.hint, err.value.hint
    folded = tmp_path / "mm_folded.py"
    folded.write_text(PEELED.format(rule=rule, loop=FOLDED_LOOP))
    built = tilelink.build(str(folded))
    assert any(e.status == "applied" for e in built.report.entries), built.report


def _short(stop: str, step: str = WHOLE, before: str = "") -> str:
    return before + f'''    for start_k in range(0, {stop}, BLOCK_K):
        rk = (start_k + tl.arange(0, BLOCK_K)).to(tl.int64)
''' + step


@pytest.mark.parametrize("loop, shown", [
    (_short("K // 2"), r"`K // 2`"),
    (_short("K - BLOCK_K"), r"`K - BLOCK_K`"),
    (_short("K // 2", MASKED), r"`K // 2`"),  # its mask bounds the columns by K: the loop still stops short
    (_short("k_end", before="    k_end = tl.cdiv(K, BLOCK_K) * BLOCK_K - BLOCK_K\n"),
     r"`k_end` \(`k_end = tl.cdiv\(K, BLOCK_K\) \* BLOCK_K - BLOCK_K`\)"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_loop_that_sums_over_part_of_k_is_refused(rule: str, loop: str, shown: str) -> None:
    """Each rank runs the loop over its own slice: a loop over `K // 2` sums the first half of each rank's slice, not
    the first half of K, and built so it gave sums 17 to 20 away from the kernel's on the whole of K at world 2."""
    with pytest.raises(AnnotationError, match=r"the loop at line \d+, which sums the partial sums of 'c_ptr', runs "
                                              rf"over {shown}, not over the K extent the call passes") as err:
        _generate(PEELED.format(rule=rule, loop=loop))
    assert err.value.line == 18 + loop.split("for start_k")[0].count("\n"), err.value
    assert "range(0, K, BLOCK_K)" in err.value.hint, err.value.hint


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_loop_over_k_through_a_name_bound_once_builds(rule: str) -> None:
    built = _generate(PEELED.format(rule=rule, loop=_short("k_end", MASKED, before="    k_end = K\n")))
    assert "producer_tile_notify" in built.text, built.text


#: a loop whose steps leave columns out between them, or count themselves by another width than the block's
GAPPED_COUNT = '''    for k in range(0, tl.cdiv(K, {count})):
        rk = (k * {step} + tl.arange(0, BLOCK_K)).to(tl.int64)
''' + MASKED
ADVANCED_BY = '''    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn
    for k in range(0, tl.cdiv(K, {count})):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (offs_k[None, :] < K - k * {count}), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * {count}) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += {count} * stride_ak
        b_ptrs += {count} * stride_bk'''

DESCRIBED = '''    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                      block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                      block_shape=[BLOCK_K, BLOCK_N])
    for k in range(0, tl.cdiv(K, {count})):
        a = a_desc.load([tl.program_id(0) * BLOCK_M, k * {count}])
        b = b_desc.load([k * {count}, tl.program_id(1) * BLOCK_N])
        acc += tl.dot(a, b)'''


@pytest.mark.parametrize("loop, says", [
    (GAPPED_COUNT.format(count="2 * BLOCK_K", step="2 * BLOCK_K"),
     r"the load at line 20 reads `BLOCK_K` columns of `a_ptr` along K on each step of the loop at line 18, which sums "
     r"the partial sums of 'c_ptr', and moves them by `2 \* BLOCK_K` a step"),
    (_short("K", WHOLE).replace("range(0, K, BLOCK_K)", "range(0, K, 2 * BLOCK_K)"),
     r"the load at line 20 reads `BLOCK_K` columns .* moves them by `2 \* BLOCK_K` a step"),
    (GAPPED_COUNT.format(count="2 * BLOCK_K", step="BLOCK_K"),
     r"the loop at line 18, which sums the partial sums of 'c_ptr', moves by `2 \* BLOCK_K` a step "
     r"\(`range\(0, tl.cdiv\(K, 2 \* BLOCK_K\)\)`\), while the load at line 20 reads `BLOCK_K` columns"),
    (ADVANCED_BY.format(count="2 * BLOCK_K"), r"the load at line 22 reads `BLOCK_K` columns .* moves them by "
                                              r"`2 \* BLOCK_K` a step"),
    (DESCRIBED.format(count="2 * BLOCK_K"), r"the load at line 23 reads `BLOCK_K` columns .* moves them by "
                                            r"`2 \* BLOCK_K` a step"),
    (_short("K", WHOLE).replace("range(0, K, BLOCK_K)", "range(BLOCK_K, K, BLOCK_K)"),
     r"the loop at line 18, which sums the partial sums of 'c_ptr', starts at `BLOCK_K` \(`range\(BLOCK_K, K, "
     r"BLOCK_K\)`\), not at 0"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_steps_that_do_not_tile_k_are_refused(rule: str, loop: str, says: str) -> None:
    """Each rank runs the loop over its own slice: a step that moves its block of `BLOCK_K` columns by `2 * BLOCK_K`
    reads every other block of each rank's slice, not of the full K (built, 14 to 18 away from the kernel's sums at
    world 2; the same through tensor descriptors), and one that starts at `BLOCK_K` leaves out each rank's first
    block (13.7 away)."""
    with pytest.raises(AnnotationError, match=says):
        _generate(PEELED.format(rule=rule, loop=loop))


@pytest.mark.parametrize("loop", [
    GAPPED_COUNT.format(count="BLOCK_K", step="BLOCK_K"), ADVANCED_BY.format(count="BLOCK_K"), _short("K", MASKED),
    DESCRIBED.format(count="BLOCK_K")])
def test_steps_that_tile_k_build(loop: str) -> None:
    built = _generate(PEELED.format(rule="reduce_scatter", loop=loop))
    assert "producer_tile_notify" in built.text, built.text


#: what each step reads, around a loop of the PEELED kernel (`a_ptr`, `b_ptr`, their strides, rm, rn, acc)
UNSTRIDED_GAP = '''    for k in range(0, tl.cdiv(K, 2 * BLOCK_K)):
        rk = k * 2 * BLOCK_K + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc += tl.dot(a, b)'''
CARRIED_OFFSETS = '''    offs_k = tl.arange(0, BLOCK_K)
    for k in range(0, tl.cdiv(K, 2 * BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(offs_k[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        offs_k += 2 * BLOCK_K'''
COUNTED_DOWN = '''    rk = tl.arange(0, BLOCK_K)
    A = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    B = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    for k in range(K, 0, -{step}):
        a = tl.load(A, mask=(rk[None, :] < k) & (rm[:, None] < M), other=0.0)
        b = tl.load(B, mask=(rk[:, None] < k) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        A += {step} * stride_ak
        B += {step} * stride_bk'''
SHIFTED = '''    for k in range(0, tl.cdiv(K, BLOCK_K)):
        rk = k * BLOCK_K + BLOCK_K + tl.arange(0, BLOCK_K)
''' + MASKED
DESCRIBED_SHIFTED = DESCRIBED.format(count="BLOCK_K").replace("k * BLOCK_K]", "k * BLOCK_K + BLOCK_K]").replace(
    "[k * BLOCK_K,", "[k * BLOCK_K + BLOCK_K,")
REBOUND = "    K = K // 2\n" + _short("K")
UNROLLED = '''    for k in range(0, K, 2 * BLOCK_K):
        rk0 = k + tl.arange(0, BLOCK_K)
        rk1 = k + BLOCK_K + tl.arange(0, BLOCK_K)
        a0 = tl.load(a_ptr + rm[:, None] * stride_am + rk0[None, :] * stride_ak,
                     mask=(rm[:, None] < M) & (rk0[None, :] < K), other=0.0)
        b0 = tl.load(b_ptr + rk0[:, None] * stride_bk + rn[None, :] * stride_bn,
                     mask=(rk0[:, None] < K) & (rn[None, :] < N), other=0.0)
        a1 = tl.load(a_ptr + rm[:, None] * stride_am + rk1[None, :] * stride_ak,
                     mask=(rm[:, None] < M) & (rk1[None, :] < K), other=0.0)
        b1 = tl.load(b_ptr + rk1[:, None] * stride_bk + rn[None, :] * stride_bn,
                     mask=(rk1[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a0, b0)
        acc += tl.dot(a1, b1)'''
PACKED = '''    for k in range(0, tl.cdiv(K, BLOCK_K)):
        rkh = k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
        rk = k * BLOCK_K + tl.arange(0, BLOCK_K)
        ah = tl.load(a_ptr + rm[:, None] * stride_am + rkh[None, :] * stride_ak,
                     mask=(rm[:, None] < M) & (2 * rkh[None, :] < K), other=0.0)
        a = tl.interleave(ah, ah)
        b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)'''
BIAS_AFTER = _short("K - BLOCK_K") + '''
    offs_bias = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = acc * tl.load(bias_ptr + offs_bias, mask=offs_bias < N, other=0.0)[None, :]'''


@pytest.mark.parametrize("loop, says", [
    (UNSTRIDED_GAP, r"the load at line 20 reads `BLOCK_K` columns of `a_ptr` along K .* moves them by `2 \* BLOCK_K`"),
    (CARRIED_OFFSETS, r"reads `BLOCK_K` columns of `a_ptr` along K .* moves them by `2 \* BLOCK_K`"),
    (COUNTED_DOWN.format(step="2 * BLOCK_K"), r"reads `BLOCK_K` columns of `a_ptr` along K .* moves them by "
                                              r"`2 \* BLOCK_K`"),
    (SHIFTED, r"the load at line 20 reads `a_ptr`'s columns along K from `BLOCK_K` on, past where the step's block "
              r"starts"),
    (DESCRIBED_SHIFTED, r"reads `a_ptr`'s columns along K from `BLOCK_K` on"),
    (REBOUND, r"the loop at line 19, which sums the partial sums of 'c_ptr', runs over `K`, which the kernel binds "
              r"again at line 18"),
    (BIAS_AFTER, r"runs over `K - BLOCK_K`, not over the K extent the call passes"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_steps_read_through_other_forms_must_tile_k(rule: str, loop: str, says: str) -> None:
    """The same gaps written other ways: a column stride of 1 left out, an offsets vector the loop advances, a loop
    counting down, the first block shifted by one (through a descriptor too), the extent bound again in the kernel,
    and a short loop beside a load after it that is no peeled step. Each built and gave sums 14 to 42 away from the
    kernel's at world 2."""
    source = PEELED.format(rule=rule, loop=loop).replace("stride_cm, stride_cn,", "stride_cm, stride_cn, bias_ptr,")
    with pytest.raises(AnnotationError, match=says):
        _generate(source)


@pytest.mark.parametrize("loop", [
    UNROLLED, COUNTED_DOWN.format(step="BLOCK_K"),
    _short("step", MASKED, before="    step = BLOCK_K\n").replace("range(0, step, BLOCK_K)", "range(0, K, step)"),
    _short("K", MASKED, before="    k0 = 0\n").replace("range(0, K, BLOCK_K)", "range(k0, K, BLOCK_K)"),
])
def test_steps_that_tile_k_other_ways_equal_the_kernel(loop: str, tmp_path, monkeypatch) -> None:
    """A step unrolled by hand (blocks at 0 and BLOCK_K of a 2 * BLOCK_K step), a loop counting down, and a step or
    start through a name bound once build, and equal the kernel on the whole of K at world 2 (each rank 40 columns:
    no whole number of blocks)."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_tiled.py"
    path.write_text(PEELED.format(rule="reduce_scatter", loop=loop))
    errors = tilelink.spawn(_peeled_on, 2, str(path), 80)
    assert all(e < 1e-4 for e in errors), errors


def test_a_packed_operand_read_at_half_the_step_builds() -> None:
    """A packed A (two values a column, `tl.interleave`) is read at half the step's width while B is read at the
    step's: the loop moves as B's blocks do."""
    built = _generate(PEELED.format(rule="reduce_scatter", loop=PACKED))
    assert "producer_tile_notify" in built.text, built.text


def _peeled_on(path: str, K: int) -> float:
    """PEELED's kernel at this rank's slice of K against the plain kernel on the whole of K."""
    import torch
    import triton

    from tests.rules.cases import module_at, plain_module, rows_of

    rank, world = tilelink.rank(), tilelink.world_size()
    M, N = 40, 32
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    grid, meta = (triton.cdiv(M, 16), triton.cdiv(N, 16)), dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    want = torch.zeros(M, N)
    plain_module(path).mm_peeled[grid](a, b, want, M, N, K, K, 1, N, 1, N, 1, **meta)
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    got = torch.full((hi - lo, N), float("nan"))
    module_at(path).mm_peeled[grid](ar, br, got, M, N, khi - klo, khi - klo, 1, N, 1, N, 1, **meta)
    return (got - want[lo:hi]).abs().max().item()


def test_a_split_over_tile_counts_builds() -> None:
    """A split-K kernel whose programs take every SPLIT_K-th of K's blocks, counted in tiles (`range(pid_k, k_tiles,
    SPLIT_K)`, `k_tiles = tl.cdiv(K, BLOCK_K)`), read through descriptors, is no loop over a part of K."""
    loop = '''    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                      block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                      block_shape=[BLOCK_K, BLOCK_N])
    k_tiles = tl.cdiv(K, BLOCK_K)
    pid_k = tl.program_id(axis=2)
    for ki in range(pid_k, k_tiles, SPLIT_K):
        a = a_desc.load([tl.program_id(0) * BLOCK_M, ki * BLOCK_K])
        b = b_desc.load([ki * BLOCK_K, tl.program_id(1) * BLOCK_N])
        acc = tl.dot(a, b, acc)'''
    source = PEELED.format(rule="reduce_scatter", loop=loop).replace(
        "BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):").replace(
        "    tl.store(c_ptr", "    tl.atomic_add(c_ptr")
    built = _generate(source)
    assert "tl.atomic_add" in built.text, built.text


OFFSETS_ADVANCED = '''    offs_k = tl.arange(0, BLOCK_K)
    for k in range(0, tl.cdiv(K, {count})):
{steps}'''
OFFSETS_STEP = '''        a = tl.load(a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(offs_k[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        offs_k += BLOCK_K'''
RANGED_BY_KEYWORD = '''    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn
    for k in tl.range(0, K, step={step}):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk'''


@pytest.mark.parametrize("loop, says", [
    # `tl.range`'s step given by keyword
    (RANGED_BY_KEYWORD.format(step="2 * BLOCK_K"), r"moves by `2 \* BLOCK_K` a step .* while the load at line \d+ "
                                                   r"reads `BLOCK_K` columns"),
    # an offsets vector advanced twice a step, past the block read between
    (OFFSETS_ADVANCED.format(count="BLOCK_K", steps=OFFSETS_STEP + "\n        offs_k += BLOCK_K"),
     r"reads `BLOCK_K` columns of `a_ptr` along K .* moves them by `2 \* BLOCK_K` a step"),
    # a start of two terms
    (_short("K", MASKED).replace("(start_k + tl.arange(0, BLOCK_K))",
                                 "(start_k + BLOCK_K - 8 + tl.arange(0, BLOCK_K))"),
     r"reads `a_ptr`'s columns along K from `a start of several terms` on"),
    # a descriptor's block shape through a name
    (DESCRIBED.format(count="BLOCK_K").replace("block_shape=[BLOCK_M, BLOCK_K])", "block_shape=a_block)").replace(
        "    a_desc =", "    a_block = [BLOCK_M, BLOCK_K]\n    a_desc =").replace("k * BLOCK_K]", "k * 2 * BLOCK_K]"),
     r"reads `BLOCK_K` columns of `a_ptr` along K .* moves them by `2 \* BLOCK_K` a step"),
])
def test_steps_read_through_names_and_keywords_must_tile_k(loop: str, says: str) -> None:
    """Gaps behind `tl.range(..., step=...)`, two advances of one offsets vector, a start of two terms, and a
    descriptor whose block shape is a name: each built and gave sums 12 to 25 away from the kernel's at world 2."""
    with pytest.raises(AnnotationError, match=says):
        _generate(PEELED.format(rule="reduce_scatter", loop=loop))


@pytest.mark.parametrize("loop", [
    RANGED_BY_KEYWORD.format(step="BLOCK_K"),
    OFFSETS_ADVANCED.format(count="2 * BLOCK_K", steps=OFFSETS_STEP + "\n" + OFFSETS_STEP),  # unrolled by hand
    "    K = tl.multiple_of(K, 16)\n" + _short("K", MASKED),
    "    K = K.to(tl.int64)\n" + _short("K", MASKED),
])
def test_steps_that_tile_k_through_names_and_keywords_build(loop: str) -> None:
    built = _generate(PEELED.format(rule="reduce_scatter", loop=loop))
    assert "producer_tile_notify" in built.text, built.text
