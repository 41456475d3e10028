"""The plain GEMM and SiLU·mul kernels under the Triton interpreter, against torch, and their errors."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tilelink.errors import LaunchError  # noqa: E402
from tilelink.ops.gemm import matmul, silu_mul  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# The CPU tests run the kernels under the interpreter; the GPU tests (marked `gpu`) compile them and
# run only with TRITON_INTERPRET=0 on a CUDA machine.
cpu = pytest.mark.skipif(not _INTERPRET, reason="CPU tests of the kernels need TRITON_INTERPRET=1")
gpu_only = pytest.mark.skipif(_INTERPRET or not torch.cuda.is_available(),
                              reason="needs a CUDA GPU and TRITON_INTERPRET=0")


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


@cpu
@pytest.mark.parametrize("m,n,k", [(50, 24, 40), (33, 17, 65), (1, 1, 1), (64, 32, 16), (7, 50, 3)])
def test_matmul_matches_torch_fp32(m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(k, n, generator=g)
    out = torch.full((m, n), float("nan"))  # poisoned: every element must be written
    matmul(a, b, out=out)
    ref = a.double() @ b.double()
    assert not out.isnan().any()
    assert _rel_err(out, ref) < 1e-5


@cpu
def test_matmul_transposed_weight_and_fp16() -> None:
    g = torch.Generator().manual_seed(7)
    a = torch.randn(33, 65, generator=g).half()
    w = torch.randn(17, 65, generator=g).half()  # (N, K) weight, used as w.t()
    out = matmul(a, w.t())
    assert out.dtype == torch.float16 and out.shape == (33, 17)
    assert _rel_err(out, a.double() @ w.double().t()) < 2e-3


@cpu
def test_matmul_empty_dims() -> None:
    assert matmul(torch.randn(0, 4), torch.randn(4, 3)).shape == (0, 3)
    assert torch.equal(matmul(torch.randn(5, 0), torch.randn(0, 3)), torch.zeros(5, 3))


@cpu
def test_silu_mul_matches_torch() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 2 * 21, generator=g)
    ref = torch.nn.functional.silu(x[:, :21].double()) * x[:, 21:].double()
    assert _rel_err(silu_mul(x), ref) < 1e-6


@cpu
@pytest.mark.parametrize("a,b,match", [
    (torch.randn(4, 5), torch.randn(6, 3), "inner dimensions"),
    (torch.randn(4), torch.randn(4, 3), "2-D"),
    (torch.randn(4, 5), torch.randn(5, 3).half(), "float16"),
    (torch.randn(4, 5).int(), torch.randn(5, 3).int(), "dtype"),
    (torch.randn(5, 4).t(), torch.randn(5, 3), "row-major"),
    (torch.randn(4, 10)[:, ::2], torch.randn(5, 3), "row-major"),
    (torch.randn(4, 5), torch.randn(5, 6)[:, ::2], "row-major or the transpose"),
])
def test_matmul_rejects_bad_input(a, b, match: str) -> None:
    with pytest.raises(LaunchError, match=match):
        matmul(a, b)


@cpu
def test_matmul_rejects_bad_out_and_variant() -> None:
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with pytest.raises(LaunchError, match="shape"):
        matmul(a, b, out=torch.empty(3, 4))
    with pytest.raises(LaunchError, match="variant"):
        matmul(a, b, variant="fastest")
    with pytest.raises(LaunchError, match="even number"):
        silu_mul(torch.randn(4, 5))


@cpu
def test_matmul_bf16() -> None:
    g = torch.Generator().manual_seed(11)
    a = torch.randn(50, 40, generator=g).bfloat16()
    b = torch.randn(40, 24, generator=g).bfloat16()
    out = matmul(a, b)
    assert out.dtype == torch.bfloat16
    assert _rel_err(out, a.double() @ b.double()) < 1e-2


@cpu
@pytest.mark.parametrize("kernel,extra", [
    ("matmul_kernel_descriptor", {}),
    ("matmul_kernel_descriptor_persistent", {}),
    ("matmul_kernel_descriptor_persistent", {"FLATTEN": False, "WARP_SPECIALIZE": True}),
])
def test_descriptor_kernels_match_torch(kernel: str, extra: dict) -> None:
    import triton

    from tilelink.ops import gemm_kernels

    g = torch.Generator().manual_seed(5)
    m, n, k = 50, 24, 40
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    c = torch.full((m, n), float("nan"))
    meta = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}
    args = (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
    if "persistent" in kernel:
        getattr(gemm_kernels, kernel)[(3,)](*args, **meta, NUM_SMS=3, **extra)
    else:
        grid = (triton.cdiv(m, 32) * triton.cdiv(n, 16),)
        getattr(gemm_kernels, kernel)[grid](*args, **meta)
    assert _rel_err(c, a.double() @ b.double()) < 1e-5


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("variant", ["pointer", "persistent", "persistent_ws", "auto"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(33, 17, 65), (1000, 520, 264)])
def test_matmul_on_gpu(m: int, n: int, k: int, dtype: torch.dtype, variant: str) -> None:
    from tilelink.ops.gemm import HOPPER_CONFIGS

    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    config = HOPPER_CONFIGS[-1] if dtype == torch.float32 else HOPPER_CONFIGS[0]  # one compile each
    matmul(a, b, out=out, variant=variant, config=config)
    ref = a.double() @ b.double()
    tol = {torch.float32: 1e-3 if torch.backends.cuda.matmul.allow_tf32 else 1e-5}.get(dtype, 1e-2)
    assert _rel_err(out, ref) < tol
    bt = b.t().contiguous().t()  # a transposed (N, K) weight
    assert _rel_err(matmul(a, bt, variant=variant, config=config), ref) < tol


def test_the_scratch_allocator_is_installed_in_every_thread() -> None:
    """``triton.set_allocator`` sets a context variable: a thread started later (a serving framework's worker)
    would find no allocator for the device-made tensor descriptors unless the operators install it there too."""
    import threading

    from triton.runtime import _allocation

    from tilelink.ops import gemm

    gemm._install_allocator()
    seen = []

    def worker() -> None:
        gemm._install_allocator()
        seen.append(_allocation._allocator.get() is gemm._alloc_scratch)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [True]


def test_the_scratch_allocator_is_installed_in_every_context_of_a_thread() -> None:
    """A context variable is per context, not per thread: an asyncio task, or a function run in a copied context,
    made before the first install in its thread, still has no allocator, and a launch from it must install one
    there too."""
    import contextvars

    from triton.runtime import _allocation

    from tilelink.ops import gemm

    token = _allocation._allocator.set(_allocation._NULL_ALLOCATOR)
    try:
        earlier = contextvars.copy_context()  # a task's context, copied before any install
        gemm._install_allocator()
        assert _allocation._allocator.get() is gemm._alloc_scratch

        def launch() -> bool:
            gemm._install_allocator()
            return _allocation._allocator.get() is gemm._alloc_scratch

        assert earlier.run(launch)
    finally:
        _allocation._allocator.reset(token)
