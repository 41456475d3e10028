"""Columns that start at a program's position (`pid_n * BLOCK_N + tl.arange(0, BLOCK_N)`) are masked by the row's
length from above only: a negative position reads the end of the row before, which no wait of the tile covers (on the
race-exposing schedule a rank's first row read its peer's last row as NaN). A position whose form shows its sign
(program ids, parameters, `+`, `*`, `//`, `%`, `tl.cdiv`, minima) builds with its parameters checked non-negative; one
whose form does not (`tl.program_id(1) - SHIFT`, the grouped `pid_n` divided by `min(num_pid_m - first_pid_m,
GROUP_M)`) is bounded from each call's grid, and a call on which it can be negative is refused. Columns indexed as a
block without a name (`tl.arange(0, 4)[None, :]`) are refused at the access: their ends are not read."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
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


def _kernel(tmp_path, source: str = SOURCE):
    path = tmp_path / "shifted_column_blocks.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"shifted_column_blocks_{abs(hash(source))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.shifted_column_blocks


class _Launcher:
    def world(self):
        return SimpleNamespace(world_size=2)


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
           f"for some program of the grid (2, 3, 1)" in said, said
    assert "which its wait does not cover" in said and "start the columns at a non-negative position" in said, said
    # a grid it cannot evaluate: the position cannot be bounded
    with pytest.raises(LaunchError, match="cannot bound from the grid of this call"):
        kernel._check_row_scales(_args(0), _Launcher(), lambda meta: ("two",))


def test_the_grouped_position_passes_on_its_grid_and_is_refused_past_it(tmp_path) -> None:
    kernel = _kernel(tmp_path, SOURCE.replace(POSITION, GROUPED))
    tiles = (M // BLOCK_M) * (D // BLOCK_D)
    kernel._check_row_scales(_args(0), _Launcher(), lambda meta: (M // BLOCK_M, tiles))
    with pytest.raises(LaunchError, match="start at `"):
        kernel._check_row_scales(_args(0), _Launcher(), (M // BLOCK_M, 4 * tiles))


@pytest.mark.parametrize("columns", ["tl.arange(0, BLOCK_D)[None, :]", "(tl.arange(0, BLOCK_D) - 2)[None, :]",
                                     "(pid_d * BLOCK_D + tl.arange(0, BLOCK_D))[None, :] * 1"],
                         ids=["arange", "shifted", "scaled"])
def test_columns_indexed_without_a_name_are_refused_at_the_access(columns: str) -> None:
    source = SOURCE.replace("offs_d[None, :], mask=", f"{columns}, mask=").replace(
        "(offs_d[None, :] < D)", "(offs_m[:, None] >= 0)")
    assert source.count(columns) == 1
    with pytest.raises(AnnotationError) as info:
        _plan(source)
    said = str(info.value)
    assert f"shifted_column_blocks.py:{LOAD_LINE}:" in said and "as a block without naming it" in said, said
    assert "bind the vector to a local first" in info.value.hint, info.value.hint


def _copy(path: str, shift: int) -> float:
    spec = importlib.util.spec_from_file_location(f"shifted_column_blocks_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(5))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((M, D), float("nan"), device=device)
    grid = (triton_cdiv(M, BLOCK_M), triton_cdiv(D, BLOCK_D))
    module.shifted_column_blocks[grid](x[lo:hi].contiguous().to(device), y, M, D, shift, D, BLOCK_M=BLOCK_M,
                                       BLOCK_D=BLOCK_D)
    got = y.cpu()
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
    with pytest.raises(LaunchError, match="which is -4 for some program of the grid"):
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
