"""A split-K write-back's channels count one add per element from every program along the split axes (the
launcher lowers each word by (splits - 1) times its elements). A program along them that skips its add, by
returning early or by a mask that reads its split index, would leave every channel of its tile short and the
consumers waiting: refused where it happens, saying what to write. A guard on the tile's own axes skips whole tiles
for every split alike and stays followed."""

from __future__ import annotations

import pytest

from tests.rules.test_split_k_and_host_descriptors import ADD, HEAD, SPLIT_K, _error, _generated

SPLIT = "pid_k = tl.program_id(axis=1)"


@pytest.mark.parametrize(("split", "write"), [
    (f"{SPLIT}\n    if pid_k * BLOCK_K >= K:\n        return", ADD),
    (f"{SPLIT}\n    if pid < 0:\n        return\n    elif pid_k * BLOCK_K >= K:\n        return", ADD),
    (SPLIT, ADD.replace("(offs_n[None, :] < N)", "(offs_n[None, :] < N) & (pid_k * BLOCK_K < K)")),
], ids=["early-return", "elif-return", "mask"])
def test_a_split_that_skips_its_add_is_refused_where_it_skips(split: str, write: str) -> None:
    source = SPLIT_K.format(rule="reduce_scatter", split=split, write=write)
    err = _error(source)
    assert "split" in str(err) and "adds" in str(err), err
    assert "every program along the split" in err.hint, err
    line = (HEAD + source).splitlines()
    # the return or the atomic_add whose mask reads the split index
    assert "return" in line[err.line - 1] or "tl.atomic_add" in line[err.line - 1], (err, line[err.line - 1])


def test_a_guard_on_the_tiles_own_axes_stays_followed() -> None:
    split = f"{SPLIT}\n    if pid >= tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N):\n        return"
    generated = _generated(SPLIT_K.format(rule="reduce_scatter", split=split, write=ADD))
    assert generated.plans[0].launch.atomic_axes == (0,)


#: a helper of the kernel's file that reads the program's position itself
SPLIT_START = '''
@triton.jit
def k_start(BLOCK_K: tl.constexpr):
    return tl.program_id(axis=1) * BLOCK_K
'''


@pytest.mark.parametrize("split", [
    f"{SPLIT}\n    if k_start(BLOCK_K) >= K:\n        return",
    f"{SPLIT}\n    if tl.program_id(axis=SPLIT_AXIS) * BLOCK_K >= K:\n        return",
], ids=["helper", "named-axis"])
def test_a_split_that_returns_on_its_index_read_through_a_helper_or_a_named_axis_is_refused(split: str) -> None:
    """The split index read inside a helper, or through an axis that is not an int literal, is still a split
    index: a program along the split that returns skips its add, and the consumers would wait for it."""
    source = SPLIT_START + SPLIT_K.format(rule="reduce_scatter", split=split, write=ADD).replace(
        "    pid = tl.program_id(0)\n", "    SPLIT_AXIS: tl.constexpr = 1\n    pid = tl.program_id(0)\n")
    err = _error(source)
    assert "returns here on a condition that reads its split index" in str(err), err


def test_a_tile_address_read_through_a_helper_is_refused_with_a_message() -> None:
    """Which grid axes the write-back's address reads decides which are the K splits: through a helper that reads
    the program id itself, TileLink cannot tell, and says so (not an internal error)."""
    source = SPLIT_START.replace("k_start(BLOCK_K: tl.constexpr)", "tile_index()").replace(
        "tl.program_id(axis=1) * BLOCK_K", "tl.program_id(axis=0)") + SPLIT_K.format(
        rule="reduce_scatter", split=SPLIT, write=ADD).replace("    pid = tl.program_id(0)\n",
                                                               "    pid = tile_index()\n")
    err = _error(source)
    assert "an axis TileLink cannot read" in str(err) and "a helper that reads the program id" in str(err), err
