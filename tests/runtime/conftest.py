"""Runtime tests: emulated worlds of CPU processes (tilelink.spawn).

The functions that run on the ranks live in ``runtime_worlds.py`` (a module of this folder, put on
``sys.path`` here so that spawned rank processes import it by the same name).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples")
for path in (HERE, EXAMPLES):
    if path not in sys.path:
        sys.path.insert(0, path)
