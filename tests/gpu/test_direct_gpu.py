"""On the GPU: a kernel launched directly (``tilelink.rules.direct``) is compiled again when a Triton setting its
compile options read changes between calls, and the scratch allocator of the device-made tensor descriptors is
installed in every context that launches (an asyncio task made before the first install in its thread)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
import triton
import triton.language as tl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@triton.jit
def _multiply_add(a_ptr, b_ptr, c_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    c = tl.load(c_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * b + c, mask=mask)


def test_a_changed_fp_fusion_setting_compiles_the_kernel_again(monkeypatch) -> None:
    """After ``default_fp_fusion`` changes, the direct launch gives what Triton's own launch gives under the new
    setting, bit for bit (a stale compiled kernel would keep the old rounding)."""
    from triton import knobs

    from tilelink.rules.direct import DirectKernel, direct

    fast = direct(_multiply_add)
    if not isinstance(fast, DirectKernel):
        pytest.skip(f"Triton {triton.__version__} takes its own launch path")
    n = 1 << 16
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b, c = (torch.randn(n, device="cuda", generator=gen) for _ in range(3))

    def run(kernel) -> torch.Tensor:
        out = torch.empty_like(a)
        for _ in range(2):  # a DirectKernel's second launch is the direct one
            kernel[(triton.cdiv(n, 1024),)](a, b, c, out, n, BLOCK=1024)
        torch.cuda.synchronize()
        return out

    monkeypatch.setattr(knobs.language, "default_fp_fusion", True)
    fused = run(_multiply_add)
    assert torch.equal(run(fast), fused)
    monkeypatch.setattr(knobs.language, "default_fp_fusion", False)
    unfused = run(_multiply_add)
    if torch.equal(unfused, fused):
        pytest.skip(f"Triton {triton.__version__} compiles the same code whatever default_fp_fusion says at run time")
    assert torch.equal(run(fast), unfused)


def test_the_scratch_allocator_reaches_an_asyncio_task_made_before_the_first_install() -> None:
    from tilelink.ops.gemm import HOPPER_CONFIGS, matmul

    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    results, errors = [], []

    async def call() -> None:
        results.append(matmul(a, b, variant="persistent", config=HOPPER_CONFIGS[3]))

    async def both() -> None:
        # both tasks copy the thread's context now, before either installs the allocator in its own
        first, second = asyncio.ensure_future(call()), asyncio.ensure_future(call())
        await asyncio.gather(first, second)

    def worker() -> None:  # a new thread: no allocator in its context yet
        try:
            asyncio.run(both())
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not errors, errors
    torch.cuda.synchronize()
    assert len(results) == 2
    for out in results:
        assert torch.allclose(out.float(), ref.float(), atol=0.5, rtol=2e-2)
