"""A GEMM in FlagGems' general form loops over whole blocks of K (`range(0, prev_multiple, BLOCK_K)`) and peels the
last, partial block after the loop (`rk = prev_multiple + tl.arange(0, BLOCK_K)`, masked by `rk < K`). Under a
reduction each rank runs both over its own slice of K: they cover it once where the loop stops at a multiple of the
block within a block of K and the peeled step reads that block, masked by K, and adds it to the sums as the loop
does, once, before the store. Those build and equal the kernel on the whole of K at world 2 (each rank's slice a
whole number of blocks or not); a peel that misses any of it is refused at its load, saying what TileLink reads."""

from __future__ import annotations

import pytest

import tilelink
from tests.rules.test_carried_accumulator import _generate
from tests.rules.test_k_offsets import MASKED, PEELED, PEELED_LOOP, WHOLE, _peeled_on
from tilelink.errors import AnnotationError


def _peel(stop: str = "prev_multiple_of(K, BLOCK_K)", start: str = "prev_multiple", step: str = MASKED,
          between: str = "", after: str = "") -> str:
    """The loop over `range(0, prev_multiple, BLOCK_K)` and its peeled step at ``start``, with ``between`` the loop
    and the peel and ``after`` it."""
    return f'''    prev_multiple = {stop}
    for start_k in range(0, prev_multiple, BLOCK_K):
        rk = (start_k + tl.arange(0, BLOCK_K)).to(tl.int64)
''' + WHOLE + between + f'''
    rk = ({start} + tl.arange(0, BLOCK_K)).to(tl.int64)
    if True:
''' + step + after


#: FlagGems' mask, through a name (`mask_k = rk < K`)
NAMED_MASK = MASKED.replace("(rk[None, :] < K)", "mask_k[None, :]").replace("(rk[:, None] < K) & ",
                                                                               "mask_k[:, None] & ")


@pytest.mark.parametrize("loop", [
    PEELED_LOOP,
    _peel(stop="K // BLOCK_K * BLOCK_K"),
    _peel(stop="K - K % BLOCK_K"),
    _peel(stop="(K - 1) // BLOCK_K * BLOCK_K"),
    _peel(step="        mask_k = rk < K\n" + NAMED_MASK),
], ids=["helper", "floor", "remainder", "strictly-below", "named-mask"])
def test_a_peel_that_covers_the_rest_of_the_slice_equals_the_kernel(loop: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_peeled.py"
    path.write_text(PEELED.format(rule="reduce_scatter", loop=loop))
    built = tilelink.build(str(path))
    assert any(e.status == "applied" for e in built.report.entries), built.report
    for K in (80, 64, 40):  # each rank 40 (two blocks and a half), 32 (two whole blocks), 20 (one and a quarter)
        errors = tilelink.spawn(_peeled_on, 2, str(path), K)
        assert all(e < 1e-4 for e in errors), (K, errors)


@pytest.mark.parametrize("loop", [
    # the loop stops at half the slice: the peeled block leaves the rest out
    _peel(stop="K // 2"),
    # the peel starts a block past where the loop stops
    _peel(start="prev_multiple + BLOCK_K"),
    # the peel's columns are not masked by K
    _peel(step=WHOLE),
    # masked by another bound than K
    _peel(step=MASKED.replace("(rk[None, :] < K)", "(rk[None, :] < K - 1)")),
    # the peel added twice
    _peel(after="\n        acc += tl.dot(a, b)"),
    # the sums scaled between the loop and the peel: the loop's part alone
    _peel(between="\n    acc = acc * 2.0"),
    # the peel's product added by another update than the loop's
    _peel(step=MASKED.replace("acc += tl.dot(a, b)", "acc += 2.0 * tl.dot(a, b)")),
    # the peel's loads under a test of the data
    _peel(step=MASKED.replace("        b = tl.load(", "        if tl.sum(a) > 0:\n            b = tl.load(")
          .replace("                    mask=(rk[:, None] < K)", "                        mask=(rk[:, None] < K)")),
    # the peeled value changed between its load and the update
    _peel(step=MASKED.replace("        acc += tl.dot(a, b)", "        a = a * 2.0\n        acc += tl.dot(a, b)")),
    # another term of the mask that reads the peel's columns
    _peel(step=MASKED.replace("(rk[None, :] < K)", "(rk[None, :] < K) & (rk[None, :] % 2 == 0)")),
    # the masked-out columns read as ones
    _peel(step=MASKED.replace("(rk[None, :] < K), other=0.0", "(rk[None, :] < K), other=1.0")),
    # B's name bound on the line of A's peeled load, to the loop's last value
    _peel(step=MASKED.replace("        b = tl.load(", "        a, b = tl.load(a_ptr + rm[:, None] * stride_am + "
                                                    "rk[None, :] * stride_ak, mask=(rm[:, None] < M) & (rk[None, :] < "
                                                    "K), other=0.0), b\n        bb = tl.load(")),
], ids=["half", "past", "unmasked", "other-bound", "twice", "scaled-between", "other-update", "data-test", "changed",
        "extra-mask", "other-ones", "stale-on-the-line"])
def test_a_peel_that_misses_part_of_the_slice_is_refused(loop: str) -> None:
    with pytest.raises(AnnotationError, match=r"after the loop at line 19 that sums|outside the loop at line 19|"
                                              r"bound at line \d+ in the loop that sums") as err:
        _generate(PEELED.format(rule="reduce_scatter", loop=loop))
    assert "each rank" in str(err.value), err.value


def test_the_stale_last_step_added_again_is_refused() -> None:
    """`acc += tl.dot(a, b)` after the loop with no loads of its own adds the loop's last block again: other columns
    on each rank than on the full K. With no peeled load, the loop is one over a part of K."""
    loop = _peel().split("\n    rk = (prev_multiple")[0] + "\n    acc += tl.dot(a, b)"
    with pytest.raises(AnnotationError, match=r"runs over `prev_multiple` .*, not over the K extent the call passes"):
        _generate(PEELED.format(rule="reduce_scatter", loop=loop))
