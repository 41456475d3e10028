"""Test-wide setting: without a GPU, Triton kernels run in Triton's interpreter.

Set before anything imports Triton. Rank processes started by ``tilelink.spawn`` (emulated) set it
themselves; this covers kernels launched in the pytest process. On a GPU machine nothing is set, and
``tests/gpu`` runs compiled.
"""

from __future__ import annotations

import os

if not os.path.exists("/dev/nvidia0") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
