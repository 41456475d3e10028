"""Rank functions of the tests of ``ag_gemm``'s and ``gemm_rs``'s kept plans (imported by name)."""

from __future__ import annotations

import os

import torch

import tilelink
import tilelink.runtime
from tests.ops.tp_worlds import bounds


def _messages(calls: dict) -> dict[str, str]:
    out = {}
    for name, call in calls.items():
        try:
            call()
        except tilelink.LaunchError as exc:
            out[name] = str(exc)
        else:
            out[name] = "NO ERROR"
    return out


def refused_after_kept_calls() -> tuple[dict[str, str], dict[str, str]]:
    """Each bad call differs from a good one in one thing its checks read (a shape, a dtype, a device, a stride, the
    context's M and its type, the path); returns their messages in a fresh process, then again once the good calls
    have run (their plans kept)."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs

    device = tilelink.runtime.current_world().device
    a, b = torch.randn(8, 16, device=device), torch.randn(16, 4, device=device)
    strided = torch.randn(4, 16, device=device).t()  # b's shape, not contiguous
    other = torch.randn(15, 4, device=device)
    bad = {
        "ag shape": lambda: ag_gemm(a, other),
        "ag dtype": lambda: ag_gemm(a, b.half()),
        "ag unsupported": lambda: ag_gemm(a.int(), b.int()),
        "ag device": lambda: ag_gemm(a, b.to("meta")),
        "ag contiguous": lambda: ag_gemm(a, strided),
        "ag rows": lambda: ag_gemm(a, b, TPContext(M=50)),
        "ag M type": lambda: ag_gemm(a, b, TPContext(M=8.0)),
        "ag path": lambda: ag_gemm(a, b, path="fast"),
        "rs shape": lambda: gemm_rs(a, other),
        "rs dtype": lambda: gemm_rs(a, b.half()),
        "rs device": lambda: gemm_rs(a.to("meta"), b),
        "rs contiguous": lambda: gemm_rs(a, strided),
        "rs path": lambda: gemm_rs(a, b, path="fast"),
    }
    fresh = _messages(bad)
    ag_gemm(a, b)
    ag_gemm(a, b, TPContext(M=8))
    ag_gemm(a.half(), b.half())
    gemm_rs(a, b)
    gemm_rs(a.half(), b.half())
    return fresh, _messages(bad)


def _error(c: torch.Tensor, ref: torch.Tensor) -> float:
    return ((c.double() - ref).norm() / max(ref.norm().item(), 1e-30)).item()


def kept_plans_compute_the_same(dtype_name: str = "float32", new_world: bool = True) -> dict:
    """``ag_gemm`` and ``gemm_rs`` called again with new data of the same form (one plan made per form; an operand
    at an address that is not 16-byte aligned, which the persistent kernels copy, takes the same plan), on the
    pointer and the persistent kernels, with K and N that need padding; then with the environment asking for a
    path that does not exist, and (``new_world``) in a new world. Every rank computes the whole product (each holds
    its rows of A for ``ag_gemm``, and ``gemm_rs`` sums the ranks' equal slices). Returns each call's relative error,
    the plans made, and the messages."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs, tp

    dtype = getattr(torch, dtype_name)
    device = tilelink.runtime.current_world().device
    r, R = tilelink.rank(), tilelink.world_size()

    made = {"ag": 0, "rs": 0}
    ag_plan, rs_plan = tp._ag_plan, tp._rs_plan

    def counted_ag(*args):
        made["ag"] += 1
        return ag_plan(*args)

    def counted_rs(*args):
        made["rs"] += 1
        return rs_plan(*args)

    tp._ag_plan, tp._rs_plan = counted_ag, counted_rs
    g = torch.Generator().manual_seed(5)
    errors: dict[str, float] = {}
    # the shared dimension (ag_gemm's K, gemm_rs's N) a 16-byte multiple, this rank's own (ag_gemm's N, gemm_rs's K)
    # not: the persistent kernels run, on padded operands
    M, shapes = 24, {"ag": (16, 6), "rs": (10, 8)}
    lo, hi = bounds(M, r, R)
    for persistent in (False, True):
        for call in range(3):
            for op, (K, N) in shapes.items():
                a = torch.randn(M, K, generator=g).to(dtype)
                b = torch.randn(K, N, generator=g).to(dtype)
                ref = a.double() @ b.double()
                a = a.to(device)
                if call == 2:  # the same form at an odd address
                    flat = torch.empty(K * N + 1, dtype=dtype, device=device)
                    flat[1:].copy_(b.flatten())
                    b = flat[1:].view(K, N)
                else:
                    b = b.to(device)
                if op == "ag":
                    c = ag_gemm(a[lo:hi].contiguous(), b, TPContext(M), persistent=persistent).cpu()
                else:  # every rank passes the same slice: the sum is R times it
                    c, ref = gemm_rs(a, b, persistent=persistent).cpu(), R * ref[lo:hi]
                errors[f"{op} {persistent} {call}"] = _error(c, ref)
    kept = dict(made)
    kernels = {"ag": sorted(p.persistent for p in tp._AG_PLANS.plans.values()),
               "rs": sorted(p.persistent for p in tp._RS_PLANS.plans.values())}
    was = os.environ.get("TILELINK_PATH")
    os.environ["TILELINK_PATH"] = "fast"
    try:
        path = _messages({"ag": lambda: ag_gemm(a[lo:hi].contiguous(), b, TPContext(M)), "rs": lambda: gemm_rs(a, b)})
    finally:
        if was is None:
            del os.environ["TILELINK_PATH"]
        else:
            os.environ["TILELINK_PATH"] = was
    out = {"errors": errors, "kept": kept, "persistent": kernels, "path": path}
    if new_world:
        before = dict(made)
        tilelink.finalize()
        tilelink.init()
        errors["rs new world"] = _error(gemm_rs(a, b, persistent=True).cpu(), ref)
        a, b = torch.randn(M, 16, generator=g).to(dtype), torch.randn(16, 6, generator=g).to(dtype)
        ref = a.double() @ b.double()
        c = ag_gemm(a[lo:hi].contiguous().to(device), b.to(device), TPContext(M), persistent=True).cpu()
        errors["ag new world"] = _error(c, ref)
        out["new world"] = {k: made[k] - before[k] for k in made}
    return out


def unkept_without_a_context(M: int, N: int, K: int) -> dict:
    """``ag_gemm`` without a ``TPContext`` in a world of several ranks exchanges the shard sizes at every call (its
    plan is not kept); with one, and ``gemm_rs``, the plan is kept. Returns the errors and what was kept."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs, tp

    r, R = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(11)
    errors, unkept = [], []
    for _ in range(2):
        a = torch.randn(M, K, generator=g)
        b = torch.randn(K, N, generator=g)
        lo, hi = bounds(M, r, R)
        klo, khi = bounds(K, r, R)
        ref = a.double() @ b.double()
        errors.append(_error(ag_gemm(a[lo:hi].contiguous(), b), ref))
        unkept.append(len(tp._AG_PLANS.plans))  # none the first time; the context's call after, kept
        errors.append(_error(ag_gemm(a[lo:hi].contiguous(), b, TPContext(M)), ref))
        full = sum(a[:, k0:k1].double() @ b[k0:k1].double()
                   for k0, k1 in (bounds(K, q, R) for q in range(R)))
        errors.append(_error(gemm_rs(a[:, klo:khi].contiguous(), b[klo:khi].contiguous()), full[lo:hi])
                      if hi > lo else 0.0)
    return {"errors": errors, "unkept": unkept, "ag kept": len(tp._AG_PLANS.plans),
            "rs kept": len(tp._RS_PLANS.plans)}


def one_row_views_of_wider_rows() -> list[float]:
    """One-row operands viewed from rows of an odd length (torch calls them contiguous, their row stride is not a
    16-byte multiple): the persistent kernels' descriptors must get a copy, not the view. Returns each call's
    error against torch."""
    from tilelink.ops import ag_gemm, gemm_rs

    device = tilelink.runtime.current_world().device
    wide = torch.randn(3, 37, device=device)
    errors = []
    a_row = wide[:1, :16]  # gemm_rs: A of one row
    b = torch.randn(16, 8, device=device)
    errors.append(float((gemm_rs(a_row, b, persistent=True) - a_row @ b).abs().max()))
    a = torch.randn(5, 1, device=device)
    b_row = wide[:1, :8]  # ag_gemm: B of one row (K = 1)
    errors.append(float((ag_gemm(a, b_row, persistent=True) - a @ b_row).abs().max()))
    return errors


def prepared_launches(capture: bool = True, new_world: bool = True) -> dict:
    """``ag_gemm`` and ``gemm_rs`` in a world of one: which calls take the kernel's launch path (counted on the
    launcher) and which the launch prepared for their form, with each result's error against torch: repeated calls,
    an operand at an odd address, another dtype, a refused stride, a captured call and its replay (an emulated graph,
    with ``capture``), a timed-out wait (every later call refused) and (``new_world``) a new world. Returns the
    errors, the counts after each step, the messages, and what launches each prepared launch's kernel (``Bound`` on a
    GPU) with its compiled variants."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs, tp, tp_kernels
    from tilelink.runtime import diagnostics
    from tilelink.runtime.graphs import EmulatedGraph

    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(7)
    counts = {"ag": 0, "rs": 0}

    def count() -> None:  # on the launchers of the world now
        for op, kernel in (("ag", tp_kernels.ag_gemm_kernel), ("rs", tp_kernels.gemm_rs_kernel)):
            launcher = kernel.launcher
            launch = launcher.launch

            def counted(grid, bound, op=op, launch=launch):
                counts[op] += 1
                return launch(grid, bound)

            launcher.launch = counted

    checks = [0]
    check_later = diagnostics.Diagnostics.check_later

    def counted_check(self, *args, **kwargs):
        checks[0] += 1
        return check_later(self, *args, **kwargs)

    diagnostics.Diagnostics.check_later = counted_check
    M, K, N = 24, 16, 8
    errors: dict[str, float] = {}
    seen: dict[str, tuple] = {}

    def both(label: str, dtype=torch.float32, odd: bool = False) -> None:
        a = torch.randn(M, K, generator=g).to(dtype)
        b = torch.randn(K, N, generator=g).to(dtype)
        ref = a.double() @ b.double()
        a = a.to(device)
        if odd:  # the same form at an address that is not 16-byte aligned
            flat = torch.empty(K * N + 1, dtype=dtype, device=device)
            flat[1:].copy_(b.flatten())
            b = flat[1:].view(K, N)
        else:
            b = b.to(device)
        before = checks[0]
        errors[f"ag {label}"] = _error(ag_gemm(a, b, TPContext(M), persistent=False).cpu(), ref)
        errors[f"rs {label}"] = _error(gemm_rs(a, b, persistent=False).cpu(), ref)
        seen[label] = (counts["ag"], counts["rs"], checks[0] - before)

    both("first")  # the kernels' first launches, which count() can only hook after
    count()
    both("new form", torch.float16)  # another dtype: its own plan, the launch path
    both("again", torch.float16)
    both("odd", torch.float16, odd=True)
    both("float again")  # the first form's prepared launch
    a, b = torch.randn(M, K, device=device), torch.randn(K, N, device=device)
    messages = _messages({"ag stride": lambda: ag_gemm(a, b.t().contiguous().t()),
                          "rs stride": lambda: gemm_rs(a, b.t().contiguous().t())})
    # a captured call takes the launch path (recorded), and its replay computes the new data
    if capture:
        graph = EmulatedGraph()
        x, w = a.clone(), b.clone()
        with graph.capture():
            c_ag = ag_gemm(x, w, TPContext(M), persistent=False)
            c_rs = gemm_rs(x, w, persistent=False)
        seen["captured"] = (counts["ag"], counts["rs"], 0)
        x.copy_(torch.randn(M, K, generator=g))
        w.copy_(torch.randn(K, N, generator=g))
        graph.replay()
        ref = x.double() @ w.double()
        errors["ag replay"], errors["rs replay"] = _error(c_ag, ref), _error(c_rs, ref)
        both("after capture")
    launches = [launch for plans in (tp._AG_PLANS, tp._RS_PLANS) for plan in plans.plans.values()
                for launch in plan.launches.values()]
    kinds = sorted({(type(launch.run).__name__, len(getattr(launch.run, "compiled", ()))) for launch in launches
                    if launch is not tp._checked})
    # a timed-out wait at a prepared call: raised, and every later call refused until a new world
    timeout = tilelink.WaitTimeout(rank=0, primitive="consumer_tile_wait", index=1, expected=2, seen=1, budget_s=1.0)

    def timed_out(self, *args, **kwargs):
        raise timeout

    diagnostics.Diagnostics.check_later = timed_out
    raised: dict[str, str] = {}
    try:
        ag_gemm(a, b, TPContext(M), persistent=False)
        raised["ag timeout"] = "NO ERROR"
    except tilelink.WaitTimeout as exc:
        raised["ag timeout"] = str(exc)
    diagnostics.Diagnostics.check_later = counted_check
    raised.update(_messages({"ag after": lambda: ag_gemm(a, b, TPContext(M), persistent=False)}))
    seen["timed out"] = (counts["ag"], counts["rs"], 0)
    if new_world:
        tilelink.finalize()
        tilelink.init()
        device = tilelink.runtime.current_world().device  # the launchers are the same objects: still counted
        both("new world")
        both("new world again")
    return {"errors": errors, "seen": seen, "messages": messages, "raised": raised, "kinds": kinds}


def kept_forms_hold_no_call_tensor(calls: int = 3) -> dict:
    """``calls`` calls of ``ag_gemm`` then ``gemm_rs`` of one form, their persistent kernels (the copy engine's
    gather, the hybrid reduce-scatter: their launches prepared after the first call): whether each call's operand,
    result and reduced rows are still alive once the caller drops them, and the kinds of the prepared launches the
    plans keep (on the race-exposing schedule a world of several ranks makes them but runs every call through the
    launch path). A kept launch must not keep a call's tensors: an activation would stay
    allocated, and under ``torch.compile(mode="reduce-overhead")`` a tensor of the CUDA graphs' pool kept past its
    call fails their check."""
    import gc
    import weakref

    from tilelink.ops import TPContext, ag_gemm, gemm_rs, tp

    device = tilelink.runtime.current_world().device
    rank, world = tilelink.rank(), tilelink.world_size()
    M, K, N = 16, 32, 24
    lo, hi = bounds(M, rank, world)
    g = torch.Generator().manual_seed(0)
    w_up, w_down = torch.randn(K, N, generator=g).to(device), torch.randn(N, K, generator=g).to(device)
    refs = []
    for _ in range(calls):
        x = torch.randn(M, K, generator=g)[lo:hi].contiguous().to(device)
        h = ag_gemm(x, w_up, TPContext(M=M), persistent=True, path="overlap")
        y = gemm_rs(h, w_down, persistent=True, path="overlap")
        refs.append([weakref.ref(t) for t in (x, h, y)])
        del x, h, y
    gc.collect()
    launches = [launch for plans in (tp._AG_PLANS, tp._RS_PLANS) for plan in plans.plans.values()
                for launch in plan.launches.values() if launch is not tp._checked]
    return {"alive": [[r() is not None for r in step] for step in refs],
            "prepared": sorted(type(launch).__name__ for launch in launches)}
