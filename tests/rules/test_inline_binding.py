"""An inlined `@triton.jit` helper does what the call did: what its `return` evaluates runs even when the call's
result is not used, and each argument is evaluated once, where the call evaluated it."""

from __future__ import annotations

import textwrap

from tilelink.annotations import requests_in
from tilelink.codegen import generate

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"


def _rewritten(source: str, kernel: str = "kernel") -> str:
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).rewritten[kernel]


def test_a_return_with_a_call_runs_when_the_result_is_not_used() -> None:
    # `return tl.store(...)` in a helper called as a statement: the store is the helper's effect
    body = _rewritten('''
        @triton.jit
        def _double(x_ptrs, y_ptrs, mask, flip):
            x = tl.load(x_ptrs, mask=mask)
            if flip:
                return tl.store(y_ptrs, -2 * x, mask=mask)
            else:
                return tl.store(y_ptrs, 2 * x, mask=mask)

        @triton.jit
        def _copy(x_ptrs, y_ptrs, mask):
            return tl.store(y_ptrs, tl.load(x_ptrs, mask=mask), mask=mask)

        @tilelink.overlap(tilelink.all_gather("x_ptr"))
        @triton.jit
        def kernel(x_ptr, y_ptr, z_ptr, N, FLIP: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            _double(x_ptr + offs, y_ptr + offs, offs < N, FLIP)
            _copy(x_ptr + offs, z_ptr + offs, offs < N)
        ''')
    flat = " ".join(body.split())
    assert "tl.store(y_ptrs, -2 * x, mask=mask)" in flat and "tl.store(y_ptrs, 2 * x, mask=mask)" in flat, body
    assert "tl.store(y_ptrs_2, tl.load(x_ptrs_2, mask=mask_2), mask=mask_2)" in flat, body
    assert "return" not in body, body


def test_a_compile_time_argument_is_written_where_it_is_used_so_an_unrolled_loop_can_repeat_the_call() -> None:
    # a `SHIFT: tl.constexpr = i + 1` local before the body would be defined again on the second unrolled step of
    # tl.static_range, which Triton's compiler refuses ("constexpr cannot be reassigned")
    body = _rewritten('''
        @triton.jit
        def _add_rows(acc, x_ptrs, SHIFT: tl.constexpr):
            return acc + tl.load(x_ptrs) * SHIFT

        @tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
        @triton.jit
        def kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            acc = tl.zeros((BLOCK,), tl.float32)
            for i in tl.static_range(2):
                acc = _add_rows(acc, x_ptr + offs, i + 1)
            tl.store(y_ptr + offs, acc)
        ''')
    assert "tl.constexpr =" not in body, body
    # in parentheses: `* i + 1` would be another value
    assert "acc = acc + tl.load(x_ptrs) * (i + 1)" in body, body


def test_arguments_are_evaluated_in_the_calls_order() -> None:
    # keyword arguments in another order than the parameters: each takes a ticket from the same counter, so the
    # order of the two adds decides which parameter gets which
    body = _rewritten('''
        @triton.jit
        def _load_rows(x_ptrs, first, second):
            return tl.load(x_ptrs) + first * 10 + second

        @tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
        @triton.jit
        def kernel(x_ptr, y_ptr, count_ptr, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            y = _load_rows(second=tl.atomic_add(count_ptr, 1), first=tl.atomic_add(count_ptr, 1), x_ptrs=x_ptr + offs)
            tl.store(y_ptr + offs, y)
        ''')
    second, first, rows = (body.index(f"{name} = ") for name in ("second", "first", "x_ptrs"))
    assert second < first < rows, body
