"""Under a reduction each rank runs the K loop over its own slice of K. An accumulator scaled inside that loop
(`acc = tl.dot(a, b, acc * 0.5)`) weighs a term by its place in the rank's slice, so the ranks' sum is not the full
problem's: refused, however the scale is written. Adding scaled terms (`acc += tl.dot(a, b) * s`), converting the
accumulator, or scaling it in an outer loop that starts it again on every pass (a persistent kernel's tile loop)
carries the sums unscaled: rewritten, and equal to torch on the race-exposing schedule."""

from __future__ import annotations

import textwrap

import pytest

import tilelink
from tests.rules.cases import _rs_gemm, module_at, plain_module, rows_of, worst
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

#: the K loop both kernels sum over, up to the update
K_LOOP = '''\
for k in range(0, tl.cdiv(K, BLOCK_K)):
    a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
    b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
'''

#: the kernels' signature and tile, up to the accumulator
PROLOGUE = '''
@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
'''

KERNEL = PROLOGUE + '''    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{k_loop}        {update}
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
{k_loop}            acc += tl.dot(a, b)
        acc = acc * 0.5
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc * 2.0,
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
'''

KERNEL = KERNEL.replace("{k_loop}", textwrap.indent(K_LOOP, "    "))
PERSISTENT = PERSISTENT.replace("{k_loop}", textwrap.indent(K_LOOP, "        "))


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


def _built_and_equal_to_torch(path, source: str) -> None:
    """``source`` builds with no refused branch, and its rewrite at two ranks equals torch."""
    body = _generate(source).rewritten["matmul"]
    assert "tl.static_assert" not in body and "tll.producer_tile_notify" in body, body
    path.write_text(source)
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


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


def _original(path: str):
    """The kernel of ``path`` without its annotation: what the rewrite must equal, run on the full problem."""
    return plain_module(path).matmul


def _scattered_on(path: str, programs: int) -> float:
    """The rewritten kernel at this rank's slice of K on a grid of ``programs``, against the plain kernel on the
    whole of K on the same grid (a persistent kernel whose programs take several tiles each)."""
    import torch

    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 50, 24, 40
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    want = torch.full((M, N), float("nan"))
    meta = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    _original(path)[(programs,)](a, b, want, M, N, K, K, 1, N, 1, N, 1, **meta)
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    got = torch.full((hi - lo, N), float("nan"))
    module_at(path).matmul[(programs,)](ar, br, got, M, N, khi - klo, khi - klo, 1, N, 1, N, 1, **meta)
    return worst((got - want[lo:hi]).abs().max().item())


def test_a_scale_carried_across_the_tiles_of_a_tile_loop_equals_the_kernel(tmp_path, monkeypatch) -> None:
    """Without the start at the top of the tile loop, the scale after the K loop reaches the next tile's sums: every
    rank runs the tile loop alike, so what each stores is its share of what the kernel stores on the full K."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = HEAD + textwrap.dedent(PERSISTENT).replace(
        "        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n        for k", "        for k").replace(
        "    for tile in", "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n    for tile in")
    path = tmp_path / "carried_tiles.py"
    path.write_text(source)
    errors = tilelink.spawn(_scattered_on, 2, str(path), 3)  # 3 programs over 8 tiles: carried from tile to tile
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("start, says", [
    ("            if k % 2 == 0:\n                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n",
     "started again on some steps only of its loop at line 17"),
    ("            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n",
     "started again on every step of its loop at line 17"),
])
def test_an_accumulator_started_again_inside_the_k_loop_is_refused(start: str, says: str) -> None:
    """The sum kept after the K loop is of the steps after the last start: each rank's last steps, not the full
    problem's."""
    source = HEAD + textwrap.dedent(PERSISTENT).replace("            acc += tl.dot(a, b)\n",
                                                        start + "            acc += tl.dot(a, b)\n")
    with pytest.raises(AnnotationError, match=says):
        _generate(source)


@pytest.mark.parametrize("update, says", [
    ("acc += tl.dot(a, b) * (k + 1)", "depends on the step of its loop at line 17 through `k`"),
    ("acc += tl.dot(a, b) * w\n        w = w * 0.5", "depends on the step of its loop at line 17 through `w`"),
    ("acc = tl.dot(a, b, acc.to(tl.int32).to(tl.float32))", "a conversion of the partial sums to an integer type"),
])
def test_a_term_weighed_by_its_step_is_refused(update: str, says: str) -> None:
    source = _source(update).replace("    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n",
                                     "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n    w = 1.0\n")
    with pytest.raises(AnnotationError, match=says):
        _generate(source)
    # weights read from memory at the step's place are this rank's data: rewritten
    body = _generate(_source("acc += tl.dot(a, b) * tl.load(a_ptr + k)")).rewritten["matmul"]
    assert "tll.producer_tile_notify" in body, body


def test_a_conversion_of_the_sums_to_an_integer_type_is_refused() -> None:
    with pytest.raises(AnnotationError, match="a conversion of the partial sums to an integer type"):
        _generate(_source("acc += tl.dot(a, b)", "acc = acc.to(tl.int32).to(tl.float32)"))


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
    _built_and_equal_to_torch(tmp_path / "persistent_subtiled.py", source)


def test_the_linear_epilogue_flag_does_not_vouch_for_the_k_loop() -> None:
    source = _source("acc = tl.dot(a, b, acc * 0.5)").replace('reduce_scatter("c_ptr")',
                                                               'reduce_scatter("c_ptr", linear_epilogue=True)')
    with pytest.raises(AnnotationError, match="carried through its loop at line 16 other than by adding"):
        _generate(source)
    body = _generate(_source("acc += tl.dot(a, b)", "acc = tl.maximum(acc, 0.0)").replace(
        'reduce_scatter("c_ptr")', 'reduce_scatter("c_ptr", linear_epilogue=True)')).rewritten["matmul"]
    assert "tll.producer_tile_notify" in body, body


STEP = '''
@triton.jit
def step(a, b, x):
    return tl.dot(a, b, x)


@triton.jit
def opaque(a, b, x):
    if a.dtype == tl.float32:
        return tl.dot(a, b, x)
    return x
'''


def test_a_helper_s_sums_are_read_through_its_return(tmp_path, monkeypatch) -> None:
    """`acc = step(a, b, acc)`, `step` returning `tl.dot(a, b, x)`: partial sums, carried by adding; a function of
    them after the loop is refused, and a helper whose body TileLink does not read, applied to this rank's data,
    is refused too (its value may be partial sums)."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source("acc = step(a, b, acc)").replace(HEAD, HEAD + textwrap.dedent(STEP))
    path = tmp_path / "helper_step.py"
    path.write_text(source)
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors
    with pytest.raises(AnnotationError, match="goes through `maximum` applied to the partial sums"):
        _generate(source.replace("    pass\n", "    acc = tl.maximum(acc, 0.0)\n"))
    with pytest.raises(AnnotationError, match="the helper `opaque` .TileLink does not read its body. applied to"):
        _generate(source.replace("acc = step(a, b, acc)", "acc = opaque(a, b, acc)"))


FLATTENED = '''
@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    first = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * grid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    mine = tl.cdiv(tiles - first, tl.num_programs(0))
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, k_tiles * mine):
        tile = first + (step // k_tiles) * tl.num_programs(0)
        k = step % k_tiles
        rm = (tile // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tile % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        if k == k_tiles - 1:
            tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
                     mask=(rm[:, None] < M) & (rn[None, :] < N))
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
'''


def test_the_flattened_persistent_loop_equals_the_kernel_and_its_variants_that_drop_terms_are_refused(
        tmp_path, monkeypatch) -> None:
    """The persistent tutorial's flattened loop sums and stores in one loop, starting the sums again right after
    each store: it equals the kernel. Scaled on each step, weighed by its step, or started again elsewhere, it is
    refused, though the loop stores."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = HEAD + textwrap.dedent(FLATTENED)
    path = tmp_path / "flattened.py"
    path.write_text(source)
    errors = tilelink.spawn(_scattered_on, 2, str(path), 3)
    assert all(e < 1e-4 for e in errors), errors
    for change, says in ((("acc = tl.dot(a, b, acc)", "acc = tl.dot(a, b, acc * 0.5)"), "other than by adding"),
                         (("acc = tl.dot(a, b, acc)", "acc += tl.dot(a, b) * (k + 1)"), "through `step`"),
                         (("        acc = tl.dot(a, b, acc)\n",
                           "        if k % 2 == 1:\n            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n"
                           "        acc = tl.dot(a, b, acc)\n"), "not right after a store of it")):
        assert change[0] in source
        with pytest.raises(AnnotationError, match=says):
            _generate(source.replace(*change))


@pytest.mark.parametrize("update, says", [
    # a weight chosen by a test of the step
    ("if k == 0:\n            w = 3.0\n        else:\n            w = 1.0\n        acc += tl.dot(a, b) * w",
     "through `k`"),
    # carried through a second name
    ("acc += tl.dot(a, b) * w\n        w_prev = w\n        w = w_prev * 0.5", "through `w`"),
    # the step of an outer K loop, inside an inner one
    ("for s in range(0, 1):\n            acc += tl.dot(a, b) * (k + 1)", "through `k`"),
])
def test_a_weight_of_the_step_is_found_through_tests_names_and_inner_loops(update: str, says: str) -> None:
    source = _source(update).replace("    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n",
                                     "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n    w = 1.0\n")
    with pytest.raises(AnnotationError, match=says):
        _generate(source)


def test_a_helper_s_scaled_sums_are_refused_under_the_linear_epilogue_flag() -> None:
    scaled = textwrap.dedent(STEP).replace("return tl.dot(a, b, x)\n", "return tl.dot(a, b, x * 0.5)\n", 1)
    source = _source("acc = step(a, b, acc)").replace(HEAD, HEAD + scaled).replace(
        'reduce_scatter("c_ptr")', 'reduce_scatter("c_ptr", linear_epilogue=True)')
    with pytest.raises(AnnotationError, match="other than by adding"):
        _generate(source)


@pytest.mark.parametrize("update, after, says", [
    ("acc = tl.dot(a, b)", "", "the partial sums `acc` bound anew on each step of the loop at line 16"),
    ("p = tl.dot(a, b)\n        acc += p", "acc = acc + p", "the partial sums `p` bound anew on each step"),
])
def test_sums_bound_anew_on_each_step_and_read_after_the_loop_are_refused(update: str, after: str,
                                                                          says: str) -> None:
    """After the K loop such a value is the last step's product: each rank's last block of its own slice, whose sum
    over the ranks is not the full problem's."""
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(_source(update, after))
    assert "holds the last step's sum only" in str(err.value) or "hold the last step's sum only" in str(err.value)


REPEATED = PROLOGUE.replace("{rule}", "reduce_scatter") + '''    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for half in range(0, 2):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{k_loop}            p = tl.dot(a, b)
            acc += p
        total += acc * 0.5
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, total,
             mask=(rm[:, None] < M) & (rn[None, :] < N))
'''.replace("{k_loop}", textwrap.indent(K_LOOP, "        "))


def test_sums_started_on_each_pass_and_added_up_in_the_loop_equal_torch(tmp_path, monkeypatch) -> None:
    """A per-step product (`p`) added to the accumulator in the K loop, and an accumulator started on each pass of
    an outer loop that adds it to another: each value is used within the loop that makes it, nothing of one step
    is lost, and the rewrite equals torch."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    _built_and_equal_to_torch(tmp_path / "repeated.py", HEAD + textwrap.dedent(REPEATED))


def test_a_term_added_only_on_steps_a_test_of_the_step_picks_is_refused() -> None:
    """`if k == tl.cdiv(K, BLOCK_K) - 1: acc += tl.dot(a, b)` adds each rank's own last block, not the full K's."""
    with pytest.raises(AnnotationError, match="only on the steps of its loop at line 16 that the test "
                                              r"`k == tl.cdiv\(K, BLOCK_K\) - 1` at line 21 picks by the step"):
        _generate(_source("if k == tl.cdiv(K, BLOCK_K) - 1:\n            acc += tl.dot(a, b)"))
