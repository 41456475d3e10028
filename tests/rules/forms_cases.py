"""Rank functions for the kernel forms of ``tests/rules/forms/`` (each a kernel of the shape upstream kernels are
written in, with only its annotation added): every one returns this rank's largest error against torch."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import torch
import triton
import triton.language as tl

import tilelink
from tests.rules.cases import module_at, rows_of, worst
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


def attention_helper_inner(calls: int = 2) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("attention_helper_inner").attn_fwd
    SKV, D = 37, 16
    g = torch.Generator().manual_seed(14)
    q, k, v = _exact(*(torch.randn(n, D, generator=g) for n in (SKV, SKV, SKV)))
    lo, hi = rows_of(rank, world, SKV)
    scale = D ** -0.5
    causal = torch.ones(SKV, SKV).tril().bool()
    refs = {1: torch.softmax(q @ k.T * scale, dim=-1) @ v,
            3: torch.softmax((q @ k.T * scale).masked_fill(~causal, float("-inf")), dim=-1) @ v}
    qd, kd, vd = _placed(q, k[lo:hi].contiguous(), v[lo:hi].contiguous())
    err = 0.0
    for stage, ref in refs.items():  # 1: every key; 3: causal, the blocks left of the diagonal then the diagonal
        for _ in range(calls):
            o = torch.full((SKV, D), float("nan"), dtype=qd.dtype, device=qd.device)
            kernel[(triton.cdiv(SKV, 16),)](scale, qd, kd, vd, o, SKV, SKV, HEAD_DIM=D, BLOCK_M=16, BLOCK_N=16,
                                            STAGE=stage)
            err = worst(err, _error(o, ref))
    return err


def attention_stages_tile(calls: int = 2) -> float:
    """Every query row against the whole sequence of keys, heads (H, S, D); K and V sharded along S."""
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("attention_stages_tile").attn_fwd
    H, S, D = 2, 37, 16
    g = torch.Generator().manual_seed(16)
    q, k, v = _exact(*(torch.randn(H, S, D, generator=g) for _ in range(3)))
    lo, hi = rows_of(rank, world, S)
    scale = D ** -0.5
    qd, kd, vd = _placed(q, k[:, lo:hi].contiguous(), v[:, lo:hi].contiguous())
    err = 0.0
    for causal in (False, True):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        for _ in range(calls):
            o = torch.full((H, S, D), float("nan"), dtype=qd.dtype, device=qd.device)
            # the full tensor's strides: the rewritten kernel reads the gathered (H, S, D) buffer
            kernel[(triton.cdiv(S, 16), H)](qd, kd, vd, o, scale, S * D, D, S * D, D, S * D, D, S * D, D, S,
                                            BLOCK_M=16, BLOCK_N=16, HEAD_DIM=D, IS_CAUSAL=causal)
            err = worst(err, _error(o, ref))
    return err


def moe_rs_expert_zeros(calls: int = 2) -> float:
    """Expert parallel: each rank holds a run of the experts (the ids of the others map to -1) and the full
    intermediate activations; the blocks of another rank's expert store zeros."""
    from tilelink.ops.moe_routing import align_tokens

    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("moe_rs_expert_zeros").fused_moe_kernel
    M, I, H, E, topk, BM = 27, 40, 24, 5, 2, 16
    g = torch.Generator().manual_seed(15)
    h, w = _exact(torch.randn(M * topk, I, generator=g), torch.randn(E, I, H, generator=g))
    topk_ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)])
    topk_ids[:5] = torch.tensor([0, 1])  # experts 0 and 1 busier
    weights = torch.rand(M, topk, generator=g)
    # the routing kernels run where the world's tensors live (the GPU under NVSHMEM)
    sorted_ids, expert_ids = (t.cpu() for t in align_tokens(topk_ids.to(current_world().device), E, BM))
    elo, ehi = rows_of(rank, world, E)
    local = torch.where((expert_ids >= elo) & (expert_ids < ehi), expert_ids - elo, -1).to(expert_ids.dtype)
    lo, hi = rows_of(rank, world, M)
    per_slot = torch.einsum("si,sih->sh", h, w[topk_ids.flatten()]) * weights.flatten()[:, None]
    ref = per_slot.view(M, topk, H).sum(1)[lo:hi]
    hd, wd, wts = _placed(h, w[elo:ehi].contiguous(), weights.flatten().contiguous())
    device = hd.device
    sorted_d, local_d = sorted_ids.to(device), local.to(device)
    compute_type = tl.float16 if hd.dtype == torch.float16 else tl.float32
    EM = sorted_ids.numel()
    err = 0.0
    for _ in range(calls):
        y = torch.full((hi - lo, H), float("nan"), dtype=hd.dtype, device=device)
        kernel[(triton.cdiv(EM, BM) * triton.cdiv(H, 16),)](
            hd, wd, y, wts, sorted_d, local_d, H, I, EM, M * topk, topk, I, 1, I * H, H, 1, H, 1,
            BLOCK_SIZE_M=BM, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, compute_type=compute_type)
        err = worst(err, _error(y, ref) if hi > lo else 0.0)
    return err


def attention_flat_heads(calls: int = 2) -> float:
    """Flat (Z * H * S, D) matrices; each rank passes its rows [lo, hi) of S of every head as the (Z * H, hi - lo,
    D) view of its flat shard."""
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("attention_flat_heads").attn_fwd_flat
    Z, H, SQ, S, D = 2, 3, 11, 37, 16
    g = torch.Generator().manual_seed(16)
    q, k, v = _exact(torch.randn(Z * H, SQ, D, generator=g), torch.randn(Z * H, S, D, generator=g),
                     torch.randn(Z * H, S, D, generator=g))
    lo, hi = rows_of(rank, world, S)
    scale = D ** -0.5
    ref = (torch.softmax(q @ k.transpose(1, 2) * scale, dim=-1) @ v).reshape(Z * H * SQ, D)
    # each rank's shard is flat, (Z * H * (hi - lo), D), as the rank's part of a flat K would be
    qd, kd, vd = _placed(q.reshape(Z * H * SQ, D), k[:, lo:hi].reshape(-1, D), v[:, lo:hi].reshape(-1, D))
    err = 0.0
    for _ in range(calls):
        o = torch.full((Z * H * SQ, D), float("nan"), dtype=qd.dtype, device=qd.device)
        kernel[(triton.cdiv(SQ, 16), Z * H)](qd, kd.view(Z * H, hi - lo, D), vd.view(Z * H, hi - lo, D), o, scale,
                                             SQ, S, D, D, D, D, HEAD_DIM=D, BLOCK_M=16, BLOCK_N=16)
        err = worst(err, _error(o, ref))
    return err


def attention_batched_rows(calls: int = 2) -> float:
    """Flat (Z * H * S, D) matrices in the tutorial's layout; each rank passes a run of the flat rows of K and V
    (a head's keys may lie on two ranks)."""
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("attention_batched_rows").attn_fwd_batched
    Z, H, S, D = 1, 3, 48, 16  # S a multiple of the query block, as the tutorial asks
    g = torch.Generator().manual_seed(18)
    q, k, v = _exact(*(torch.randn(Z * H, S, D, generator=g) for _ in range(3)))
    lo, hi = rows_of(rank, world, Z * H * S)
    scale = D ** -0.5
    ref = (torch.softmax(q @ k.transpose(1, 2) * scale, dim=-1) @ v).reshape(Z * H * S, D)
    qd, kd, vd = _placed(q.reshape(-1, D), k.reshape(-1, D)[lo:hi].contiguous(), v.reshape(-1, D)[lo:hi].contiguous())
    err = 0.0
    for _ in range(calls):
        o = torch.full((Z * H * S, D), float("nan"), dtype=qd.dtype, device=qd.device)
        kernel[(triton.cdiv(S, 16), Z * H)](scale, Z, H, qd, kd, vd, o, S, HEAD_DIM=D, BLOCK_M=16, BLOCK_N=16)
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


def _row_scaled(seed: int):
    """A GEMM's operands with a scale per row of A and per column of B, and this rank's rows of A."""
    M, N, K = 45, 24, 40
    g = torch.Generator().manual_seed(seed)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    scale_a, scale_b = torch.rand(M, generator=g) + 0.5, torch.rand(N, generator=g) + 0.5
    return (M, N, K), (a, b), (scale_a, scale_b), rows_of(tilelink.rank(), tilelink.world_size(), M)


def gemm_row_scales(calls: int = 2) -> float:
    kernel = load_form("gemm_row_scales").matmul_row_scales
    (M, N, K), (a, b), (scale, _), (lo, hi) = _row_scaled(17)
    ad, sd, bd = _placed(a[lo:hi].contiguous(), scale[lo:hi].contiguous(), b)
    err = 0.0
    for _ in range(calls):
        c = torch.full((M, N), float("nan"), dtype=ad.dtype, device=ad.device)
        kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](
            ad, sd, bd, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        err = worst(err, _error(c, (a @ b) * scale[:, None]))
    return err


def gemm_scale_blocks(calls: int = 2) -> float:
    kernel = load_form("gemm_scale_blocks").scaled_matmul
    (M, N, K), (a, b), (scale_a, scale_b), (lo, hi) = _row_scaled(19)
    ad, sd, bd, sbd = _placed(a[lo:hi].contiguous(), scale_a[lo:hi].contiguous(), b, scale_b)
    err = 0.0
    for _ in range(calls):
        c = torch.full((M, N), float("nan"), dtype=ad.dtype, device=ad.device)
        kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](
            ad, bd, sd, sbd, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
            c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        err = worst(err, _error(c, (a @ b) * scale_a[:, None] * scale_b[None, :]))
    return err


def block_scaled(rank: int, world: int, M: int = 45, N: int = 32, K: int = 64, group: int = 16,
                 scale_columns: int | None = None):
    """The block-scaled GEMM's inputs and its call on this rank's rows of A and of its scales: ``(call, reference)``,
    ``call(c)`` launching it into ``c``; ``scale_columns`` scale columns of A passed in place of ``K / group``."""
    kernel = load_form("gemm_block_scales").block_scaled_matmul
    g = torch.Generator().manual_seed(29)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(N, K, generator=g))
    a_s, b_s = _exact(torch.rand(M, K // group, generator=g) + 0.5, torch.rand(N // group, K // group, generator=g)
                      + 0.5)
    reference = (a * a_s.repeat_interleave(group, 1)) @ (b * b_s.repeat_interleave(group, 0).repeat_interleave(
        group, 1)).T
    lo, hi = rows_of(rank, world, M)
    a_s = a_s[:, :scale_columns] if scale_columns is not None else a_s
    ad, asd, bd, bsd = _placed(a[lo:hi].contiguous(), a_s[lo:hi].contiguous(), b, b_s)

    def call(c: torch.Tensor) -> None:
        grid = (triton.cdiv(M, 16) * triton.cdiv(N, 16),)
        kernel[grid](ad, bd, c, asd, bsd, M, N, K, group, group, K, 1, 1, K, N, 1, asd.shape[1], 1, 1, K // group,
                     BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)

    return call, reference, ad


def gemm_block_scales(calls: int = 2) -> float:
    call, reference, ad = block_scaled(tilelink.rank(), tilelink.world_size())
    err = 0.0
    for _ in range(calls):
        c = torch.full(reference.shape, float("nan"), dtype=ad.dtype, device=ad.device)
        call(c)
        err = worst(err, _error(c, reference))
    return err


def gemm_columns_beside(calls: int = 2, M: int = 50, N: int = 24, K: int = 40, blocks=(16, 16, 16)) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("gemm_columns_beside").scaled_mm_kernel
    g = torch.Generator().manual_seed(23)
    a, b, scale = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g),
                         torch.rand(M, generator=g) + 0.5)
    lo, hi = rows_of(rank, world, M)
    ad, bd, sd = _placed(a[lo:hi].contiguous(), b, scale)
    sd = sd.float()
    bm, bn, bk = blocks
    err = 0.0
    for _ in range(calls):
        c = torch.full((M, N), float("nan"), dtype=ad.dtype, device=ad.device)
        kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](
            ad, bd, sd, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        err = worst(err, _error(c, (a @ b) * scale[:, None]))
    return err


def row_softmax(calls: int = 2) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("row_softmax").softmax_kernel
    rows, cols = 37, 20
    (x,) = _exact(torch.randn(rows, cols, generator=torch.Generator().manual_seed(29)))
    lo, hi = rows_of(rank, world, rows)
    (xd,) = _placed(x[lo:hi].contiguous())
    err = 0.0
    for _ in range(calls):
        y = torch.full((rows, cols), float("nan"), dtype=xd.dtype, device=xd.device)
        kernel[(5,)](y, xd, cols, y.stride(0), rows, cols, BLOCK_SIZE=32, num_stages=1)
        err = worst(err, _error(y, torch.softmax(x, dim=1)))
    return err


def row_layer_norm(calls: int = 2) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("row_layer_norm")._layer_norm_fwd_fused
    rows, cols = 37, 20
    g = torch.Generator().manual_seed(31)
    x, w, b = _exact(torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g),
                     torch.randn(cols, generator=g))
    lo, hi = rows_of(rank, world, rows)
    xd, wd, bd = _placed(x[lo:hi].contiguous(), w, b)
    want = torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5)
    err = 0.0
    for _ in range(calls):
        y = torch.full((rows, cols), float("nan"), dtype=xd.dtype, device=xd.device)
        mean = torch.full((rows,), float("nan"), device=xd.device)
        rstd = torch.full((rows,), float("nan"), device=xd.device)
        kernel[(rows,)](xd, y, wd, bd, mean, rstd, cols, cols, 1e-5, BLOCK_SIZE=8)
        err = worst(err, _error(y, want), _error(mean, x.mean(dim=1)))
    return err


def matvec_rows(calls: int = 2, masked: bool = False) -> float:
    """``y = A @ x``, K split over the ranks; reduce-scattered (one output element a program) or, ``masked``,
    all-reduced on a grid three programs longer than the rows."""
    rank, world = tilelink.rank(), tilelink.world_size()
    rows, k = 37, 45
    g = torch.Generator().manual_seed(41)
    a, x = _exact(torch.randn(rows, k, generator=g), torch.randn(k, generator=g))
    klo, khi = rows_of(rank, world, k)
    ar, xr = _placed(a[:, klo:khi].contiguous(), x[klo:khi].contiguous())
    lo, hi = (0, rows) if masked else rows_of(rank, world, rows)
    err = 0.0
    for _ in range(calls):
        y = torch.full((hi - lo,), float("nan"), dtype=ar.dtype, device=ar.device)
        if masked:
            load_form("matvec_rows_masked_ar").matvec_rows_masked[(rows + 3,)](
                ar, xr, y, rows, khi - klo, ar.stride(0), BLOCK_K=8)
        else:
            load_form("matvec_rows_rs").matvec_rows[(rows,)](ar, xr, y, khi - klo, ar.stride(0), BLOCK_K=8)
        err = worst(err, _error(y, (a @ x)[lo:hi]) if hi > lo else 0.0)
    return err


def matvec_rows_masked_ar(calls: int = 2) -> float:
    return matvec_rows(calls, masked=True)


def row_outputs(calls: int = 2, sweep: bool = False) -> float:
    """``y = x @ w.T`` one output row a program, K split over the ranks: reduce-scattered, the row's columns in one
    block, or, ``sweep``, all-reduced through a loop over the row's column blocks (the last one partly masked)."""
    rank, world = tilelink.rank(), tilelink.world_size()
    rows, n, k = 13, 21, 45
    g = torch.Generator().manual_seed(43)
    x, w = _exact(torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g))
    klo, khi = rows_of(rank, world, k)
    xr, wr = _placed(x[:, klo:khi].contiguous(), w[:, klo:khi].contiguous())
    lo, hi = (0, rows) if sweep else rows_of(rank, world, rows)
    err = 0.0
    for _ in range(calls):
        y = torch.full((hi - lo, n), float("nan"), dtype=xr.dtype, device=xr.device)
        if sweep:
            load_form("row_sweep_ar").row_sweep[(rows,)](xr, wr, y, xr.stride(0), wr.stride(0), y.stride(0), n,
                                                         khi - klo, BLOCK_N=8, BLOCK_K=16)
        else:
            load_form("row_outputs_rs").row_linear[(rows,)](xr, wr, y, n, khi - klo, xr.stride(0), wr.stride(0),
                                                            y.stride(0), BLOCK_N=32, BLOCK_K=16)
        err = worst(err, _error(y, (x @ w.T)[lo:hi]) if hi > lo else 0.0)
    return err


def row_sweep_ar(calls: int = 2) -> float:
    return row_outputs(calls, sweep=True)


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


def gemm_rs_split_k(calls: int = 2, M: int = 50, N: int = 40, K: int = 90, blocks: tuple[int, int, int] = (16, 16, 16),
                    split: int = 3) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("gemm_rs_split_k").matmul_split_k
    bm, bn, bk = blocks
    g = torch.Generator().manual_seed(14)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    klo, khi = rows_of(rank, world, K)  # each rank holds a slice of K, which its programs split again
    ar, br = _placed(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    lo, hi = rows_of(rank, world, M)
    err = 0.0
    for _ in range(calls):
        # float32 sums, as split-K kernels keep them; NaN to start: the rule zeroes its partial sums itself
        out = torch.full((hi - lo, N), float("nan"), dtype=torch.float32, device=ar.device)
        # the grid as upstream kernels give it, from the launch's meta-parameters
        kernel[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])](
            ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), N, 1,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, GROUP_M=2)
        err = worst(err, _error(out, (a @ b)[lo:hi]) if hi > lo else 0.0)
    return err


def gemm_rs_k_row_stride(calls: int = 2, M: int = 50, N: int = 40, K: int = 90,
                         blocks: tuple[int, int, int] = (16, 16, 16)) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("gemm_rs_k_row_stride").matmul_nt
    bm, bn, bk = blocks
    g = torch.Generator().manual_seed(15)
    a, bt = _exact(torch.randn(M, K, generator=g), torch.randn(N, K, generator=g))
    klo, khi = rows_of(rank, world, K)  # each rank holds a slice of K of both, contiguous: its own K is their stride
    ar, btr = _placed(a[:, klo:khi].contiguous(), bt[:, klo:khi].contiguous())
    lo, hi = rows_of(rank, world, M)
    err = 0.0
    for _ in range(calls):
        out = torch.full((hi - lo, N), float("nan"), dtype=torch.float32, device=ar.device)
        kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](ar, btr, out, M, N, khi - klo,
                                                            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        err = worst(err, _error(out, (a @ bt.T)[lo:hi]) if hi > lo else 0.0)
    return err


def gemm_ar_split_k(calls: int = 2, M: int = 50, N: int = 40, K: int = 90,
                    blocks: tuple[int, int, int] = (16, 16, 16), split: int = 3) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("gemm_ar_split_k")._kernel
    bm, bn, bk = blocks
    g = torch.Generator().manual_seed(15)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    klo, khi = rows_of(rank, world, K)  # each rank holds a slice of K, which its programs split again
    ar, br = _placed(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    err = 0.0
    for _ in range(calls):
        # every rank passes the whole output; NaN to start: the rule zeroes its partial sums itself
        out = torch.full((M, N), float("nan"), dtype=torch.float32, device=ar.device)
        kernel[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])](
            ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), N, 1,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, SPLIT_K=split)
        err = worst(err, _error(out, a @ b))
    return err


def _descriptor(t: torch.Tensor, block: list[int]):
    """A tensor descriptor made on the host over all of ``t``, as the persistent-matmul tutorial passes them."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


def gemm_host_descriptor_ag(calls: int = 2, M: int = 50, N: int = 40, K: int = 40,
                            blocks: tuple[int, int, int] = (16, 16, 16), programs: int = 3,
                            path: str | None = None) -> float:
    """``path``: a file holding the form's kernel spelled otherwise, run in its place."""
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = (module_at(path) if path else load_form("gemm_host_descriptor_ag")).matmul_descriptor_persistent
    bm, bn, bk = blocks
    g = torch.Generator().manual_seed(15)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    lo, hi = rows_of(rank, world, M)
    ad, bt = _placed(a[lo:hi].contiguous(), b.T.contiguous())
    err = 0.0
    for _ in range(calls):
        c = torch.full((M, N), float("nan"), dtype=ad.dtype, device=ad.device)
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        kernel[(min(programs, tiles),)](
            _descriptor(ad, [bm, bk]), _descriptor(bt, [bn, bk]), _descriptor(c, [bm, bn]), M, N, K,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, NUM_SMS=min(programs, tiles))
        err = worst(err, _error(c, a @ b))
    return err


def gemm_host_descriptor_rs(calls: int = 2, M: int = 50, N: int = 40, K: int = 96,
                            blocks: tuple[int, int, int] = (16, 16, 16), programs: int = 3) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    kernel = load_form("gemm_host_descriptor_rs").matmul_descriptor_persistent_rs
    bm, bn, bk = blocks
    g = torch.Generator().manual_seed(16)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    klo, khi = rows_of(rank, world, K)  # each rank holds a slice of K (a multiple of 8: 16-byte descriptor rows)
    ar, bt = _placed(a[:, klo:khi].contiguous(), b[klo:khi].T.contiguous())
    lo, hi = rows_of(rank, world, M)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    err = 0.0
    for subtile in (True, False):
        for _ in range(calls):
            out = torch.full((hi - lo, N), float("nan"), dtype=ar.dtype, device=ar.device)
            c_block = [bm, bn // 2 if subtile else bn]  # a subtiled epilogue stores half-width boxes
            kernel[(min(programs, tiles),)](
                _descriptor(ar, [bm, bk]), _descriptor(bt, [bn, bk]), _descriptor(out, c_block), M, N, khi - klo,
                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, EPILOGUE_SUBTILE=subtile, NUM_SMS=min(programs, tiles))
            err = worst(err, _error(out, (a @ b)[lo:hi]))
    return err


def gemm_rs_persistent_grouped(calls: int = 2, M: int = 50, N: int = 40, K: int = 36,
                               blocks: tuple[int, int, int] = (16, 16, 16), programs: int = 5) -> float:
    # 12 tiles on 5 programs: each program's tiles end in a group of fewer than four, which the flush sends
    g = torch.Generator().manual_seed(17)
    a, b = _exact(torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))
    return _persistent_rs(load_form("gemm_rs_persistent_grouped").persistent_mm, a, b, calls, blocks, programs)


def gemm_persistent_counter(calls: int = 2, M: int = 50, N: int = 40, K: int = 36,
                            blocks: tuple[int, int, int] = (16, 16, 16), programs: int = 5) -> float:
    # the kernel stores float16: small integers keep every partial sum exact, so the reduction is compared exactly
    g = torch.Generator().manual_seed(19)
    a, b = (torch.randint(-2, 3, shape, generator=g).float() for shape in ((M, K), (K, N)))
    return _persistent_rs(load_form("gemm_persistent_counter").matmul_kernel_persistent, a, b, calls, blocks,
                          programs, torch.float16)


def _persistent_rs(kernel, a: torch.Tensor, b: torch.Tensor, calls: int, blocks: tuple[int, int, int],
                   programs: int, dtype: torch.dtype | None = None) -> float:
    """A persistent matmul of the tutorials' signature reduce-scattering ``a @ b``: each rank holds a slice of K, so
    the partial sums add up to it, and keeps its rows of the result; a program per tile, at most ``programs``."""
    rank, world = tilelink.rank(), tilelink.world_size()
    (M, K), N = a.shape, b.shape[1]
    bm, bn, bk = blocks
    klo, khi = rows_of(rank, world, K)
    ar, br = _placed(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    lo, hi = rows_of(rank, world, M)
    programs = min(programs, triton.cdiv(M, bm) * triton.cdiv(N, bn))
    err = 0.0
    for _ in range(calls):
        out = torch.full((hi - lo, N), float("nan"), dtype=dtype or ar.dtype, device=ar.device)
        kernel[(programs,)](
            ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), N, 1,
            BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=2, NUM_SMS=programs)
        err = worst(err, _error(out, (a @ b)[lo:hi]) if hi > lo else 0.0)
    return err


RUNS = {"attention_descriptor_advance": attention_descriptor_advance, "attention_helper_inner": attention_helper_inner,
        "attention_stages_tile": attention_stages_tile,
        "attention_flat_heads": attention_flat_heads, "attention_batched_rows": attention_batched_rows,
        "gemm_row_wrap": gemm_row_wrap,
        "gemm_row_wrap_hints": gemm_row_wrap_hints, "gemm_row_clamp": gemm_row_clamp,
        "gemm_row_scales": gemm_row_scales, "gemm_scale_blocks": gemm_scale_blocks,
        "gemm_columns_beside": gemm_columns_beside,
        "gemm_block_scales": gemm_block_scales,
        "row_softmax": row_softmax, "row_layer_norm": row_layer_norm,
        "gemm_rs_epilogue_branch": gemm_rs_epilogue_branch, "gemm_rs_split_k": gemm_rs_split_k,
        "gemm_rs_k_row_stride": gemm_rs_k_row_stride, "gemm_ar_split_k": gemm_ar_split_k,
        "gemm_host_descriptor_ag": gemm_host_descriptor_ag, "gemm_host_descriptor_rs": gemm_host_descriptor_rs,
        "moe_rs_expert_zeros": moe_rs_expert_zeros, "gemm_rs_persistent_grouped": gemm_rs_persistent_grouped,
        "gemm_persistent_counter": gemm_persistent_counter, "matvec_rows_rs": matvec_rows,
        "matvec_rows_masked_ar": matvec_rows_masked_ar, "row_outputs_rs": row_outputs, "row_sweep_ar": row_sweep_ar}


def run_forms(names: list[str], sizes: dict | None = None) -> dict[str, float | str]:
    """Each form's largest error on this rank (or its traceback); ``sizes``: keyword arguments of the forms' runs
    (``M``, ``N``, ``K``, ``blocks``) in place of their small defaults."""
    import traceback

    out: dict[str, float | str] = {}
    for name in names:
        try:
            run = RUNS[name]
            accepted = inspect.signature(run).parameters
            out[name] = run(**{k: v for k, v in (sizes or {}).items() if k in accepted})
        except Exception:  # noqa: BLE001 - reported by the test
            out[name] = traceback.format_exc()
    return out
