"""Compositions of the matmul spellings TileLink follows one by one (``matmul_variants.py``: tile orders, row
offsets, K loops, accumulations, stores) build under each rule, and a sample of them equals torch on the
race-exposing schedule at two ranks: a composition refused, or built wrong, is a gap between forms TileLink reads
alone and together."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilelink
from tests.rules.matmul_variants import COVERING, RULES, VARIANTS, multiply


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
