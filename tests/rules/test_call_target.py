"""The call's barrier target in a rewritten kernel: read once, before anything else in the kernel's body
(``tlk_target = tll.call_target(tlk_epoch, tlk_diag)``), and taken as it is by every wait (``scaled=True``); with it,
one read of every channel (``tlk_ready = tll.channels_ready(...)``) that every wait takes (``ready=tlk_ready``: a
program that found every channel there passes its waits without polling). Both are read long before the waits use
them, so nothing in between may rebind them: a kernel's own ``tlk_`` name is refused, and an inlined helper's is
renamed."""

from __future__ import annotations

import importlib.util
import textwrap

import libcst as cst
import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"
HOIST = "tlk_target = tll.call_target(tlk_epoch, tlk_diag)"
READY = "tlk_ready = tll.channels_ready(tlk_barriers, tlk_world * tlk_channels_per_rank, tlk_target)"

#: a 1-D kernel written on its `def` line
ONE_LINE = (
    '@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))\n@triton.jit\n'
    "def double_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr): offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK); "
    "x = tl.load(x_ptr + offs, mask=offs < N, other=0.0); tl.store(y_ptr + offs, x + x, mask=offs < N)\n")

#: a kernel whose first statement is the loop that holds the waits, after a docstring
LOOP_FIRST = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def sum_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    """y[i] = x[i] + x[i + BLOCK] + ... over the blocks"""
    for b in range(0, tl.cdiv(N, BLOCK)):
        offs = b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
        tl.atomic_add(y_ptr + tl.arange(0, BLOCK), x)
'''

#: a kernel that binds a name of the tlk_ prefix itself
OWN_NAME = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def double_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tlk_target = 0
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, x + x + tlk_target, mask=offs < N)
'''

#: a helper with such a name that reads the gathered tensor: inlined into the kernel, where the wait goes
HELPER_NAME = '''
@triton.jit
def load_twice(ptr, offs, N):
    tlk_target = 2
    return tl.load(ptr + offs, mask=offs < N, other=0.0) * tlk_target


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def double_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = load_twice(x_ptr, offs, N)
    tl.store(y_ptr + offs, x, mask=offs < N)
'''


def _generated(source: str):
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


def _body_lines(source: str, kernel: str) -> list[str]:
    return [line.strip() for line in _generated(source).rewritten[kernel].splitlines()]


@pytest.mark.parametrize("source, kernel", [(ONE_LINE, "double_kernel"), (LOOP_FIRST, "sum_kernel"),
                                            (HELPER_NAME, "double_kernel")], ids=["one-line", "loop-first", "helper"])
def test_the_target_is_read_once_before_every_wait(source: str, kernel: str) -> None:
    body = _generated(source).rewritten[kernel]
    cst.parse_module(body)  # it is Python
    assert body.count(HOIST) == 1, body
    waits = [i for i in range(len(body)) if body.startswith("tll.consumer_tile_wait", i)]
    assert body.count(READY) == 1 and body.index(HOIST) < body.index(READY), body
    assert waits and all(body.index(READY) < i for i in waits), body
    assert body.count("tlk_target, tlk_diag, tlk_budget, scaled=True, ready=tlk_ready)") == len(waits), body
    # nothing else binds them
    for name in ("tlk_target", "tlk_ready"):
        assert sum(line.lstrip().startswith(f"{name} =") for line in body.splitlines()) == 1, body


def test_a_kernel_that_binds_a_tlk_name_is_refused_at_its_line() -> None:
    with pytest.raises(AnnotationError) as info:
        _generated(OWN_NAME)
    err = info.value
    assert "assigns 'tlk_target'" in str(err) and "rename" in str(err), err
    assert (HEAD + textwrap.dedent(OWN_NAME)).splitlines()[err.line - 1].strip() == "tlk_target = 0", err


def test_an_inlined_helpers_tlk_name_is_renamed() -> None:
    body = _generated(HELPER_NAME).rewritten["double_kernel"]
    assert "user_tlk_target = 2" in body, body


def _doubled(path: str) -> float:
    spec = importlib.util.spec_from_file_location("call_target_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    N, block = 45, 16
    x = torch.randn(N, generator=torch.Generator().manual_seed(5))
    lo, hi = rows_of(tilelink.rank(), tilelink.world_size(), N)
    err = 0.0
    for _ in range(2):  # the second call's target is twice the first's
        y = torch.full((N,), float("nan"))
        module.double_kernel[(triton.cdiv(N, block),)](x[lo:hi].contiguous(), y, N, BLOCK=block)
        err = float("nan") if y.isnan().any() else max(err, (y - 2 * x).abs().max().item())
    return err


@pytest.mark.parametrize("source", [ONE_LINE, HELPER_NAME], ids=["one-line", "helper"])
def test_the_rewritten_kernels_equal_torch_on_the_race_exposing_schedule(source: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "call_target_kernels.py"
    path.write_text(HEAD + textwrap.dedent(source))
    errors = tilelink.spawn(_doubled, 2, str(path))
    assert all(e == 0.0 for e in errors), errors
