"""An address whose rows lie along an inner dim keeps its other terms off those rows: on a contiguous (B, S, D) tensor
gathered along S, `+ D` (an element offset no stride scales) is the next row along S, and a batch step `b * stride_xb`
moves along S unless the stride is the full tensor's. The launch evaluates both with the call's arguments and the
gathered buffer's shape, and refuses what would touch rows the wait does not cover; a computed term that no stride
parameter scales cannot be attributed to a dim and is refused at build."""

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
from tilelink.errors import AnnotationError, LaunchError
from tilelink.runtime import current_world

SHIFTED = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("x_ptr", dim=1, tile=("s0", "BLOCK_S"), size="S"), via="copy_engine")
    @triton.jit
    def tail_sum(x_ptr, y_ptr, S, D, SHIFT, stride_xb, stride_xs, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
        # the sums of each row's last D - SHIFT values, a row of S per offset
        s0 = tl.program_id(0) * BLOCK_S
        b = tl.program_id(1)
        offs_s = s0 + tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        x = tl.load(x_ptr + b * stride_xb + offs_s[:, None] * stride_xs + offs_d[None, :] + SHIFT,
                    mask=(offs_s[:, None] < S) & (offs_d[None, :] < D - SHIFT), other=0.0)
        tl.store(y_ptr + b * S + offs_s, tl.sum(x, 1), mask=offs_s < S)
''')
LOAD_LINE = next(i for i, line in enumerate(SHIFTED.splitlines(), 1) if "x = tl.load(" in line)


def _plan(text: str):
    return generate(text, "tail_sum.py", requests_in(text, "tail_sum.py")).plans[0].launch


def _written(tmp_path) -> str:
    path = tmp_path / "tail_sum.py"
    path.write_text(SHIFTED)
    return str(path)


def _kernel(path: str):
    spec = importlib.util.spec_from_file_location("tail_sum", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tail_sum


class _Launcher:
    """What the row check asks of a launcher: the world and the full size along the rows."""

    def world(self):
        return SimpleNamespace(world_size=2)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound

    def size_of(self, bound: dict, grid=None) -> int:
        return bound["S"]


def _args(shift: int, stride_xb: int = 12 * 4) -> dict:
    return dict(x_ptr=torch.zeros(2, 6, 4), y_ptr=torch.zeros(2, 12), S=12, D=4, SHIFT=shift, stride_xb=stride_xb,
                stride_xs=4, BLOCK_S=4, BLOCK_D=4)


def test_the_terms_off_the_rows_stride_are_kept_for_the_launch() -> None:
    plan = _plan(SHIFTED)
    # the columns' last element the mask lets through (SHIFT + D - SHIFT - 1), and their first
    assert plan.row_shifts == (
        ("x_ptr", ((False, ("SHIFT",)), (False, ("D",)), (True, ("SHIFT",)), (True, ("1",))), LOAD_LINE),
        ("x_ptr", ((False, ("SHIFT",)),), LOAD_LINE)), plan.row_shifts
    assert plan.row_steps == (("x_ptr", ("stride_xb",), "(tl.program_id(1))", LOAD_LINE),), plan.row_steps


def test_a_shift_along_the_gathered_dim_is_refused_at_the_launch(tmp_path) -> None:
    kernel = _kernel(_written(tmp_path))
    kernel._check_row_scales(_args(1), _Launcher())  # within a row: the last three values
    for shift, rows in ((4, 1), (9, 2)):
        with pytest.raises(LaunchError) as info:
            kernel._check_row_scales(_args(shift), _Launcher())
        said = str(info.value)
        assert said.startswith("tail_sum: the address at "), said
        assert f"tail_sum.py:{LOAD_LINE} adds {shift} elements (SHIFT={shift}) to 'x_ptr'" in said, said
        assert f"moves it {rows} row{'s' if rows > 1 else ''} along dim 1" in said, said
        assert "the full 12 rows along dim 1 of 4 elements each" in said, said


def test_a_batch_stride_other_than_the_full_tensors_is_refused_at_the_launch(tmp_path) -> None:
    kernel = _kernel(_written(tmp_path))
    kernel._check_row_scales(_args(0, stride_xb=12 * 4 * 3), _Launcher())  # every third batch of a larger tensor
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(_args(0, stride_xb=6 * 4), _Launcher())  # the shard's stride
    said = str(info.value)
    assert f"tail_sum.py:{LOAD_LINE} adds a value the kernel computes times stride_xb=24 (24 elements)" in said, said
    assert "pass the full tensor's stride of dim 0 (48 here)" in said, said


def test_a_computed_term_no_stride_scales_is_refused_at_build() -> None:
    with pytest.raises(AnnotationError) as info:
        _plan(SHIFTED.replace("x_ptr + b * stride_xb + ", "x_ptr + b + "))
    err = info.value
    assert err.line == LOAD_LINE, err
    assert "adds `tl.program_id(1)` to 'x_ptr', a value the kernel computes that no stride parameter scales" \
        in str(err), err
    assert "scale it by the stride of the dim it steps along" in err.hint, err.hint


def _tail_sums(path: str, shift: int, stride_xb: int | None = None) -> float:
    kernel = _kernel(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    B, S, D = 2, 12, 4
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(3))
    lo, hi = rows_of(rank, world, S)
    device = current_world().device
    shard = x[:, lo:hi].contiguous().to(device)
    y = torch.full((B, S), float("nan"), device=device)
    kernel[(S // 4, B)](shard, y, S, D, shift, S * D if stride_xb is None else stride_xb, D, BLOCK_S=4, BLOCK_D=4)
    return (y.cpu() - x[:, :, shift:].sum(2)).abs().max().item()


@pytest.mark.slow
def test_the_shifts_are_checked_at_two_ranks_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path)
    assert all(e < 1e-5 for e in tilelink.spawn(_tail_sums, 2, path, 1))
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_tail_sums, 2, path, 4)
    assert "moves it 1 row along dim 1" in str(info.value), info.value
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_tail_sums, 2, path, 1, 6 * 4)
    assert "stride_xb=24" in str(info.value), info.value
