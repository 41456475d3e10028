"""Rank functions of the ``path=`` tests (run in spawned emulated worlds; imported by name)."""

from __future__ import annotations

import logging

import torch

import tilelink
import tilelink.runtime


def _bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per)


def plain_matches_torch(M: int, N: int, K: int, dtype_name: str) -> dict[str, float]:
    """ag_gemm and gemm_rs on the plain path (uneven row shards; gemm_rs with this rank's own slice of K)
    against a float64 reference; the overlapped kernels must not run."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs, tp

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(11)
    a = torch.randn(M, K, generator=g).to(dtype)
    b = torch.randn(K, N, generator=g).to(dtype)
    ref = a.double() @ b.double()
    device = tilelink.runtime.current_world().device
    a, b, ref = a.to(device), b.to(device), ref.to(device)
    lo, hi = _bounds(M, r, R)
    klo, khi = _bounds(K, r, R)
    out = {}
    launched = []
    real_start = tp._start  # where ag_gemm and gemm_rs launch every overlapped GEMM
    tp._start = lambda plan, *args, **kwargs: launched.append(plan.kernel) or real_start(plan, *args, **kwargs)
    try:
        for label, ctx in (("ag_gemm", None), ("ag_gemm_ctx", TPContext(M))):
            c = ag_gemm(a[lo:hi].contiguous(), b, ctx, path="plain")
            assert c.dtype == dtype and c.shape == (M, N), (c.dtype, c.shape)
            out[label] = ((c.double() - ref).norm() / ref.norm()).item()
        y = gemm_rs(a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), path="plain")
        assert y.dtype == dtype and y.shape == (hi - lo, N), (y.dtype, y.shape)
        out["gemm_rs"] = ((y.double() - ref[lo:hi]).norm() / ref[lo:hi].norm()).item() if hi > lo else 0.0
    finally:
        tp._start = real_start
    assert not launched, f"the plain path launched an overlapped kernel: {launched}"
    return out


class _Paths(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def chosen_paths(M: int, N: int, K: int, path: str = "auto") -> dict:
    """The paths ag_gemm and gemm_rs took for an fp32 (M, N, K) product (from the ``tilelink`` debug log),
    their results' errors against torch, and whether the plain path ran (it is replaced here by one that
    counts its calls)."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs, plain

    r, R = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(5)
    device = tilelink.runtime.current_world().device
    a = torch.randn(M, K, generator=g).to(device)
    b = torch.randn(K, N, generator=g).to(device)
    ref = a.double() @ b.double()
    lo, hi = _bounds(M, r, R)
    klo, khi = _bounds(K, r, R)
    nlo, nhi = _bounds(N, r, R)  # ag_gemm: each rank its own columns of B (uneven N)
    handler = _Paths()
    logger = logging.getLogger("tilelink")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    plain_calls = []
    real = plain.ag_gemm, plain.gemm_rs
    plain.ag_gemm = lambda *args: plain_calls.append("ag_gemm") or real[0](*args)
    plain.gemm_rs = lambda *args: plain_calls.append("gemm_rs") or real[1](*args)
    try:
        c = ag_gemm(a[lo:hi].contiguous(), b[:, nlo:nhi].contiguous(), TPContext(M), path=path)
        y = gemm_rs(a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), path=path)
    finally:
        plain.ag_gemm, plain.gemm_rs = real
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    err_ag = ((c.double() - ref[:, nlo:nhi]).norm() / max(ref[:, nlo:nhi].norm(), 1e-30)).item() if nhi > nlo else 0.0
    err_rs = ((y.double() - ref[lo:hi]).norm() / ref[lo:hi].norm()).item() if hi > lo else 0.0
    return {"log": handler.lines, "plain_calls": plain_calls, "errors": (err_ag, err_rs)}


def attention_plain_matches_sdpa(B: int, H: int, Hkv: int, S: int, D: int, dtype_name: str) -> dict[str, float]:
    """sp_attention on the plain path (K and V gathered, then SDPA), causal and not, against SDPA on the full
    sequence; the overlapped kernel must not run."""
    from tests.ops.attention_worlds import bounds, inputs, reference
    from tilelink.ops import attention, sp_attention

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    q, k, v = inputs(B, H, Hkv, S, D, dtype, tilelink.runtime.current_world().device)
    lo, hi = bounds(S, r, R)
    real_launch = attention._launch
    attention._launch = lambda *args, **kwargs: (_ for _ in ()).throw(AssertionError("the kernel ran"))
    out = {}
    try:
        for causal in (False, True):
            o = sp_attention(q[:, :, lo:hi].contiguous(), k[:, :, lo:hi].contiguous(), v[:, :, lo:hi].contiguous(),
                             causal=causal, path="plain")
            assert o.dtype == dtype and o.shape == (B, H, hi - lo, D), (o.dtype, o.shape)
            ref = reference(q, k, v, causal)[:, :, lo:hi]
            out[f"causal={causal}"] = ((o.double().cpu() - ref).norm() / ref.norm()).item() if hi > lo else 0.0
    finally:
        attention._launch = real_launch
    return out


def plain_gemm_ar_matches_torch(M: int, N: int, K: int, dtype_name: str) -> float:
    """``gemm_ar(..., path="plain")`` on this rank's slice of K: it runs the plain GEMM + all-reduce
    (``tilelink.ops.plain.gemm_ar``, counted here) and matches torch."""
    from tilelink.ops import gemm_ar, plain

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    world = tilelink.runtime.current_world()
    g = torch.Generator().manual_seed(3)
    a = torch.randn(M, K, generator=g).to(dtype).to(world.device)
    b = torch.randn(K, N, generator=g).to(dtype).to(world.device)
    ref = a.double() @ b.double()
    klo, khi = _bounds(K, r, R)
    calls, real = [], plain.gemm_ar
    plain.gemm_ar = lambda *args: calls.append(1) or real(*args)
    try:
        c = gemm_ar(a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), path="plain")
    finally:
        plain.gemm_ar = real
    assert calls == [1], calls
    assert c.dtype == dtype and c.shape == (M, N), (c.dtype, c.shape)
    return ((c.double() - ref).norm() / ref.norm()).item()


def moe_plain_matches_torch(M: int, H: int, inter: int, E: int, top_k: int, dtype_name: str) -> dict[str, float]:
    """ag_moe and moe_rs on the plain path, each rank its slice of every expert's intermediate dim, against torch;
    no overlapped kernel runs (none of their contexts is made)."""
    from tests.ops.moe_worlds import routing
    from tilelink.ops import ag_moe, moe_kernels, moe_rs

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, H, generator=g)
    w_up = torch.randn(E, H, inter, generator=g) / H**0.5
    w_down = torch.randn(E, inter, H, generator=g) / inter**0.5
    ilo, ihi = _bounds(inter, r, R)
    lo, hi = _bounds(M, r, R)
    topk_ids = routing(M, E, top_k, "skewed", g)
    weights = torch.rand(M, top_k, generator=g)
    h = torch.randn(M * top_k, inter, generator=g)
    up = ag_moe(x[lo:hi].contiguous().to(dtype).to(device), w_up[:, :, ilo:ihi].contiguous().to(dtype).to(device),
                topk_ids.to(device), path="plain")
    y = moe_rs(h[:, ilo:ihi].contiguous().to(dtype).to(device), w_down[:, ilo:ihi].contiguous().to(dtype).to(device),
               topk_ids.to(device), weights.to(device), path="plain")
    assert up.shape == (M * top_k, ihi - ilo) and up.dtype == dtype and y.shape == (hi - lo, H) and y.dtype == dtype
    ref_up = torch.einsum("sh,shi->si", x.double().repeat_interleave(top_k, 0),
                          w_up.double()[topk_ids.flatten()])[:, ilo:ihi]
    per_slot = torch.einsum("si,sih->sh", h.double(), w_down.double()[topk_ids.flatten()])
    ref_y = (per_slot * weights.double().flatten()[:, None]).view(M, top_k, H).sum(1)[lo:hi]
    kernels = (moe_kernels.ag_group_gemm_kernel, moe_kernels.ag_group_gemm_persistent_kernel,
               moe_kernels.group_gemm_rs_kernel, moe_kernels.group_gemm_rs_sweep_kernel)
    assert not any(k.launcher.contexts for k in kernels), "an overlapped MoE kernel ran on the plain path"
    rel = lambda a, b: ((a.double().cpu() - b).norm() / max(b.norm().item(), 1e-30)).item()  # noqa: E731
    return {"ag_moe": rel(up, ref_up), "moe_rs": rel(y, ref_y) if hi > lo else 0.0}


def setting_on_one_rank() -> str:
    """gemm_rs with path="auto" where rank 0 alone has TILELINK_PATH=plain: the error each rank raises."""
    import os

    from tilelink.ops import gemm_rs

    r, R = tilelink.rank(), tilelink.world_size()
    if r == 0:
        os.environ["TILELINK_PATH"] = "plain"
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(7, 12, generator=g).to(device), torch.randn(12, 8, generator=g).to(device)
    klo, khi = _bounds(12, r, R)
    try:
        gemm_rs(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    except Exception as exc:  # noqa: BLE001 - the test reads it
        return f"{type(exc).__name__}: {exc}"
    finally:
        os.environ.pop("TILELINK_PATH", None)
    return "no error"
