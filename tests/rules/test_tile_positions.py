"""Where a tile is, as the wait or the notify reads it. Each form below built before and was wrong on the
race-exposing schedule at world 2 (rows read before they arrived, a channel completed while a tile of it was unstored),
or failed at its first call; each is now refused at its line or built right."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

import tilelink
from tests.rules.cases import module_at, plain_module, rows_of, worst
from tests.rules.test_carried_accumulator import _generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

KERNEL = '''
@tilelink.overlap(tilelink.{spec})
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr{extra}):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // grid_n{shift}
    pid_n = pid % grid_n
    {rows}
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + {a_rows}[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=({a_rows}[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        {update}
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask={store_mask}(rm[:, None] < M) & (rn[None, :] < N))
'''


def _source(spec: str, rows: str = "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", a_rows: str = "rm",
            update: str = "acc += tl.dot(a, b)", shift: str = "", extra: str = "", store_mask: str = "") -> str:
    return HEAD + textwrap.dedent(KERNEL).format(spec=spec, rows=rows, a_rows=a_rows, update=update, shift=shift,
                                                 extra=extra, store_mask=store_mask)


@pytest.mark.parametrize("spec", ['all_gather("a_ptr", dim=0)', 'reduce_scatter("c_ptr")'])
def test_a_start_that_takes_the_next_tile_of_a_queue_is_refused(spec: str) -> None:
    # the wait (or notify) would compute the channels from the start again: a second tl.atomic_add, another tile
    # (A's rows of their own: under reduce_scatter, a load reading the queue's rows is refused first)
    source = _source(spec, rows="rm = tl.atomic_add(q_ptr, 1) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
                                "    ra = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
                     a_rows="rm" if spec.startswith("all_gather") else "ra", extra=", q_ptr")
    with pytest.raises(AnnotationError, match=r"start at `tl.atomic_add\(q_ptr, 1\) \* BLOCK_M`, which calls "
                                              r"`tl.atomic_add`") as err:
        _generate(source)
    if spec.startswith("reduce_scatter"):  # a store's tiles are checked at the launch: from program ids only
        assert "tl.program_id" in err.value.hint, err.value.hint
        return
    assert "tile_id = tl.atomic_add(q_ptr, 1)" in err.value.hint
    # as the hint says: the value bound first, read once
    named = source.replace("    rm = tl.atomic_add(q_ptr, 1) * BLOCK_M",
                           "    tile_id = tl.atomic_add(q_ptr, 1)\n    rm = tile_id * BLOCK_M")
    assert "tile_id * BLOCK_M" in _generate(named).rewritten["matmul"]


@pytest.mark.parametrize("spec", ['reduce_scatter("c_ptr")', 'all_reduce("c_ptr")'])
def test_an_idle_program_before_the_first_tile_stays_idle_under_the_tile_order(tmp_path, monkeypatch,
                                                                                  spec: str) -> None:
    # a grid one tile row longer than the rows, starting at tile -1 (stored nowhere): the rotation of the tile order
    # once sent it onto a real tile, stored twice, whose channel completed before the other programs' tiles
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source(spec, shift=" - 1", store_mask="(rm[:, None] >= 0) & ", a_rows="ra",
                     rows="rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\n"
                          "    ra = tl.maximum(pid_m, 0) * BLOCK_M + tl.arange(0, BLOCK_M)")
    assert "tl_remap_tile" in _generate(source).rewritten["matmul"]
    path = tmp_path / "idle_first.py"
    path.write_text(source)
    errors = tilelink.spawn(_against_plain, 2, str(path), "all_reduce" if "all_reduce" in spec else "reduce_scatter",
                            (4 + 1) * 2)
    assert all(e < 1e-4 for e in errors), errors


def test_loads_of_one_tile_whose_rows_wrap_share_a_wait_that_covers_the_wrap(tmp_path, monkeypatch) -> None:
    # two row vectors from one start, one of them wrapped `% M`: their loads share one wait, which once covered only
    # the first's rows; the wrapped rows summed over the tile reach every stored row
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source('all_gather("a_ptr", dim=0)',
                     rows="s = pid_m * BLOCK_M\n"
                          "    rm, ra = s + tl.arange(0, BLOCK_M), (s + tl.arange(0, BLOCK_M)) % M",
                     update="w = tl.load(a_ptr + ra[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,\n"
                            "                    mask=(k * BLOCK_K + rk)[None, :] < K, other=0.0)\n"
                            "        acc += tl.dot(a, b) + tl.sum(tl.dot(w, b), axis=0)[None, :]")
    body = _generate(source).rewritten["matmul"]
    assert "the rows its offsets wrap to" in body, body
    path = tmp_path / "wrapped_pair.py"
    path.write_text(source)
    errors = tilelink.spawn(_against_plain, 2, str(path), "all_gather", 8)
    assert all(e < 1e-3 for e in errors), errors


@pytest.mark.parametrize("rows, called", [
    # a permutation loaded for the start, then written over before the wait reads it again
    ("rm = tl.load(q_ptr + pid) * BLOCK_M + tl.arange(0, BLOCK_M)\n    tl.store(q_ptr + pid, 0)", "tl.load"),
    # a helper that takes the next tile of a queue, reached through another name
    ("rm = queue.next_tile(q_ptr) * BLOCK_M + tl.arange(0, BLOCK_M)", "queue.next_tile"),
])
def test_a_start_read_again_with_another_value_is_refused(rows: str, called: str) -> None:
    source = _source('all_gather("a_ptr", dim=0)', rows=rows, extra=", q_ptr")
    with pytest.raises(AnnotationError, match=rf"which calls `{re.escape(called)}`"):
        _generate(source)
    # a permutation the kernel only reads builds (MoE-style tile ids)
    if called == "tl.load":
        assert "consumer_tile_wait" in _generate(source.replace("    tl.store(q_ptr + pid, 0)\n", "")).rewritten[
            "matmul"]


TILE = 'all_gather("a_ptr", dim=0, tile=("lo", "BLOCK_M"), size="M")'
SHIFTED = "lo = pid_m * BLOCK_M\n    {bind}\n    rm = lo + tl.arange(0, BLOCK_M)"
#: rows no offsets vector names: bounded by the proof, not compared with tile=
SHIFTED_ROWS = "(lo + d + tl.arange(0, BLOCK_M))"


@pytest.mark.parametrize("bind, atom", [
    ("d = 0\n    if pid_m == 2:\n        d = -8", "`d`"),  # a local bound to a negative value on one path
    ("d = tl.load(d_ptr + pid_m)", "`tl.load("),  # a value loaded from memory
    ("d = tl.where(pid_m == 2, -8, 0)", "`tl.where("),  # a value chosen
    ("d = d_arg.to(tl.int8)", "`d_arg.to(tl.int8)`"),  # a parameter narrowed: 248 passed is -8 in the kernel
])
def test_rows_under_tile_shifted_by_a_value_of_unknown_sign_are_refused(bind: str, atom: str) -> None:
    # the proof that the rows lie in the tile takes every atom as non-negative; these may not be
    source = _source(TILE, rows=SHIFTED.format(bind=bind), a_rows=SHIFTED_ROWS, extra=", d_ptr, d_arg").replace(
        f"mask=({SHIFTED_ROWS}[:, None] < M)", f"mask=({SHIFTED_ROWS}[:, None] < lo + BLOCK_M)")
    with pytest.raises(AnnotationError, match="which the proof that they lie in the tile takes as non-negative") as e:
        _generate(source)
    assert f"rows from {atom}" in str(e.value), e.value


def test_rows_under_tile_shifted_by_a_local_bound_to_non_negative_values_build() -> None:
    source = _source(TILE, rows=SHIFTED.format(bind="d = 0\n    if pid_m == 2:\n        d = BLOCK_M // 2"),
                     a_rows=SHIFTED_ROWS).replace(f"mask=({SHIFTED_ROWS}[:, None] < M)",
                                                  f"mask=({SHIFTED_ROWS}[:, None] < lo + BLOCK_M)")
    assert "consumer_tile_wait" in _generate(source).rewritten["matmul"]


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_store_under_tile_whose_rows_are_not_read_is_refused(rule: str) -> None:
    # the tiles stored in the reverse order while tile= names the program's own: the notify announced other rows
    source = _source(f'{rule}("c_ptr", tile=("pid_m * BLOCK_M", "BLOCK_M"), size="M")').replace(
        "tl.store(c_ptr + rm[:, None] * stride_cm",
        "tl.store(c_ptr + ((tl.cdiv(M, BLOCK_M) - 1 - pid_m) * BLOCK_M + tl.arange(0, BLOCK_M))[:, None] * stride_cm")
    with pytest.raises(AnnotationError, match="cannot read the rows the store writes as those rows"):
        _generate(source)
    # the same rows as tile= names, written inline: built
    same = source.replace("(tl.cdiv(M, BLOCK_M) - 1 - pid_m) * BLOCK_M", "pid_m * BLOCK_M")
    assert "producer_tile_notify" in _generate(same).rewritten["matmul"]


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_two_outputs_in_one_reduction_are_refused_at_the_annotation(rule: str) -> None:
    source = _source(f'{rule}(("c_ptr", "d_ptr"))', extra=", d_ptr")
    with pytest.raises(AnnotationError, match=rf"{rule}: one output tensor per kernel, got \('c_ptr', 'd_ptr'\)"):
        _generate(source)


def test_a_pointer_held_in_a_tuple_is_refused() -> None:
    # the wait's token is added to the pointer the load goes through: once written as `ptrs = ptrs + tlk_token`
    source = _source('all_gather("a_ptr", dim=0)').replace(
        "    acc = tl.zeros(", "    ptrs = (a_ptr, b_ptr)\n    acc = tl.zeros(", 1).replace(
        "a = tl.load(a_ptr + rm", "a = tl.load(ptrs[0] + rm", 1)
    with pytest.raises(AnnotationError, match=r"`ptrs` holds 'a_ptr' in a tuple \(`ptrs = \(a_ptr, b_ptr\)`\)"):
        _generate(source)


def _against_plain(path: str, rule: str, programs: int) -> float:
    """The rewrite on this rank's part against the plain kernel on the whole problem, on ``programs`` programs."""
    rank, world = tilelink.rank(), tilelink.world_size()
    m, n, k = 50, 24, 40
    meta = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    want = torch.full((m, n), float("nan"))
    plain_module(path).matmul[(programs,)](a, b, want, m, n, k, k, 1, n, 1, n, 1, **meta)
    kernel = module_at(path).matmul
    lo, hi = rows_of(rank, world, m)
    klo, khi = rows_of(rank, world, k)
    error = 0.0
    for _ in range(2):  # a second call counts its channels from where the first left them
        if rule == "all_gather":
            got = torch.full((m, n), float("nan"))
            kernel[(programs,)](a[lo:hi].contiguous(), b, got, m, n, k, k, 1, n, 1, n, 1, **meta)
            error = worst(error, (got - want).abs().max().item())
            continue
        got = torch.full((hi - lo if rule == "reduce_scatter" else m, n), float("nan"))
        kernel[(programs,)](a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), got, m, n, khi - klo, khi - klo, 1,
                            n, 1, n, 1, **meta)
        error = worst(error, (got - (want[lo:hi] if rule == "reduce_scatter" else want)).abs().max().item())
    return error


def test_a_position_read_through_a_module_imported_from_its_package_builds(tmp_path) -> None:
    # FlagGems' `from flag_gems.utils import triton_lang_extension as tle`, `pid = tle.program_id(0)` (its program ids
    # widened to int64): the helper's return is read, so the columns' start is a program's position
    package = tmp_path / "kernelutils"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "lang.py").write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef program_id(axis: tl.constexpr):\n"
        "    return tl.program_id(axis).to(tl.int64)\n")
    source = _source('reduce_scatter("c_ptr")').replace("import tilelink\n", "import tilelink\n"
                                                         "from kernelutils import lang as tle\n", 1).replace(
        "    pid = tl.program_id(0)\n", "    pid = tle.program_id(0)\n", 1)
    path = tmp_path / "flaggems_form.py"
    path.write_text(source)
    from tilelink.annotations import requests_in
    from tilelink.codegen import generate

    generated = generate(source, str(path), requests_in(source, str(path)))
    assert "producer_tile_notify" in generated.rewritten["matmul"]
    # without the helper's module to read, its value is unknown: refused at the columns, as before
    (package / "lang.py").unlink()
    with pytest.raises(AnnotationError, match="the columns `rn` of the store at line"):
        generate(source, str(path), requests_in(source, str(path)))
