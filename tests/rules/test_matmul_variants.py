"""Compositions of the matmul spellings TileLink follows one by one (``matmul_variants.py``: tile orders, row
offsets, K loops, accumulations, stores) build under each rule, and a sample of them equals torch on the
race-exposing schedule at two ranks: a composition refused, or built wrong, is a gap between forms TileLink reads
alone and together."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilelink
from tests.rules.matmul_variants import COVERING, RULES, VARIANTS, Variant, multiply


@pytest.mark.slow
@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_composition_builds(rule: str, tmp_path) -> None:
    refused = []
    for variant in COVERING:
        path = tmp_path / f"{str(variant).replace('-', '_')}.py"
        path.write_text(variant.source(rule))
        try:
            built = tilelink.build(str(path))
        except tilelink.AnnotationError as error:
            refused.append(f"{variant}: {error}")
            continue
        assert built.report.applied, (str(variant), [str(e) for e in built.report.entries])
    assert not refused, "\n".join(refused[:5]) + f"\n({len(refused)} of {len(COVERING)} refused)"


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(variant=st.sampled_from(VARIANTS), rule=st.sampled_from(sorted(RULES)))
def test_compositions_equal_torch_on_the_race_exposing_schedule(variant, rule, tmp_path_factory, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path_factory.mktemp("variants") / f"{str(variant).replace('-', '_')}_{rule}.py"
    path.write_text(variant.source(rule))
    errors = tilelink.spawn(multiply, 2, str(path), rule, variant.order == "two_axes")
    assert errors == [0.0, 0.0], (str(variant), rule, errors)


@pytest.mark.parametrize(("loop", "rule", "written", "instead"), [
    # widened columns bounded past K, or stepping twice the block: each rank's slice is not what its loop sums
    ("widened", "reduce_scatter", "rk[None, :] < K)", "rk[None, :] < K + 8)"),
    ("widened", "all_reduce", "(start_k + tl.arange", "(2 * start_k + tl.arange"),
    # the widened columns wider than the block the mask bounds, or narrowed (a cast that loses values)
    ("for_mask", "all_gather", "tl.arange(0, BLOCK_K).to(tl.int64)", "tl.arange(0, 2 * BLOCK_K).to(tl.int64)"),
    ("for_mask", "all_gather", "tl.arange(0, BLOCK_K).to(tl.int64)", "tl.arange(0, BLOCK_K).to(tl.int8)"),
])
def test_widened_columns_are_read_as_their_values_and_no_further(loop: str, rule: str, written: str, instead: str,
                                                                 tmp_path) -> None:
    source = Variant("rows_first", "plain", loop, "add", "tutorial").source(rule)
    assert written in source
    path = tmp_path / "widened.py"
    path.write_text(source.replace(written, instead, 1))
    with pytest.raises(tilelink.AnnotationError, match="line 21"):
        tilelink.build(str(path))
