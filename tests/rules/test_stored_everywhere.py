"""A reduction's channel completes when its rows' elements are all counted: a call whose stores leave some of them
unstored (an output wider than the columns the store's mask bounds, a grid short of the tiles, a program that returns
before its store) would wait until the waits time out. Each store's elements per row are written out at the build
(the last field of ``stored_tiles``); each call with more than one rank evaluates them over its grid, with the rows,
and refuses such a call before anything of it is enqueued, saying which rows or columns are left."""

from __future__ import annotations

import textwrap

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of
from tests.rules.test_carried_accumulator import HEAD, KERNEL
from tilelink.errors import LaunchError
from tilelink.overlapped import _unstored

#: a 2-D grid of 16 x 16 tiles over N columns, masked by the columns' bound
ROWS, COLS = "tl.program_id(0) * 16", "tl.program_id(1) * 16"
LIVE = "tl.minimum(tl.maximum((N) - (tl.program_id(1) * 16), 0), 16)"


def _tile(test: str = "", live: str = LIVE) -> tuple:
    return ROWS, "16", COLS, "16", test, 7, live


@pytest.mark.parametrize("programs, width, test, said", [
    ((4, 3, 1), 40, "", None),
    ((4, 3, 1), 48, "", "the stores write 40 of the 48 elements of each row of 'c' in rows [0, 16)"),
    ((4, 3, 1), 32, "", "the stores write 40 of the 32 elements of each row of 'c' in rows [0, 16), past the row's "
                        "end"),
    ((2, 3, 1), 40, "", "no program stores rows [32, 48) of 'c' (nor 1 more tile of rows)"),
    ((4, 2, 1), 40, "", "the stores write 32 of the 40 elements"),
    ((4, 3, 1), 40, "not ((tl.program_id(1) == 1))", "the stores write 24 of the 40 elements"),
    ((5, 3, 1), 40, "", None),  # a program past the rows stores nothing any channel counts
])
def test_what_the_stores_leave_is_said(programs, width: int, test: str, said: str | None) -> None:
    found = _unstored((_tile(test),), {"N": 40}, programs, 50, width, "c")
    assert (found is None) == (said is None) and (said is None or found.startswith(said)), found


def test_a_store_whose_elements_per_row_are_not_known_is_judged_by_its_rows_only() -> None:
    # its counts are not compared with the row (48 here), but rows no program stores never complete either way
    assert _unstored((_tile(live=""),), {"N": 40}, (4, 1, 1), 50, 48) is None
    assert _unstored((_tile(live=""),), {"N": 40}, (2, 1, 1), 50, 48).startswith("no program stores rows [32, 48)")


def test_a_store_swept_over_the_columns_counts_each_step() -> None:
    step = "tl.range(0, tl.cdiv(N, 16), 1, loop=18)"
    tile = (ROWS, "16", "", "", "", 27, f"tl.minimum(tl.maximum((N) - ({step} * 16), 0), 16)")
    assert _unstored((tile,), {"N": 40}, (4, 1, 1), 50, 40) is None
    assert "write 40 of the 48" in _unstored((tile,), {"N": 40}, (4, 1, 1), 50, 48)


def _kernel(tmp_path, rule: str, after: str = "pass") -> str:
    """The plain GEMM of one program per tile (``rm``, ``rn`` from one program id), with ``after`` before its
    store."""
    path = tmp_path / f"stored_{rule}.py"
    path.write_text(HEAD + textwrap.dedent(KERNEL).format(rule=rule, update="acc += tl.dot(a, b)", after=after))
    return str(path)


def _launch(path: str, rule: str, wide: int, grid: int | None = None) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = module_at(path).matmul
    M, N, K = 50, 40, 40
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M) if rule == "reduce_scatter" else (0, M)
    out = torch.full((hi - lo, N + wide), 7.0)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    kernel[(grid or triton.cdiv(M, 16) * triton.cdiv(N, 16),)](
        ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), out.stride(0), 1,
        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return (out[:, :N] - (a @ b)[lo:hi]).abs().max().item()


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("wide, grid, after, says", [
    (8, None, "pass", r"the stores write 40 of the 48 elements of each row of 'c_ptr' in rows \[0, 16\) \(the store "
                      r"at line 23\)"),
    (0, 9, "pass", r"no program stores rows \[48, 50\) of 'c_ptr'"),
    (0, None, "if pid % 3 == 1:\n        return", r"the stores write 24 of the 40 elements of each row"),
], ids=["padded_output", "short_grid", "early_return"])
def test_a_call_leaving_elements_unstored_is_refused_before_it_waits(tmp_path, monkeypatch, rule: str, wide: int,
                                                                    grid, after: str, says: str) -> None:
    """Each of these waited before until its waits timed out (over a minute with the emulated world's budget)."""
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "600")  # a call that reached a wait would fail the test's own timeout
    path = _kernel(tmp_path, rule, after)
    with pytest.raises(LaunchError, match=says) as err:
        tilelink.spawn(_launch, 2, path, rule, wide, grid)
    assert "Store every element of the output" in str(err.value)
    if after == "pass":  # the same kernel, launched over all of its output, equals torch
        assert all(e < 1e-4 for e in tilelink.spawn(_launch, 2, path, rule, 0, None))


def _twice(path: str, rule: str) -> float:
    """A call over the whole output, then one whose output is 8 columns wider: the first passing the check must not
    let the second by."""
    _launch(path, rule, 0)
    return _launch(path, rule, 8)


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_call_that_passed_does_not_pass_another_output_s_row(tmp_path, monkeypatch, rule: str) -> None:
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "600")
    with pytest.raises(LaunchError, match=r"the stores write 40 of the 48 elements"):
        tilelink.spawn(_twice, 2, _kernel(tmp_path, rule), rule)
