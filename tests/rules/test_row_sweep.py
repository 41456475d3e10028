"""The row sweep (a store in a loop that keeps its rows, notified once after the loop): every element a
loop stores is counted exactly once, with several stores in one loop too; a loop that moves the rows
through the store's address is not taken for a sweep; a column count whose start changes after the
column vector was made falls back to counting the vector."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n\n"
DECORATORS = '@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0), order="mesh")\n@triton.jit\n'

# each iteration stores two column tiles of the same rows: two counts, two notifies
TWO_STORES = '''
def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + 1.0
    for j in range(0, tl.cdiv(N, 2 * BLOCK_N)):
        offs_a = 2 * j * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_b = (2 * j + 1) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_a[None, :], acc,
                 mask=(offs_m[:, None] < M) & (offs_a[None, :] < N))
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_b[None, :], acc,
                 mask=(offs_m[:, None] < M) & (offs_b[None, :] < N))
'''

# a swept store and, in the same loop, a store of other rows notified per iteration (tlk_cols reused)
SWEPT_AND_TILE = '''
def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + 1.0
    for j in range(0, tl.cdiv(N, BLOCK_N)):
        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
        offs_m2 = (pid_m + tl.num_programs(0)) * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(c_ptr + offs_m2[:, None] * stride_cm + offs_n[None, :], acc,
                 mask=(offs_m2[:, None] < M) & (offs_n[None, :] < N))
'''


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sweep_case.py"
    path.write_text(HEAD + DECORATORS + textwrap.dedent(body))
    return path


def _generated(text: str) -> str:
    return generate(text, "sweep_case.py", requests_in(text, "sweep_case.py")).text


@pytest.mark.parametrize("body", [TWO_STORES, SWEPT_AND_TILE], ids=["two", "with_tile"])
def test_a_second_store_beside_a_swept_one_is_refused(tmp_path: Path, body: str) -> None:
    # each store's count is its own, but TileLink cannot tell that the two write other elements: columns the next
    # iteration's other store writes (`offs_a = j * BLOCK_N + ...` beside `offs_b = (j + 1) * BLOCK_N + ...` would
    # store every column twice), rows another program stores; each element stored twice would complete its channel
    # early, so a second store of the tensor in a sweep loop is refused
    path = _write(tmp_path, body)
    with pytest.raises(AnnotationError, match="may both write the same elements in one program"):
        _generated(path.read_text())


ADVANCED = '''
def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    for j in range(0, 4):
        tl.store(ptrs, 1.0, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
        ptrs += BLOCK_M * stride_cm
'''

ROW_TERM = '''
def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    for j in range(0, 4):
        tl.store(c_ptr + (offs_m[:, None] + j * BLOCK_M) * stride_cm + offs_n[None, :], 1.0,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
'''


# a column term the mask does not bound carries the loop's row offset
UNBOUNDED_COLUMNS = '''
def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    for i in range(0, 2):
        cols = offs_n + i * tl.num_programs(0) * BLOCK_M * stride_cm
        tl.store(c_ptr + offs_m[:, None] * stride_cm + cols[None, :], 1.0,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
'''

# a value assigned once in the loop, but from an atomic: it differs from one iteration to the next
ATOMIC_SHIFT = '''
def kernel(c_ptr, ctr_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    for i in range(0, 2):
        shift = tl.atomic_add(ctr_ptr + tl.program_id(0), 1) * tl.num_programs(0) * BLOCK_M * stride_cm
        tl.store(c_ptr + offs_m[:, None] * stride_cm + shift + offs_n[None, :], 1.0,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
'''


@pytest.mark.parametrize("body", [ADVANCED, ROW_TERM, UNBOUNDED_COLUMNS, ATOMIC_SHIFT],
                         ids=["pointer_advanced", "loop_index_in_rows", "unbounded_columns", "atomic_shift"])
def test_a_loop_that_moves_the_rows_is_not_a_sweep(body: str) -> None:
    text = HEAD + DECORATORS + textwrap.dedent(body)
    with pytest.raises(AnnotationError) as info:
        _generated(text)
    text = str(info.value)
    if body is ADVANCED:  # refused before the sweep is considered: the advance moves the rows themselves
        assert "`ptrs` is advanced at line 15 by `BLOCK_M * stride_cm`, along the rows of 'c_ptr'" in text
    elif body is ROW_TERM:  # refused before too: the address's rows are not the tile's offsets vector
        assert "touches the rows `(offs_m[:, None] + j * BLOCK_M) * stride_cm` of 'c_ptr'" in text
    elif body is ATOMIC_SHIFT:  # refused before too: a term along the rows that changes from step to step, unbounded
        assert "adds `shift` along the rows of 'c_ptr', which changes from one step of a loop to the next" in text
    else:  # refused before too: columns that move with the loop, which no mask bounds by the row
        assert "the columns `cols` of the store at line 14 are not bounded by the mask" in text, text


def test_column_count_falls_back_when_its_start_changes_later_in_the_loop() -> None:
    text = HEAD + DECORATORS + textwrap.dedent('''
        def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
            col = 0
            offs_n = col + tl.arange(0, BLOCK_N)
            for t in range(0, tl.cdiv(M, BLOCK_M)):
                offs_m = t * BLOCK_M + tl.arange(0, BLOCK_M)
                tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], 1.0,
                         mask=(offs_m[:, None] < M) & (offs_n[None, :] < N - col))
                col += 0
    ''')
    # the mask's bound changes in the loop (`col += ...`) beside columns made before it: it bounds nothing the launch
    # reads (a negative `col` lets the columns past the row), so the store is refused where its columns are read
    with pytest.raises(AnnotationError, match=r"the columns `offs_n` of the store at line \d+ are bounded by a mask "
                                              r"that changes from one step of a loop to the next"):
        _generated(text)


@pytest.mark.parametrize(("second", "says"), [
    ("j * BLOCK_N", "write the same rows in the loop at line 11"),  # the same columns twice
    ("(2 * j + 2) * BLOCK_N", "write the same rows in the loop at line 11"),  # overlaps the next iteration's
])
def test_stores_of_a_sweep_that_may_write_the_same_columns_are_refused(second: str, says: str) -> None:
    text = HEAD + DECORATORS + textwrap.dedent(f'''
        def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
            offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
            for j in range(0, tl.cdiv(N, 2 * BLOCK_N)):
                offs_a = 2 * j * BLOCK_N + tl.arange(0, BLOCK_N)
                offs_b = {second} + tl.arange(0, BLOCK_N)
                tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_a[None, :], 1.0,
                         mask=(offs_m[:, None] < M) & (offs_a[None, :] < N))
                tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_b[None, :], 1.0,
                         mask=(offs_m[:, None] < M) & (offs_b[None, :] < N))
        ''')
    with pytest.raises(AnnotationError) as info:
        _generated(text)
    assert says in str(info.value), info.value


def test_a_store_repeated_on_every_step_of_an_inner_loop_is_refused() -> None:
    text = HEAD + DECORATORS + textwrap.dedent('''
        def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
            offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for k in range(0, 4):
                acc += 1.0
                tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc,
                         mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
        ''')
    with pytest.raises(AnnotationError) as info:
        _generated(text)
    assert "the loop at line 13 stores the same elements of 'c_ptr' on every iteration (line 15)" in str(info.value), \
        info.value
    assert "store once, after the loop" in info.value.hint, info.value.hint


@pytest.mark.parametrize(("loop", "says"), [
    # the columns made after the store: its first step stores the columns made before the loop, its second the
    # first step's again
    ("offs_n = tl.arange(0, BLOCK_N)\n    for j in range(0, tl.cdiv(N, BLOCK_N) + 1):\n        {store}\n"
     "        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)", "cannot tell that each iteration stores other columns"),
    # made in a branch: a step that skips it stores the columns of a step before
    ("offs_n = tl.arange(0, BLOCK_N)\n    for j in range(0, 2 * tl.cdiv(N, BLOCK_N)):\n"
     "        if j * BLOCK_N < N:\n            offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)\n        {store}",
     "cannot tell that each iteration stores other columns"),
    # wrapped onto the row's start: the last block's lanes past N store its first columns again
    ("for j in range(0, tl.cdiv(N, BLOCK_N)):\n        offs_n = (j * BLOCK_N + tl.arange(0, BLOCK_N)) % N\n"
     "        {store}", "the columns `offs_n` of the store at line 15"),
    # a step that leaves before its store: its columns are never counted
    ("for j in range(0, tl.cdiv(N, BLOCK_N)):\n        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)\n"
     "        if j == 1:\n            continue\n        {store}", "a step may leave it before the store"),
    # the loop's target bound again in its body, or by an inner loop, before the columns are made: every step
    # stores the same block
    ("for j in range(0, tl.cdiv(N, BLOCK_N)):\n        j = 0\n        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)\n"
     "        {store}", "cannot tell that each iteration stores other columns"),
    ("for j in range(0, tl.cdiv(N, BLOCK_N)):\n        for j in range(0, 1):\n            pass\n"
     "        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)\n        {store}",
     "cannot tell that each iteration stores other columns"),
    # the mask bounds columns that move, the address stores others that do not
    ("base = tl.arange(0, BLOCK_N)\n    for j in range(0, tl.cdiv(N, BLOCK_N)):\n"
     "        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)\n"
     "        tl.store(c_ptr + offs_m[:, None] * stride_cm + base[None, :], acc,\n"
     "                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))",
     "cannot tell that each iteration stores other columns"),
])
def test_a_sweep_whose_columns_may_repeat_or_go_unstored_is_refused(loop: str, says: str) -> None:
    """Each iteration's count is added to the row's: the columns it stores must be its own, made on that step before
    the store, and every step must store them (a column counted twice completes the channel early, one never
    counted leaves it short)."""
    store = ("tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc,\n"
             "                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))")
    text = HEAD + DECORATORS + textwrap.dedent('''
        def kernel(c_ptr, M, N, stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
            pid_m = tl.program_id(0)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + 1.0
        ''') + "    " + loop.replace("{store}", store) + "\n"
    with pytest.raises(AnnotationError) as info:
        _generated(text)
    assert says in str(info.value), info.value
