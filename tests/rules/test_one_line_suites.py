"""A store in a one-line suite (`if STORE: tl.store(...)`) is notified in its branch, as on a line of its own: the
rewrite makes the suite a block and puts the notify after the store in it. A store followed on its line by a `return`
is refused, as it is on a line of its own."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of
from tilelink.errors import AnnotationError

KERNEL = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("y_ptr"))
@triton.jit
def scaled(x_ptr, w_ptr, y_ptr, N, STORE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    w = tl.load(w_ptr + offs, mask=offs < N, other=0.0)
    {store}
'''
STORE = "tl.store(y_ptr + offs, x * w, mask=offs < N)"


def written(tmp_path, store: str) -> str:
    path = tmp_path / f"scaled_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(KERNEL.format(store=store))
    return str(path)


def test_a_store_in_a_one_line_suite_is_notified_in_its_branch(tmp_path) -> None:
    built = tilelink.build(written(tmp_path, f"if STORE: {STORE}"))
    text = built.rewritten["scaled"]
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "tl.store(y_ptr" in line)
    assert lines[at - 1].strip() == "if STORE:" and lines[at].startswith(" " * 8), text
    assert lines[at + 1].startswith(" " * 8 + "# tilelink: notify"), text
    assert any("in a branch of the `if` at line 13" in e.message for e in built.report.entries), built.report


def test_a_store_followed_by_a_return_on_its_line_is_refused(tmp_path) -> None:
    with pytest.raises(AnnotationError, match="followed on its line by a `return`"):
        tilelink.build(written(tmp_path, f"if STORE: {STORE}; return"))


def _run(path: str) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    N = 77
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(N, generator=g) for _ in range(world)]
    w = torch.randn(N, generator=g)
    lo, hi = rows_of(rank, world, N)
    error = 0.0
    for _ in range(2):
        y = torch.full((hi - lo,), float("nan"))
        module_at(path).scaled[(triton.cdiv(N, 32),)](xs[rank], w, y, N, STORE=True, BLOCK=32)
        error = max(error, (y - sum(x * w for x in xs)[lo:hi]).abs().max().item() if hi > lo else 0.0)
    return error


@pytest.mark.slow
def test_a_one_line_suite_store_equals_torch_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    errors = tilelink.spawn(_run, 2, written(tmp_path, f"if STORE: {STORE}"))
    assert max(errors) < 1e-5, errors
