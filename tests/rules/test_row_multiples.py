"""A tile= proof may take a divisibility fact: blocks of BLOCK_S rows stepping from a chunk's first row, read through a
descriptor over every row, end inside the chunk only when CHUNK % BLOCK_S == 0. The fact is carried in the launch plan
with the compile-time branch the load is in (EVEN), and each call with more than one rank that takes the branch checks
it, under each autotuning configuration; a loop that starts off the chunk's first row is refused at build."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError
from tilelink.runtime import current_world

FORM = Path(__file__).parent / "forms" / "chunked_rows_whole_descriptor.py"
NAME = "chunked_col_sum_whole"


def _line_of(text: str, what: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if what in line)


def _generate(text: str):
    return generate(text, str(FORM), requests_in(text, str(FORM)))


def _written(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"{NAME}.py"
    path.write_text(text)
    return str(path)


def _load(path: str):
    spec = importlib.util.spec_from_file_location(f"form_{NAME}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, NAME)


class _Launcher:
    """What the row check asks of a launcher: the world it launches on and the full size along the rows."""

    def __init__(self, world_size: int) -> None:
        self.size = world_size

    def world(self):
        return SimpleNamespace(world_size=self.size)

    def as_launched(self, bound: dict, grid) -> dict:  # the call's tensors are the buffers the kernel is given
        return bound

    def size_of(self, bound: dict, grid=None) -> int:
        return bound["S"]


def _args(chunk: int, even: bool, **more) -> dict:
    B, S, D = 2, 40, 4
    return dict(x_ptr=torch.zeros(B, S // 2, D), y_ptr=torch.zeros(B, D), S=S, END=37, D=D, CHUNK=chunk,
                stride_xb=S * D, stride_xs=D, BLOCK_S=8, BLOCK_D=D, EVEN=even, **more)


# -- quick: what the proof takes, what it refuses


def test_the_plan_carries_the_fact_under_the_branch_that_needs_it() -> None:
    text = FORM.read_text()
    generated = _generate(text)
    launch = generated.plans[0].launch
    # only the whole descriptor's load needs it: the descriptor per chunk ends at the chunk's last row
    assert launch.row_multiples == ((("CHUNK",), "BLOCK_S", "(EVEN)", _line_of(text, "x = whole.load(")),), launch
    body = generated.rewritten[NAME]
    assert body.count("tll.consumer_tile_wait(") == 1, body
    # one wait per chunk, before the loop over its blocks
    assert body.index("tll.consumer_tile_wait(") < body.index("for start in range(s_lo, s_hi, BLOCK_S):"), body


@pytest.mark.parametrize(("old", "new"), [
    ("range(s_lo, s_hi, BLOCK_S)", "range(s_lo + 1, s_hi, BLOCK_S)"),  # a row past the chunk's first
    ("range(s_lo, s_hi, BLOCK_S)", "range(s_lo + BLOCK_S + 1, s_hi, BLOCK_S)"),
    ("whole.load([start, 0])", "whole.load([start + 1, 0])"),
    ("block_shape=[BLOCK_S, BLOCK_D])\n    for c", "block_shape=[2 * BLOCK_S, BLOCK_D])\n    for c"),  # wider blocks
])
def test_a_block_that_may_run_past_the_chunk_is_refused_at_build(old: str, new: str) -> None:
    text = FORM.read_text()
    assert old in text, old
    with pytest.raises(AnnotationError) as info:
        _generate(text.replace(old, new))
    err = info.value
    assert err.line == _line_of(text, "x = whole.load("), err
    assert "of the descriptor's rows [0, S), which may run past the tile's end; tile=('s_lo', 'CHUNK')" in str(err), err


def test_a_chunk_end_bounded_past_the_chunk_is_refused_at_build() -> None:
    text = FORM.read_text().replace("tl.minimum(s_lo + CHUNK, END)", "tl.minimum(s_lo + CHUNK + BLOCK_S, END)")
    with pytest.raises(AnnotationError, match="which may run past the tile's end"):
        _generate(text)


def test_a_loop_started_a_parameter_later_takes_its_fact_too() -> None:
    # range(s_lo + SKIP, ...) keeps the blocks in the chunk when CHUNK - SKIP is a multiple of the step: the proof
    # takes both facts (a sum of multiples is one), and the sign of SKIP
    text = FORM.read_text().replace("range(s_lo, s_hi, BLOCK_S)", "range(s_lo + SKIP, s_hi, BLOCK_S)").replace(
        "CHUNK, stride_xb", "CHUNK, SKIP, stride_xb")
    launch = _generate(text).plans[0].launch
    line = _line_of(text, "x = whole.load(")
    assert set(launch.row_multiples) == {(("CHUNK",), "BLOCK_S", "(EVEN)", line),
                                         (("SKIP",), "BLOCK_S", "(EVEN)", line)}, launch.row_multiples
    assert ("SKIP", line) in launch.row_signs, launch.row_signs


def test_the_call_is_refused_where_the_chunk_is_no_whole_number_of_blocks(tmp_path) -> None:
    kernel = _load(_written(tmp_path, FORM.read_text()))
    two = _Launcher(2)
    kernel._check_row_scales(_args(16, True), two)
    kernel._check_row_scales(_args(12, False), two)  # the descriptor per chunk: no fact to check
    kernel._check_row_scales(_args(12, True), _Launcher(1))  # alone, the kernel reads the caller's whole tensor
    for _ in range(2):  # refused every time, also after a good call
        with pytest.raises(LaunchError) as info:
            kernel._check_row_scales(_args(12, True), two)
        said = str(info.value)
        line = _line_of(FORM.read_text(), "x = whole.load(")
        assert said.startswith(f"{NAME}: the load at "), said
        assert f"{NAME}.py:{line} reads rows its wait covers only with CHUNK a multiple of " \
               "BLOCK_S (the load is compiled where `(EVEN)` holds, as it does here)" in said, said
        assert "here CHUNK=12 and BLOCK_S=8, so its last block can read past them" in said, said
        assert "pass arguments that make CHUNK a multiple of BLOCK_S, or ones under which `(EVEN)` does not hold" \
            in said, said


def test_the_fact_is_checked_under_each_autotuning_configuration(tmp_path) -> None:
    text = FORM.read_text().replace(
        "@triton.jit", '@triton.autotune(configs=[triton.Config({"BLOCK_S": 4}), triton.Config({"BLOCK_S": 8})], '
        'key=["D"])\n@triton.jit')
    kernel = _load(_written(tmp_path, text))
    two = _Launcher(2)
    args = {k: v for k, v in _args(12, True).items() if k != "BLOCK_S"}
    with pytest.raises(LaunchError) as info:
        kernel._check_row_scales(args, two)
    assert "BLOCK_S=8 under the autotuning configuration BLOCK_S=8" in str(info.value), info.value
    kernel._check_row_scales({**args, "CHUNK": 16}, two)


# -- slow: on the race-exposing schedule


def _col_sums(path: str, chunk: int, even: bool) -> float:
    """Column sums of the first END rows of a (B, S, D) tensor whose rows [lo, hi) of S each rank holds, read in
    chunks of ``chunk`` rows (not a rank's shard: a chunk may span two ranks)."""
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = _load(path)
    B, S, END, D = 2, 40, 37, 4
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(5))
    device = current_world().device
    if device.type == "cuda":
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
        x, D = torch.nn.functional.pad(x, (0, 12)).half(), 16  # a descriptor's rows are 16-byte multiples
    lo, hi = rows_of(rank, world, S)
    shard = x[:, lo:hi].contiguous().to(device)
    err = 0.0
    for _ in range(2):  # the second call runs at epoch 2
        y = torch.full((B, D), float("nan"), device=device)
        kernel[(B,)](shard, y, S, END, D, chunk, S * D, D, BLOCK_S=8, BLOCK_D=D, EVEN=even)
        want = x[:, :END].float().sum(1)
        err = max(err, (y.float().cpu() - want).abs().max().item(), float("nan") if y.isnan().any() else 0.0)
    return err


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_both_branches_equal_torch_and_a_broken_fact_is_refused(world: int, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path, FORM.read_text())
    # chunks of 16 in blocks of 8 through the whole descriptor: the last chunk's block reads rows 37-39, past END
    # but in the chunk its wait covers; chunks of 12 through a descriptor each
    for chunk, even in ((16, True), (12, False)):
        errors = tilelink.spawn(_col_sums, world, path, chunk, even)
        assert all(e < 1e-4 for e in errors), (chunk, even, errors)
    with pytest.raises(LaunchError, match="CHUNK a multiple of BLOCK_S"):
        tilelink.spawn(_col_sums, world, path, 12, True)
