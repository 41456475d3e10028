"""Rows indexed by the offsets vector itself, unscaled (`x_ptr + offs`: a 1-D tensor, dim 0, whose elements are its
rows): any other term of the address moves along those rows (`+ BLOCK` is the next tile), so it is refused at the
access like a term along a named row stride, never waited for as if it read the tile."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

KERNEL = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def shift_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    {load}
    tl.store(y_ptr + offs, x + x2, mask=offs < N)
'''


def _generated(source: str):
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


@pytest.mark.parametrize("load", [
    "x2 = tl.load(x_ptr + offs + BLOCK, mask=offs + BLOCK < N, other=0.0)",
    "x2 = tl.load(x_ptr + pid + offs, mask=offs < N, other=0.0)",
    "xp = x_ptr + offs\n    x2 = tl.load(xp + 1, mask=offs + 1 < N, other=0.0)",
])
def test_a_term_beside_unscaled_rows_is_refused_at_the_access(load: str) -> None:
    with pytest.raises(AnnotationError) as info:
        _generated(KERNEL.format(load=load))
    err = info.value
    assert "along the rows of 'x_ptr'" in str(err) and err.line == 12 + load.count("\n"), err


def test_the_tile_itself_stays_followed() -> None:
    body = _generated(KERNEL.format(load="x2 = tl.load(x_ptr + offs, mask=offs < N, other=1.0)")).rewritten[
        "shift_kernel"]
    assert body.count("tll.consumer_tile_wait(") == 1, body


def _shifted(path: str) -> float:
    spec = importlib.util.spec_from_file_location("unit_stride_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 64, 16
    x = torch.randn(N, generator=torch.Generator().manual_seed(22))
    lo, hi = rows_of(rank, world, N)
    y = torch.full((N,), float("nan"))
    module.shift_kernel[(triton.cdiv(N, block),)](x[lo:hi].contiguous(), y, N, BLOCK=block)
    ref = x + torch.cat([x[block:], torch.zeros(block)])
    return float("nan") if y.isnan().any() else (y - ref).abs().max().item()


@pytest.mark.slow
def test_the_next_tile_read_with_offsets_of_its_own_equals_torch_on_the_race_exposing_schedule(tmp_path,
                                                                                                monkeypatch) -> None:
    # what the refusal asks for: the next tile's rows as an offsets vector of their own, waited for on their own
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "unit_stride_kernel.py"
    path.write_text(HEAD + textwrap.dedent(KERNEL.format(
        load="nxt = (pid + 1) * BLOCK + tl.arange(0, BLOCK)\n    x2 = tl.load(x_ptr + nxt, mask=nxt < N, other=0.0)")))
    errors = tilelink.spawn(_shifted, 2, str(path))
    assert all(e == 0.0 for e in errors), errors


def test_rows_scaled_by_a_literal_stride_keep_their_other_dims() -> None:
    body = _generated('''
        @tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
        @triton.jit
        def rows_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            cols = tl.arange(0, 64)
            x = tl.load(x_ptr + offs[:, None] * 64 + cols[None, :], mask=offs[:, None] < N, other=0.0)
            tl.store(y_ptr + offs, tl.sum(x, 1), mask=offs < N)
        ''').rewritten["rows_kernel"]
    assert body.count("tll.consumer_tile_wait(") == 1, body
