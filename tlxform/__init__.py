"""TileLink: compute-communication overlapped Triton kernels from plain annotated kernels.

Public API::

    import tilelink

    @tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
    @triton.jit
    def matmul(a_ptr, b_ptr, c_ptr, M, N, K, ...): ...

    tilelink.init()                      # or tilelink.spawn(fn, world_size, backend="emulated")
    matmul[grid](a_shard, b, c, M, N, K, ...)
"""

from __future__ import annotations

import importlib
import time as _time

from tilelink.errors import (
    AnnotationError,
    LaunchError,
    NotInitializedError,
    SymmetricHeapError,
    TileLinkError,
    WaitTimeout,
    WorldMismatchError,
)

__version__ = "0.1.0"

#: when this process imported TileLink: a source file of it changed later may not be the code that runs
_IMPORTED_NS = _time.time_ns()

# name -> module that defines it; imported on first use so that `import tilelink` stays cheap and
# the runtime (torch, triton) is only loaded when asked for.
_LAZY = {
    "overlap": "tilelink.overlapped",
    "all_gather": "tilelink.spec",
    "reduce_scatter": "tilelink.spec",
    "all_reduce": "tilelink.spec",
    "init": "tilelink.runtime.world",
    "finalize": "tilelink.runtime.world",
    "rank": "tilelink.runtime.world",
    "world_size": "tilelink.runtime.world",
    "local_rank": "tilelink.runtime.world",
    "is_initialized": "tilelink.runtime.world",
    "spawn": "tilelink.runtime.launch",
    "build": "tilelink.overlapped",
}

__all__ = [
    "AnnotationError",
    "LaunchError",
    "NotInitializedError",
    "SymmetricHeapError",
    "TileLinkError",
    "WaitTimeout",
    "WorldMismatchError",
    *_LAZY,
]


#: sub-packages reachable as attributes after a bare ``import tilelink`` (``tilelink.ops.ag_gemm``,
#: ``tilelink.nn.TPMLP``), imported on first use: ``tilelink.ops`` and ``tilelink.nn`` load torch
_SUBMODULES = ("ops", "nn", "runtime", "language")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"tilelink.{name}")  # the import sets the attribute itself
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tilelink' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
