"""Offsets broadcast where they are bound (FlagGems' `offset_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]`, the
name used bare after) are read as the vector and its subscript at each use (``tilelink.expanded``): a matrix-vector
kernel in that form builds under the three rules and equals torch on the race-exposing schedule, the code inserted
reading the name as bound; names used otherwise, or bound twice, are read as before."""

from __future__ import annotations

import libcst as cst
import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of, worst
from tilelink.errors import AnnotationError
from tilelink.expanded import as_written, expanded_offsets
from tilelink.runtime import current_world

MV = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.{rule})
@triton.jit
def mv_kernel(A, B, C, N, M, stride_an, stride_am, stride_bm, stride_cn, BLOCK_N: tl.constexpr,
              BLOCK_M: tl.constexpr):
    pid = tl.program_id(0)
    offset_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]
    offset_m = tl.arange(0, BLOCK_M)[None, :]
    n_mask = offset_n < N
    A_ptrs = A + offset_n * stride_an + offset_m * stride_am
    B_ptrs = B + offset_m * stride_bm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for m in range(0, M, BLOCK_M):
        m_mask = m + offset_m < M
        a = tl.load(A_ptrs, mask=n_mask & m_mask, other=0.0).to(tl.float32)
        b = tl.load(B_ptrs, mask=m_mask, other=0.0).to(tl.float32)
        acc += a * b
        A_ptrs += BLOCK_M * stride_am
        B_ptrs += BLOCK_M * stride_bm
    acc = tl.sum(acc, axis=1)
    C_ptrs = C + offset_n * stride_cn
    tl.store(C_ptrs, acc[:, None], mask=n_mask)
'''
RULES = {"reduce": 'reduce_scatter("C")', "all_reduce": 'all_reduce("C")', "gather": 'all_gather("A")'}
N, M = 37, 40


def written(tmp_path, rule: str) -> str:
    path = tmp_path / f"mv_{rule}.py"
    path.write_text(MV.format(rule=RULES[rule]))
    return str(path)


def mv(path: str, rule: str) -> float:
    """``C = A @ B`` with A's columns (a reduction) or rows (a gather) split over the ranks, two calls."""
    rank, world = tilelink.rank(), tilelink.world_size()
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randint(-3, 4, (N, M), generator=gen).float(), torch.randint(-3, 4, (M,), generator=gen).float()
    want = a @ b
    lo, hi = rows_of(rank, world, N)
    if rule == "gather":
        ar, br, rows, mm = a[lo:hi].contiguous(), b, (0, N), M
    else:
        klo, khi = rows_of(rank, world, M)
        ar, br, mm = a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), khi - klo
        rows = (lo, hi) if rule == "reduce" else (0, N)
    device = current_world().device
    ar, br = ar.to(device), br.to(device)
    kernel = module_at(path).mv_kernel
    error = 0.0
    for _ in range(2):
        c = torch.full((rows[1] - rows[0],), float("nan"), device=device)
        kernel[(triton.cdiv(N, 8),)](ar, br, c, N, mm, ar.stride(0), ar.stride(1), br.stride(0), c.stride(0),
                                     BLOCK_N=8, BLOCK_M=8)
        error = worst(error, (c.cpu() - want[rows[0]:rows[1]]).abs().max().item())
    return error


@pytest.mark.parametrize("rule", sorted(RULES))
def test_offsets_broadcast_where_bound_build_with_the_name_as_bound(rule: str, tmp_path) -> None:
    built = tilelink.build(written(tmp_path, rule))
    assert built.report.applied, [str(e) for e in built.report.entries]
    notes = [e.message for e in built.report.entries if "broadcast where bound" in e.message]
    assert notes and "`offset_n` (`[:, None]`)" in notes[0] and "`offset_m` (`[None, :]`)" in notes[0], notes
    kernel = built.rewritten["mv_kernel"]
    # the kernel as written; the inserted code reads `offset_n` as bound, a column (no second subscript)
    assert "offset_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]" in kernel
    assert "offset_n[:, None]" not in kernel, kernel


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_offsets_broadcast_where_bound_equal_torch(rule: str, world: int, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    errors = tilelink.spawn(mv, world, written(tmp_path, rule), rule)
    assert errors == [0.0] * world, errors


def _axes(body: str) -> dict[str, str]:
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(p, n, B: tl.constexpr):\n"
              "    pid = tl.program_id(0)\n" + body)
    return expanded_offsets(cst.parse_module(source), "k")[1]


def test_only_names_bound_once_and_read_by_value_are_read_as_vectors() -> None:
    column = "    o = pid * B + tl.arange(0, B)[:, None]\n"
    assert _axes(column + "    tl.store(p + o, 0, mask=o < n)\n") == {"o": "[:, None]"}
    assert _axes("    o = tl.arange(0, B)[None, :] + pid * B\n    tl.store(p + o, 0)\n") == {"o": "[None, :]"}
    # bound twice, its shape read, passed to a function of its own: as before
    assert _axes("    o = pid * B + tl.arange(0, B)[:, None]\n    o = o + 1\n    tl.store(p + o, 0)\n") == {}
    assert _axes("    o = pid * B + tl.arange(0, B)[:, None]\n    z = tl.zeros(o.shape, tl.int32)\n"
                 "    tl.store(p + o, z)\n") == {}
    assert _axes("    o = pid * B + tl.arange(0, B)[:, None]\n    tl.store(p + f(o), 0)\n") == {}
    # statements joined on a line: a longer first one would move where the next one starts
    assert _axes(column + "    x = o + 1; tl.store(p + o, 0)\n") == {}
    assert _axes(column + "    if n > 0: tl.store(p + o, 0)\n") == {}
    # a vector start makes a grid, which the vector and a subscript are not
    store = "    tl.store(p + o, 0)\n"
    assert _axes("    c = tl.arange(0, B)\n    o = c[None, :] + tl.arange(0, B)[:, None]\n" + store) == {}
    assert _axes("    c = tl.arange(0, B)\n    o = c + tl.arange(0, B)[:, None]\n" + store) == {}


def test_inserted_code_reads_the_name_as_bound_or_the_plan_is_made_on_the_kernel_as_written() -> None:
    axes = {"o": "[:, None]"}
    assert as_written(("x = tl.sum(tl.where(o[:, None] < n, 1, 0))",), axes) == ("x = tl.sum(tl.where(o < n, 1, 0))",)
    assert as_written(("x = o + 1",), axes) is None  # the vector itself: the kernel as written has no such value
    assert as_written(("y = other[:, None]",), axes) == ("y = other[:, None]",)


#: FlagGems' vendor form: a heuristic constexpr picks a one-tile branch or MV's K loop
ONE_TILE = '@triton.heuristics({"ONE_TILE": lambda args: args["M"] <= args["BLOCK_M"]})\n'
HEURISTIC = MV.format(rule=RULES["reduce"]).replace("@triton.jit\n", ONE_TILE + "@triton.jit\n").replace(
    "BLOCK_M: tl.constexpr):", "BLOCK_M: tl.constexpr, ONE_TILE: tl.constexpr):").replace(
    "    acc = tl.zeros(", """    if ONE_TILE:
        a = tl.load(A_ptrs, mask=n_mask, other=0.0).to(tl.float32)
        b = tl.load(B_ptrs).to(tl.float32)
        tl.store(C + offset_n * stride_cn, tl.sum(a * b, axis=1)[:, None], mask=n_mask)
        return
    acc = tl.zeros(""")


def test_a_refusal_of_the_kernel_read_so_is_the_one_reported(tmp_path) -> None:
    """FlagGems' vendor form: a branch that reads A outside the loop over the ranks' slices of M. Read as written, the
    stores' rows are not found ("cannot tell which rows of 'C'"); read with the vectors, the analysis gets to the
    reason that stands."""
    path = tmp_path / "mv_heuristic.py"
    path.write_text(HEURISTIC)
    with pytest.raises(AnnotationError, match=r"the load at line 19 reads `A` outside the loop at line 24 that sums"):
        tilelink.build(str(path))


def test_a_start_is_a_scalar_only_where_every_part_of_it_is() -> None:
    # `tl.cdiv` of a vector is a vector: its sum with the column is a grid
    assert _axes("    s = tl.cdiv(pid * B + tl.arange(0, B), 1)\n    o = s + tl.arange(0, B)[:, None]\n"
                 "    tl.store(p + o, 0)\n") == {}
    assert _axes("    s = tl.cdiv(pid * B, 2)\n    o = s + tl.arange(0, B)[:, None]\n    tl.store(p + o, 0)\n") == {
        "o": "[:, None]"}
    # a language extension's program id (FlagGems' `tle.program_id`)
    source = ("import triton\nimport triton.language as tl\nimport tle\n\n\n@triton.jit\ndef k(p, B: tl.constexpr):\n"
              "    pid = tle.program_id(0)\n    o = pid * B + tl.arange(0, B)[:, None]\n    tl.store(p + o, 0)\n")
    assert expanded_offsets(cst.parse_module(source), "k")[1] == {"o": "[:, None]"}


def test_a_refusal_of_the_kernel_read_so_names_the_code_and_column_as_written(tmp_path) -> None:
    path = tmp_path / "mv_columns.py"
    # the columns' sum inside the product: a form the analysis does not read, refused either way
    path.write_text(MV.format(rule=RULES["gather"]).replace(
        "a = tl.load(A_ptrs, mask=n_mask & m_mask, other=0.0)",
        "a = (offset_m >= 0) * tl.load(A + offset_n * stride_an + (m + offset_m) * stride_am, mask=n_mask & m_mask,"
        " other=0.0)"))
    with pytest.raises(AnnotationError) as refused:
        tilelink.build(str(path))
    line = path.read_text().splitlines()[refused.value.line - 1]
    assert line[refused.value.column - 1:].startswith("tl.load("), (refused.value.column, line)
    assert "[None, :]" not in str(refused.value) and "[:, None]" not in str(refused.value), str(refused.value)
