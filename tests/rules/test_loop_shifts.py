"""A scalar term along dim 0 that a loop variable makes (`+ j` for `j in range(SPAN - 1, -1, -1)`, through an alias
bound in the loop) is checked at the launch at both ends of the loop's range: `SPAN` past the row's length reads the
next row at its last step and is refused, naming the load; within the row the kernel runs and equals torch. Counting
from 0 by 1 beside columns masked by what is left of the row (`cols[None, :] < D - j`), the mask stops the walk: its
bound `D` is what the launch checks, and a `SPAN` past the row runs and equals torch."""

from __future__ import annotations

import importlib.util
import textwrap
from types import SimpleNamespace

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

WINDOWS = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("x_ptr", size="M"))
    @triton.jit
    def window_sum(x_ptr, y_ptr, M, D, SPAN, stride_xm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        # y[m, d] = the sum of x[m, d + j] over the SPAN values of j that stay in the row
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for j in range(0, SPAN):
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] + j,
                        mask=(offs_m[:, None] < M) & (cols[None, :] < D - j), other=0.0)
            acc += x
        tl.store(y_ptr + offs_m[:, None] * BLOCK_D + cols[None, :], acc, mask=offs_m[:, None] < M)
''')
# the same term through an alias bound in the loop, the range counting down from SPAN - 1
ALIASED = WINDOWS.replace(
    "    for j in range(0, SPAN):\n        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] + j,",
    "    for j in range(SPAN - 1, -1, -1):\n        row = x_ptr + j\n"
    "        x = tl.load(row + offs_m[:, None] * stride_xm + cols[None, :],")
assert ALIASED != WINDOWS
LOAD_LINE = next(i for i, line in enumerate(WINDOWS.splitlines(), 1) if "x = tl.load(" in line)
M, D = 12, 4


def _written(tmp_path, source: str, name: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return str(path)


def _kernel(path: str):
    spec = importlib.util.spec_from_file_location(f"window_sum_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.window_sum


class _Launcher:
    """What the row check asks of a launcher: the world it launches on."""

    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound


def _args(span: int) -> dict:
    return dict(x_ptr=torch.zeros(M // 2, D), y_ptr=torch.zeros(M, D), M=M, D=D, SPAN=span, stride_xm=D,
                BLOCK_M=4, BLOCK_D=D)


def test_the_loop_variables_term_is_kept_at_both_ends_of_its_range() -> None:
    plan = generate(WINDOWS, "window_sum.py", requests_in(WINDOWS, "window_sum.py")).plans[0].launch
    # counting from 0 beside the mask `cols[None, :] < D - j`: the mask's bound, not the loop's ends
    assert plan.row_bounds == (("x_ptr", ((False, ("D",)),), "1", LOAD_LINE),) and not plan.row_shifts, plan
    aliased = generate(ALIASED, "window_sum.py", requests_in(ALIASED, "window_sum.py")).plans[0].launch
    # from SPAN - 1 down to 0, the stop -1 plus one
    assert set(aliased.row_shifts) == {("x_ptr", ((False, ("SPAN",)), (True, ("1",))), LOAD_LINE + 1),
                                       ("x_ptr", ((False, ("1",)), (True, ("1",))), LOAD_LINE + 1)}, \
        aliased.row_shifts


def test_a_loop_running_past_the_row_is_refused_at_the_launch(tmp_path) -> None:
    kernel = _kernel(_written(tmp_path, ALIASED, "window_sum"))
    for span in (1, D):
        kernel._check_row_scales(_args(span), _Launcher())
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_args(D + 1), _Launcher())
    said = str(info.value)
    assert f"window_sum.py:{LOAD_LINE + 1} adds {D} elements" in said and "SPAN=5" in said, said
    assert "to the rows of 'x_ptr', whose rows are 4 elements long" in said, said


def test_a_walk_the_mask_stops_is_bounded_by_the_mask(tmp_path) -> None:
    """Past the row, the mask stops the steps of the loop counting from 0: a longer loop passes, a mask bound past
    the row does not."""
    kernel = _kernel(_written(tmp_path, WINDOWS, "window_sum"))
    for span in (1, D, D + 1, 3 * D):
        kernel._check_row_scales(_args(span), _Launcher())
    past = _kernel(_written(tmp_path, WINDOWS.replace("cols[None, :] < D - j", "cols[None, :] < D + 1 - j"),
                            "window_sum_past"))
    with pytest.raises(LaunchError, match="up to the mask's bound D=4 \\+ 1 = 5"):
        past._check_row_scales(_args(1), _Launcher())


def _windows(path: str, span: int) -> float:
    kernel = _kernel(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(5))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((M, D), float("nan"), device=device)
    kernel[(M // 4,)](x[lo:hi].contiguous().to(device), y, M, D, span, D, BLOCK_M=4, BLOCK_D=D)
    want = sum(torch.nn.functional.pad(x[:, j:], (0, j)) for j in range(span))
    return (y.cpu() - want).abs().max().item()


@pytest.mark.slow
def test_the_loops_within_the_row_equal_torch_and_one_past_it_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path, ALIASED, "window_sum_aliased")
    assert all(e < 1e-5 for e in tilelink.spawn(_windows, 2, path, 3))
    with pytest.raises(LaunchError, match="SPAN=5"):
        tilelink.spawn(_windows, 2, path, D + 1)
    # counting from 0, the mask stops the steps past the row
    assert all(e < 1e-5 for e in tilelink.spawn(_windows, 2, _written(tmp_path, WINDOWS, "window_sum"), D + 1))
