"""``tilelink.ops``: ready overlapped operators, written as annotated plain Triton kernels.

``ag_gemm``, ``gemm_rs``, ``gemm_ar`` and ``TPContext`` load the rewriter and the runtime on first use.
``tilelink.ops.library`` registers the operators as ``torch.library`` custom ops (``torch.ops.tilelink.*``);
it is imported here, so that a compiled graph holding them runs once ``tilelink.ops`` is imported.
"""

from __future__ import annotations

import importlib

from tilelink.ops import library  # noqa: F401 - registers torch.ops.tilelink.* (torch, no Triton)

_LAZY = {"ag_gemm": "tilelink.ops.tp", "gemm_rs": "tilelink.ops.tp", "TPContext": "tilelink.ops.tp",
         "gemm_ar": "tilelink.ops.tp_ar",
         "ag_moe": "tilelink.ops.moe", "moe_rs": "tilelink.ops.moe",
         "matmul": "tilelink.ops.gemm", "silu_mul": "tilelink.ops.gemm",
         "sp_attention": "tilelink.ops.attention", "SPContext": "tilelink.ops.attention",
         "flash_attention": "tilelink.ops.attention"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tilelink.ops' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(module), name)  # kept: found without this next time
    return value
