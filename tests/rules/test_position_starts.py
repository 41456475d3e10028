"""Columns that start at a program's position (`pid_n * BLOCK_N + tl.arange(0, BLOCK_N)`) are masked by the row's
length from above only: a negative position reads the end of the row before, which no wait of the tile covers (on the
race-exposing schedule a rank's first row read its peer's last row as NaN). A position whose form shows its sign
(program ids, parameters, `+`, `*`, `//`, `%`, `tl.cdiv`, minima) builds with its parameters checked non-negative; one
whose form does not (`tl.program_id(1) - SHIFT`, the grouped `pid_n` divided by `min(num_pid_m - first_pid_m,
GROUP_M)`, also over a persistent loop's `tile_id`) is bounded from each call's grid, and a call on which it can be
negative is refused. Columns indexed out of an expression (`(k * BLOCK_K + offs_k)[None, :]`) are checked as a named
vector bound to that expression."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tilelink
from tests.rules.cases import module_at, rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError
from tilelink.overlapped import _value_range
from tilelink.runtime import current_world

FORM = Path(__file__).parent / "forms" / "shifted_column_blocks.py"
SOURCE = FORM.read_text()
LOAD_LINE = next(i for i, line in enumerate(SOURCE.splitlines(), 1) if "x = tl.load(" in line)
POSITION = "    pid_d = tl.program_id(1) - SHIFT\n"
M, D, BLOCK_M, BLOCK_D = 8, 12, 4, 4

GROUPED = """    pid = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(D, BLOCK_D)
    num_pid_in_group = 2 * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * 2
    group_size_m = min(num_pid_m - first_pid_m, 2)
    pid_d = (pid % num_pid_in_group) // group_size_m
"""


def _plan(source: str):
    return generate(source, "shifted_column_blocks.py",
                    requests_in(source, "shifted_column_blocks.py")).plans[0].launch


def test_a_position_of_unknown_sign_is_kept_for_the_launch() -> None:
    assert _plan(SOURCE).row_starts == (("(tl.program_id(1) - SHIFT) * BLOCK_D", LOAD_LINE),), _plan(SOURCE)


@pytest.mark.parametrize("position", [
    "    pid_d = tl.program_id(1)\n",
    "    pid_d = tl.program_id(1) % tl.cdiv(D, BLOCK_D)\n",
    "    pid_d = tl.minimum(tl.program_id(1), tl.cdiv(D, BLOCK_D)) // 2\n",
], ids=["program_id", "modulo_cdiv", "minimum"])
def test_a_position_whose_form_shows_its_sign_builds_with_its_parameters_checked(position: str) -> None:
    plan = _plan(SOURCE.replace(POSITION, position))
    assert plan.row_starts == (), plan.row_starts
    assert "BLOCK_D" in {name for name, _ in plan.row_signs}, plan.row_signs


def test_a_position_a_helper_returns_is_written_out_over_its_arguments() -> None:
    helper = "@triton.jit\ndef tile_of(pid, N, BLOCK: tl.constexpr):\n    n = tl.cdiv(N, BLOCK)\n" \
             "    return pid // n, pid % n - SHIFT_OF\n\n\n"
    source = SOURCE.replace("@tilelink.overlap", helper + "@tilelink.overlap").replace(
        POSITION, "    pid_r, pid_d = tile_of(tl.program_id(1), D, BLOCK_D)\n").replace("SHIFT_OF", "1")
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "x = tl.load(" in text)
    assert _plan(source).row_starts == (
        ("((tl.program_id(1)) % (tl.cdiv((D), (BLOCK_D))) - 1) * BLOCK_D", line),), _plan(source).row_starts


def test_the_grouped_position_is_bounded_from_a_covering_grid() -> None:
    (value, _), = _plan(SOURCE.replace(POSITION, GROUPED)).row_starts
    assert "min(" in value and "tl.cdiv" in value, value
    values = dict(M=M, D=D, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)
    tiles = (M // BLOCK_M) * (D // BLOCK_D)
    assert _value_range(value, values, (1, tiles, 1)) == (0, D - BLOCK_D)
    # programs past the tiles: the group's size can reach 0 or below, and the interval cannot be bounded
    low = _value_range(value, values, (1, 4 * tiles, 1))
    assert low is None or low[0] < 0, low


SWIZZLED = """    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(D, BLOCK_D)
    pid = tl.program_id(1)
    _, pid_d = tl.swizzle2d(pid // num_pid_n, pid % num_pid_n, num_pid_m, num_pid_n, 2)
"""


def test_a_position_from_triton_s_swizzle2d_is_written_out_and_bounded_from_the_grid() -> None:
    # `tl.swizzle2d` is read from the installed Triton's own definition, as a straight-line helper of the file is
    (value, _), = _plan(SOURCE.replace(POSITION, SWIZZLED)).row_starts
    assert "swizzle2d" not in value and "tl.minimum(" in value, value
    values = dict(M=M, D=D, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)
    rows, cols = M // BLOCK_M, D // BLOCK_D

    def swizzled_column(pid: int) -> int:  # the swizzle's column, as its documentation states it
        i, j = pid // cols, pid % cols
        group = (i * cols + j) // (2 * cols)
        size = min(rows - group * 2, 2)
        return ((i * cols + j) % (2 * cols)) // size

    want = [swizzled_column(p) * BLOCK_D for p in range(rows * cols)]
    assert _value_range(value, values, (1, rows * cols, 1)) == (min(want), max(want))


def test_a_step_that_may_leave_its_32_bits_is_not_bounded() -> None:
    # Triton holds program ids, arguments and literals that fit as 32-bit ints: `pid * 2**30` wraps at pid 2, and
    # `// 2**30` of the wrapped value is negative, where exact arithmetic would say 2
    wrapped = "(tl.program_id(0) * 1073741824) // 1073741824"
    assert _value_range(wrapped, {}, (2, 1, 1)) == (0, 1)
    assert _value_range(wrapped, {}, (4, 1, 1)) is None
    assert _value_range(wrapped.replace("tl.program_id(0)", "tl.program_id(0).to(tl.int64)"), {}, (4, 1, 1)) == (0, 3)
    assert _value_range("tl.cdiv(N, 4)", {"N": (1 << 31) - 2}, (1, 1, 1)) is None  # `N + 4 - 1` wraps
    # a grid too large to evaluate program by program is bounded by intervals, with the same widths
    many = (1 << 21, 1, 1)
    assert _value_range("tl.program_id(0) * 1024", {}, many) == (0, ((1 << 21) - 1) * 1024)
    assert _value_range("tl.program_id(0) * 2048", {}, many) is None
    # a plain int past 32 bits may be a constexpr, which Triton folds and then makes 32-bit beside `pid`; cast first
    assert _value_range("tl.program_id(0) * W", {"W": 1 << 40}, (2, 1, 1)) is None
    assert _value_range("tl.program_id(0).to(tl.int64) * W", {"W": 1 << 40}, (2, 1, 1)) == (0, 1 << 40)
    assert _value_range("(tl.program_id(0) * (SIZE // 4096)) // 1024", {"SIZE": 1 << 32}, (2049, 1, 1)) is None
    # constants fold as Python ints, then take the width of the tensor beside them: `2**31 - 1` is a 32-bit int there
    assert _value_range("tl.program_id(0) + (2147483648 - 1)", {}, (1, 1, 1)) == ((1 << 31) - 1,) * 2
    assert _value_range("tl.program_id(0) + (2147483648 - 1)", {}, (2, 1, 1)) is None
    assert _value_range("(tl.program_id(0) + 1) * (2147483648 // 2)", {}, (2, 1, 1)) is None
    assert _value_range("tl.program_id(AXIS) * 4", {"AXIS": 1}, (1, 3, 1)) == (0, 8)  # an axis passed by argument


def _kernel(tmp_path, source: str = SOURCE):
    path = tmp_path / "shifted_column_blocks.py"
    path.write_text(source)
    return module_at(path, f"shifted_column_blocks_{abs(hash(source))}").shifted_column_blocks


class _Launcher:
    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound


def _args(shift: int) -> dict:
    return dict(x_ptr=torch.zeros(M // 2, D), y_ptr=torch.zeros(M, D), M=M, D=D, SHIFT=shift, stride_xm=D,
                BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)


def test_a_call_whose_grid_makes_the_position_negative_is_refused_at_the_launch(tmp_path) -> None:
    kernel = _kernel(tmp_path)
    grid = (M // BLOCK_M, D // BLOCK_D)
    kernel._check_row_scales(_args(0), _Launcher(), grid)
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_args(1), _Launcher(), grid)
    said = str(info.value)
    assert f"shifted_column_blocks.py:{LOAD_LINE} start at `(tl.program_id(1) - SHIFT) * BLOCK_D`, which is -4 " \
           f"for the program (0, 0, 0) of the grid (2, 3, 1)" in said, said
    assert "which its wait does not cover" in said and "every program starts its columns at 0 or past it" in said, said
    # a grid it cannot evaluate: the position cannot be bounded
    with pytest.raises(LaunchError, match="cannot bound over the grid of this call"):
        kernel._check_row_scales(_args(0), _Launcher(), lambda meta: ("two",))


def test_the_grouped_position_passes_on_its_grid_and_is_refused_past_it(tmp_path) -> None:
    kernel = _kernel(tmp_path, SOURCE.replace(POSITION, GROUPED))
    tiles = (M // BLOCK_M) * (D // BLOCK_D)
    kernel._check_row_scales(_args(0), _Launcher(), lambda meta: (M // BLOCK_M, tiles))
    with pytest.raises(LaunchError, match="start at `"):
        kernel._check_row_scales(_args(0), _Launcher(), (M // BLOCK_M, 4 * tiles))


def test_the_swizzled_position_passes_on_its_grid_and_runs_at_two_ranks(tmp_path, monkeypatch) -> None:
    source = SOURCE.replace(POSITION, SWIZZLED)
    kernel = _kernel(tmp_path, source)
    tiles = (M // BLOCK_M) * (D // BLOCK_D)
    kernel._check_row_scales(_args(0), _Launcher(), (M // BLOCK_M, tiles))
    with pytest.raises(LaunchError, match="start at `"):
        kernel._check_row_scales(_args(0), _Launcher(), (M // BLOCK_M, 4 * tiles))
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "swizzled.py"
    path.write_text(source)
    for got in tilelink.spawn(_copied, 2, str(path)):
        assert torch.equal(got, swizzled_copy())


def swizzled_copy() -> torch.Tensor:
    """What the swizzled kernel writes: its program p < D // BLOCK_D copies the column block p // 2 (the swizzle's
    first group of two rows)."""
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(5))
    return torch.cat([x[:, (p // 2) * BLOCK_D:(p // 2 + 1) * BLOCK_D] for p in range(D // BLOCK_D)], dim=1)


def _copied(path: str, shift: int = 0) -> torch.Tensor:
    """What the kernel of ``path`` writes on this rank, each rank passing its rows of the same ``x``."""
    module = module_at(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(5))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((M, D), float("nan"), device=device)
    grid = (triton_cdiv(M, BLOCK_M), triton_cdiv(D, BLOCK_D))
    module.shifted_column_blocks[grid](x[lo:hi].contiguous().to(device), y, M, D, shift, D, BLOCK_M=BLOCK_M,
                                       BLOCK_D=BLOCK_D)
    return y.cpu()


@pytest.mark.parametrize("columns, shifts", [
    ("tl.arange(0, BLOCK_D)[None, :]", (((False, ("BLOCK_D",)), (True, ("1",))),)),
    ("(tl.arange(0, BLOCK_D) - 2)[None, :]", (((True, ("2",)),), ((True, ("2",)), (False, ("BLOCK_D",)),
                                                                   (True, ("1",))))),
], ids=["arange", "shifted"])
def test_columns_indexed_out_of_an_expression_are_checked_as_named_ones(columns: str, shifts: tuple) -> None:
    # `(k * BLOCK_K + offs_k)[None, :]`, as the matmul tutorials write it: unmasked here, so both ends are checked
    source = SOURCE.replace("offs_d[None, :], mask=", f"{columns}, mask=").replace(
        "offs_d[None, :] < D), other", "offs_m[:, None] >= 0), other")
    assert source.count(columns) == 1 and "offs_d[None, :] < D), other" not in source
    plan = _plan(source)
    assert plan.row_shifts == tuple(("x_ptr", terms, LOAD_LINE) for terms in shifts), plan.row_shifts


def test_columns_out_of_an_expression_are_named_by_it_in_a_refusal() -> None:
    columns = "(pid_d * BLOCK_D + tl.arange(0, BLOCK_D))"
    source = SOURCE.replace("offs_d[None, :], mask=", f"{columns}[None, :], mask=").replace(
        "offs_d[None, :] < D), other", "offs_m[:, None] >= 0), other")
    with pytest.raises(AnnotationError) as info:
        _plan(source)
    said = str(info.value)
    assert f"shifted_column_blocks.py:{LOAD_LINE}:" in said, said
    assert f"the columns `{columns}` of the load at line {LOAD_LINE} are not bounded by the mask" in said, said
    # masked by the same expression: built, its start bounded at each call
    masked = SOURCE.replace("offs_d[None, :], mask=", f"{columns}[None, :], mask=").replace(
        "offs_d[None, :] < D), other", f"{columns}[None, :] < D), other")
    plan = _plan(masked)
    assert plan.row_starts == (("(tl.program_id(1) - SHIFT) * BLOCK_D", LOAD_LINE),), plan.row_starts


def test_the_persistent_grouped_form_bounds_its_store_over_the_loops_range() -> None:
    from tests.rules.forms_cases import FORMS

    source = (FORMS / "gemm_rs_persistent_grouped.py").read_text()
    plan = generate(source, "gemm_rs_persistent_grouped.py",
                    requests_in(source, "gemm_rs_persistent_grouped.py")).plans[0].launch
    (value, _), = plan.row_starts
    assert "tl.range((tl.program_id(axis=0))" in value and "min(" in value, value
    values = dict(M=50, N=40, BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, GROUP_SIZE_M=2, NUM_SMS=3)
    assert _value_range(value, values, (3, 1, 1)) == (0, 32)


def _copy(path: str, shift: int) -> float:
    got = _copied(path, shift)
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(5))
    return float("inf") if got.isnan().any() else (got - x).abs().max().item()


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.slow
def test_the_position_is_bounded_at_two_ranks_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "shifted_column_blocks.py"
    path.write_text(SOURCE)
    assert all(e < 1e-6 for e in tilelink.spawn(_copy, 2, str(path), 0))
    # one block back: the first program along the columns reads the end of the row before
    with pytest.raises(LaunchError, match="which is -4 for the program"):
        tilelink.spawn(_copy, 2, str(path), 1)


def test_a_position_an_imported_helper_returns_is_written_out_and_bounded() -> None:
    # `pid_m, pid_n = tile_coordinates(...)`, imported by name from another module of the package
    path = Path(tilelink.__file__).parent / "ops" / "tp_kernels.py"
    if not path.exists():  # an installed layout: the ops package beside the tilelink package's own files
        import tilelink.ops.tp_kernels as tp_kernels

        path = Path(tp_kernels.__file__)
    source = path.read_text()
    plans = {p.kernel: p.launch for p in generate(source, str(path), requests_in(source, str(path))).plans}
    (value, _), = plans["gemm_rs_kernel"].row_starts
    assert "tile_coordinates" not in value and "min(" in value, value
    values = dict(M=70, N=40, BLOCK_M=16, BLOCK_N=16, GROUP_M=8)
    tiles = 5 * 3
    assert _value_range(value, values, (tiles, 1, 1)) == (0, 32)


HELPER = "@triton.jit\ndef pos(pid, SHIFT_BY: tl.constexpr = 0):\n    return pid - SHIFT_BY\n\n\n"


@pytest.mark.parametrize("edit, said", [
    # a parameter the kernel binds again: the launch would bound the argument, not the kernel's value
    ((POSITION, "    SHIFT = SHIFT + 1\n" + POSITION), "it reads `SHIFT`"),
    # a helper that reads a global of its module bound again: which value runs is not known
    (("@tilelink.overlap", "OFF = 1\nOFF = 2\n\n\n@triton.jit\ndef pos(pid):\n    return pid - OFF\n\n\n"
                           "@tilelink.overlap"), "it reads `pos`"),
    # a helper the file defines twice: the last definition is the one that runs
    (("@tilelink.overlap", "@triton.jit\ndef pos(pid):\n    return pid\n\n\n" + HELPER + "@tilelink.overlap"),
     "it reads `pos`"),
], ids=["rebound_parameter", "helper_global", "helper_defined_twice"])
def test_a_position_tilelink_cannot_write_out_is_refused_at_the_access(edit, said: str) -> None:
    source = SOURCE.replace(*edit)
    if "def pos" in source:
        source = source.replace(POSITION, "    pid_d = pos(tl.program_id(1))\n")
    with pytest.raises(AnnotationError) as info:
        _plan(source)
    assert f"shifted_column_blocks.py:{LOAD_LINE + source.count(chr(10)) - SOURCE.count(chr(10))}:" in str(info.value)
    assert "whose sign TileLink cannot tell from its form and cannot write out" in str(info.value), str(info.value)
    assert said in str(info.value), str(info.value)


def test_a_helper_reading_an_int_constant_of_its_file_is_written_out() -> None:
    # `OFF = 1` bound once at the file's top level: Triton reads it as that constant
    source = SOURCE.replace("@tilelink.overlap", "OFF = 1\n\n\n@triton.jit\ndef pos(pid):\n    return pid - OFF\n\n\n"
                            "@tilelink.overlap").replace(POSITION, "    pid_d = pos(tl.program_id(1))\n")
    (value, _), = _plan(source).row_starts
    assert "pos" not in value and "OFF" not in value and "- 1" in value, value


@pytest.mark.parametrize("call", ["pos(tl.program_id(1))", "pos(pid=tl.program_id(axis=1))",
                                  "pos(tl.program_id(1), SHIFT_BY=SHIFT)"],
                         ids=["default", "keyword", "keyword_parameter"])
def test_a_helper_called_with_keywords_or_defaults_is_written_out(call: str) -> None:
    source = SOURCE.replace("@tilelink.overlap", HELPER + "@tilelink.overlap").replace(
        POSITION, f"    pid_d = {call}\n")
    (value, _), = _plan(source).row_starts
    assert "pos" not in value and "program_id" in value, value


def test_a_keyword_argument_is_not_a_value_to_write_out() -> None:
    # `axis = 1` in the kernel: `tl.program_id(axis=axis)` keeps its keyword
    source = SOURCE.replace(POSITION, "    axis = 1\n    pid_d = tl.program_id(axis=axis) - SHIFT\n")
    (value, _), = _plan(source).row_starts
    assert value == "(tl.program_id(axis=(1)) - SHIFT) * BLOCK_D", value
    assert _value_range(value, {"SHIFT": 0, "BLOCK_D": 4}, (2, 3, 1)) == (0, 8)


def test_columns_stepped_in_a_loop_start_at_its_target_and_keep_their_end() -> None:
    loop = SOURCE.replace(POSITION, "    for j in range(0, NSTEP):\n        pid_d = j\n").replace(
        "y_ptr, M, D, SHIFT,", "y_ptr, M, D, SHIFT, NSTEP,")
    body = loop.split("        pid_d = j\n")
    loop = body[0] + "        pid_d = j\n" + "\n".join("    " + line if line else line for line in body[1].split("\n"))
    plan = _plan(loop)
    line = next(i for i, text in enumerate(loop.splitlines(), 1) if "x = tl.load(" in text)
    assert plan.row_shifts == (("x_ptr", ((False, ("D",)), (True, ("1",))), line),), plan.row_shifts
    # a loop's target moved below 0: written out over the loop's range, for each call to bound
    (value, _), = _plan(loop.replace("        pid_d = j\n", "        pid_d = j - SHIFT\n")).row_starts
    at = next(i for i, text in enumerate(loop.splitlines(), 1) if "for j in range(0, NSTEP)" in text)
    assert value == f"(tl.range(0, NSTEP, 1, loop={at}) - SHIFT) * BLOCK_D", value
    assert _value_range(value, {"NSTEP": 3, "SHIFT": 1, "BLOCK_D": 4}, (2, 3, 1)) == (-4, 4)
    # one TileLink cannot write out (a loop over a loaded bound): refused, saying so
    with pytest.raises(AnnotationError, match="changes from one step of a loop to the next and whose sign"):
        _plan(loop.replace("        pid_d = j\n", "        pid_d = j - tl.load(x_ptr).to(tl.int32)\n"))


@pytest.mark.parametrize("columns, builds", [
    ("offs_d[None, :].to(tl.int64)", True), ("offs_d[None, :] * (D // D)", False),
    # broadcast to the block: the same columns, read as `offs_d[None, :]` (as a store's address is)
    ("tl.broadcast_to(offs_d[None, :], (BLOCK_M, BLOCK_D))", True), ("tl.expand_dims(offs_d, 0)", False)],
    ids=["cast", "unread_scale", "broadcast", "expand_dims"])
def test_columns_in_a_form_tilelink_does_not_read_are_refused(columns: str, builds: bool) -> None:
    source = SOURCE.replace("offs_d[None, :], mask=", f"{columns}, mask=")
    if builds:
        assert _plan(source).row_shifts == (("x_ptr", ((False, ("D",)), (True, ("1",))), LOAD_LINE),)
        return
    with pytest.raises(AnnotationError) as info:
        _plan(source)
    assert "in a form TileLink does not read" in str(info.value) or "does not read as the columns" in str(
        info.value), str(info.value)


def test_the_least_value_is_found_program_by_program(tmp_path) -> None:
    # `pid - (pid // n) * n` is never negative, which a bound of each operand alone cannot tell
    kernel = _kernel(tmp_path, SOURCE.replace(POSITION, "    pid_d = tl.program_id(1) - (tl.program_id(1) // 3) * 3"
                                                        " - SHIFT\n"))
    kernel._check_row_scales(_args(0), _Launcher(), (2, 6))
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_args(1), _Launcher(), (2, 6))
    assert "which is -4 for the program (0, 0, 0) of the grid (2, 6, 1)" in str(info.value), str(info.value)
    # a narrowing cast: not read, so not bounded
    narrow = _kernel(tmp_path, SOURCE.replace(POSITION, "    pid_d = (tl.program_id(1) + 126 - SHIFT).to(tl.int8)\n"))
    with pytest.raises(LaunchError, match="cannot bound over the grid of this call"):
        narrow._check_row_scales(_args(0), _Launcher(), (2, 3))


def test_columns_masked_through_a_second_vector_keep_their_end() -> None:
    # `offs_k = ki * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)` masked by `offs_k_for_mask[None, :] < K - ki *
    # BLOCK_SIZE_K`: its last column is K - 1, which each call checks within the row
    source = COUNTER.replace('reduce_scatter("c_ptr")', 'all_gather("a_ptr")')
    plan = generate(source, "gemm_persistent_counter.py", requests_in(source, "gemm_persistent_counter.py")).plans[0]
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "a = tl.load(" in text)
    assert plan.launch.row_shifts == (("a_ptr", ((False, ("K", "stride_ak")), (True, ("1", "stride_ak"))), line),)
    # a bound past the row through the second vector: `K + 4` reads the next row on the last step
    wide = source.replace("offs_k_for_mask[None, :] < K - ki", "offs_k_for_mask[None, :] < K + 4 - ki")
    shifts = generate(wide, "w.py", requests_in(wide, "w.py")).plans[0].launch.row_shifts
    assert shifts == (("a_ptr", ((False, ("K", "stride_ak")), (False, ("4", "stride_ak")),
                                 (True, ("1", "stride_ak"))), line),), shifts


COUNTER = (Path(__file__).parent / "forms" / "gemm_persistent_counter.py").read_text()
FOUND_AGAIN = "        pid_m, pid_n = _compute_pid(tile_id_c, num_pid_in_group, num_pid_m, GROUP_SIZE_M, NUM_SMS)\n"
UPDATE = "        tile_id_c += NUM_SMS\n"


def test_a_store_found_again_from_a_counter_in_step_with_its_loop_is_bounded_at_the_launch() -> None:
    # `tile_id_c = start_pid - NUM_SMS` and `tile_id_c += NUM_SMS` once a step of `tl.range(start_pid, num_tiles,
    # NUM_SMS)`: after the update it is the loop's target, so the store's `pid_n` (of the second `pid_m, pid_n = ...`,
    # the one that reaches it) is written out over the loop's range for each call to bound
    plan = generate(COUNTER, "p.py", requests_in(COUNTER, "p.py")).plans[0].launch
    line = next(i for i, text in enumerate(COUNTER.splitlines(), 1) if "tl.store(c_ptrs" in text)
    (written, at), = plan.row_starts
    assert at == line, at
    at = next(i for i, text in enumerate(COUNTER.splitlines(), 1) if "for tile_id in" in text)
    assert written.count("tl.range((tl.program_id(axis=0)), ((tl.cdiv(M, BLOCK_SIZE_M)) * (tl.cdiv(N, BLOCK_SIZE_N))), "
                         f"NUM_SMS, loop={at})") == 2 and "tile_id" not in written and "pid_" not in written, written


@pytest.mark.parametrize("start, update, before", [
    ("start_pid - NUM_SMS", "NUM_SMS", True),  # in step: the loop's target
    ("start_pid", "NUM_SMS", True),  # a step ahead of the target
    ("start_pid - NUM_SMS", "2 * NUM_SMS", True),  # advanced by another step than the loop's
    ("start_pid", "NUM_SMS", False),  # read before the update: the steps before this one
    ("2 * start_pid + 1", "3", False),
], ids=["in_step", "ahead", "other_step", "read_before_update", "other_start"])
def test_a_counter_of_the_loops_steps_is_written_out_at_the_read(start: str, update: str, before: bool) -> None:
    import libcst as cst
    from libcst.metadata import MetadataWrapper

    from tilelink.analysis import Where, _Analyzer, program_value
    from tilelink.overlapped import _each_step

    body = [f"    c = {start}\n", "    for t in tl.range(start_pid, T, NUM_SMS):\n"]
    read, advance = "        y = c\n", f"        c += {update}\n"
    body += [advance, read] if before else [read, advance]
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(x_ptr, T, NUM_SMS: tl.constexpr):\n"
              "    start_pid = tl.program_id(0)\n" + "".join(body))
    module = cst.parse_module(source)
    an = _Analyzer(module, MetadataWrapper(module, unsafe_skip_copy=True), module.body[2], "k.py", {})
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "y = c" in text)
    written = program_value(an, "c", loops=True, at=Where("k.py", line, 13))
    assert "c" not in written.replace("cdiv", "") or "tl.range" in written, written
    values, programs = {"T": 11, "NUM_SMS": 3}, (3, 1, 1)
    dom, (got,) = _each_step((written,), values, programs)
    ran = {(int(p), int(s)): int(v) for s, p, v in zip(dom.steps[0], dom.steps[1], got, strict=True)}
    expected = {}
    for pid in range(3):  # the kernel's own steps, run in Python
        c = eval(start, {"start_pid": pid, "NUM_SMS": 3})
        for step, _ in enumerate(range(pid, 11, 3)):
            if before:
                c += eval(update, {"NUM_SMS": 3})
            expected[pid, step] = c
            if not before:
                c += eval(update, {"NUM_SMS": 3})
    assert ran == expected, (written, ran, expected)


@pytest.mark.parametrize("old, new", [
    # advanced only on some steps
    (UPDATE, "        if K > 0:\n    " + UPDATE),
    # `pid_n` bound again in a branch between its assignment and the store
    (FOUND_AGAIN, FOUND_AGAIN + "        if N > 64:\n            pid_n = pid_n - 1\n"),
    # the counter set afresh in the loop
    (UPDATE, UPDATE + "        tile_id_c = tile_id_c - 1\n"),
    # the builtin `range` with its step given by keyword: compiled Triton drops the keyword and steps by 1
    ("tl.range(start_pid, num_tiles, NUM_SMS, flatten=True)", "range(start_pid, num_tiles, step=NUM_SMS)"),
    # the loop's step rebound between the counter's start and the loop
    ("    for tile_id in", "    NUM_SMS = NUM_SMS - 1\n    for tile_id in"),
])
def test_a_counter_out_of_step_or_a_name_bound_again_before_the_store_is_refused(old: str, new: str) -> None:
    assert old in COUNTER, old
    source = COUNTER.replace(old, new)
    with pytest.raises(AnnotationError) as info:
        generate(source, "p.py", requests_in(source, "p.py"))
    assert "the columns `offs_cn` of the store" in str(info.value) and "whose sign TileLink cannot tell" in str(
        info.value), str(info.value)


def test_the_assignment_that_reaches_a_read_is_the_last_one_no_later_step_can_change() -> None:
    import libcst as cst
    from libcst.metadata import MetadataWrapper

    from tilelink.analysis import Where, _Analyzer, _reaching

    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(x_ptr, N):\n"
              "    x = 1\n"                          # line 7
              "    for i in range(N):\n"
              "        y = x\n"                      # line 9: `x = 2` below runs before it on the next step
              "        x = 2\n"
              "        z = x\n"                      # line 11: `x = 2` reaches it
              "    w = x\n"                          # line 12: after the loop, either value
              "    x = 3\n"
              "    v = x\n")                         # line 14
    module = cst.parse_module(source)
    an = _Analyzer(module, MetadataWrapper(module, unsafe_skip_copy=True), module.body[2], "k.py", {})

    def reached(line: int) -> str | None:
        found = _reaching(an, "x", Where("k.py", line, source.splitlines()[line - 1].index("= x") + 3))
        return None if found is None else cst.Module([]).code_for_node(found[1])

    assert [reached(line) for line in (9, 11, 12, 14)] == [None, "2", None, "3"]
    # `with ... as x` binds x too
    held = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(x_ptr, N):\n"
            "    x = 1\n    with ctx() as x:\n        w = x\n")
    module = cst.parse_module(held)
    an = _Analyzer(module, MetadataWrapper(module, unsafe_skip_copy=True), module.body[2], "k.py", {})
    assert _reaching(an, "x", Where("k.py", 9, 13)) is None


STALE_MASK = """
    k = 0
    for i in range(0, 2):
        cmask = (offs_m[:, None] < M) & ((k * BLOCK_D + tl.arange(0, BLOCK_D))[None, :] < D)
        k += 1
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k * BLOCK_D + tl.arange(0, BLOCK_D))[None, :], mask=cmask)
"""


@pytest.mark.parametrize("edit, said", [
    # a mask bound before `k` moves: it bounds the columns of the step before, not those the load reads
    (lambda src: src.replace(src[src.index("    x = tl.load("):src.index("    cols = tl.program_id(1)")],
                             STALE_MASK), "are not bounded by the mask"),
    # a helper's default argument that reads its module's global (`shift=SHIFT`), beside a kernel parameter SHIFT
    (lambda src: src.replace("@tilelink.overlap", "SHIFT_OF = 1\n\n\n@triton.jit\ndef col(pid, shift=SHIFT_OF):\n"
                             "    return pid - shift\n\n\n@tilelink.overlap").replace(
        POSITION, "    pid_d = col(tl.program_id(1))\n"), "it reads `col`"),
    # a helper defined again under a module-level `if`: which one runs is not known here
    (lambda src: src.replace("@tilelink.overlap", "@triton.jit\ndef col(pid):\n    return pid\n\n\nif True:\n"
                             "    @triton.jit\n    def col(pid):  # noqa: F811\n        return pid - 1\n\n\n"
                             "@tilelink.overlap").replace(POSITION, "    pid_d = col(tl.program_id(1))\n"),
     "it reads `col`"),
    # a name twice in one unpacking: the last one is bound, not the first
    (lambda src: src.replace(POSITION, "    pid_d, pid_d = tl.program_id(1), tl.program_id(1) - 1\n"),
     "cannot write out over program ids and arguments"),
    # bound again under an `if`: either binding may reach the load
    (lambda src: src.replace(POSITION, "    pid_d = tl.program_id(1)\n    if SHIFT > 0:\n"
                             "        pid_d = tl.program_id(1) - SHIFT\n"),
     "which reads a local bound more than once: TileLink cannot tell which binding reaches the load"),
    # the column vector itself bound on both sides of an `if`
    (lambda src: src.replace(POSITION + "    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)\n",
                             "    pid_d = tl.program_id(1)\n    if SHIFT >= 0:\n"
                             "        pid_d = tl.program_id(1) - SHIFT\n"
                             "        offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)\n    else:\n"
                             "        offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)\n"),
     "are bound more than once outside any loop"),
    # the columns moved by `+=` or bound in a named expression outside any loop
    (lambda src: src.replace("    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)\n",
                             "    offs_d = tl.arange(0, BLOCK_D)\n    offs_d += pid_d * BLOCK_D\n"),
     "are bound more than once outside any loop"),
    (lambda src: src.replace("    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)\n",
                             "    q = (offs_d := pid_d * BLOCK_D + tl.arange(0, BLOCK_D))\n"),
     "are bound more than once outside any loop"),
    # the pointer built from the columns, then the columns bound again before the load: the load reads the first
    (lambda src: src.replace("    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :], mask=",
                             "    ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_d[None, :]\n"
                             "    offs_d = tl.arange(0, BLOCK_D)\n    x = tl.load(ptrs, mask="),
     "are bound more than once outside any loop"),
], ids=["stale_mask", "helper_default_global", "helper_redefined_in_a_block", "unpacked_twice", "bound_in_a_branch",
        "vector_in_branches", "vector_moved_in_place", "vector_in_a_named_expression",
        "vector_rebound_after_the_pointer"])
def test_what_a_review_found_is_refused_at_the_access(edit, said: str) -> None:
    source = edit(SOURCE)
    assert source != SOURCE
    with pytest.raises(AnnotationError) as info:
        _plan(source)
    assert said in str(info.value), str(info.value)


def test_a_position_bound_twice_is_bounded_from_the_binding_that_reaches_the_access(tmp_path) -> None:
    # a position bound twice outside any loop: the second binding reaches the load, and each call bounds it
    source = SOURCE.replace(POSITION, "    pid_d = tl.program_id(1)\n    pid_d = tl.program_id(1) - SHIFT\n")
    assert _plan(source).row_starts == (("(tl.program_id(1) - SHIFT) * BLOCK_D", LOAD_LINE + 1),)
    kernel = _kernel(tmp_path, source)
    kernel._check_row_scales(_args(0), _Launcher(), (2, 3))
    with pytest.raises(LaunchError, match="which is -4 for the program"):
        kernel._check_row_scales(_args(1), _Launcher(), (2, 3))


def test_columns_bound_again_before_every_read_are_checked_from_that_binding() -> None:
    # bound again before the pointer is built: every read sees the second binding, whose start is checked
    source = SOURCE.replace("    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)\n",
                            "    offs_d = tl.arange(0, BLOCK_D)\n"
                            "    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)\n")
    assert source != SOURCE
    assert _plan(source).row_starts == (("(tl.program_id(1) - SHIFT) * BLOCK_D", LOAD_LINE + 1),)


def test_what_a_review_found_is_refused_at_the_launch(tmp_path) -> None:
    # a step given by keyword counts down: `j` reaches -1 when LO=-2
    down = SOURCE.replace(POSITION, "    for j in tl.range(1, SHIFT, step=-1):\n        pid_d = j\n")
    down = down.replace("\n    offs_d =", "\n        offs_d =").replace("\n    x = tl.load(", "\n        x = tl.load(")
    down = down.replace("\n        offs_d[None, :] < D), other=0.0)", "\n            offs_d[None, :] < D), other=0.0)")
    down = down.replace("\n    cols =", "\n        cols =").replace("\n    tl.store(", "\n        tl.store(")
    plan = _plan(down)
    assert plan.row_starts and "tl.range(1, SHIFT, -1," in plan.row_starts[0][0], plan.row_starts
    with pytest.raises(LaunchError, match="cannot bound over the grid of this call"):
        _kernel(tmp_path, down)._check_row_scales(_args(-2), _Launcher(), (2, 3))
    # a local named like the names TileLink gives inline columns keeps its own binding
    # (an earlier load of the tensor reads inline columns, which TileLink names while it checks that load)
    named = SOURCE.replace(POSITION, "    first = tl.load(x_ptr + offs_m[:, None] * stride_xm + tl.arange(0, BLOCK_D)"
                                     "[None, :], mask=(offs_m[:, None] < M) & (tl.arange(0, BLOCK_D)[None, :] < D))\n"
                                     "    _tilelink_columns_0 = tl.program_id(1) - SHIFT\n"
                                     "    pid_d = _tilelink_columns_0\n")
    assert _plan(named).row_starts == (("(tl.program_id(1) - SHIFT) * BLOCK_D", LOAD_LINE + 2),)
    # a position past what 32-bit ints hold may wrap to a negative start
    wide = _kernel(tmp_path, SOURCE.replace(POSITION, "    pid_d = (tl.program_id(1) - SHIFT) * 536870912\n"))
    with pytest.raises(LaunchError, match="past what a 32-bit int holds"):
        wide._check_row_scales(_args(0), _Launcher(), (2, 3))
