"""Under a reduction each rank runs the K loop over its own slice of K, counting from its start. A load's mask that
bounds the K offsets by the K extent the call passes (`offs_k[None, :] < K - k * BLOCK_K`, through a local of the
loop, or a loop counting down from K) keeps the terms of the rank's slice: rewritten. A mask that relates the step to
the rows (a triangular product), to a literal (`k < 1`: the first block only) or to loaded data picks terms by their
place in the rank's slice, not in the full K: refused at the build, at the load."""

from __future__ import annotations

import pytest

import tilelink
from tests.rules.test_carried_accumulator import _generate, _scattered, _source
from tilelink.errors import AnnotationError

A_MASK = "mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K)"


@pytest.mark.parametrize("mask, term", [
    ("mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] <= rm[:, None])",
     "(k * BLOCK_K + rk)[None, :] <= rm[:, None]"),
    ("mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K) & (k < 1)", "k < 1"),
    ("mask=(rm[:, None] < M) & (tl.load(a_ptr + k) > 0.0)", "tl.load(a_ptr + k) > 0.0"),
])
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_mask_relating_the_step_to_other_than_the_k_extent_is_refused(rule: str, mask: str, term: str) -> None:
    source = _source("acc += tl.dot(a, b)", rule=rule)
    assert A_MASK in source
    with pytest.raises(AnnotationError, match="the mask of the load at line 17 reads the step of the loop at line 16") \
            as err:
        _generate(source.replace(A_MASK, mask))
    assert f"(`{term}`)" in str(err.value) and "its own slice of K" in str(err.value), err.value
    assert "offs_k[None, :] < K - k * BLOCK_K" in err.value.hint, err.value.hint


@pytest.mark.parametrize("mask", [
    "mask=(rm[:, None] < M) & (rk[None, :] < K - k * BLOCK_K)",  # what is left of K
    "mask=(rm[:, None] < M) & (rk[None, :] < left)",  # through a local of the loop (triton.ops' `k_remaining`)
    "mask=a_ok",  # a mask bound once, its terms read through it
])
def test_a_mask_bounding_the_k_offsets_by_the_k_extent_equals_torch(mask: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source("acc += tl.dot(a, b)").replace(A_MASK, mask).replace(
        "        a = tl.load(", "        left = K - k * BLOCK_K\n"
                               "        a_ok = (rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K)\n"
                               "        a = tl.load(")
    body = _generate(source).rewritten["matmul"]
    assert "tll.producer_tile_notify" in body, body
    path = tmp_path / "k_mask.py"
    path.write_text(source)
    errors = tilelink.spawn(_scattered, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors
