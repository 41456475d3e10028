"""Offsets broadcast where they are bound (FlagGems' matrix-vector form, ``tilelink.expanded``), the kernel compiled by
Triton and run on the GPU by two ranks sharing it through NVSHMEM, under the three rules."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.test_expanded_offsets import RULES, mv, written

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_offsets_broadcast_where_bound_on_the_gpu(rule: str, tmp_path) -> None:
    errors = tilelink.spawn(mv, 2, written(tmp_path, rule), rule, backend="nvshmem")
    assert errors == [0.0, 0.0], errors
