"""FP8 (e4m3) operands for ``ag_gemm`` and ``gemm_rs``: checks, scales, and the launch of
:mod:`tilelink.ops.tp_fp8_kernels`.

:func:`tilelink.ops.tp.ag_gemm` and :func:`~tilelink.ops.tp.gemm_rs` come here when their operands are
``torch.float8_e4m3fn`` (or a scale is passed). What the caller passes:

- ``a``/``a_shard``: (rows, K) ``float8_e4m3fn``, row-major. ``a_scale``: fp32, a scalar tensor (per-tensor:
  shape ``()`` or ``(1,)``) or one per row of ``a`` (``(rows,)`` or ``(rows, 1)``, ``torch._scaled_mm``'s
  shape). ``ag_gemm`` gathers the row scales with the rows (a per-tensor scale is sent as that value for each
  of this rank's rows, so the ranks may quantise their shards with scales of their own).
- ``b``/``b_shard``: (K, N) ``float8_e4m3fn``; best the transpose of a row-major (N, K) weight (``w.t()``, the
  layout ``torch._scaled_mm`` takes): the persistent kernels read B K-major, as Hopper's FP8 MMA needs, and copy
  a row-major B into that layout on every call. ``b_scale``: fp32, a scalar tensor or one per column of C
  (``(N,)`` or ``(1, N)``).
- ``out_dtype``: the result's dtype, ``torch.bfloat16`` (default), ``torch.float16`` or ``torch.float32``.

The product is ``(a @ b) * a_scale[row] * b_scale[col]``, accumulated in fp32 and scaled in the kernel's
epilogue. ``gemm_rs``'s scales are this rank's own: each rank scales its partial product before the
reduction, so ranks may quantise their slices of K with different scales. ``float8_e5m2`` (the gradient
format) is refused, as are fp8 operands without both scales and scales of another shape or dtype.
"""

from __future__ import annotations

import torch
import triton

from tilelink.errors import LaunchError
from tilelink.mapping import shard_range
from tilelink.ops.contract import aligned, full_size, interpreting, persistent_grid, persistent_wanted

__all__ = ["FP8", "OUT_DTYPES", "ag_gemm_fp8", "gemm_rs_fp8", "quantize_fp8", "refuse_out_dtype", "scaled_gemm",
           "wants_fp8"]

FP8 = torch.float8_e4m3fn
#: the largest finite e4m3 value
FP8_MAX = 448.0
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FP8_KINDS = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)

#: shared memory a Hopper block may allocate (bytes)
_SMEM_BYTES = 227 * 1024


def wants_fp8(a: object, b: object, a_scale: object, b_scale: object) -> bool:
    """Whether a call of ``ag_gemm``/``gemm_rs`` is an FP8 one: an 8-bit float operand or a scale."""
    return (a_scale is not None or b_scale is not None
            or any(isinstance(t, torch.Tensor) and t.dtype in _FP8_KINDS for t in (a, b)))


def refuse_out_dtype(op: str, a: torch.Tensor, out_dtype: object) -> None:
    """Refuse ``out_dtype`` on a call that is not FP8: 16- and 32-bit operands give a result of their dtype."""
    if out_dtype is not None and isinstance(a, torch.Tensor) and out_dtype != a.dtype:
        raise LaunchError(f"{op}: out_dtype={out_dtype} is for FP8 operands (float8_e4m3fn with a_scale= and "
                          f"b_scale=); {a.dtype} operands give a {a.dtype} result: cast it")


def quantize_fp8(x: torch.Tensor, rowwise: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` with ``q`` the ``float8_e4m3fn`` copy of the 2-D ``x`` and ``x ≈ q * scale``: ``scale`` one
    fp32 per row of ``x`` (``rowwise``, shape ``(rows,)``) or one for the whole tensor (shape ``()``), each the
    row's (or tensor's) largest magnitude over 448, e4m3's largest value. For B, quantise the (N, K) weight
    row-wise and pass ``q.t()`` with its scales: one per column of C."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.dtype.is_floating_point or x.dtype in _FP8_KINDS:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise LaunchError(f"quantize_fp8: x must be a 2-D floating-point tensor (not fp8 already), got {got}")
    x32 = x.float()
    if x.numel() == 0:  # no element (a rank without rows, or without columns of an uneven split): scales of 1
        amax = x32.new_full((x.shape[0],) if rowwise else (), FP8_MAX)
    else:
        amax = x32.abs().amax(dim=1) if rowwise else x32.abs().amax()
    scale = (amax / FP8_MAX).clamp(min=1e-12)
    q = (x32 / (scale[:, None] if rowwise else scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


# ------------------------------------------------------------------------------------------------
# checks


def _check_operand(op: str, what: str, t: object, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise LaunchError(f"{op}: {what} must be a 2-D torch.Tensor, got {got}")
    if t.dtype in _FP8_KINDS and t.dtype != FP8:
        raise LaunchError(f"{op}: {what} is {t.dtype}; FP8 operands must be torch.float8_e4m3fn (e4m3, the format "
                          f"of weights and activations; e5m2 is not supported): quantise with "
                          f"tilelink.ops.tp_fp8.quantize_fp8 or .to(torch.float8_e4m3fn) with its scale")
    if t.dtype != FP8:
        raise LaunchError(f"{op}: {what} is {t.dtype}, but a scale was passed or the other operand is FP8: both "
                          f"operands must be torch.float8_e4m3fn with a_scale= and b_scale=, or neither")
    if t.device.type != device.type or (t.device.index or 0) != (device.index or 0):
        raise LaunchError(f"{op}: {what} is on {t.device}, this rank computes on {device}")


def _scale(op: str, name: str, s: object, length: int, along: str, device: torch.device) -> torch.Tensor:
    """``s`` as a 1-D contiguous fp32 tensor: one element (per-tensor) or ``length`` (one per ``along``)."""
    shapes = f"a scalar tensor (shape () or (1,)), or one per {along}: shape ({length},) or " + (
        f"({length}, 1)" if name == "a_scale" else f"(1, {length})")
    if s is None:
        raise LaunchError(f"{op}: float8_e4m3fn operands need {name}=, a float32 tensor: {shapes}")
    if not isinstance(s, torch.Tensor):
        raise LaunchError(f"{op}: {name} must be a float32 torch.Tensor: {shapes}; got {type(s).__name__}")
    if s.dtype != torch.float32:
        raise LaunchError(f"{op}: {name} is {s.dtype}; pass float32 scales (.float())")
    if s.device.type != device.type or (s.device.index or 0) != (device.index or 0):
        raise LaunchError(f"{op}: {name} is on {s.device}, this rank computes on {device}")
    per_tensor = s.dim() == 0 or tuple(s.shape) == (1,)
    wide = tuple(s.shape) in ((length,), (length, 1) if name == "a_scale" else (1, length))
    if not (per_tensor or wide):
        raise LaunchError(f"{op}: {name} has shape {tuple(s.shape)}; pass {shapes}")
    return s.reshape(-1).contiguous()


def _check_out_dtype(op: str, out_dtype: object) -> torch.dtype:
    if out_dtype is None:
        return torch.bfloat16
    if out_dtype not in OUT_DTYPES:
        raise LaunchError(f"{op}: out_dtype={out_dtype!r} is not one of torch.bfloat16, torch.float16, "
                          f"torch.float32")
    return out_dtype


def _check(op: str, a, b, a_scale, b_scale, out_dtype, world, a_name: str, b_name: str):
    """The checked operands: ``(a_scale, b_scale, out_dtype)``, each scale 1-D fp32 of 1 or rows/columns."""
    _check_operand(op, a_name, a, world.device)
    _check_operand(op, b_name, b, world.device)
    if a.shape[1] != b.shape[0]:
        raise LaunchError(f"{op}: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    if not a.is_contiguous():
        raise LaunchError(f"{op}: {a_name} must be contiguous (row-major: its rows are communicated; call "
                          f".contiguous())")
    if not (b.is_contiguous() or b.t().is_contiguous()):
        raise LaunchError(f"{op}: {b_name} must be the transpose of a row-major (N, K) tensor (w.t(), fastest) or "
                          f"row-major (K, N), got strides {b.stride()}; call .contiguous()")
    a_scale = _scale(op, "a_scale", a_scale, a.shape[0], f"row of {a_name}", world.device)
    b_scale = _scale(op, "b_scale", b_scale, b.shape[1], f"column of {b_name}", world.device)
    return a_scale, b_scale, _check_out_dtype(op, out_dtype)


# ------------------------------------------------------------------------------------------------
# configuration and launch


def fp8_config(persistent: bool, part: str, out_bytes: int = 2) -> dict:
    """Tiles and pipeline of the FP8 kernels. On a GPU 128 x 256 x 128 tiles, 8 warps (BLOCK_K 128: a 128-byte K
    row of e4m3, the widest TMA swizzle), as Triton's own FP8 matmul examples take them, with as many stages as
    shared memory holds next to the staged C tile of ``out_bytes`` elements: for a 16-bit C four for the AG
    kernel, which stages C in 128-column halves, and for the pointer kernels (no staged C), three for the GEMM+RS
    one (a whole 128 x 256 C tile); an fp32 C takes a stage more of room."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2)  # a tail piece of 8 bf16 columns: 16 bytes
    bm, bn, bk = 128, 256, 128
    staged = bm * (bn // 2 if part == "ag_gemm" else bn) * out_bytes if persistent else 0  # C staging
    stages = min(4, (_SMEM_BYTES - staged) // ((bm + bn) * bk))
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=stages)


def _k_major(b: torch.Tensor, cols: int, rows: int | None = None) -> torch.Tensor:
    """B (K, N) as the transpose of a row-major (N', K') tensor, 16-byte aligned, with K' >= ``cols`` and (given
    ``rows``) N' >= ``rows`` zero-padded to 16 elements: what the persistent kernels' descriptor reads. No copy
    when ``b`` already is."""
    nk = b.t()
    if not nk.is_contiguous():
        nk = nk.contiguous()  # a row-major (K, N) B: one transposing copy per call
    nk = aligned(nk, -1, cols)
    return (nk if rows is None else aligned(nk, 0, rows)).t()


def scaled_gemm(part: str, a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                c: torch.Tensor, persistent: bool, device: torch.device):
    """``(overlapped kernel, grid, args, meta)`` of one FP8 GEMM of ``part`` ("ag_gemm" or "gemm_rs"): what the
    operators launch and what ``benchmarks.mlp`` times. ``a_scale`` is 1-D: one per row of A (the AG kernel
    takes only that), or one; ``b_scale`` 1-D: one per column of C, or one. For ``persistent``, ``b`` must be
    K-major (:func:`_k_major`)."""
    from tilelink.ops import tp_fp8_kernels
    from tilelink.ops.gemm import _install_allocator
    from tilelink.ops.tp import _compute_sms

    K = a.shape[1]
    M, N = a.shape[0] if part == "gemm_rs" else c.shape[0], c.shape[1]  # the full M: C's rows, or A's for RS
    flags = {"B_SCALE_COLS": b_scale.numel() != 1 or N == 1}
    if part == "gemm_rs":
        flags["A_SCALE_ROWS"] = a_scale.numel() != 1 or M == 1
    meta = {**fp8_config(persistent, part, c.element_size()), **flags}
    args = (a, a_scale, b, b_scale, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
            c.stride(1))
    name = f"{part}_fp8_persistent_kernel" if persistent else f"{part}_fp8_kernel"
    kernel = getattr(tp_fp8_kernels, name)
    tiles = triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])
    if not persistent:
        return kernel, (tiles,), args, meta
    if device.type == "cuda":
        _install_allocator()  # tensor descriptors made on the device need scratch memory
    grid, launch_meta = persistent_grid(tiles, _compute_sms(device, kernel), meta, tail=part == "ag_gemm")
    return kernel, grid, args, launch_meta


def _check_path(op: str, path: str) -> None:
    """FP8 calls run the overlapped kernels: ``path="auto"`` takes them, ``"plain"`` has no FP8 form."""
    if path not in ("auto", "overlap"):
        raise LaunchError(f"{op}: path={path!r} has no FP8 form (the plain path is cuBLAS on 16- and 32-bit "
                          f"operands): pass path='overlap' or 'auto', which run the FP8 kernels")


def ag_gemm_fp8(a_shard, b, ctx, a_scale, b_scale, out_dtype, persistent: bool | None,
                path: str = "auto") -> torch.Tensor:
    """:func:`tilelink.ops.tp.ag_gemm` on FP8 operands (see the module's docstring)."""
    from tilelink.ops.tp import _check_shard_rows
    from tilelink.runtime import current_world

    _check_path("ag_gemm", path)
    world = current_world()
    a_scale, b_scale, out_dtype = _check(
        "ag_gemm", a_shard, b, a_scale, b_scale, out_dtype, world, "a_shard", "b")
    if ctx is not None and (not isinstance(ctx.M, int) or isinstance(ctx.M, bool) or ctx.M < 0):
        raise LaunchError(f"ag_gemm: TPContext.M={ctx.M!r} must be a non-negative int (the rows of the full A)")
    M = full_size(a_shard, 0, ctx.M if ctx is not None else None, world, op="ag_gemm")
    _check_shard_rows(a_shard.shape[0], M, world, ctx)
    K, N = b.shape
    if M == 0:
        return torch.empty((0, N), dtype=out_dtype, device=world.device)
    if K == 0:  # every rank has K == 0 (the ranks share K): nothing to gather
        return torch.zeros((M, N), dtype=out_dtype, device=world.device)
    rows = a_shard.shape[0]
    if a_scale.numel() != rows:  # per-tensor: the value for each row, gathered with the rows
        a_scale = a_scale.expand(rows).contiguous()
    elif a_scale.data_ptr() % 16:  # the persistent kernel reads it by descriptor (a world of one: the tensor itself)
        a_scale = a_scale.clone()
    # decided from K, which every rank shares (e4m3 rows of 16-byte multiples), never from this rank's N
    persistent = persistent_wanted(world.device, persistent) and K % 16 == 0
    if persistent:  # N is this rank's own: pad B's columns (zero columns, scale zero) rather than choose by it
        b_run = _k_major(b, K, N)
    else:  # with N == 0 this rank still takes part in the gather the others wait for, on one dummy column
        b_run = b if N else b.new_zeros((K, 1))
    n_run = b_run.shape[1]
    if b_scale.numel() != 1 and n_run != N:
        b_scale = torch.cat([b_scale, b_scale.new_zeros(n_run - N)])
    c = torch.empty((M, n_run), dtype=out_dtype, device=world.device)
    kernel, grid, args, meta = scaled_gemm("ag_gemm", a_shard, a_scale, b_run, b_scale, c, persistent, world.device)
    kernel[grid](*args, **meta)
    return c if n_run == N else c[:, :N].contiguous()


def gemm_rs_fp8(a, b_shard, a_scale, b_scale, out_dtype, persistent: bool | None, path: str = "auto") -> torch.Tensor:
    """:func:`tilelink.ops.tp.gemm_rs` on FP8 operands (see the module's docstring)."""
    from tilelink.runtime import current_world

    _check_path("gemm_rs", path)
    world = current_world()
    a_scale, b_scale, out_dtype = _check("gemm_rs", a, b_shard, a_scale, b_scale, out_dtype, world, "a", "b_shard")
    M, K = a.shape
    N = b_shard.shape[1]
    lo, hi = shard_range(M, world.rank, world.world_size)
    out = torch.empty((hi - lo, N), dtype=out_dtype, device=world.device)
    if M == 0 or N == 0:
        return out
    if K == 0:  # this rank contributes nothing: a zero slice still takes part in the reduction
        a = torch.zeros((M, 1), dtype=FP8, device=world.device)
        b_shard = torch.zeros((1, N), dtype=FP8, device=world.device)
        K = 1
    # decided from N and the out dtype, which every rank shares (C's rows are 16-byte multiples)
    persistent = persistent_wanted(world.device, persistent) and (N * out_dtype.itemsize) % 16 == 0
    if persistent:  # K is this rank's own: zero columns of A and rows of B add nothing
        a = aligned(a, -1)
        b_shard = _k_major(b_shard, a.shape[1])
    kernel, grid, args, meta = scaled_gemm("gemm_rs", a, a_scale, b_shard, b_scale, out, persistent, world.device)
    kernel[grid](*args, **meta)
    return out
