"""Test-wide settings: without a GPU, Triton kernels run in Triton's interpreter, and every overlapped call
runs on the race-exposing schedule (``TILELINK_RACES=1``, ``tilelink.runtime.races``: poisoned gathered rows
delivered only when a wait asks for them, reduced rows taken when their notify completes them). A test of a
partner kernel's own schedule sets ``TILELINK_RACES=0``.

Set before anything imports Triton. Rank processes started by ``tilelink.spawn`` (emulated) set it
themselves; this covers kernels launched in the pytest process. On a GPU machine nothing is set, and
``tests/gpu`` runs compiled.
"""

from __future__ import annotations

import os

if not os.path.exists("/dev/nvidia0") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TILELINK_RACES", "1")
