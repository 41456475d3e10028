"""A reduce-scatter kernel that returns on a value it loads, before it stores its tile: the program's rows stay
unstored and their channels short, so the reduction's wait times out naming them. The report says so at the
`return`, as it does for a store in a branch; a return that stores first (the zeros an MoE kernel writes for an
expert on another rank) or that skips a tile past the end is not noted."""

from __future__ import annotations

import textwrap

import pytest

from tilelink.annotations import requests_in
from tilelink.codegen import generate

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

KERNEL = '''
@tilelink.overlap(tilelink.reduce_scatter("y_ptr", size="N"))
@triton.jit
def masked_copy_kernel(x_ptr, flag_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    {guard}
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, x, mask=offs < N)
'''


def _notes(guard: str) -> list[str]:
    text = HEAD + textwrap.dedent(KERNEL.format(guard=guard))
    report = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).report
    return [str(e) for e in report.entries if "returns at line" in e.message]


@pytest.mark.parametrize("guard", [
    "if tl.load(flag_ptr + pid) == 0:\n        return",
    "skip = tl.load(flag_ptr + pid)\n    if skip != 0:\n        return",
])
def test_a_return_on_a_loaded_value_before_the_store_is_noted_at_the_return(guard: str) -> None:
    notes = _notes(guard)
    line = 11 + guard.count("\n")
    assert len(notes) == 1 and f"(user_kernels.py:{line})" in notes[0], notes
    assert "before the store at line" in notes[0] and "times out naming them" in notes[0], notes


@pytest.mark.parametrize("guard", [
    "if pid * BLOCK >= N:\n        return",  # a tile past the end: no rows
    "if tl.load(flag_ptr + pid) == 0:\n        tl.store(y_ptr + offs, tl.zeros((BLOCK,), tl.float32), mask=offs < N)"
    "\n        return",  # its tile stored (zeros) before it returns
])
def test_a_return_that_skips_no_rows_is_not_noted(guard: str) -> None:
    assert _notes(guard) == []
