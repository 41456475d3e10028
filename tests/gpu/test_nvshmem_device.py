"""NVSHMEM device functions from Triton: my_pe/n_pes, putmem_signal_block + signals, fence/quiet.

The ring puts into pe = (rank + 1) % n, so rank 0 launches with pe == 1, which Triton compiles into
a module of its own: this is the regression test for the illegal addresses of a module that links
the NVSHMEM bitcode but never got ``module_init``.
"""

from __future__ import annotations

import pytest

from tests.gpu.putmem_kernels import ring_put_signal
from tests.gpu.ranks import run_world


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_put_signal_ring(world_size, heap_for_ranks):
    heap_for_ranks(world_size)
    results = run_world(ring_put_signal, world_size, timeout=300)
    for r, out in enumerate(results):
        assert out["pe"] == [r, world_size]
        assert out["signal_from_prev"] == 8  # SET 3, then ADD 5
        assert out["data_ok"]
        assert out["device_wait_seen"] >= 8
        assert out["fence_quiet"] == 1
        # every module the rank compiled was initialised: pe, put, wait, fence
        assert out["modules_after"] >= 4
    print("put_signal ring", world_size, results)


def test_hook_chains_existing_hook():
    from triton import knobs

    from tilelink.runtime import nvshmem_device as nvd

    calls = []

    def earlier(**kwargs):
        calls.append(kwargs["key"])
        return "earlier result"

    saved = knobs.runtime.jit_post_compile_hook
    try:
        knobs.runtime.jit_post_compile_hook = earlier
        nvd.install_module_init_hook()
        nvd.install_module_init_hook()  # idempotent
        hook = knobs.runtime.jit_post_compile_hook
        assert hook._tilelink_previous is earlier
        assert hook(key="k", repr="", fn=None, compile={"extern_libs": (("libdevice", "x.bc"),)},
                    is_manual_warmup=False, already_compiled=False) == "earlier result"
        assert calls == ["k"]
    finally:
        knobs.runtime.jit_post_compile_hook = saved
