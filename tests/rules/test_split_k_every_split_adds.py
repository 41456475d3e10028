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
