"""A reduction's notify counts what its store wrote, so a channel is complete only if no element of it is stored
twice: two programs storing one tile (a persistent kernel launched with more programs than its tile loop's step, a
grid axis the store's position does not read, a position taken modulo the tiles' count) complete the channel while
other tiles of it are unstored. The build writes each store's tile out over program ids and arguments
(``stored_tiles``); each call with more than one rank evaluates it for every program and loop step of its grid and
refuses a call where two of them overlap."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of
from tests.rules.forms_cases import FORMS, _placed, load_form
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError
from tilelink.overlapped import _stored_twice, _tiles_key

LOOP = "tl.range(tl.program_id(0), 12, NUM_SMS, loop=3)"  # 12 tiles of 3 x 4, walked by a persistent loop (line 3)


def _tiles(row: str, col: str = "", cols: str = "", line: int = 7, test: str = "") -> tuple[str, str, str, str, str,
                                                                                         int]:
    return row, "16", col, cols, test, line


PERSISTENT = (_tiles(f"({LOOP} // 4) * 16", f"({LOOP} % 4) * 8", "8"),)


@pytest.mark.parametrize("programs", [1, 3, 5])
def test_a_persistent_loop_with_at_most_its_step_of_programs_stores_each_tile_once(programs: int) -> None:
    assert _stored_twice(PERSISTENT, {"NUM_SMS": 5}, (programs, 1, 1), 48) is None


def test_more_programs_than_the_loops_step_store_tiles_twice() -> None:
    twice, said = _stored_twice(PERSISTENT, {"NUM_SMS": 5}, (8, 1, 1), 48)
    # program 5 starts at tile 5, which program 0 stores on its second step
    assert twice and "program (0, 0, 0) (step 1 of its tile loop)" in said, said
    assert "program (5, 0, 0) (step 0 of its tile loop)" in said and "rows [16, 32), columns [8, 16)" in said, said


@pytest.mark.parametrize("row, programs, size, twice", [
    ("tl.program_id(0) * 16", (4, 1, 1), 64, False),
    ("tl.program_id(0) * 16", (4, 2, 1), 64, True),  # axis 1 unread: both programs along it store the rows
    ("tl.program_id(0) * 16", (8, 1, 1), 64, False),  # programs past the rows store nothing a channel counts
    ("(tl.program_id(0) % 4) * 16", (8, 1, 1), 64, True),  # wrapped back onto the first tiles
    ("tl.minimum(tl.program_id(0), 3) * 16", (6, 1, 1), 64, True),  # clamped onto the last tile
    ("tl.program_id(0) * 8", (4, 1, 1), 64, True),  # tiles of 16 rows, 8 apart
], ids=["one_per_tile", "unread_axis", "past_the_rows", "modulo", "clamp", "overlapping_rows"])
def test_tiles_over_the_grid(row: str, programs, size: int, twice: bool) -> None:
    said = _stored_twice((_tiles(row),), {}, programs, size)
    assert (said is not None) == twice, said  # refused: stored twice, or rows off the tiles' lattice


def test_the_alternatives_of_one_program_may_overlap_but_not_anothers() -> None:
    # halves on one side of an `if`, the whole tile on the other: one program runs one side
    pid_m, pid_n = "(tl.program_id(0) // 2) * 16", "(tl.program_id(0) % 2) * 8"
    tiles = (_tiles(pid_m, pid_n, "4", 10), _tiles(pid_m, f"{pid_n} + 4", "4", 11), _tiles(pid_m, pid_n, "8", 13))
    assert _stored_twice(tiles, {}, (4, 1, 1), 32) is None
    # a fourth store, one column into the next program's tile
    twice, said = _stored_twice(tiles + (_tiles(pid_m, "tl.program_id(0) % 2", "8", 15),), {}, (4, 1, 1), 32)
    assert twice and "columns [1, 8)" in said, said


def test_a_store_runs_where_its_if_tests_hold() -> None:
    # the even programs store the first tiles, the odd ones the rest (two tile loops on the two sides of an `if`)
    even, odd = "tl.program_id(0) % 2 == 0", "not (tl.program_id(0) % 2 == 0)"
    tiles = (_tiles("tl.range(tl.program_id(0) // 2, 3, 2, loop=9) * 16", test=f"({even})", line=10),
             _tiles("tl.range(3 + tl.program_id(0) // 2, 6, 2, loop=13) * 16", test=odd, line=14))
    assert _stored_twice(tiles, {}, (4, 1, 1), 96) is None
    # without the tests every program would run both loops
    twice, said = _stored_twice(tuple(t[:4] + ("", t[5]) for t in tiles), {}, (4, 1, 1), 96)
    assert twice and "both store rows" in said, said
    # a compile-time test: the halves or the whole tile, as the launch's constexpr decides
    pid_m, pid_n = "(tl.program_id(0) // 2) * 16", "(tl.program_id(0) % 2) * 8"
    split = (_tiles(pid_m, pid_n, "4", 10, "(SPLIT)"), _tiles(pid_m, f"{pid_n} + 4", "4", 11, "(SPLIT)"),
             _tiles(pid_m, pid_n, "10", 13, "not (SPLIT)"))
    assert _stored_twice(split, {"SPLIT": 1}, (4, 1, 1), 32) is None
    twice, said = _stored_twice(split, {"SPLIT": 0}, (4, 1, 1), 32)  # whole tiles two columns wider than their step
    assert twice and "columns [8, 10)" in said, said


def test_the_splits_of_a_split_k_write_back_add_into_one_tile() -> None:
    # grid (tiles, SPLIT_K): the programs along axis 1 add into the tile of their axis-0 program, each add counted
    tiles = (_tiles("tl.program_id(0) * 16"),)
    assert _stored_twice(tiles, {}, (4, 3, 1), 64, splits=(1,)) is None
    assert _stored_twice(tiles, {}, (4, 3, 1), 64) is not None  # as plain stores: each element three times
    # two programs along the tiles' own axis wrapped onto one tile: the adds of one are not counted for the other
    twice, said = _stored_twice((_tiles("(tl.program_id(0) % 2) * 16"),), {}, (4, 3, 1), 64, splits=(1,))
    assert twice and "program (0, 0, 0)" in said and "program (2, 0, 0)" in said, said


def test_two_loops_over_equal_ranges_are_two_loops() -> None:
    # `for i in range(0, 2): for j in range(0, 2):` storing tile 3 * pid + i + j: tile 3 * pid + 1 twice
    nested = _tiles("(tl.program_id(0) * 3 + tl.range(0, 2, 1, loop=4) + tl.range(0, 2, 1, loop=5)) * 16")
    twice, said = _stored_twice((nested,), {}, (2, 1, 1), 96)
    assert twice and "rows [16, 32)" in said, said
    # 3 * i + j over i < 2, j < 3: each tile once
    rows = "(tl.program_id(0) * 6 + tl.range(0, 2, 1, loop=4) * 3 + tl.range(0, 3, 1, loop=5)) * 16"
    assert _stored_twice((_tiles(rows),), {}, (2, 1, 1), 192) is None
    # an inner loop whose range reads the outer one's target: tiles 4 * pid + 2 * i + j for j < i
    inner = "tl.range(0, tl.range(0, 3, 1, loop=4), 1, loop=5)"
    assert _stored_twice((_tiles(f"(tl.program_id(0) * 4 + tl.range(0, 3, 1, loop=4) * 2 + {inner}) * 16"),), {},
                         (2, 1, 1), 256) is None
    # the inner target alone: tile 4 * pid on the steps i = 1 and i = 2
    assert _stored_twice((_tiles(f"(tl.program_id(0) * 4 + {inner}) * 16"),), {}, (2, 1, 1), 256)[0]


def test_a_chained_comparison_holds_where_each_does() -> None:
    tiles = (_tiles("tl.program_id(0) * 16", test="(0 <= tl.program_id(1) < 1)"),)
    assert _stored_twice(tiles, {}, (2, 3, 1), 32) is None  # only the programs of axis-1 index 0 store
    assert _stored_twice((_tiles("tl.program_id(0) * 16", test="(0 <= tl.program_id(1) < 2)"),), {}, (2, 3, 1),
                         32)[0]


def test_a_grid_of_numpy_ints_is_read() -> None:
    import numpy as np

    from tilelink.overlapped import _grid_of

    assert _grid_of((np.int64(2), np.int32(3)), {}) == (2, 3, 1)
    assert _grid_of((True,), {}) is None


LOOPED = """
@tilelink.overlap(tilelink.reduce_scatter("y_ptr", size="M"))
@triton.jit
def k(x_ptr, y_ptr, M, BLOCK_M: tl.constexpr, NUM_SMS: tl.constexpr):
    pid = tl.program_id(0)
{body}
"""


@pytest.mark.parametrize("body, said", [
    # the same tile on every step of a loop
    ("    for t in tl.range(pid, 8, NUM_SMS):\n        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)\n"
     "        tl.store(y_ptr + rows, tl.load(x_ptr + rows), mask=rows < M)",
     "is inside the loop at line 10, but the tile it writes does not move with that loop"),
    # a tile of the outer loop only, stored on every step of the inner one
    ("    for i in range(0, 2):\n        for j in range(0, 2):\n"
     "            rows = (pid * 3 + i) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
     "            tl.store(y_ptr + rows, tl.load(x_ptr + rows), mask=rows < M)",
     "is inside the loop at line 11, but the tile it writes does not move with that loop"),
    # a loop's target read after the loop: its last value, on every step of the next loop
    ("    for t in range(0, 2):\n        pass\n    for s in tl.range(pid, 8, NUM_SMS):\n"
     "        rows = (pid * 2 + t) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
     "        tl.store(y_ptr + rows, tl.load(x_ptr + rows), mask=rows < M)",
     "which TileLink cannot write out"),
    # a local bound in a loop, read after it: its last step's value only
    ("    for t in range(0, 2):\n        start = (pid + t) * BLOCK_M\n"
     "    rows = start + tl.arange(0, BLOCK_M)\n    tl.store(y_ptr + rows, tl.load(x_ptr + rows), mask=rows < M)",
     "writes the rows from `start`, which TileLink cannot write out"),
    # a `while` loop: how many passes, and which tile each stores, is not read
    ("    i = 0\n    while i < 4:\n        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)\n"
     "        tl.store(y_ptr + rows, tl.load(x_ptr + rows), mask=rows < M)\n        i += 1",
     "is inside the `while` loop at line 11"),
], ids=["same_tile_each_step", "inner_loop_unread", "target_after_its_loop", "local_after_its_loop", "while_loop"])
def test_a_store_whose_tile_does_not_move_with_its_loops_is_refused(body: str, said: str) -> None:
    source = "import triton\nimport triton.language as tl\n\nimport tilelink\n" + LOOPED.format(body=body)
    with pytest.raises(AnnotationError, match=said):
        generate(source, "looped.py", requests_in(source, "looped.py"))


@pytest.mark.slow
def test_grids_of_millions_of_programs_are_told_apart() -> None:
    # one row per program, the last ones clamped onto one row: past 2**22 rows and 2**21 programs
    last = 1 << 22
    clamped = (("tl.minimum(tl.program_id(0), LAST)", "1", "", "", "", 12),)
    twice, said = _stored_twice(clamped, {"LAST": last}, (last + 2, 1, 1), last + 2)
    assert twice and f"program ({last}, 0, 0) at line 12 and program ({last + 1}, 0, 0)" in said, said
    # program 2**21 of one store and program 0 of a store in a loop: two programs, though packed alike once
    shifted = (("tl.program_id(0) * 16", "16", "", "", "(tl.program_id(0) > 0)", 14),
               (f"({1 << 21} + tl.range(0, 1, 1, loop=18)) * 16", "16", "", "", "(tl.program_id(0) == 0)", 19))
    twice, said = _stored_twice(shifted, {}, ((1 << 21) + 1, 1, 1), 1 << 26)
    assert twice and f"program ({1 << 21}, 0, 0) at line 14" in said, said


def test_a_host_descriptors_block_is_read_from_the_argument() -> None:
    tiles = (("tl.program_id(0) * c_desc.block_shape[0]", "c_desc.block_shape[0]", "tl.program_id(1) * 8",
              "c_desc.block_shape[1]", "", 9),)
    assert _stored_twice(tiles, {"c_desc": SimpleNamespace(block_shape=[16, 8])}, (2, 3, 1), 32) is None
    twice, said = _stored_twice(tiles, {"c_desc": SimpleNamespace(block_shape=[16, 16])}, (2, 3, 1), 32)
    assert twice and "columns [8, 16)" in said, said


def test_a_value_the_launch_cannot_evaluate_is_said() -> None:
    twice, said = _stored_twice((_tiles("tl.program_id(0) * SCALE"),), {"SCALE": 1.5}, (2, 1, 1), 32)
    assert not twice and "spans `tl.program_id(0) * SCALE`, which TileLink cannot evaluate" in said, said


def test_the_persistent_forms_plans_hold_their_tiles_over_the_loop() -> None:
    for form, kernel_line in (("gemm_rs_persistent_grouped", "tl.store(c_ptrs"),
                              ("gemm_persistent_counter", "tl.store(c_ptrs")):
        source = (FORMS / f"{form}.py").read_text()
        plan = generate(source, f"{form}.py", requests_in(source, f"{form}.py")).plans[0].launch
        line = next(i for i, text in enumerate(source.splitlines(), 1) if kernel_line in text)
        (row, rows, col, cols, test, at, _), = plan.stored_tiles
        assert at == line and test == "" and rows == "BLOCK_SIZE_M", plan.stored_tiles
        assert "tl.range(" in row and "tl.range(" in col, plan.stored_tiles
        values = dict(M=50, N=40, BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, GROUP_SIZE_M=2, NUM_SMS=5)
        assert _stored_twice(plan.stored_tiles, values, (5, 1, 1), 50) is None
        assert _stored_twice(plan.stored_tiles, values, (8, 1, 1), 50) is not None


def test_a_row_start_tilelink_cannot_write_out_is_refused_at_the_build() -> None:
    source = (FORMS / "row_tile_copy.py").read_text()
    head, scale = source.split("def row_tile_scale")
    # the position one side of an `if` binds: the launch could not tell which tiles the programs store
    edited = head + "def row_tile_scale" + scale.replace(
        "pid = tl.program_id(0)", "pid = tl.program_id(0)\n    if M > 64:\n        pid = tl.program_id(1)", 1)
    with pytest.raises(AnnotationError, match="writes the rows from `pid \\* BLOCK_M`, which TileLink cannot write "
                                              "out over program ids"):
        generate(edited, "row_tile_copy.py", requests_in(edited, "row_tile_copy.py"))


def _persistent(grid: int, num_sms: int) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K, block = 50, 40, 36, 16
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randint(-2, 3, shape, generator=g).float() for shape in ((M, K), (K, N)))
    klo, khi = rows_of(rank, world, K)
    ar, br = _placed(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    lo, hi = rows_of(rank, world, M)
    out = torch.full((hi - lo, N), float("nan"), device=ar.device)
    load_form("gemm_rs_persistent_grouped").persistent_mm[(grid,)](
        ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), N, 1,
        BLOCK_SIZE_M=block, BLOCK_SIZE_N=block, BLOCK_SIZE_K=block, GROUP_SIZE_M=2, NUM_SMS=num_sms)
    return (out.float().cpu() - (a @ b)[lo:hi]).abs().max().item()


def persistent_launches(backend: str = "emulated") -> None:
    """At two ranks: the grouped persistent form on 5 programs for a step of 5 equals torch; on 8 it is refused."""
    assert triton.cdiv(50, 16) * triton.cdiv(40, 16) == 12  # tiles: 8 programs of step 5 store tiles 5-7 twice
    assert all(e == 0 for e in tilelink.spawn(_persistent, 2, 5, 5, backend=backend))
    with pytest.raises(LaunchError, match=r"on the grid \(8, 1, 1\), program .* both store rows") as info:
        tilelink.spawn(_persistent, 2, 8, 5, backend=backend)
    assert "at most as many programs as its tile loop's step" in str(info.value), info.value


def test_a_persistent_kernel_with_more_programs_than_its_step_is_refused_at_two_ranks() -> None:
    persistent_launches()


def test_a_call_is_remembered_by_its_float_arguments_too() -> None:
    # a float an `if` test around the store reads: the next call with the same grid and values is not checked again
    assert _tiles_key((4, 1, 1), 32, (0.5, 16, (16, 8), None)) == _tiles_key((4, 1, 1), 32, (0.5, 16, (16, 8), None))
    assert _tiles_key((4, 1, 1), 32, (0.5,)) != _tiles_key((4, 1, 1), 32, (0.25,))
    # a float the tiles cannot be evaluated with is not the int call that passed
    assert len({_tiles_key((4, 1, 1), 32, (v,)) for v in (2, 2.0, True)}) == 3
    assert _tiles_key((4, 1, 1), 32, (torch.zeros(2),)) is None


def test_the_two_sides_of_a_test_the_launch_cannot_read_may_store_one_tile() -> None:
    # a float compared in the test: both sides count as stored, each program's two stores overlap, no two programs'
    sides = (("tl.program_id(0) * 16", "16", "", "", "scale > 0", 10),
             ("tl.program_id(0) * 16", "16", "", "", "not (scale > 0)", 12))
    assert _stored_twice(sides, {"scale": 0.5}, (1 << 16, 1, 1), 1 << 20) is None
    clamped = (sides[0], ("tl.minimum(tl.program_id(0), 7) * 16", "16", "", "", "not (scale > 0)", 12))
    twice, said = _stored_twice(clamped, {"scale": 0.5}, (1 << 16, 1, 1), 1 << 20)
    assert twice and "program (7, 0, 0) at line 10 and program (8, 0, 0) at line 12 both store rows [112, 128)" in said


def _too_many() -> None:
    M, N, K = 50, 40, 36
    klo, khi = rows_of(tilelink.rank(), tilelink.world_size(), K)
    a, b = _placed(torch.zeros(M, khi - klo), torch.zeros(khi - klo, N))
    lo, hi = rows_of(tilelink.rank(), tilelink.world_size(), M)
    out = torch.zeros(hi - lo, N, device=a.device)
    load_form("gemm_rs_persistent_grouped").persistent_mm[((1 << 24) + 1,)](
        a, b, out, M, N, khi - klo, a.stride(0), a.stride(1), b.stride(0), b.stride(1), N, 1,
        BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=2, NUM_SMS=5)


def test_a_grid_of_more_programs_than_are_checked_is_refused_saying_so() -> None:
    with pytest.raises(LaunchError, match=r"has 16777217 programs, more than the 16777216 whose tiles TileLink checks "
                                          r"one by one .*launch fewer programs"):
        tilelink.spawn(_too_many, 2)


COLUMNS = """import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("y_ptr", size="M"))
@triton.jit
def k(x_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
{columns}
    mask = (rows < M)[:, None] & (out_cols < N)[None, :]
    v = tl.load(x_ptr + rows[:, None] * N + out_cols[None, :], mask=mask)
    tl.store(y_ptr + rows[:, None] * N + out_cols[None, :], v, mask=mask)
"""


@pytest.mark.parametrize("columns", [
    "    out_cols = cols",  # kernl's `n_offs = n_offs_untagged`
    "    out_cols = cols + 0",
], ids=["alias", "alias-plus-zero"])
def test_columns_through_a_local_made_from_others_are_the_programs_own(columns: str) -> None:
    source = COLUMNS.format(columns="    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)\n" + columns)
    plan = generate(source, "columns.py", requests_in(source, "columns.py")).plans[0].launch
    (_, _, col, cols, _, _, _), = plan.stored_tiles
    assert col.startswith("(tl.program_id(1) * BLOCK_N)") and cols == "BLOCK_N", plan.stored_tiles
    assert _stored_twice(plan.stored_tiles, dict(M=32, N=16, BLOCK_M=16, BLOCK_N=8), (2, 2, 1), 32) is None


@pytest.mark.parametrize("columns", ["    out_cols = cols", "    out_cols = cols + 0"], ids=["alias", "shifted"])
def test_columns_made_from_a_vector_bound_again_before_the_store_are_refused(columns: str) -> None:
    # made from the columns every program shares, then those bound again to the program's own: the programs store
    # the first columns, not those the name holds at the store
    source = COLUMNS.format(columns=f"    cols = tl.arange(0, BLOCK_N)\n{columns}\n"
                                    "    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)")
    with pytest.raises(AnnotationError, match="made from the vector `cols`, which is bound more than once"):
        generate(source, "columns.py", requests_in(source, "columns.py"))


def _alias_columns(path: str) -> float:
    """The reduce-scatter of each rank's (M, N) values, stored through a column alias, against their sum."""
    module = module_at(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N = 30, 16
    values = [torch.randn(M, N, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    lo, hi = rows_of(rank, world, M)
    error = 0.0
    for _ in range(2):
        y = torch.full((hi - lo, N), float("nan"))
        module.k[(triton.cdiv(M, 16), 2)](values[rank], y, M, N, BLOCK_M=16, BLOCK_N=8)
        error = max(error, (y - sum(values)[lo:hi]).abs().max().item())
    return error


def test_columns_through_an_alias_reduce_as_the_sum(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "alias_columns.py"
    path.write_text(COLUMNS.format(columns="    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)\n"
                                           "    out_cols = cols"))
    errors = tilelink.spawn(_alias_columns, 2, str(path))
    assert all(e < 1e-5 for e in errors), errors
