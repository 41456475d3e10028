"""Rank functions of the prepared launches with peers (``GatherLaunch``, ``ScatterLaunch``: a kept form of call
launched again without the kernel's launch path), shared by the emulated test (``test_prepared_with_peers.py``) and
the GPU's (``tests/gpu/test_uncaptured_handshake_gpu.py``)."""

from __future__ import annotations

import torch

import tilelink
from tests.ops.tp_worlds import bounds

#: label -> (operator, persistent): the copy-engine gather, the SM pull gather, the hybrid reduce-scatter
FORMS = {"ag_gemm copy_engine": ("ag", True), "ag_gemm sm_pull": ("ag", False), "gemm_rs hybrid": ("rs", True)}


def prepared_calls_with_peers(M: int, N: int, K: int, calls: int, dtype_name: str = "float32") -> dict:
    """``ag_gemm`` (copy engine, SM pull) and ``gemm_rs`` (hybrid), ``calls`` calls each with new data, queued back to
    back and checked at the end. Returns, per form, the largest relative error against torch, how many calls took
    the kernel's launch path, and the kinds of the launches the operator prepared for its kept forms."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs, tp, tp_kernels

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    lo, hi = bounds(M, r, R)
    klo, khi = bounds(K, r, R)
    g = torch.Generator().manual_seed(29)
    out: dict = {}
    for label, (op, persistent) in FORMS.items():
        kernel = {("ag", True): tp_kernels.ag_gemm_persistent_kernel, ("ag", False): tp_kernels.ag_gemm_kernel,
                  ("rs", True): tp_kernels.gemm_rs_persistent_kernel}[(op, persistent)]
        launcher, paths = kernel.launcher, []
        launch = launcher.launch
        launcher.launch = lambda grid, bound, launch=launch, paths=paths: (paths.append(1), launch(grid, bound))[1]
        runs = []
        try:
            for _ in range(calls):
                a = torch.randn(M, K, generator=g).to(dtype)
                b = torch.randn(K, N, generator=g).to(dtype)
                ref = a.double() @ b.double()
                if op == "ag":
                    runs.append((ag_gemm(a[lo:hi].contiguous().to(device), b.to(device), TPContext(M),
                                         persistent=persistent), ref))
                else:
                    runs.append((gemm_rs(a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device),
                                         persistent=persistent), ref[lo:hi]))
        finally:
            del launcher.launch
        errors = [((c.double().cpu() - ref).norm() / ref.norm()).item() for c, ref in runs]
        plans = tp._AG_PLANS if op == "ag" else tp._RS_PLANS
        kinds = sorted({type(launch).__name__ for plan in plans.plans.values() if plan.kernel is kernel
                        for launch in plan.launches.values()})
        out[label] = (float("nan") if any(e != e for e in errors) else max(errors), len(paths), kinds)
    return out
