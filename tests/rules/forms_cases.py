"""Rank functions for the kernel forms of ``tests/rules/forms/`` (each a kernel of the shape upstream kernels are
written in, with only its annotation added): every one returns this rank's largest error against torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import triton

import tilelink
from tests.rules.cases import rows_of, worst
from tilelink.runtime import current_world

FORMS = Path(__file__).parent / "forms"


def _placed(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inputs where this rank computes: float32 on the CPU, float16 on a GPU (made on the CPU, so every rank
    and the reference see the same values)."""
    device = current_world().device
    if device.type != "cuda":
        return tensors
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    return tuple(t.to(device=device, dtype=torch.float16) for t in tensors)


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error against ``ref`` (float32, CPU), relative to its largest entry on a GPU (float16 inputs)."""
    err = (out.float().cpu() - ref).abs().max().item()
    return err / max(1.0, ref.abs().max().item()) if out.is_cuda else err


def _exact(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The values a GPU rank computes with (float16), as float32 on the CPU, for the reference."""
    cuda = current_world().device.type == "cuda"
    return tuple(t.half().float() if cuda else t for t in tensors)


def load_form(name: str):
    spec = importlib.util.spec_from_file_location(f"form_{name}", FORMS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attention_descriptor_advance(calls: int = 2) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("attention_descriptor_advance").attn_fwd
    SQ, SKV, D = 20, 37, 16
    g = torch.Generator().manual_seed(11)
    q, k, v = _exact(*(torch.randn(n, D, generator=g) for n in (SQ, SKV, SKV)))
    lo, hi = rows_of(rank, world, SKV)
    scale = D ** -0.5
    ref = torch.softmax(q @ k.T * scale, dim=-1) @ v
    qd, kd, vd = _placed(q, k[lo:hi].contiguous(), v[lo:hi].contiguous())
    err = 0.0
    for _ in range(calls):
        o = torch.full((SQ, D), float("nan"), dtype=qd.dtype, device=qd.device)
        kernel[(triton.cdiv(SQ, 16),)](qd, kd, vd, o, SQ, SKV, scale, HEAD_DIM=D, BLOCK_M=16, BLOCK_N=16)
        err = worst(err, _error(o, ref))
    return err


def gemm_row_wrap(calls: int = 2, form: str = "gemm_row_wrap", kernel: str = "matmul_wrap") -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = getattr(load_form(form), kernel)
    M, N, K = 50, 24, 40
    g = torch.Generator().manual_seed(12)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    lo, hi = rows_of(rank, world, M)
    ad, bd = _placed(a[lo:hi].contiguous(), b)
    err = 0.0
    for _ in range(calls):
        c = torch.full((M, N), float("nan"), dtype=ad.dtype, device=ad.device)
        kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](
            ad, bd, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
        err = worst(err, _error(c, a @ b))
    return err


def gemm_rs_epilogue_branch(calls: int = 2) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("gemm_rs_epilogue_branch").matmul_branch
    M, N, K = 50, 40, 36
    g = torch.Generator().manual_seed(13)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    klo, khi = rows_of(rank, world, K)  # each rank holds a slice of K: the partial sums add up to a @ b
    ar, br = _placed(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    lo, hi = rows_of(rank, world, M)
    err = 0.0
    for split in (True, False):
        for _ in range(calls):
            out = torch.full((hi - lo, N), float("nan"), dtype=ar.dtype, device=ar.device)
            kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](
                ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), N, 1,
                BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT_EPILOGUE=split)
            err = worst(err, _error(out, (a @ b)[lo:hi]) if hi > lo else 0.0)
    return err


def gemm_row_clamp(calls: int = 2) -> float:
    return gemm_row_wrap(calls, "gemm_row_clamp", "matmul_clamp")


def gemm_row_wrap_hints(calls: int = 2) -> float:
    return gemm_row_wrap(calls, "gemm_row_wrap_hints", "matmul_wrap_hints")


RUNS = {"attention_descriptor_advance": attention_descriptor_advance, "gemm_row_wrap": gemm_row_wrap,
        "gemm_row_wrap_hints": gemm_row_wrap_hints, "gemm_row_clamp": gemm_row_clamp,
        "gemm_rs_epilogue_branch": gemm_rs_epilogue_branch}


def run_forms(names: list[str]) -> dict[str, float | str]:
    import traceback

    out: dict[str, float | str] = {}
    for name in names:
        try:
            out[name] = RUNS[name]()
        except Exception:  # noqa: BLE001 - reported by the test
            out[name] = traceback.format_exc()
    return out
