"""The factors of a step an access takes are read as moving it forward: a batch step `b * stride_xb` along an inner
dim (a whole step of the dims before the rows) and the advance of the matmul form (`x_ptrs += STEP * stride_xd` under
`offs_d[None, :] < D - j * STEP`). A negative factor moves the access back, before the rows the launch bounds: the
batch step before the gathered buffer, the advance into the end of the row before, whose rows no wait covers (NaN on
the race-exposing schedule at the first row of a rank's own tile). Each call with more than one rank refuses a
negative one, naming the argument and the access."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tilelink
from tests.rules import test_inner_dim_shifts as inner
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

# the matmul form stepping by a parameter of its own, the mask shrinking by the same step
STEPPED = (Path(__file__).parent / "forms" / "window_strip_sum.py").read_text().replace(
    "x_ptrs += BLOCK_D * stride_xd", "x_ptrs += STEP * stride_xd").replace("D - j * BLOCK_D", "D - j * STEP").replace(
    "NSTEP, stride_xm", "NSTEP, STEP, stride_xm")
LOAD_LINE = next(i for i, line in enumerate(STEPPED.splitlines(), 1) if "acc += tl.load(" in line)
M, D, BLOCK_D = 16, 8, 4


def _plan(source: str, name: str):
    return generate(source, name, requests_in(source, name)).plans[0].launch


def test_the_factors_of_a_step_are_sign_facts() -> None:
    assert ("stride_xb", inner.LOAD_LINE) in _plan(inner.SHIFTED, "tail_sum.py").row_signs
    assert ("STEP", LOAD_LINE) in _plan(STEPPED, "window_strip_sum.py").row_signs


class _Launcher:
    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound

    def size_of(self, bound: dict, grid=None) -> int:
        return bound["S"]


def test_a_batch_step_backwards_is_refused_at_the_launch(tmp_path) -> None:
    # -S * D is a whole step of the gathered buffer, backwards: batch 1 reads before the buffer
    kernel = inner._kernel(inner._written(tmp_path))
    kernel._check_row_scales(inner._args(0, stride_xb=12 * 4), _Launcher())
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(inner._args(0, stride_xb=-12 * 4), _Launcher())
    said = str(info.value)
    assert said.startswith("tail_sum: argument 'stride_xb' is -48, but the rows the load at "), said
    assert f"tail_sum.py:{inner.LOAD_LINE} reads were proven to be those its wait covers with stride_xb taken as " \
           "non-negative" in said and "pass a non-negative stride_xb" in said, said


def _write(tmp_path) -> str:
    path = tmp_path / "window_strip_sum.py"
    path.write_text(STEPPED)
    return str(path)


def _stepped(path: str, step: int, nstep: int) -> float:
    spec = importlib.util.spec_from_file_location(f"window_strip_sum_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(3))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((M, BLOCK_D), float("nan"), device=device)
    module.window_strip_sum[(M // 4,)](x[lo:hi].contiguous().to(device), y, M, D, 0, nstep, step, D, 1, BLOCK_M=4,
                                       BLOCK_D=BLOCK_D)
    # the columns c + j * step of each row (masked past D), through the flat tensor: a step back reads the row before
    flat = torch.cat([torch.zeros(D), x.flatten(), torch.zeros(D + nstep * abs(step))])
    cols = torch.arange(BLOCK_D)
    want = sum(torch.where(cols + j * step < D, flat[D + torch.arange(M)[:, None] * D + j * step + cols], 0.0)
               for j in range(nstep))
    got = y.cpu()
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


def test_an_advance_backwards_is_refused_at_the_launch(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("window_strip_sum_stepped", _write(tmp_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = dict(x_ptr=torch.zeros(M // 2, D), y_ptr=torch.zeros(M, BLOCK_D), M=M, D=D, OFF=0, NSTEP=2,
                stride_xm=D, stride_xd=1, BLOCK_M=4, BLOCK_D=BLOCK_D)
    module.window_strip_sum._check_row_scales(args | {"STEP": BLOCK_D}, _Launcher())
    with pytest.raises(LaunchError, match="argument 'STEP' is -4, but the rows the load at .* taken as non-negative"):
        module.window_strip_sum._check_row_scales(args | {"STEP": -BLOCK_D}, _Launcher())


@pytest.mark.slow
def test_an_advance_backwards_is_refused_at_two_ranks_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _write(tmp_path)
    assert all(e < 1e-5 for e in tilelink.spawn(_stepped, 2, path, BLOCK_D, 2))
    # a block back on the second step: the first row of a rank's own tile reads its peer's last row
    with pytest.raises(LaunchError, match="argument 'STEP' is -4"):
        tilelink.spawn(_stepped, 2, path, -BLOCK_D, 2)
