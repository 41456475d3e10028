"""The tile-order rotation gives each program another tile by rotating the variable its rows start from (`pid`). A
kernel that also reads its position directly, for rows of its own (`o = tl.program_id(0) * BLOCK + ...`) or in an
address (`tl.store(sum_ptr + pid, ...)` with `pid_m = pid`), would then write one tile's values at another tile's
rows: the rotation is not applied there (the report says why), and the kernel keeps its own order."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.runtime import current_world

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

# the gathered rows doubled, written at rows the kernel computes from the program id itself
OWN_ROWS = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def double_kernel(x_ptr, y_ptr, sum_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + o, 2 * x, mask=o < N)
'''

# each tile's sum, at the program's own index
OWN_INDEX = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def double_kernel(x_ptr, y_ptr, sum_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    pid_m = pid
    offs = pid_m * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, 2 * x, mask=offs < N)
    tl.store(sum_ptr + pid, tl.sum(x))
'''

FORMS = {"own_rows": OWN_ROWS, "own_index": OWN_INDEX}


def _report(source: str) -> list[str]:
    text = HEAD + textwrap.dedent(source)
    return [str(e) for e in generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).report.entries
            if "order" in e.message]


@pytest.mark.parametrize("form, says", [
    ("own_rows", "the offsets `o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)` start from the program id"),
    ("own_index", "reads the program id (`tl.store(sum_ptr + pid, tl.sum(x))`)"),
])
def test_a_kernel_reading_its_position_other_than_through_the_rotated_variable_keeps_its_order(form: str,
                                                                                             says: str) -> None:
    (entry,) = _report(FORMS[form])
    assert entry.startswith("[not applied]") and says in entry, entry


def test_a_kernel_reading_its_position_through_the_rotated_variable_only_is_rotated() -> None:
    (entry,) = _report(OWN_INDEX.replace("tl.store(sum_ptr + pid, tl.sum(x))", "tl.store(sum_ptr + pid_m, tl.sum(x))"))
    assert entry.startswith("[applied]") and "pid_m rotated" in entry, entry


def _double(path: str, form: str) -> float:
    spec = importlib.util.spec_from_file_location(f"bypass_{form}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 48, 8
    x = torch.randn(N, generator=torch.Generator().manual_seed(8))
    lo, hi = rows_of(rank, world, N)
    device = current_world().device
    y, sums = (torch.full((n,), float("nan"), device=device) for n in (N, N // block))
    module.double_kernel[(N // block,)](x[lo:hi].contiguous().to(device), y, sums, N, BLOCK=block)
    y, sums = y.cpu(), sums.cpu()
    got = torch.cat([y - 2 * x, sums - x.view(-1, block).sum(dim=1)]) if form == "own_index" else y - 2 * x
    return float("inf") if got.isnan().any() else got.abs().max().item()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_kernels_reading_their_position_equal_torch_on_the_race_exposing_schedule(form: str, world: int, tmp_path,
                                                                                  monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"bypass_{form}.py"
    path.write_text(HEAD + textwrap.dedent(FORMS[form]))
    errors = tilelink.spawn(_double, world, str(path), form)
    assert all(e < 1e-5 for e in errors), errors
