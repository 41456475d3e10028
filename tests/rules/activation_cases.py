"""Rank functions for the GEMM of ``forms/gemm_rs_activation.py`` (the matmul tutorial's form: an activation under a
compile-time string), launched with and without the activation its reduce-scatter refuses."""

from __future__ import annotations

import torch
import triton

import tilelink
from tests.rules.cases import rows_of, worst
from tests.rules.forms_cases import _error, _exact, _placed, load_form

M, N, K = 50, 40, 36
SENTINEL = -7.0  # what the output shard holds before a launch: a refused launch must leave it so


def _launch(kernel, a, b, out, activation: str | None) -> None:
    extra = {} if activation is None else {"ACTIVATION": activation}
    grid = (triton.cdiv(M, 16) * triton.cdiv(N, 16),)
    kernel[grid](a, b, out, M, N, a.shape[1], a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                 out.stride(1), BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=2, **extra)


def _inputs():
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(17)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    klo, khi = rows_of(rank, world, K)  # each rank holds a slice of K: the partial sums add up to a @ b
    ar, br = _placed(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    lo, hi = rows_of(rank, world, M)
    return a, b, ar, br, lo, hi


def linear_launches(calls: int = 2) -> float:
    """This rank's largest error against torch over launches that leave ACTIVATION at its default and that pass
    ACTIVATION="" (both build without the activation)."""
    kernel = load_form("gemm_rs_activation").matmul_act
    a, b, ar, br, lo, hi = _inputs()
    err = 0.0
    for activation in (None, ""):
        for _ in range(calls):
            out = torch.full((hi - lo, N), float("nan"), dtype=ar.dtype, device=ar.device)
            _launch(kernel, ar, br, out, activation)
            err = worst(err, _error(out, (a @ b)[lo:hi]) if hi > lo else 0.0)
    return err


def refused_launch() -> dict:
    """A launch with ACTIVATION="leaky_relu" after a linear one: what it raised, whether the output shard kept its
    values, and this rank's error of a linear launch after it (the launcher refuses the call before anything of it
    runs, so the kernel stays usable)."""
    kernel = load_form("gemm_rs_activation").matmul_act
    a, b, ar, br, lo, hi = _inputs()
    out = torch.full((hi - lo, N), float("nan"), dtype=ar.dtype, device=ar.device)
    _launch(kernel, ar, br, out, "")
    out.fill_(SENTINEL)
    raised = None
    try:
        _launch(kernel, ar, br, out, "leaky_relu")
    except Exception as exc:  # noqa: BLE001 - the test reads what the launch raised
        raised = f"{type(exc).__name__}: {exc}"
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    kept = bool((out == SENTINEL).all())
    out = torch.full((hi - lo, N), float("nan"), dtype=ar.dtype, device=ar.device)
    _launch(kernel, ar, br, out, "")
    return {"raised": raised, "kept": kept, "after": _error(out, (a @ b)[lo:hi]) if hi > lo else 0.0}
