"""The pull-bandwidth benchmark's harness, on emulated ranks: every setting of both SM pull partners runs,
produces the right sums and rows, and the launcher's own setting is marked (times are meaningless here)."""

from __future__ import annotations

import json

import pytest

from tilelink.benchmarks import pull_bandwidth

pytestmark = pytest.mark.slow  # about 10 s on two cores


def test_every_setting_runs_and_is_right(tmp_path) -> None:
    rows = pull_bandwidth.run(2, 64, 32, 2, tmp_path)
    consumer = [r for r in rows if r["kernel"] == "rs_pull_consumer"]
    producer = [r for r in rows if r["kernel"] == "ag_pull_producer"]
    assert len(consumer) == 2 * len(pull_bandwidth.CONSUMER_SETTINGS)
    assert len(producer) == len(pull_bandwidth.PRODUCER_SETTINGS)
    assert all(r["max_rel_error"] < 1e-2 for r in consumer), consumer  # bf16 sums of two ranks' partials
    assert all(r["max_rel_error"] == 0 for r in producer), producer
    assert sum(r["taken"] for r in consumer) == 2 and sum(r["taken"] for r in producer) == 1
    record = json.loads((tmp_path / "pull_bandwidth_w2.json").read_text())
    assert record["backend"] == "emulated" and record["results"] == rows
