"""The inserted waits are real: a rewritten consumer whose channel never arrives times out with a
diagnosis instead of hanging or reading early."""

from __future__ import annotations

import os

import pytest

import tilelink
from tests.rules.cases import unsatisfied_wait


@pytest.mark.slow
def test_unsatisfied_channel_times_out_with_its_name(monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "0.3")
    assert os.environ["TILELINK_WAIT_TIMEOUT"] == "0.3"
    (result,) = tilelink.spawn(unsatisfied_wait, 1)
    # tile 0 of BLOCK_M=16 reads rows 0..15: channel 0 (rows 0..9) arrived, channel 1 (10..19) did not
    assert result["primitive"] == "consumer_tile_wait", result
    assert result["index"] == 1 and result["expected"] == 5 and result["seen"] == 0
    assert "matmul_kernel" in result["message"] and "rank 0" in result["message"]
