"""Launch each golden case per the launch contract and compare with torch on the full problem.

Used by ``test_end_to_end.py`` inside spawned (emulated) worlds. Every function returns the largest
absolute error of this rank's result against the torch reference.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import triton

import tilelink

HERE = Path(__file__).parent


def load_case(rule: str, case: str):
    return module_at(HERE / rule / f"{case}.before.py", f"case_{rule}_{case}")


def module_at(path, name: str | None = None):
    """The module of the file at ``path``, run (its kernels rewritten by their annotations) under ``name``, by
    default one of its own for each path."""
    spec = importlib.util.spec_from_file_location(name or f"module_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plain_module(path: str):
    """The module of the kernel file at ``path`` without its annotation: what a rewrite must equal, run on the full
    problem. One copy per process: ranks run this at once, and one must not import a copy another is still writing."""
    import os

    text = "\n".join(line for line in open(path).read().splitlines() if "@tilelink.overlap" not in line)
    plain = str(path).replace(".py", f"_plain_{os.getpid()}.py")
    with open(plain, "w") as f:
        f.write(text)
    return module_at(plain)


def launch_refusal(run) -> str:
    """What the call ``run`` makes is refused with (its ``LaunchError``'s text), or ``"ran"`` where it runs."""
    from tilelink.errors import LaunchError

    try:
        run()
    except LaunchError as error:
        return str(error)
    return "ran"


def worst(*errors: float) -> float:
    """The largest of ``errors``, NaN if any is (``max`` would pass a NaN over: ``max(0.0, nan)`` is 0.0)."""
    return float("nan") if any(e != e for e in errors) else max(errors)


def rows_of(rank: int, world: int, size: int) -> tuple[int, int]:
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per)


def _ag_gemm(kernel, rank, world, M=50, N=24, K=40, grid_fn=None, **meta):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    lo, hi = rows_of(rank, world, M)
    c = torch.full((M, N), float("nan"))
    grid = grid_fn or (lambda m: (triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"]),))
    err = 0.0
    for _ in range(2):  # a context is reused: the second call runs at epoch 2
        kernel[grid](a[lo:hi].contiguous(), b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1), **meta)
        err = worst(err, (c - a @ b).abs().max().item())
    return err


def all_gather_pointer_gemm(rank, world):
    kernel = load_case("all_gather", "pointer_gemm").matmul_kernel
    return _ag_gemm(kernel, rank, world, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)


def all_gather_descriptor_gemm(rank, world):
    kernel = load_case("all_gather", "descriptor_gemm").matmul_descriptor_kernel
    M, N = 48, 32  # descriptors need 16-byte aligned strides
    return _ag_gemm(kernel, rank, world, M=M, N=N, K=32,
                    grid_fn=lambda m: (triton.cdiv(M, m["BLOCK_M"]), triton.cdiv(N, m["BLOCK_N"])),
                    BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


def all_gather_persistent_gemm(rank, world):
    kernel = load_case("all_gather", "persistent_gemm").persistent_matmul_kernel
    return _ag_gemm(kernel, rank, world, grid_fn=lambda m: (3,), NUM_PROGRAMS=3, BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


def all_gather_helper_functions(rank, world):
    kernel = load_case("all_gather", "helper_functions").matmul_relu_kernel
    M, N, K = 50, 24, 40
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    lo, hi = rows_of(rank, world, M)
    c = torch.full((M, N), float("nan"))
    kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](a[lo:hi].contiguous(), b, c, M, N, K, K, 1, N, 1, N, 1,
                                                       BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return (c - torch.relu(a @ b)).abs().max().item()


def all_gather_kv_attention(rank, world):
    kernel = load_case("all_gather", "kv_attention").attention_kernel
    SQ, SKV, D = 20, 37, 16
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, D, generator=g) for n in (SQ, SKV, SKV))
    lo, hi = rows_of(rank, world, SKV)
    o = torch.full((SQ, D), float("nan"))
    scale = D ** -0.5
    kernel[(triton.cdiv(SQ, 16),)](q, k[lo:hi].contiguous(), v[lo:hi].contiguous(), o, SQ, SKV, D, D, D, D,
                                   scale, HEAD_DIM=D, BLOCK_M=16, BLOCK_N=16)
    ref = torch.softmax(q @ k.T * scale, dim=-1) @ v
    return (o - ref).abs().max().item()


def all_gather_vector_1d(rank, world):
    kernel = load_case("all_gather", "vector_1d").scale_kernel
    N = 77
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(N, generator=g), torch.randn(N, generator=g)
    lo, hi = rows_of(rank, world, N)
    y = torch.full((N,), float("nan"))
    kernel[(triton.cdiv(N, 32),)](x[lo:hi].contiguous(), w, y, N, BLOCK=32)
    return (y - x * w).abs().max().item()


def _rs_gemm(kernel, rank, world, M=50, N=24, K=40, grid_fn=None, **meta):
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    klo, khi = rows_of(rank, world, K)  # each rank holds a slice of K: the partial sums add up to a @ b
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    lo, hi = rows_of(rank, world, M)
    out = torch.full((hi - lo, N), float("nan"))
    grid = (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),) if grid_fn is None else grid_fn(M)
    err = 0.0
    for _ in range(2):
        kernel[grid](ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), N, 1,
                     **meta)
        err = worst(err, (out - (a @ b)[lo:hi]).abs().max().item() if hi > lo else 0.0)
    return err


def reduce_scatter_pointer_gemm(rank, world):
    kernel = load_case("reduce_scatter", "pointer_gemm").matmul_kernel
    return _rs_gemm(kernel, rank, world, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)


def reduce_scatter_activation_gemm(rank, world):
    kernel = load_case("reduce_scatter", "activation_gemm").matmul_kernel
    return _rs_gemm(kernel, rank, world, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)


def reduce_scatter_row_sweep(rank, world):
    kernel = load_case("reduce_scatter", "row_sweep").matmul_kernel
    return _rs_gemm(kernel, rank, world, N=40, grid_fn=lambda M: (triton.cdiv(M, 16),), BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


def reduce_scatter_descriptor_row_sweep(rank, world):
    kernel = load_case("reduce_scatter", "descriptor_row_sweep").matmul_kernel
    # descriptors need 16-byte strides: K = 48 splits into 12, 16 or 24 columns a rank
    return _rs_gemm(kernel, rank, world, N=40, K=48, grid_fn=lambda M: (triton.cdiv(M, 16),), BLOCK_M=16,
                    BLOCK_N=16, BLOCK_K=16)


def reduce_scatter_two_kernels(rank, world):
    """The two halves of a TP MLP: h = relu(x @ w1[:, cols]) then y = sum_r h_r @ w2[rows]."""
    mod = load_case("reduce_scatter", "two_kernels")
    M, H, I = 45, 24, 40
    g = torch.Generator().manual_seed(6)
    x, w1, w2 = torch.randn(M, H, generator=g), torch.randn(H, I, generator=g), torch.randn(I, H, generator=g)
    ilo, ihi = rows_of(rank, world, I)
    w1r, w2r = w1[:, ilo:ihi].contiguous(), w2[ilo:ihi].contiguous()
    lo, hi = rows_of(rank, world, M)
    Ir = ihi - ilo
    h = torch.empty(M, max(Ir, 1))
    mod.up_kernel[(triton.cdiv(M, 16) * triton.cdiv(max(Ir, 1), 16),)](
        x[lo:hi].contiguous(), w1r, h, M, max(Ir, 1), H, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    y = torch.full((hi - lo, H), float("nan"))
    mod.down_kernel[(triton.cdiv(M, 16) * triton.cdiv(H, 16),)](
        h if Ir else torch.zeros(M, 1), w2r if Ir else torch.zeros(1, H), y, M, H, max(Ir, 1),
        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    ref = torch.relu(x @ w1) @ w2
    return (y - ref[lo:hi]).abs().max().item() if hi > lo else 0.0


def run_cases(names: list[str]) -> dict[str, str | float]:
    """Run the named cases on this rank; an exception becomes its text (the test reports it)."""
    import traceback

    import tilelink

    out: dict[str, str | float] = {}
    for name in names:
        try:
            out[name] = CASES[name](tilelink.rank(), tilelink.world_size())
        except Exception:  # noqa: BLE001 - reported by the test with the traceback
            out[name] = traceback.format_exc()
    return out


def reduce_scatter_vector_partial_sums(rank, world):
    kernel = load_case("reduce_scatter", "vector_partial_sums").partial_scale_kernel
    N = 77
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(N, generator=g) for _ in range(world)]  # rank r's partial input
    w = torch.randn(N, generator=g)
    lo, hi = rows_of(rank, world, N)
    y = torch.full((hi - lo,), float("nan"))
    for _ in range(2):
        kernel[(triton.cdiv(N, 32),)](xs[rank], w, y, N, BLOCK=32)
    ref = sum(x * w for x in xs)
    return (y - ref[lo:hi]).abs().max().item() if hi > lo else 0.0


def all_gather_moe_gather(rank, world):
    from tilelink.ops.moe_routing import align_tokens

    kernel = load_case("all_gather", "moe_gather").fused_moe_kernel
    M, K, N, E, topk, BM = 29, 24, 20, 4, 2, 16
    g = torch.Generator().manual_seed(10)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(E, K, N, generator=g)
    topk_ids = torch.randint(0, E - 1, (M, topk), generator=g)  # expert E-1 receives no token
    topk_ids[:5] = 0  # and expert 0 many
    sorted_ids, expert_ids = align_tokens(topk_ids, E, BM)
    lo, hi = rows_of(rank, world, M)
    c = torch.full((M * topk, N), float("nan"))
    EM = sorted_ids.numel()
    grid = (triton.cdiv(EM, BM) * triton.cdiv(N, 16),)
    for _ in range(2):
        kernel[grid](x[lo:hi].contiguous(), w, c, sorted_ids, expert_ids, N, K, EM, M * topk, topk,
                     K, 1, K * N, N, 1, N, 1, BLOCK_M=BM, BLOCK_N=16, BLOCK_K=16)
    ref = torch.einsum("tk,tkn->tn", x.repeat_interleave(topk, 0), w[topk_ids.flatten()])
    return (c - ref).abs().max().item()


def reduce_scatter_moe_scatter_topk(rank, world):
    """Each rank holds a slice of every expert's intermediate dim (TP experts): its partial outputs
    summed over ranks and over each token's top-k slots (router-weighted) give the MoE output."""
    return moe_down(load_case("reduce_scatter", "moe_scatter_topk").fused_moe_down_kernel, rank, world)


def moe_down_from_file(path: str) -> float:
    """:func:`moe_down` on this rank of the ``fused_moe_down_kernel`` defined in the file ``path`` (a
    variant of the moe_scatter_topk case written by a test)."""
    import tilelink

    spec = importlib.util.spec_from_file_location("moe_down_variant", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return moe_down(module.fused_moe_down_kernel, tilelink.rank(), tilelink.world_size())


def fill_from_file(path: str, name: str, M: int, N: int, programs: int, meta: dict, calls: int = 2) -> float:
    """Run ``name(c_ptr, M, N, stride_cm, **meta)`` from the file ``path`` (a kernel that stores 1.0 to every
    element of C, reduce-scattered along M) on ``programs`` programs, ``calls`` times; the largest error of
    this rank's rows against the world size (every rank adds its ones)."""
    import tilelink

    spec = importlib.util.spec_from_file_location(f"fill_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = getattr(module, name)
    lo, hi = rows_of(tilelink.rank(), tilelink.world_size(), M)
    err = 0.0
    for _ in range(calls):
        out = torch.full((hi - lo, N), float("nan"))
        kernel[(programs,)](out, M, N, N, **meta)
        err = worst(err, (out - tilelink.world_size()).abs().max().item() if hi > lo else 0.0)
    return err


def moe_down(kernel, rank, world):
    from tilelink.ops.moe_routing import align_tokens

    M, I, H, E, topk, BM = 27, 40, 24, 4, 2, 16
    g = torch.Generator().manual_seed(11)
    h = torch.randn(M * topk, I, generator=g)  # intermediate activations, one row per slot
    w = torch.randn(E, I, H, generator=g)
    topk_ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)])
    topk_ids[:4] = torch.tensor([0, 1])  # expert 0 and 1 busier
    weights = torch.rand(M, topk, generator=g)
    sorted_ids, expert_ids = align_tokens(topk_ids, E, BM)
    ilo, ihi = rows_of(rank, world, I)
    h_r, w_r = h[:, ilo:ihi].contiguous(), w[:, ilo:ihi].contiguous()
    lo, hi = rows_of(rank, world, M)
    y = torch.full((hi - lo, H), float("nan"))
    EM, Ir = sorted_ids.numel(), ihi - ilo
    grid = (triton.cdiv(EM, BM) * triton.cdiv(H, 16),)
    for _ in range(2):
        kernel[grid](h_r, w_r, y, weights.flatten().contiguous(), sorted_ids, expert_ids, H, Ir, EM, M * topk, topk,
                     Ir, 1, Ir * H, H, 1, H, 1, BLOCK_M=BM, BLOCK_N=16, BLOCK_K=16)
    per_slot = torch.einsum("si,sih->sh", h, w[topk_ids.flatten()]) * weights.flatten()[:, None]
    ref = per_slot.view(M, topk, H).sum(1)
    return (y - ref[lo:hi]).abs().max().item() if hi > lo else 0.0


def reduce_scatter_hybrid_gemm(rank, world):
    kernel = load_case("reduce_scatter", "hybrid_gemm").matmul_kernel
    return _rs_gemm(kernel, rank, world, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)


def unsatisfied_wait():
    """Launch a rewritten consumer whose channels nobody notifies: its wait must time out (no hang)
    and the check must name the primitive, the channel and the values."""
    import tilelink
    from tilelink.mapping import RowSharding
    from tilelink.runtime import Diagnostics

    okernel = load_case("all_gather", "pointer_gemm").matmul_kernel
    kernel = getattr(okernel.module, okernel.name)
    M, N, K = 40, 16, 16
    a, b, c = torch.randn(M, K), torch.randn(K, N), torch.empty(M, N)
    sh = RowSharding(M, 2, 2)  # as if rank 0 of 2 ranks: rows 0..19 in channels 0, 1
    diag = Diagnostics()
    barriers = torch.zeros(sh.num_channels, dtype=torch.int64)
    barriers[0] = 5  # channel 0 arrived, channel 1 never does
    kernel[(1,)](a, b, c, M, N, K, K, 1, N, 1, N, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1,
                 tlk_barriers=barriers, tlk_epoch=5, tlk_rank=0, tlk_world=2, tlk_rows=M,
                 tlk_rows_per_rank=sh.rows_per_rank, tlk_rows_per_channel=sh.rows_per_channel,
                 tlk_channels_per_rank=sh.channels_per_rank, tlk_diag=diag.buffer, tlk_budget=diag.budget_ns)
    try:
        diag.check(kernel=okernel.name)
    except tilelink.WaitTimeout as exc:
        return {"primitive": exc.primitive, "index": exc.index, "expected": exc.expected, "seen": exc.seen,
                "message": str(exc)}
    return {"primitive": None}


def all_gather_inner_dim_copy_engine(rank, world):
    kernel = load_case("all_gather", "inner_dim_copy_engine").row_sum_kernel
    B, S, D = 3, 23, 8
    g = torch.Generator().manual_seed(12)
    x = torch.randn(B, S, D, generator=g)
    lo, hi = rows_of(rank, world, S)
    y = torch.full((B, S), float("nan"))
    for _ in range(2):
        kernel[(triton.cdiv(S, 8), B)](x[:, lo:hi].contiguous(), y, S, D, S * D, D, BLOCK_S=8, BLOCK_D=8)
    return (y - x.sum(-1)).abs().max().item()


def reduce_scatter_ring_gemm(rank, world):
    kernel = load_case("reduce_scatter", "ring_gemm").matmul_kernel
    return _rs_gemm(kernel, rank, world, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)


def all_gather_push_gemm(rank, world):
    kernel = load_case("all_gather", "push_gemm").matmul_kernel
    return _ag_gemm(kernel, rank, world, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)


def run_cases_warmed_up(names: list[str]) -> dict[str, str | float]:
    """:func:`run_cases` with the GPU's first-call warm-up: every kernel first runs against the
    scratch channel at epoch 0. The results must not change: the warm-up must leave the real channels
    and the peers' buffers alone (the world only pretends not to be emulated; kernels still run in the
    interpreter, one after the other)."""
    from tilelink.runtime import current_world

    current_world().backend = "warm-up test"
    return run_cases(names)


def back_to_back_all_gathers(calls: int = 4, slow_rank: int = 1) -> dict[str, float]:
    """The all-gathers of three cases (SM pull, SM push, the copy engine with K and V gathered together),
    ``calls`` calls each with new data every call, checked only at the end; rank ``slow_rank`` gathers late
    (``tests/ops/tp_worlds.py``'s ``lagging_gathers``), so the others run a call ahead. No barrier separates
    calls: a rank that wrote its next shard over the one a slow peer was still reading, or pushed into a copy
    the peer's consumer was still reading, would give a wrong result. Returns each case's largest error on
    this rank."""

    from tests.ops.tp_worlds import lagging_gathers

    rank, world = tilelink.rank(), tilelink.world_size()
    errors = {}
    g = torch.Generator().manual_seed(21)
    with lagging_gathers(rank == slow_rank):
        M, N, K = 50, 24, 40
        lo, hi = rows_of(rank, world, M)
        for case in ("pointer_gemm", "push_gemm"):
            kernel = load_case("all_gather", case).matmul_kernel
            grid = (triton.cdiv(M, 16) * triton.cdiv(N, 16),)
            runs = []
            for _ in range(calls):
                a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
                c = torch.full((M, N), float("nan"))
                kernel[grid](a[lo:hi].contiguous(), b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                             b.stride(1), c.stride(0), c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
                runs.append((c, a @ b))
            errors[case] = worst(*((c - ref).abs().max().item() for c, ref in runs))
        kernel = load_case("all_gather", "kv_attention").attention_kernel
        SQ, SKV, D = 20, 37, 16
        lo, hi = rows_of(rank, world, SKV)
        runs = []
        for _ in range(calls):
            q, k, v = (torch.randn(n, D, generator=g) for n in (SQ, SKV, SKV))
            o = torch.full((SQ, D), float("nan"))
            kernel[(triton.cdiv(SQ, 16),)](q, k[lo:hi].contiguous(), v[lo:hi].contiguous(), o, SQ, SKV, D, D, D,
                                           D, D ** -0.5, HEAD_DIM=D, BLOCK_M=16, BLOCK_N=16)
            runs.append((o, torch.softmax(q @ k.T * D ** -0.5, dim=-1) @ v))
        errors["kv_attention"] = worst(*((o - ref).abs().max().item() for o, ref in runs))
    return errors


def _ar_gemm(kernel, rank, world, M, N, K, grid, calls=2, **meta):
    """``kernel`` computes this rank's partial product x[:, K slice] @ w[K slice] into the whole (M, N) output,
    all-reduced; new inputs on each call (the context's second call runs at epoch 2)."""
    g = torch.Generator().manual_seed(31)
    klo, khi = rows_of(rank, world, K)
    err = 0.0
    for _ in range(calls):
        x, w = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
        xr, wr = x[:, klo:khi].contiguous(), w[klo:khi].contiguous()
        y = torch.full((M, N), float("nan"))
        kernel[grid](xr, wr, y, M, N, khi - klo, **meta)
        err = worst(err, (y - x @ w).abs().max().item())
    return err


def all_reduce_pointer_gemm(rank, world):
    kernel = load_case("all_reduce", "pointer_gemm").row_parallel_kernel
    M, N, K = 5, 40, 70  # a few decode rows
    klo, khi = rows_of(rank, world, K)
    return _ar_gemm(kernel, rank, world, M, N, K, (triton.cdiv(M, 16), triton.cdiv(N, 16)),
                    stride_xm=khi - klo, stride_xk=1, stride_wk=N, stride_wn=1, stride_ym=N, stride_yn=1,
                    BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


def all_reduce_persistent_gemm(rank, world):
    kernel = load_case("all_reduce", "persistent_gemm").persistent_matmul_kernel
    M, N = 20, 32  # descriptors need 16-byte aligned strides: every rank's K slice is 16 columns
    return _ar_gemm(kernel, rank, world, M, N, 16 * world, (3,), NUM_PROGRAMS=3, BLOCK_M=16, BLOCK_N=16,
                    BLOCK_K=16)


def all_reduce_vector_partial_sums(rank, world):
    kernel = load_case("all_reduce", "vector_partial_sums").partial_product_kernel
    N = 77
    g = torch.Generator().manual_seed(32)
    err = 0.0
    for _ in range(2):
        xs = [torch.randn(N, generator=g) for _ in range(world)]  # rank r's partial input
        w = torch.randn(N, generator=g)
        y = torch.full((N,), float("nan"))
        kernel[(triton.cdiv(N, 32),)](xs[rank], w, y, N, BLOCK=32)
        err = worst(err, (y - sum(x * w for x in xs)).abs().max().item())
    return err


#: every launch harness of this module, by name (case functions are named <rule>_<case>)
CASES = {name: fn for name, fn in globals().items()
         if name.startswith(("all_gather_", "reduce_scatter_", "all_reduce_")) and callable(fn)}


def moe_down_too_large():
    """A top-k reduce-scatter whose partial sums would hold 2**31 elements (65536 tokens x top-128 x 256
    columns): refused before anything is allocated or launched. Returns the message."""
    kernel = load_case("reduce_scatter", "moe_scatter_topk").fused_moe_down_kernel
    M, H, topk = 65536, 256, 128
    y = torch.empty(M // tilelink.world_size(), H)
    tiny = torch.zeros(16)
    ids = torch.zeros(16, dtype=torch.int32)
    try:
        kernel[(1,)](tiny, tiny, y, tiny, ids, ids, H, 1, 16, M * topk, topk, 1, 1, 1, 1, 1, H, 1,
                     BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    except tilelink.LaunchError as exc:
        return str(exc)
    return "NO ERROR"
