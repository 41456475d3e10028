"""What a rewrite's row proof reads at each call, past where a column vector or a step starts: the bound a mask puts
on its columns (`cols[None, :] < D` with `D` larger than the row reads the next row), the sign of a program's position
the columns start at (`pid_d * STEP` with a negative `STEP` reads the end of the row before), the first element of a
descriptor along an inner dim (a negative base term hidden behind its extent), and the batch a whole step of the dims
before the rows reaches (a grid of more programs than the batch reads outside the gathered rows). Each would read rows
no wait covers (NaN, or a wrong sum, on the race-exposing schedule) under a report saying applied; each is refused at
the call, naming the argument or the values and the access."""

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
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

FORMS = Path(__file__).parent / "forms"
BLOCKS = (FORMS / "column_block_sums.py").read_text()
BLOCKS_LINE = next(i for i, line in enumerate(BLOCKS.splitlines(), 1) if "x = tl.load(" in line)
CHUNKED = (FORMS / "chunked_rows_pointer.py").read_text()
CHUNKED_LINE = next(i for i, line in enumerate(CHUNKED.splitlines(), 1) if "x = tl.load(" in line)
# the descriptor made per chunk, its base moved LEAD elements back along the row: its last element is in the row, its
# first in the row before
LEADING = (FORMS / "chunked_rows_descriptor.py").read_text().replace(
    "s_lo * stride_xs, shape=", "s_lo * stride_xs - LEAD, shape=").replace(
    "def chunked_col_sum_desc(x_ptr, y_ptr, S, D, CHUNK,", "def chunked_col_sum_desc(x_ptr, y_ptr, S, D, CHUNK, LEAD,")
LEADING_LINE = next(i for i, line in enumerate(LEADING.splitlines(), 1) if "x = desc.load(" in line)
M, ROW, BLOCK_M, BLOCK_D = 16, 8, 4, 4
B, S, D = 2, 8, 4


def _plan(source: str, name: str):
    return generate(source, name, requests_in(source, name)).plans[0].launch


def _load(path: Path, source: str, name: str):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


class _Launcher:
    """What the row checks ask of a launcher: the world, and the full size along the rows (`size="S"`)."""

    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound

    def size_of(self, bound: dict, grid=None) -> int:
        return bound["S"]


# -- quick: the facts the build keeps, and the refusals at the call


def test_a_masked_column_vector_keeps_its_bound_and_its_positions_signs() -> None:
    plan = _plan(BLOCKS, "column_block_sums.py")
    # from the row's start: the last column the mask lets through, times the column stride
    assert plan.row_shifts == (("x_ptr", ((False, ("D", "stride_xd")), (True, ("1", "stride_xd"))), BLOCKS_LINE),), \
        plan.row_shifts
    assert {name for name, _ in plan.row_signs} == {"STEP", "BLOCK_D"}, plan.row_signs
    # along an inner dim: the bound from the row's start, and the first element
    chunked = _plan(CHUNKED, "chunked_rows_pointer.py")
    assert chunked.row_shifts == (("x_ptr", ((False, ("D",)), (True, ("1",))), CHUNKED_LINE),), chunked.row_shifts
    leading = _plan(LEADING, "chunked_rows_descriptor.py")
    assert ("x_ptr", ((True, ("LEAD",)),), LEADING_LINE) in leading.row_shifts, leading.row_shifts


def _block_args(d: int, step: int) -> dict:
    return dict(x_ptr=torch.zeros(M // 2, ROW), y_ptr=torch.zeros(M, 2), M=M, D=d, STEP=step, stride_xm=ROW,
                stride_xd=1, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)


def test_a_mask_bound_past_the_row_and_a_negative_position_are_refused_at_the_call(tmp_path) -> None:
    kernel = _load(tmp_path / "column_block_sums.py", BLOCKS, "column_block_sum")
    kernel._check_row_scales(_block_args(ROW, BLOCK_D), _Launcher())
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_block_args(2 * ROW, BLOCK_D), _Launcher())
    said = str(info.value)
    assert f"column_block_sums.py:{BLOCKS_LINE} adds 15 elements (D=16 * stride_xd=1 + -1 * stride_xd=1)" in said \
        and "whose rows are 8 elements long" in said, said
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_block_args(ROW, -BLOCK_D), _Launcher())
    assert "argument 'STEP' is -4" in str(info.value), info.value


def _chunked_args(d: int, stride_xb: int = S * D) -> dict:
    return dict(x_ptr=torch.zeros(B, S // 2, D), y_ptr=torch.zeros(B, d), S=S, D=d, CHUNK=4, stride_xb=stride_xb,
                stride_xs=D, BLOCK_S=4, BLOCK_D=2 * D)


def test_along_an_inner_dim_a_mask_bound_past_the_row_is_refused_at_the_call(tmp_path) -> None:
    kernel = _load(tmp_path / "chunked_rows_pointer.py", CHUNKED, "chunked_col_sum")
    kernel._check_row_scales(_chunked_args(D), _Launcher(), (B,))
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_chunked_args(2 * D), _Launcher(), (B,))
    said = str(info.value)
    assert f"chunked_rows_pointer.py:{CHUNKED_LINE} adds 7 elements (D=8 + -1)" in said and \
        "moves it 1 row along dim 1" in said, said


def test_whole_steps_past_the_batch_or_before_it_are_refused_at_the_call(tmp_path) -> None:
    kernel = _load(tmp_path / "chunked_rows_pointer.py", CHUNKED, "chunked_col_sum")
    kernel._check_row_scales(_chunked_args(D), _Launcher(), (B,))
    kernel._check_row_scales(_chunked_args(D), _Launcher(), lambda meta: (meta["D"] // 2,))  # a function of them
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_chunked_args(D), _Launcher(), (B + 1,))
    said = str(info.value)
    assert f"chunked_rows_pointer.py:{CHUNKED_LINE} steps 'x_ptr' by values the kernel computes, on the grid " \
           f"(3, 1, 1): `(tl.program_id(0))` in [0, 2] times stride_xb=32, so it reaches block 2" in said, said
    assert "holds 2 of them (32 elements each)" in said, said
    # stepped back from the tensor's start
    back = _load(tmp_path / "chunked_back.py", CHUNKED.replace("x_ptr + b * stride_xb", "x_ptr - b * stride_xb"),
                 "chunked_col_sum")
    with pytest.raises(LaunchError, match="so it reaches block -1 of the dims before dim 1"):
        back._check_row_scales(_chunked_args(D), _Launcher(), (B,))
    # a value the grid cannot bound
    scaled = CHUNKED.replace("    b = tl.program_id(0)\n", "    b = tl.program_id(0) * BATCH\n").replace(
        "def chunked_col_sum(x_ptr, y_ptr, S, D, CHUNK,", "def chunked_col_sum(x_ptr, y_ptr, S, D, CHUNK, BATCH,")
    loaded = _load(tmp_path / "chunked_loaded.py", scaled, "chunked_col_sum")
    with pytest.raises(LaunchError, match="so it reaches block 2"):
        loaded._check_row_scales({**_chunked_args(D), "BATCH": 2}, _Launcher(), (B,))


def test_a_descriptors_first_element_before_the_row_is_refused_at_the_call(tmp_path) -> None:
    kernel = _load(tmp_path / "chunked_rows_descriptor.py", LEADING, "chunked_col_sum_desc")
    args = dict(x_ptr=torch.zeros(B, S // 2, D), y_ptr=torch.zeros(B, D), S=S, D=D, CHUNK=4, LEAD=0, stride_xb=S * D,
                stride_xs=D, BLOCK_S=4, BLOCK_D=D)
    kernel._check_row_scales(args, _Launcher(), (B,))
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales({**args, "LEAD": 2}, _Launcher(), (B,))
    said = str(info.value)
    assert f"chunked_rows_descriptor.py:{LEADING_LINE} adds -2 elements (-LEAD=2)" in said, said


# -- slow: the reads at two ranks on the race-exposing schedule


def _block_sums(path: str, d: int, step: int, blocks: int) -> float:
    spec = importlib.util.spec_from_file_location(f"column_block_sums_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, ROW, generator=torch.Generator().manual_seed(7))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((M, blocks), float("nan"), device=device)
    module.column_block_sum[(M // BLOCK_M, blocks)](x[lo:hi].contiguous().to(device), y, M, d, step, ROW, 1,
                                                    BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)
    got = y.cpu()
    want = torch.stack([x[:, j * step:j * step + BLOCK_D].sum(1) for j in range(blocks)], 1)
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


@pytest.mark.slow
def test_masked_columns_are_checked_at_two_ranks_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "column_block_sums.py"
    path.write_text(BLOCKS)
    assert all(e < 1e-5 for e in tilelink.spawn(_block_sums, 2, str(path), ROW, BLOCK_D, ROW // BLOCK_D))
    # a bound of two rows: the last blocks of a rank's last row read its peer's first row
    with pytest.raises(LaunchError, match="whose rows are 8 elements long"):
        tilelink.spawn(_block_sums, 2, str(path), 2 * ROW, BLOCK_D, 2 * ROW // BLOCK_D)
    # a step back: the second block of a rank's first row reads its peer's last row
    with pytest.raises(LaunchError, match="argument 'STEP' is -4"):
        tilelink.spawn(_block_sums, 2, str(path), ROW, -BLOCK_D, 2)


def _chunked_sums(path: str, d: int, programs: int) -> float:
    spec = importlib.util.spec_from_file_location(f"chunked_rows_pointer_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(9))
    lo, hi = rows_of(rank, world, S)
    device = current_world().device
    y = torch.full((programs, d), float("nan"), device=device)
    module.chunked_col_sum[(programs,)](x[:, lo:hi].contiguous().to(device), y, S, d, -(-S // world), S * D, D,
                                        BLOCK_S=4, BLOCK_D=2 * D)
    got = y.cpu()
    want = torch.cat([x, x.roll(-1, 1)], 2).sum(1)[:, :d] if d > D else x.sum(1)
    return float("inf") if got.isnan().any() else (got[:B] - want).abs().max().item()


@pytest.mark.slow
def test_inner_dim_columns_and_steps_are_checked_at_two_ranks_on_the_race_exposing_schedule(tmp_path,
                                                                                           monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "chunked_rows_pointer.py"
    path.write_text(CHUNKED)
    assert all(e < 1e-5 for e in tilelink.spawn(_chunked_sums, 2, str(path), D, B))
    # columns masked by two rows' length: a rank's last row of a chunk reads the next chunk's first row
    with pytest.raises(LaunchError, match="moves it 1 row along dim 1"):
        tilelink.spawn(_chunked_sums, 2, str(path), 2 * D, B)
    # a program past the batch reads past the gathered rows
    with pytest.raises(LaunchError, match="so it reaches block 2"):
        tilelink.spawn(_chunked_sums, 2, str(path), D, B + 1)
