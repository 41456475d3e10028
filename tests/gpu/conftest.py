"""GPU tests: collected everywhere, skipped only where torch sees no CUDA device."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # ranks.py, for the spawned rank processes too


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
