"""``tilelink.ops``: ready overlapped operators, written as annotated plain Triton kernels.

``ag_gemm``, ``gemm_rs`` and ``TPContext`` load the rewriter and the runtime on first use.
"""

from __future__ import annotations

import importlib

_LAZY = {"ag_gemm": "tilelink.ops.tp", "gemm_rs": "tilelink.ops.tp", "TPContext": "tilelink.ops.tp",
         "ag_moe": "tilelink.ops.moe", "moe_rs": "tilelink.ops.moe",
         "matmul": "tilelink.ops.gemm", "silu_mul": "tilelink.ops.gemm",
         "sp_attention": "tilelink.ops.attention", "SPContext": "tilelink.ops.attention",
         "flash_attention": "tilelink.ops.attention"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tilelink.ops' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
