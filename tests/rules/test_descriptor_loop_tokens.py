"""A descriptor load whose row offset is the target of the loop around its wait (`for start in range(lo, hi, BLOCK)`:
`desc.load([start, 0])`) has the target carry the wait's token, as a start the kernel binds itself does: nothing else
orders the load after this iteration's wait (a pipelined loop may issue a later iteration's load while an earlier one
runs). The rewritten kernel equals torch on the race-exposing schedule and compiles for sm_90 with its bulk copy."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.runtime import current_world

ROOT = Path(__file__).resolve().parents[2]
FORM = Path(__file__).parent / "forms" / "descriptor_block_sums.py"


def _generated():
    text = FORM.read_text()
    return generate(text, str(FORM), requests_in(text, str(FORM)))


def test_the_loop_target_a_descriptor_load_reads_carries_the_token() -> None:
    generated = _generated()
    lines = [line.strip() for line in generated.rewritten["block_sums"].splitlines()]
    wait = next(i for i, line in enumerate(lines) if line.startswith("tlk_token = tll.consumer_tile_wait("))
    assert lines[wait + 2] == "start = start + tlk_token", lines[wait:wait + 4]  # after the call's second line
    assert lines[wait + 3] == "acc += desc.load([start, 0])", lines[wait:wait + 4]
    assert not [e for e in generated.report.entries if "no token carried" in str(e)]


def _sums(path: str) -> float:
    spec = importlib.util.spec_from_file_location("descriptor_block_sums_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    M, D = 24, 8
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(8))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    if device.type == "cuda":  # the descriptor's scratch memory
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    y = torch.full((M, D), float("nan"), device=device)
    module.block_sums[(M // 4,)](x[lo:hi].contiguous().to(device), y, M, D, D, SPAN=8, BLOCK_M=4, BLOCK_D=D)
    padded = torch.cat([x, torch.zeros(4, D)])
    want = padded[:M] + padded[4:M + 4]
    got = y.cpu()
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


@pytest.mark.slow
def test_block_sums_equal_torch_on_the_race_exposing_schedule(monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert all(e < 1e-5 for e in tilelink.spawn(_sums, 2, str(FORM)))


COMPILE = '''
import importlib.util, sys, tempfile
from pathlib import Path
from tests.rules.compile_rewritten import compile_ptx
from tests.rules.test_descriptor_loop_tokens import _generated
path = Path(tempfile.mkdtemp()) / "descriptor_block_sums_rewritten.py"
path.write_text(_generated().text)
spec = importlib.util.spec_from_file_location("descriptor_block_sums_rewritten", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
ptx = compile_ptx(module.block_sums, {"x_ptr": "*fp16", "y_ptr": "*fp32", "tlk_barriers": "*i64", "tlk_diag": "*i64",
                                      "tlk_budget": "i64"}, {"SPAN": 128, "BLOCK_M": 64, "BLOCK_D": 64})
print(ptx.count("cp.async.bulk.tensor"))
'''


@pytest.mark.slow
def test_the_rebound_loop_target_compiles_for_sm90_with_its_bulk_copy() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600,
                            cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert int(result.stdout.split()[-1]) >= 1, result.stdout
