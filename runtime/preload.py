"""Compile and load a kernel without running it.

A kernel that spins on a flag deadlocks if the kernel it waits for is launched for the first time
while it spins: Triton compiles and loads a module on its first launch, and loading waits for the
running kernel. So every kernel of an overlapped operator is preloaded first.
"""

from __future__ import annotations

from tilelink.runtime.world import interpreting


def preload(kernel, grid, *args, **kwargs):
    """Compile ``kernel`` for these arguments and load its module on the current device, launching
    nothing. Returns the compiled kernel (``None`` under ``TRITON_INTERPRET=1``, where there is
    nothing to load)."""
    if interpreting():
        return None
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    init_handles = getattr(compiled, "_init_handles", None)
    if init_handles is not None:
        init_handles()  # loads the cubin into the context now, not at first launch
    return compiled
