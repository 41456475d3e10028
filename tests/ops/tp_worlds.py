"""Rank functions of the operator tests (run in spawned emulated worlds; imported by name)."""

from __future__ import annotations

import contextlib

import torch

import tilelink
import tilelink.runtime


def bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per)


def ops_match_torch(M: int, N: int, K: int, dtype_name: str) -> dict[str, float]:
    from tilelink.ops import TPContext, ag_gemm, gemm_rs

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(7)
    a = torch.randn(M, K, generator=g).to(dtype).to(device)
    b = torch.randn(K, N, generator=g).to(dtype).to(device)
    lo, hi = bounds(M, r, R)
    ref = a.double() @ b.double()
    out: dict[str, float] = {}
    for label, ctx in (("ag_gemm", None), ("ag_gemm_ctx", TPContext(M))):
        c = ag_gemm(a[lo:hi].contiguous(), b, ctx)
        assert c.dtype == dtype and c.shape == (M, N)
        out[label] = ((c.double() - ref).norm() / ref.norm()).item()
    klo, khi = bounds(K, r, R)
    for _ in range(2):
        y = gemm_rs(a[:, klo:khi].contiguous(), b[klo:khi].contiguous())
    assert y.dtype == dtype and y.shape == (hi - lo, N)
    out["gemm_rs"] = ((y.double() - ref[lo:hi]).norm() / max(ref[lo:hi].norm(), 1e-30)).item() if hi > lo else 0.0
    return out


def uneven_slices_match_torch(M: int, N: int, K: int, persistent: bool | None) -> dict[str, float]:
    """ag_gemm with this rank's own slice of B's columns and gemm_rs with its own slice of K, split
    unevenly (a rank may hold none), on the kernel asked for by the operators' ``persistent``. Every rank
    must take the same kernel whatever its own slice, or the ranks would wait on different protocols.
    float32 (4-byte elements)."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs, tp_kernels

    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(9)
    a = torch.randn(M, K, generator=g)
    b = torch.randn(K, N, generator=g)
    lo, hi = bounds(M, r, R)
    nlo, nhi = bounds(N, r, R)
    klo, khi = bounds(K, r, R)
    out: dict[str, float] = {}
    c = ag_gemm(a[lo:hi].contiguous().to(device), b[:, nlo:nhi].contiguous().to(device), TPContext(M),
                persistent=persistent)
    assert c.shape == (M, nhi - nlo) and c.is_contiguous()
    ref = a.double() @ b[:, nlo:nhi].double()
    out["ag_gemm"] = ((c.double().cpu() - ref).norm() / max(ref.norm(), 1e-30)).item() if nhi > nlo else 0.0
    y = gemm_rs(a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device), persistent=persistent)
    ref = (a.double() @ b.double())[lo:hi]
    out["gemm_rs"] = ((y.double().cpu() - ref).norm() / max(ref.norm(), 1e-30)).item() if hi > lo else 0.0
    # the kernels that ran are the ones asked for, where the dimension the ranks share allows them (K for
    # the gather's rows, N for the reduced rows)
    for name, shared in (("ag_gemm", K), ("gemm_rs", N)):
        wanted = device.type == "cuda" if persistent is None else persistent
        expected = wanted and (shared * 4) % 16 == 0
        assert bool(getattr(tp_kernels, f"{name}_persistent_kernel").launcher.contexts) == expected, name
        assert bool(getattr(tp_kernels, f"{name}_kernel").launcher.contexts) != expected, name
    return out


def mlp_matches_torch(S: int, H: int, I: int) -> float:
    from tilelink.nn import TPMLP

    r, R = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(8)
    gate, up = torch.randn(I, H, generator=g) / H**0.5, torch.randn(I, H, generator=g) / H**0.5
    down = torch.randn(H, I, generator=g) / I**0.5
    x = torch.randn(S, H, generator=g)
    device = tilelink.runtime.current_world().device
    gate, up, down, x = (t.to(device) for t in (gate, up, down, x))
    mlp = TPMLP(gate, up, down)
    lo, hi = bounds(S, r, R)
    y = mlp(x[lo:hi].contiguous())
    ref = (torch.nn.functional.silu(x @ gate.t()) * (x @ up.t())) @ down.t()
    return ((y - ref[lo:hi]).norm() / max(ref[lo:hi].norm(), 1e-30)).item() if hi > lo else 0.0


def bad_inputs() -> list[str]:
    """Each bad call must raise LaunchError before any kernel runs; returns the messages."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    calls = [
        lambda: ag_gemm(a, torch.randn(15, 4)),  # inner dims differ
        lambda: ag_gemm(a.half(), b),  # dtypes differ
        lambda: ag_gemm(a.int(), b.int()),  # unsupported dtype
        lambda: ag_gemm(a.t(), torch.randn(8, 4)),  # not contiguous
        lambda: ag_gemm(a[0], b),  # not 2-D
        lambda: ag_gemm(a, b, TPContext(M=50)),  # a context for another shape: 8 rows is not this rank's share
        lambda: gemm_rs(a, torch.randn(15, 4)),
    ]
    messages = []
    for call in calls:
        try:
            call()
        except tilelink.LaunchError as exc:
            messages.append(str(exc))
        else:
            messages.append("NO ERROR")
    return messages


@contextlib.contextmanager
def lagging_gathers(lag: bool):
    """While open, and if ``lag``, this rank's all-gather producers start late: the host sleeps 0.3 s in the
    emulated world; on a GPU the side stream sleeps a few ms before its copies. The rank has already told its
    peers that its shard is in place, so they go on to their next call while it has still to read theirs (the
    warm-up's dry run is not delayed)."""
    import time

    from tilelink.rules.all_gather.launcher import AllGatherLauncher

    produce = AllGatherLauncher._producer

    def late(self, ctx, world, epoch, *args):
        if epoch:
            if world.device.type == "cuda":
                with torch.cuda.stream(ctx.streams.side):  # the copy engine is enqueued with no stream context
                    torch.cuda._sleep(5_000_000)
            else:
                time.sleep(0.3)
        return produce(self, ctx, world, epoch, *args)

    if lag:
        if tilelink.runtime.current_world().device.type == "cuda":
            # loaded now: CUDA loads a module lazily, at its first launch, and a load waits for the kernels
            # running, which would be this rank's consumer spinning on the copies queued behind the sleep
            torch.cuda._sleep(1)
            torch.cuda.synchronize()
        AllGatherLauncher._producer = late
    try:
        yield
    finally:
        AllGatherLauncher._producer = produce


def ag_gemm_back_to_back(M: int, N: int, K: int, calls: int, dtype_name: str = "float32") -> dict[str, float]:
    """``ag_gemm`` on the persistent kernel (the copy engine) and on the pointer kernel (the SM pull), ``calls``
    calls each with new data every call, queued one after another and checked only at the end, rank 1's
    gathers late (:func:`lagging_gathers`). No barrier separates the calls: a rank that wrote its next shard
    over one a peer was still reading would give that peer a wrong product. Returns each kernel's largest
    relative error on this rank."""
    from tilelink.ops import TPContext, ag_gemm, tp_kernels

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    lo, hi = bounds(M, r, R)
    g = torch.Generator().manual_seed(17)
    ctx = TPContext(M)  # M known: no host all-gather of the shard sizes, which would line the ranks up
    out: dict[str, float] = {}
    for label, persistent in (("copy_engine", True), ("sm_pull", False)):
        runs = []
        with lagging_gathers(r == 1):
            for _ in range(calls):
                a = torch.randn(M, K, generator=g).to(dtype)
                b = torch.randn(K, N, generator=g).to(dtype)
                runs.append((ag_gemm(a[lo:hi].contiguous().to(device), b.to(device), ctx, persistent=persistent),
                             a.double() @ b.double()))
        errors = [((c.double().cpu() - ref).norm() / ref.norm()).item() for c, ref in runs]
        out[label] = float("nan") if any(e != e for e in errors) else max(errors)  # max() skips a NaN
        kernel = tp_kernels.ag_gemm_persistent_kernel if persistent else tp_kernels.ag_gemm_kernel
        assert kernel.launcher.contexts, f"{label}: {kernel} did not run"
    return out


def calls_with_a_late_host(M: int, N: int, K: int, late_s: float, dtype_name: str = "float32") -> dict[str, float]:
    """``ag_gemm`` (copy engine, SM pull) and ``gemm_rs`` (the hybrid), three calls each; rank 1's host is
    ``late_s`` behind before the second (an evaluation on one rank between two steps), longer than the wait
    budget the caller set: the other ranks' calls must wait for it, not time out. Returns each operator's
    largest relative error on this rank."""
    import time

    from tilelink.ops import TPContext, ag_gemm, gemm_rs

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    lo, hi = bounds(M, r, R)
    klo, khi = bounds(K, r, R)
    g = torch.Generator().manual_seed(23)
    ctx = TPContext(M)
    out: dict[str, float] = {}
    for label, persistent, op in (("ag_gemm copy_engine", True, "ag"), ("ag_gemm sm_pull", False, "ag"),
                                  ("gemm_rs hybrid", True, "rs")):
        errors = []
        for call in range(3):
            a = torch.randn(M, K, generator=g).to(dtype)
            b = torch.randn(K, N, generator=g).to(dtype)
            if call == 1 and r == 1:
                time.sleep(late_s)
            ref = a.double() @ b.double()
            if op == "ag":
                c = ag_gemm(a[lo:hi].contiguous().to(device), b.to(device), ctx, persistent=persistent)
            else:
                c = gemm_rs(a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device),
                            persistent=persistent)
                ref = ref[lo:hi]
            errors.append(((c.double().cpu() - ref).norm() / ref.norm()).item())
        out[label] = float("nan") if any(e != e for e in errors) else max(errors)  # max() skips a NaN
    return out
