"""Host wrappers of the plain GEMM and SiLU·mul kernels: ``matmul(a, b)`` and ``silu_mul(x)``.

On the GPU the GEMM kernels are autotuned over Hopper configurations keyed on (M, N, K) and the
dtypes; under ``TRITON_INTERPRET=1`` (CPU tensors) one small fixed configuration runs instead, so
that tests see several tiles and a ragged K loop even on small shapes.

Variants (``variant=``):

- ``"pointer"``: :func:`tilelink.ops.gemm_kernels.matmul_kernel`, pointer arithmetic, any strides.
  The kernel the overlapped operators are annotated from.
- ``"descriptor"``: tensor descriptors (TMA), one program per tile.
- ``"persistent"``: tensor descriptors, one program per SM.
- ``"persistent_ws"``: ``"persistent"`` with ``tl.range(..., warp_specialize=True)`` (no loop
  flattening).
- ``"auto"``: the fastest on the paper's per-rank MLP shapes (on an H200) where the layout
  allows it (descriptors need unit last strides and 16-byte aligned rows), else ``"pointer"``.
"""

from __future__ import annotations

import functools
import importlib

import torch
import triton
import triton.testing

from tilelink.errors import LaunchError
from tilelink.ops import gemm_kernels
from tilelink.ops.contract import DTYPES, descriptor_ready, interpreting

__all__ = ["matmul", "silu_mul", "VARIANTS", "HOPPER_CONFIGS"]

VARIANTS = ("auto", "pointer", "descriptor", "persistent", "persistent_ws")
# On an H200, persistent_ws had the best worst case on the per-rank MLP shapes (0.95 of cuBLAS).
_AUTO_VARIANT = "persistent_ws"
_SMEM_BYTES = 227 * 1024  # Hopper's largest shared-memory allocation per block


def _config(bm: int, bn: int, bk: int, stages: int, warps: int, group_m: int = 8) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
                         num_stages=stages, num_warps=warps)


# Hopper (H100/H200) candidates. 16-bit inputs: 128x256 and 256x128 tiles keep two warpgroups busy on
# wgmma, 128x128 suits narrow N; BLOCK_K = 64 makes a 128-byte K row (the widest TMA swizzle). fp32
# inputs: the same with BLOCK_K = 32 (the 128-byte row again, and the stages still fit).
HOPPER_CONFIGS = [
    _config(128, 256, 64, 3, 8),
    _config(128, 256, 64, 4, 8),
    _config(256, 128, 64, 3, 8),
    _config(128, 128, 64, 4, 8),
    _config(128, 128, 64, 4, 4),
    _config(128, 256, 32, 3, 8),
    _config(128, 128, 32, 4, 8),
    _config(128, 128, 32, 3, 4),
]

# Under the interpreter: small tiles so that 50x24x40 already spans several tiles and K steps.
_INTERPRET_META = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}


def _prune_configs(configs, named_args, *, epilogue_in_smem: bool, **kwargs):
    """Keep the configurations whose K row is 128 bytes and whose buffers fit in shared memory.

    The pipelined A and B tiles take ``stages * (BLOCK_M + BLOCK_N) * BLOCK_K`` elements; the
    descriptor kernels also stage the C tile for its TMA store.
    """
    size = named_args["a_ptr"].element_size()
    out_size = named_args["c_ptr"].element_size()

    def smem(c) -> int:
        bm, bn, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        return c.num_stages * (bm + bn) * bk * size + (bm * bn * out_size if epilogue_in_smem else 0)

    fits = [c for c in configs if c.kwargs["BLOCK_K"] * size == 128 and smem(c) <= _SMEM_BYTES]
    return fits or [min(configs, key=smem)]




_KERNELS = {
    "pointer": gemm_kernels.matmul_kernel,
    "descriptor": gemm_kernels.matmul_kernel_descriptor,
    "persistent": gemm_kernels.matmul_kernel_descriptor_persistent,
    "persistent_ws": gemm_kernels.matmul_kernel_descriptor_persistent,
}


@functools.cache
def _autotuned(variant: str):
    prune = functools.partial(_prune_configs, epilogue_in_smem=variant != "pointer")
    return triton.autotune(configs=HOPPER_CONFIGS, key=["M", "N", "K"], do_bench=_tuning_bench,
                           prune_configs_by={"early_config_prune": prune})(_KERNELS[variant])


def _tuning_bench(fn, quantiles):
    # Shorter than do_bench's defaults: the candidates differ by far more than this run-to-run noise.
    return triton.testing.do_bench(fn, warmup=10, rep=50, quantiles=quantiles)


def _alloc_scratch(size: int, alignment: int, stream):
    """Global scratch memory of a launch (tensor descriptors made on the device keep their TMA descriptors there):
    one buffer per device and stream, grown when a launch asks more, in place of an allocation per launch (host
    time of every call). The kernels of one stream run one after the other, so a launch reuses the memory of the
    one before it as torch's allocator would reuse a buffer freed on that stream. While a stream captures a CUDA
    graph each launch gets its own, from the graph's pool."""
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(size, dtype=torch.int8, device="cuda")
    key = (torch.cuda.current_device(), stream)
    buffer = _SCRATCH.get(key)
    if buffer is None or buffer.numel() < size:
        from tilelink.runtime import graphs

        with graphs.kept(torch.device("cuda", key[0])):
            buffer = _SCRATCH[key] = torch.empty(size, dtype=torch.int8, device="cuda")
    return buffer


#: (device, stream) -> the scratch buffer of its launches (_alloc_scratch)
_SCRATCH: dict[tuple, torch.Tensor] = {}


def _install_allocator() -> None:
    """Give Triton the scratch allocator in the caller's context: ``triton.set_allocator`` sets a context variable,
    which a thread started later (a serving framework's worker) does not inherit, and which an asyncio task, or a
    function run in a copied context, made before the first install in its thread does not see either; so the
    variable itself is read at each launch, not a flag of the thread's."""
    if _ALLOCATOR is None or _ALLOCATOR.get() is not _alloc_scratch:
        triton.set_allocator(_alloc_scratch)


#: Triton's context variable of the scratch allocator (None where a release keeps it elsewhere: then it is set at
#: every launch)
_ALLOCATOR = getattr(importlib.import_module("triton.runtime._allocation"), "_allocator", None)
if not hasattr(_ALLOCATOR, "get"):
    _ALLOCATOR = None


def _descriptor_ok(*tensors: torch.Tensor) -> bool:
    """TMA needs a unit last stride, 16-byte aligned row strides and a 16-byte aligned base."""
    return all(descriptor_ready(t) for t in tensors)


def _check(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, variant: str) -> None:
    if variant not in VARIANTS:
        raise LaunchError(f"matmul: unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise LaunchError(f"matmul: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise LaunchError(f"matmul: {name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise LaunchError(f"matmul: {name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
    if a.shape[1] != b.shape[0]:
        raise LaunchError(f"matmul: inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} "
                          f"(a.shape[1] must equal b.shape[0])")
    if a.dtype != b.dtype:
        raise LaunchError(f"matmul: a is {a.dtype} but b is {b.dtype}; cast one so that both match")
    if a.device != b.device:
        raise LaunchError(f"matmul: a is on {a.device} but b is on {b.device}; move both to one device")
    if a.device.type == "cpu" and not interpreting():
        raise LaunchError("matmul: CPU tensors run only under the Triton interpreter; set TRITON_INTERPRET=1 "
                          "before importing triton, or move the tensors to a CUDA device")
    if a.device.type not in ("cpu", "cuda"):
        raise LaunchError(f"matmul: tensors on {a.device.type} are not supported; use CUDA (or CPU under "
                          f"TRITON_INTERPRET=1)")
    # The overlapped operators gather/scatter whole rows of A and C, so these are row-major; B may be
    # row-major or the transpose of a row-major (N, K) weight.
    if a.numel() and a.stride(1) != 1 and a.shape[1] > 1:
        raise LaunchError(f"matmul: a must be row-major (stride(1) == 1), got strides {a.stride()}; "
                          f"call .contiguous()")
    if b.numel() and b.stride(1) != 1 and b.stride(0) != 1:
        raise LaunchError(f"matmul: b must be row-major or the transpose of a row-major tensor, got strides "
                          f"{b.stride()}; call .contiguous()")
    if out is not None:
        M, N = a.shape[0], b.shape[1]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N):
            raise LaunchError(f"matmul: out must be a tensor of shape {(M, N)}")
        if out.dtype not in DTYPES or out.device != a.device:
            raise LaunchError(f"matmul: out must be float16/bfloat16/float32 on {a.device}, got {out.dtype} "
                              f"on {out.device}")
        if out.numel() and out.stride(1) != 1:
            raise LaunchError(f"matmul: out must be row-major, got strides {out.stride()}")


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
           variant: str = "auto", config: triton.Config | None = None) -> torch.Tensor:
    """Return ``a @ b`` computed by a TileLink plain Triton GEMM.

    Args:
        a: (M, K), row-major, float16 / bfloat16 / float32.
        b: (K, N), same dtype and device as ``a``; row-major or a transposed row-major (N, K) weight.
        out: optional (M, N) row-major output; its dtype is the result's (default ``a.dtype``).
        variant: one of :data:`VARIANTS` (see the module docstring).
        config: a fixed ``triton.Config`` (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages) instead
            of autotuning, e.g. one of :data:`HOPPER_CONFIGS`.

    fp32 inputs use tf32 tensor cores when ``torch.backends.cuda.matmul.allow_tf32`` is set, and
    full-precision dots otherwise, as ``torch.matmul`` does.

    Raises:
        tilelink.LaunchError: a bad shape, dtype, device, layout or variant, before anything runs.
    """
    _check(a, b, out, variant)
    M, K = a.shape
    N = b.shape[1]
    c = out if out is not None else torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    precision = "ieee"
    if a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        precision = "tf32"
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))

    if interpreting():
        # One fixed configuration; the interpreter needs no tuning and runs the pointer kernel the
        # overlapped operators are written from. Triton 3.9's interpreter computes tl.dot of bf16
        # operands wrongly (numpy has no bf16), so bf16 inputs go in as fp32: bf16 products are exact
        # in fp32, so the result is the same up to summation order.
        if a.dtype == torch.bfloat16:
            a32, b32 = a.float(), b.float()
            args = (a32, b32, *args[2:6], a32.stride(0), a32.stride(1), b32.stride(0), b32.stride(1),
                    *args[10:])
            precision = "ieee"
        meta = _INTERPRET_META
        grid = (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
        gemm_kernels.matmul_kernel[grid](*args, **meta, DOT_PRECISION=precision)
        return c

    if variant == "auto":
        variant = _AUTO_VARIANT
    if variant in ("descriptor", "persistent", "persistent_ws") and not _descriptor_ok(a, b, c):
        variant = "pointer"  # a transposed B or unaligned rows: TMA cannot describe them
    if config is None:
        kernel, meta = _autotuned(variant), {}
    else:
        kernel = _KERNELS[variant]
        meta = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    if variant != "pointer":
        _install_allocator()
    if variant in ("pointer", "descriptor"):
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
        kernel[grid](*args, DOT_PRECISION=precision, **meta)
        return c
    num_sms = _num_sms(a.device.index if a.device.index is not None else torch.cuda.current_device())
    grid = lambda meta: (min(num_sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)
    if variant == "persistent_ws":
        meta.update(FLATTEN=False, WARP_SPECIALIZE=True)
    kernel[grid](*args, NUM_SMS=num_sms, DOT_PRECISION=precision, **meta)
    return c


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def silu_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Return ``silu(x[:, :n]) * x[:, n:]`` for ``x`` of shape (M, 2n): the MLP's gate·up activation.

    Raises:
        tilelink.LaunchError: ``x`` not 2-D, an odd number of columns, an unsupported dtype or device.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] % 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise LaunchError(f"silu_mul: x must be 2-D with an even number of columns (gate | up), got {shape}")
    if x.dtype not in DTYPES:
        raise LaunchError(f"silu_mul: x has dtype {x.dtype}; supported: float16, bfloat16, float32")
    if x.device.type == "cpu" and not interpreting():
        raise LaunchError("silu_mul: CPU tensors run only under TRITON_INTERPRET=1")
    M, N = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != (M, N) or out.device != x.device:
        raise LaunchError(f"silu_mul: out must have shape {(M, N)} on {x.device}")
    if M == 0 or N == 0:
        return out
    block_m, block_n = (16, 16) if interpreting() else (32, 128)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    from tilelink.runtime import graphs

    # a step of an emulated graph being captured, run again on each replay (a CUDA graph replays the kernel; the
    # interpreter's run is no tensor operation the emulated capture would record); otherwise launched now
    graphs.enqueue(lambda: gemm_kernels.silu_mul_kernel[grid](
        x, out, M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=4))
    return out
