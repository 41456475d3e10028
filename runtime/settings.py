"""Settings read from the environment at every call, cheaply.

The operators read their settings (``TILELINK_PATH``, ``TILELINK_WAIT_TIMEOUT``, ``TRITON_INTERPRET``, ...) at
each call, so that a change takes effect at the next one; ``os.environ.get`` encodes the name and decodes the value
each time, 1-2 µs a read (most for a name that is not set), several times a call.
"""

from __future__ import annotations

import os

__all__ = ["setting"]

_DATA = getattr(os.environ, "_data", None) if hasattr(os.environ, "encodekey") else None
_KEYS: dict[str, object] = {}


def setting(name: str, default: str = "") -> str:
    """``os.environ.get(name, default)`` at the cost of a dict lookup: it reads the mapping ``os.environ`` keeps,
    which ``os.environ[name] = ...`` and ``del os.environ[name]`` update."""
    key = _KEYS.get(name)
    if key is None:
        if not isinstance(_DATA, dict):
            return os.environ.get(name, default)
        key = _KEYS[name] = os.environ.encodekey(name)
    value = _DATA.get(key)
    return default if value is None else os.environ.decodevalue(value)
