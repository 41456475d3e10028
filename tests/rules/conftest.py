"""Rewriter tests. ``cases.py`` (launch harnesses of the golden cases) is imported by spawned rank
processes by name, so this folder is put on ``sys.path``."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
