"""The matmul form of a loop advance (`x_ptrs += BLOCK_D * stride_xd`, `offs_d[None, :] < D - j * BLOCK_D`) has its
columns bounded by the mask from above only: a column vector that may hold a negative column reads the end of the row
before, which no wait of the tile covers (on the race-exposing schedule, the first row of a rank's own tile read its
peer's last row as NaN). A vector TileLink cannot read as non-negative (`tl.arange(0, BLOCK_D) - 2`) is refused at
the access; a start the call passes (`OFF + tl.arange(0, BLOCK_D)`) and the step's factors are checked non-negative
at each call with more than one rank."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton.language as tl

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError
from tilelink.runtime import current_world

FORM = Path(__file__).parent / "forms" / "window_strip_sum.py"
SOURCE = FORM.read_text()
LOAD_LINE = next(i for i, line in enumerate(SOURCE.splitlines(), 1) if "acc += tl.load(" in line)
START = "    offs_d = OFF + tl.arange(0, BLOCK_D)\n"
M, D, BLOCK_D = 16, 8, 4


def _generated(source: str):
    return generate(source, "window_strip_sum.py", requests_in(source, "window_strip_sum.py"))


@pytest.mark.parametrize("start", ["tl.arange(0, BLOCK_D) - 2", "OFF - 2 + tl.arange(0, BLOCK_D)",
                                   "tl.arange(0, BLOCK_D) + (OFF - 2)", "tl.arange(1, BLOCK_D + 1) * OFF - 1"],
                         ids=["minus_literal", "minus_in_start", "minus_in_parentheses", "negative_term"])
def test_columns_that_may_start_before_the_row_are_refused_at_the_access(start: str) -> None:
    source = SOURCE.replace(START, f"    offs_d = {start}\n")
    assert source != SOURCE
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    said = str(info.value)
    assert f"window_strip_sum.py:{LOAD_LINE}:" in said, said
    assert "its columns `offs_d` may start before the row's first column" in said, said
    assert "start the columns at 0 or a non-negative offset" in info.value.hint, info.value.hint


@pytest.mark.parametrize("start", ["OFF + tl.arange(0, BLOCK_D)", "tl.arange(0, BLOCK_D)",
                                   "tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)"],
                         ids=["passed", "zero", "program_position"])
def test_a_start_of_known_sign_builds_and_its_parameters_are_checked_at_the_launch(start: str) -> None:
    gen = _generated(SOURCE.replace(START, f"    offs_d = {start}\n"))
    (entry, *_) = [str(e) for e in gen.report.entries if e.message.startswith("consumer_tile_wait")]
    assert entry.startswith("[applied]"), entry
    signs = {name for name, _ in gen.plans[0].launch.row_signs}
    # the step's factor, and the start's parameters
    assert signs == {"BLOCK_D"} | ({"OFF"} if "OFF" in start else set()), signs


def _kernel(tmp_path):
    path = tmp_path / "window_strip_sum.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("window_strip_sum_launch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.window_strip_sum


class _Launcher:
    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound


def _args(off: int) -> dict:
    return dict(x_ptr=torch.zeros(M // 2, D), y_ptr=torch.zeros(M, BLOCK_D), M=M, D=D, OFF=off, NSTEP=3,
                stride_xm=D, stride_xd=1, BLOCK_M=4, BLOCK_D=BLOCK_D)


def test_a_negative_start_is_refused_at_the_launch(tmp_path) -> None:
    kernel = _kernel(tmp_path)
    kernel._check_row_scales(_args(2), _Launcher())
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_args(-2), _Launcher())
    said = str(info.value)
    assert said.startswith("window_strip_sum: argument 'OFF' is -2, but the rows the load at "), said
    assert f"window_strip_sum.py:{LOAD_LINE} reads were proven to be those its wait covers with OFF taken as " \
           "non-negative" in said, said
    assert "pass a non-negative OFF" in said, said


def _windows(path: str, off: int, nstep: int) -> float:
    spec = importlib.util.spec_from_file_location(f"window_strip_sum_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(3))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((M, BLOCK_D), float("nan"), device=device)
    module.window_strip_sum[(M // 4,)](x[lo:hi].contiguous().to(device), y, M, D, off, nstep, D, 1, BLOCK_M=4,
                                       BLOCK_D=BLOCK_D)
    padded = torch.cat([x, torch.zeros(M, off + nstep * BLOCK_D)], dim=1)
    want = sum(padded[:, off + j * BLOCK_D:off + (j + 1) * BLOCK_D] for j in range(nstep))
    got = y.cpu()
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


@pytest.mark.slow
def test_the_start_is_checked_at_two_ranks_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "window_strip_sum.py"
    path.write_text(SOURCE)
    assert all(e < 1e-5 for e in tilelink.spawn(_windows, 2, str(path), 2, 3))
    # two columns before the row: a rank's first row, in a tile of its own rows, reads its peer's last row
    with pytest.raises(LaunchError, match="argument 'OFF' is -2"):
        tilelink.spawn(_windows, 2, str(path), -2, 3)


@pytest.mark.parametrize("again, builds", [("tl.arange(0, BLOCK_D)", True), ("tl.arange(0, BLOCK_D) - 2", False)],
                         ids=["both_non_negative", "one_negative"])
def test_columns_bound_twice_are_as_signed_as_their_values(again: str, builds: bool) -> None:
    # a persistent kernel binds its column vector in its body loop and again in its tail: the name holds one of its
    # values wherever it is read, so it is non-negative when every value is
    cols = "    cols = tl.arange(0, BLOCK_D)\n"
    source = SOURCE.replace(cols, f"{cols}    offs_d = {again}\n")
    assert source != SOURCE
    if builds:
        gen = _generated(source)
        (entry, *_) = [str(e) for e in gen.report.entries if e.message.startswith("consumer_tile_wait")]
        assert entry.startswith("[applied]"), entry
        return
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    assert "its columns `offs_d` may start before the row's first column" in str(info.value), str(info.value)


#: a column start chosen per program by a conditional expression (`a if pid_m < 1 else b`): the launch cannot take
#: one side for every program, and one side may be negative
PER_PROGRAM_START = '''
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.all_gather("A", dim=0))
@triton.jit
def copy_rows(A, C, M, D, stride_am, stride_cm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    start = pid_n * BLOCK_D if pid_m < 1 else pid_n * BLOCK_D - 3
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = start + tl.arange(0, BLOCK_D)
    x = tl.load(A + rm[:, None] * stride_am + cols[None, :], mask=(rm[:, None] < M) & (cols[None, :] < D), other=0.0)
    tl.store(C + rm[:, None] * stride_cm + cols[None, :], x, mask=(rm[:, None] < M) & (cols[None, :] < D))
'''


def _per_program_start(path: str) -> str:
    spec = importlib.util.spec_from_file_location("per_program_start", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    rows, d = 64, 8
    a = torch.arange(rows * d, dtype=torch.float32).reshape(rows, d)
    lo, hi = rows_of(rank, world, rows)
    c = torch.zeros(rows, d)
    try:
        module.copy_rows[(rows // 16, d // 2)](a[lo:hi].contiguous(), c, rows, d, d, d, BLOCK_M=16, BLOCK_D=2)
    except LaunchError as exc:
        return str(exc)
    return f"ran: {int(torch.isnan(c).sum())} NaN"


def test_a_column_start_chosen_per_program_is_refused_at_the_call(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "per_program_start.py"
    path.write_text(PER_PROGRAM_START)
    outcomes = tilelink.spawn(_per_program_start, 2, str(path))
    assert all("cannot bound over the grid of this call" in o for o in outcomes), outcomes


@pytest.mark.parametrize("test, values, taken", [
    ("not F", {"F": tl.constexpr(False)}, True),
    ("X < 100 and F", {"X": 4, "F": tl.constexpr(True)}, True),
    ("X - 5 < 0", {"X": 4}, True),
    ("(X - 5) // 2 < 0", {"X": 4}, None),  # Triton truncates -1 // 2 to 0; Python floors it to -1
    ("(X - 5) % 2 == 1", {"X": 4}, None),  # Triton: -1; Python: 1
    ("X * X > 0", {"X": 65536}, None),  # 2**32 wraps to 0 in 32 bits
    ("tl.program_id(0) < 1", {}, None),  # differs between programs
    ("pid_m < 1", {}, None),  # a local: not a constant of the call
])
def test_a_conditional_position_takes_a_side_only_where_its_test_reads_as_triton_reads_it(test, values, taken) -> None:
    import ast

    from tilelink.overlapped import _constant_test

    assert _constant_test(ast.parse(test, mode="eval").body, values) is taken
