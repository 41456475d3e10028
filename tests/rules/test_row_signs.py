"""The tile= proofs take every name as non-negative; the launch refuses a call that passes a negative int to a
parameter a proof read (here a chunk's first rows skipped, `SKIP`: at -1 each chunk's loads start one row before the
tile its wait covers), naming the argument and the load, and runs the same call form with a non-negative value."""

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

SKIPPING = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("x_ptr", dim=1, tile=("s_lo", "s_hi - s_lo"), size="S"), via="copy_engine")
    @triton.jit
    def skipped_col_sum(x_ptr, y_ptr, S, D, CHUNK, SKIP, stride_xb, stride_xs, BLOCK_S: tl.constexpr,
                        BLOCK_D: tl.constexpr):
        # the column sums of each chunk of the sequence past its first SKIP rows
        b = tl.program_id(0)
        offs_d = tl.arange(0, BLOCK_D)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for c in range(0, tl.cdiv(S, CHUNK)):
            s_lo = c * CHUNK
            s_hi = tl.minimum(s_lo + CHUNK, S)
            for start in range(s_lo + SKIP, s_hi, BLOCK_S):
                rows = start + tl.arange(0, BLOCK_S)
                x = tl.load(x_ptr + b * stride_xb + rows[:, None] * stride_xs + offs_d[None, :],
                            mask=(rows[:, None] < s_hi) & (offs_d[None, :] < D), other=0.0)
                acc += tl.sum(x.to(tl.float32), 0)
        tl.store(y_ptr + b * D + offs_d, acc, mask=offs_d < D)
''')
LOAD_LINE = next(i for i, line in enumerate(SKIPPING.splitlines(), 1) if "x = tl.load(" in line)


def _written(tmp_path) -> str:
    path = tmp_path / "skipped_col_sum.py"
    path.write_text(SKIPPING)
    return str(path)


def _kernel(path: str):
    spec = importlib.util.spec_from_file_location("skipped_col_sum", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.skipped_col_sum


def _args(skip: int) -> dict:
    x = torch.zeros(2, 6, 4)
    return dict(x_ptr=x, y_ptr=torch.zeros(2, 4), S=12, D=4, CHUNK=4, SKIP=skip, stride_xb=12 * 4, stride_xs=4,
                BLOCK_S=2, BLOCK_D=4)


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


def test_the_proof_names_the_parameters_it_takes_as_non_negative() -> None:
    generated = generate(SKIPPING, "skipped_col_sum.py", requests_in(SKIPPING, "skipped_col_sum.py"))
    signs = generated.plans[0].launch.row_signs
    assert ("SKIP", LOAD_LINE) in signs and ("CHUNK", LOAD_LINE) in signs, signs
    assert not any(name in ("x_ptr", "b", "s_lo", "start") for name, _ in signs), signs


def test_a_negative_argument_the_proof_read_is_refused_at_the_launch(tmp_path) -> None:
    kernel = _kernel(_written(tmp_path))
    two = _Launcher(2)
    kernel._check_row_scales(_args(1), two)
    for _ in range(2):  # refused every time, also after a good call of the same shapes
        with pytest.raises(LaunchError) as info:
            kernel._check_row_scales(_args(-1), two)
        said = str(info.value)
        assert said.startswith("skipped_col_sum: argument 'SKIP' is -1, but the rows the load at "), said
        assert f"skipped_col_sum.py:{LOAD_LINE} reads were proven to be those its wait covers with SKIP taken as " \
            "non-negative" in said, said
        assert "pass a non-negative SKIP" in said, said
    kernel._check_row_scales(_args(0), two)
    kernel._check_row_scales(_args(-1), _Launcher(1))  # alone, the kernel runs on the caller's tensor as written


def _skipped(path: str, skip: int) -> float:
    kernel = _kernel(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    B, S, D, CHUNK = 2, 12, 4, 4
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(7))
    lo, hi = rows_of(rank, world, S)
    device = current_world().device
    shard = x[:, lo:hi].contiguous().to(device)
    y = torch.full((B, D), float("nan"), device=device)
    kernel[(B,)](shard, y, S, D, CHUNK, skip, S * D, D, BLOCK_S=2, BLOCK_D=4)
    keep = torch.tensor([s % CHUNK >= skip for s in range(S)])
    return (y.cpu() - x[:, keep].sum(1)).abs().max().item()


@pytest.mark.slow
def test_a_negative_skip_is_refused_and_a_positive_one_equals_torch_at_two_ranks(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path)
    assert all(e < 1e-5 for e in tilelink.spawn(_skipped, 2, path, 1))
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_skipped, 2, path, -1)
    assert "argument 'SKIP' is -1" in str(info.value), info.value


# one sequence's rows gathered along dim 1, past the first SKIP of each chunk, each read at its first element: the only
# row facts are the signs its tile= proof takes (no batch step, no row scale, no columns)
SIGNS_ONLY = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("x_ptr", dim=1, tile=("s_lo", "s_hi - s_lo"), size="S"), via="copy_engine")
    @triton.jit
    def skipped_seq_sum(x_ptr, y_ptr, S, CHUNK, SKIP, stride_xs, BLOCK_S: tl.constexpr):
        acc = tl.zeros([BLOCK_S], dtype=tl.float32)
        for c in range(0, tl.cdiv(S, CHUNK)):
            s_lo = c * CHUNK
            s_hi = tl.minimum(s_lo + CHUNK, S)
            for start in range(s_lo + SKIP, s_hi, BLOCK_S):
                rows = start + tl.arange(0, BLOCK_S)
                x = tl.load(x_ptr + rows * stride_xs, mask=rows < s_hi, other=0.0)
                acc += x.to(tl.float32)
        tl.store(y_ptr + tl.arange(0, BLOCK_S), acc)
''')


def test_a_kernel_whose_only_row_facts_are_signs_checks_a_form_of_call_once(tmp_path) -> None:
    path = tmp_path / "skipped_seq_sum.py"
    path.write_text(SIGNS_ONLY)
    spec = importlib.util.spec_from_file_location("skipped_seq_sum", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = module.skipped_seq_sum
    launch = kernel.plan.launch
    assert launch.row_signs and not (launch.row_scales or launch.row_shifts or launch.row_steps
                                     or launch.row_bounds), launch
    args = dict(x_ptr=torch.zeros(1, 6, 4), y_ptr=torch.zeros(2), S=12, CHUNK=4, SKIP=1, stride_xs=4, BLOCK_S=2)
    two = _Launcher(2)
    for _ in range(3):
        kernel._check_row_scales(args, two)
    assert len(kernel._signs_passed) == 1, kernel._signs_passed
    with pytest.raises(LaunchError, match="argument 'CHUNK' is -4"):
        kernel._check_row_scales({**args, "CHUNK": -4}, two)
    assert len(kernel._signs_passed) == 1, kernel._signs_passed
