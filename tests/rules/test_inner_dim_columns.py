"""A column vector read with no mask along an inner dim counts its last element, as along dim 0: `offs_d =
tl.arange(0, BLOCK_D)` on a (B, S, D) tensor gathered along S reads `BLOCK_D - 1` elements past each row's start, the
next row of S when D < BLOCK_D, which no wait of the tile covers (on the race-exposing schedule the last row of a
rank's tile read its peer's first row as NaN). The launch checks both ends of the columns against the row; masked
columns add nothing, and columns whose ends TileLink cannot read are refused at the access."""

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
from tilelink.runtime import current_world

FORM = Path(__file__).parent / "forms" / "row_block_sums.py"
SOURCE = FORM.read_text()
LOAD_LINE = next(i for i, line in enumerate(SOURCE.splitlines(), 1) if "x = tl.load(" in line)
COLUMNS = "    offs_d = tl.arange(0, BLOCK_D)\n"
B, S = 2, 8


def _plan(source: str):
    return generate(source, "row_block_sums.py", requests_in(source, "row_block_sums.py")).plans[0].launch


def test_the_columns_last_element_is_kept_for_the_launch() -> None:
    assert _plan(SOURCE).row_shifts == (("x_ptr", ((False, ("BLOCK_D",)), (True, ("1",))), LOAD_LINE),)
    # columns a stride apart: the last element times the stride
    strided = _plan(SOURCE.replace("offs_d[None, :]", "offs_d[None, :] * stride_xd").replace(
        "stride_xs, BLOCK_S", "stride_xs, stride_xd, BLOCK_S"))
    assert strided.row_shifts == (
        ("x_ptr", ((False, ("BLOCK_D", "stride_xd")), (True, ("1", "stride_xd"))), LOAD_LINE),), strided.row_shifts
    # masked by the row's length: the mask bounds them, and its bound is checked against the row
    masked = SOURCE.replace("mask=offs_s[:, None] < S,", "mask=(offs_s[:, None] < S) & (offs_d[None, :] < D),").replace(
        "S, stride_xb", "S, D, stride_xb")
    assert _plan(masked).row_shifts == (("x_ptr", ((False, ("D",)), (True, ("1",))), LOAD_LINE),), \
        _plan(masked).row_shifts


def test_columns_whose_end_tilelink_cannot_read_are_refused_at_the_access() -> None:
    source = SOURCE.replace(COLUMNS, "    offs_d = tl.arange(0, BLOCK_D // 2)\n")
    with pytest.raises(AnnotationError) as info:
        _plan(source)
    said = str(info.value)
    assert f"row_block_sums.py:{LOAD_LINE}:" in said, said
    assert "the columns `offs_d` of the load at line" in said and "no mask bounding them" in said, said
    assert "mask the columns by the row's length" in info.value.hint, info.value.hint


def _kernel(tmp_path):
    path = tmp_path / "row_block_sums.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("row_block_sums_launch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.row_block_sum


class _Launcher:
    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound

    def size_of(self, bound: dict, grid=None) -> int:
        return bound["S"]


def test_columns_past_the_row_are_refused_at_the_launch(tmp_path) -> None:
    kernel = _kernel(tmp_path)

    def args(d: int, block_d: int) -> dict:
        return dict(x_ptr=torch.zeros(B, S // 2, d), y_ptr=torch.zeros(B, S), S=S, stride_xb=S * d, stride_xs=d,
                    BLOCK_S=4, BLOCK_D=block_d)

    kernel._check_row_scales(args(8, 8), _Launcher())
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(args(6, 8), _Launcher())
    said = str(info.value)
    assert f"row_block_sums.py:{LOAD_LINE} adds 7 elements (BLOCK_D=8 + -1) to 'x_ptr'" in said, said
    assert "the full 8 rows along dim 1 of 6 elements each" in said and "moves it 1 row along dim 1" in said, said


def _sums(path: str, d: int, block_d: int) -> float:
    spec = importlib.util.spec_from_file_location(f"row_block_sums_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(B, S, d, generator=torch.Generator().manual_seed(3))
    lo, hi = rows_of(rank, world, S)
    device = current_world().device
    y = torch.full((B, S), float("nan"), device=device)
    module.row_block_sum[(S // 4, B)](x[:, lo:hi].contiguous().to(device), y, S, S * d, d, BLOCK_S=4,
                                      BLOCK_D=block_d)
    got = y.cpu()
    return float("inf") if got.isnan().any() else (got - x[:, :, :block_d].sum(2)).abs().max().item()


@pytest.mark.slow
def test_the_columns_are_checked_at_two_ranks_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "row_block_sums.py"
    path.write_text(SOURCE)
    assert all(e < 1e-5 for e in tilelink.spawn(_sums, 2, str(path), 8, 8))
    # eight columns of six-element rows: the last row of a rank's tile reads its peer's first row
    with pytest.raises(LaunchError, match="moves it 1 row along dim 1"):
        tilelink.spawn(_sums, 2, str(path), 6, 8)
