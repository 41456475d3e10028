"""Rank functions of the captured-call tests (emulated worlds: :class:`tilelink.runtime.graphs.EmulatedGraph`
records a call's steps and replays them with the arguments they were recorded with, as a CUDA graph does)."""

from __future__ import annotations

import time

import torch

import tilelink
import tilelink.runtime
from tests.ops.tp_worlds import bounds

#: the operator kernels a captured call is tested on, with the kernel each takes
FORMS = {
    "ag_gemm copy_engine": ("ag", True),
    "ag_gemm sm_pull": ("ag", False),
    "gemm_rs hybrid": ("rs", True),
    "gemm_rs sm_pull": ("rs", False),
}


def _launch_ag(a_shard, b, c, M: int, persistent: bool) -> None:
    """What ``tilelink.ops.ag_gemm`` launches (its plan of this form), on the caller's tensors (the graph replays
    into ``c``)."""
    from tilelink.ops import tp

    K, N = b.shape
    world = tilelink.runtime.current_world()
    plan = tp._ag_plan(a_shard, b, tp.TPContext(M), persistent, "overlap", world)
    assert plan.persistent == persistent and plan.run == N, (persistent, plan)  # the form this test names
    tp._start(plan, (a_shard, b, c, M, N, K, K, 1, b.stride(0), b.stride(1), c.stride(0), c.stride(1)), world)


def _launch_rs(a, b_shard, out, persistent: bool) -> None:
    """What ``tilelink.ops.gemm_rs`` launches, on the caller's tensors."""
    from tilelink.ops import tp

    M, K = a.shape
    N = b_shard.shape[1]
    world = tilelink.runtime.current_world()
    plan = tp._rs_plan(a, b_shard, persistent, "overlap", world)
    assert plan.persistent == persistent and plan.run == K, (persistent, plan)
    tp._start(plan, (a, b_shard, out, M, N, K, a.stride(0), a.stride(1), b_shard.stride(0), b_shard.stride(1), N, 1),
              world)


def replays_match_torch(M: int, N: int, K: int, replays: int, late_s: float, forms: tuple[str, ...] = tuple(FORMS),
                        advance: bool = True) -> dict[str, list[float]]:
    """Each form: one uncaptured call (the warm-up that makes the context), one call captured, then ``replays``
    replays, each after new data is written into the captured inputs; on the second replay rank 1 writes its data
    ``late_s`` late, so a peer that did not wait for it would read its last shard; then two uncaptured calls (rank 1
    late) and a replay again. Returns each one's relative error against torch, then ``inf`` if a wait timed out.
    ``advance=False`` captures the calls without the device-side advance of the call count and only replays them (a
    check that the tests see what a frozen count does)."""
    from tilelink.runtime.graphs import EmulatedGraph

    r, R = tilelink.rank(), tilelink.world_size()
    lo, hi = bounds(M, r, R)
    klo, khi = bounds(K, r, R)
    g = torch.Generator().manual_seed(5)
    out: dict[str, list[float]] = {}
    for label in forms:
        op, persistent = FORMS[label]
        a = torch.randn(M, K, generator=g)
        b = torch.randn(K, N, generator=g)
        if op == "ag":
            x, w, y = a[lo:hi].contiguous(), b.clone(), torch.empty(M, N)

            def call(x=x, w=w, y=y, persistent=persistent) -> None:
                _launch_ag(x, w, y, M, persistent)
        else:
            x, w, y = a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), torch.empty(hi - lo, N)

            def call(x=x, w=w, y=y, persistent=persistent) -> None:
                _launch_rs(x, w, y, persistent)

        call()  # uncaptured: makes the context
        graph = EmulatedGraph()
        if advance:
            with graph.capture():
                call()
        else:
            from tilelink.rules.launch import Launcher

            begin = Launcher.begin_captured
            try:
                Launcher.begin_captured = _frozen(begin)
                with graph.capture():
                    call()
            finally:
                Launcher.begin_captured = begin
        errors: list[float] = []
        try:
            _replay_and_call(graph, call, op, x, w, y, M, N, K, replays, late_s, g, errors, after=advance)
        except tilelink.WaitTimeout:  # raised by an uncaptured call after the replays: a replay's wait timed out
            errors.append(float("inf"))
        try:  # a replay's timed-out wait is raised by the next uncaptured check
            _kernel(op, persistent).check()
        except tilelink.WaitTimeout:
            errors.append(float("inf"))
        out[label] = errors
    return out


def _replay_and_call(graph, call, op: str, x, w, y, M: int, N: int, K: int, replays: int, late_s: float, g,
                     errors: list[float], after: bool = True) -> None:
    """``replays`` replays with new data (rank 1 ``late_s`` late on the second), then, with ``after``, two uncaptured
    calls (rank 1 late on each) and a replay again: the contexts serve both. Each one's relative error is appended
    to ``errors``."""
    r, R = tilelink.rank(), tilelink.world_size()
    lo, hi = bounds(M, r, R)
    klo, khi = bounds(K, r, R)
    steps = [("replay", late_s if i == 1 else 0.0) for i in range(replays)]
    steps += [("call", late_s / 2), ("call", late_s / 2), ("replay", 0.0)] if after else []
    for step, late in steps:
        a = torch.randn(M, K, generator=g)
        b = torch.randn(K, N, generator=g)
        if r == 1 and late:
            time.sleep(late)
        if op == "ag":
            x.copy_(a[lo:hi])
            w.copy_(b)
            ref = a.double() @ b.double()
        else:
            x.copy_(a[:, klo:khi])
            w.copy_(b[klo:khi])
            ref = (a.double() @ b.double())[lo:hi]
        y.fill_(float("nan"))
        if step == "call":
            call()
        else:
            graph.replay()
        errors.append(((y.double() - ref).norm() / ref.norm()).item())


def _kernel(op: str, persistent: bool):
    from tilelink.ops import tp_kernels

    if op == "ag":
        return tp_kernels.ag_gemm_persistent_kernel if persistent else tp_kernels.ag_gemm_kernel
    return tp_kernels.gemm_rs_persistent_kernel if persistent else tp_kernels.gemm_rs_kernel


def _frozen(begin):
    """``Launcher.begin_captured`` whose call count is never advanced on the device (the graph's steps are run
    with a count frozen at its value at capture, as a host-side count would be)."""
    from tilelink.runtime import graphs

    def frozen(self, ctx, world, grid, call):
        enqueue = graphs.enqueue
        graphs.enqueue = lambda fn: None  # the advance is the one step begin_captured enqueues
        try:
            return begin(self, ctx, world, grid, call)
        finally:
            graphs.enqueue = enqueue

    return frozen


#: the GEMM + all-reduce forms a captured call is tested on: the operator called whole with each algorithm forced
#: (the fused kernel, path="overlap"), and the decode MLP whose down projection it is
AR_FORMS = ("gemm_ar one_shot", "gemm_ar two_shot", "TPMLP all_reduce")


def _all_reduce_form(label: str, M: int, N: int, K: int, g: torch.Generator, device):
    """The call of a GEMM + all-reduce form on this rank's captured inputs, what writes new data into them (and
    returns the whole result in float64) and the overlapped kernel to check. gemm_ar: this rank's K slice of the
    (M, K) @ (K, N) product. TPMLP: hidden size K, intermediate size N, every rank passing all M rows."""
    from tilelink.nn import TPMLP
    from tilelink.ops import gemm_ar, tp_ar_kernels

    r, R = tilelink.rank(), tilelink.world_size()
    klo, khi = bounds(K, r, R)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16

    def rand(*shape, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    if label.startswith("gemm_ar"):
        mode = label.split()[1]
        x, w = torch.empty(M, khi - klo, dtype=dtype, device=device), torch.empty(khi - klo, N, dtype=dtype,
                                                                                  device=device)

        def run():
            return gemm_ar(x, w, mode=mode, path="overlap")

        def new():
            a, b = rand(M, K), rand(K, N)
            x.copy_(a[:, klo:khi])
            w.copy_(b[klo:khi])
            return a.double() @ b.double()

        return run, new, tp_ar_kernels.FORCED[mode]
    gate, up, down = rand(N, K, scale=K**-0.5), rand(N, K, scale=K**-0.5), rand(K, N, scale=N**-0.5)
    mlp = TPMLP(gate, up, down, output="all_reduce")
    x = torch.empty(M, K, dtype=dtype, device=device)

    def run():
        return mlp(x)

    def new():
        a = rand(M, K)
        x.copy_(a)
        a, gd, ud, dd = (t.double() for t in (a, gate, up, down))
        return (torch.nn.functional.silu(a @ gd.t()) * (a @ ud.t())) @ dd.t()

    return run, new, tp_ar_kernels.gemm_ar_kernel


def all_reduce_replays_match_torch(M: int, N: int, K: int, replays: int, late_s: float,
                                   forms: tuple[str, ...] = AR_FORMS, advance: bool = True) -> dict[str, list[float]]:
    """Each GEMM + all-reduce form (:data:`AR_FORMS`): one uncaptured call (the warm-up that makes the context), one
    call captured, then ``replays`` replays, each after new data is written into the captured inputs; on the second
    replay rank 1 writes its data ``late_s`` late, so a peer that did not wait for its partial sums of that replay
    would sum its last ones; then two uncaptured calls (rank 1 late) and a replay again. Returns each one's relative
    error against torch, then ``inf`` if a wait timed out. ``advance=False`` captures the calls without the
    device-side advance of the call count and only replays them."""
    from tilelink.runtime.graphs import EmulatedGraph

    r = tilelink.rank()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(7)
    out: dict[str, list[float]] = {}
    for label in forms:
        run, new, kernel = _all_reduce_form(label, M, N, K, g, device)
        new()
        run()  # uncaptured: makes the context
        graph = EmulatedGraph()
        if advance:
            with graph.capture():
                y = run()
        else:
            from tilelink.rules.launch import Launcher

            begin = Launcher.begin_captured
            try:
                Launcher.begin_captured = _frozen(begin)
                with graph.capture():
                    y = run()
            finally:
                Launcher.begin_captured = begin
        steps = [("replay", late_s if i == 1 else 0.0) for i in range(replays)]
        steps += [("call", late_s / 2), ("call", late_s / 2), ("replay", 0.0)] if advance else []
        out[label] = replay_errors(graph, y, run, new, steps, r, (kernel,))
    return out


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``got``'s relative error against ``ref`` (float64), ``inf`` where it holds NaN (rows never written)."""
    if not ref.numel():
        return 0.0
    err = ((got.double().cpu() - ref).norm() / max(ref.norm().item(), 1e-30)).item()
    return err if err == err else float("inf")


def replay_errors(graph, y: torch.Tensor, run, new, steps: list[tuple[str, float]], rank: int,
                  kernels) -> list[float]:
    """Run ``steps`` after a capture of ``run`` into ``graph`` (whose output is ``y``): each ``("replay", late)`` or
    ``("call", late)`` writes new data (``new()``, the reference it returns), rank 1 ``late`` seconds late, then replays
    the graph (its output filled with NaN first, so a replay that writes nothing is seen) or calls ``run`` uncaptured.
    Returns each step's :func:`rel_error`, then ``inf`` if a wait timed out: raised by an uncaptured call after the
    replays, or by the check of ``kernels`` (a replay's timed-out wait is raised by the next uncaptured check)."""
    errors: list[float] = []
    try:
        for step, late in steps:
            if rank == 1 and late:
                time.sleep(late)
            ref = new()
            if step == "call":
                got = run()
            else:
                y.fill_(float("nan"))
                graph.replay()
                got = y
            errors.append(rel_error(got, ref))
    except tilelink.WaitTimeout:
        errors.append(float("inf"))
    try:
        for kernel in kernels:
            kernel.check()
    except tilelink.WaitTimeout:
        errors.append(float("inf"))
    return errors


def a_replay_a_peer_skips_times_out(M: int, N: int, K: int, check: bool = True, op: str = "ag_gemm") -> str:
    """``op`` (ag_gemm, SM pull; or gemm_ar, one-shot) captured on every rank; rank 1 never replays it, rank 0
    does: rank 0's wait for rank 1 inside the replay must end (bounded on the device) and its record raise at the
    next uncaptured check: ``kernel.check()``, or without ``check`` ``tilelink.finalize()``. Returns rank 0's
    message."""
    import os

    from tilelink.ops import gemm_ar, tp_ar_kernels, tp_kernels
    from tilelink.runtime.graphs import EmulatedGraph

    r, R = tilelink.rank(), tilelink.world_size()
    if op == "gemm_ar":
        klo, khi = bounds(K, r, R)
        a, b = torch.randn(M, khi - klo), torch.randn(khi - klo, N)
        kernel = tp_ar_kernels.FORCED["one_shot"]

        def call() -> None:
            gemm_ar(a, b, mode="one_shot", path="overlap")
    else:
        lo, hi = bounds(M, r, R)
        x, w, y = torch.randn(hi - lo, K), torch.randn(K, N), torch.empty(M, N)
        kernel = tp_kernels.ag_gemm_kernel

        def call() -> None:
            _launch_ag(x, w, y, M, False)
    call()
    graph = EmulatedGraph()
    budget = os.environ.get("TILELINK_WAIT_TIMEOUT")
    os.environ["TILELINK_WAIT_TIMEOUT"] = "0.05"  # the captured handshakes' budgets (taken at capture)
    try:
        with graph.capture():
            call()
    finally:
        if budget is None:
            os.environ.pop("TILELINK_WAIT_TIMEOUT")
        else:
            os.environ["TILELINK_WAIT_TIMEOUT"] = budget
    if r == 1:
        tilelink.runtime.current_world().barrier()  # leaves once rank 0 has checked
        if not check:
            tilelink.finalize()  # with rank 0
        return "skipped"
    graph.replay()
    if check:
        try:
            kernel.check()
        except tilelink.WaitTimeout as exc:
            message = str(exc)
        else:
            message = "NO TIMEOUT"
        tilelink.runtime.current_world().barrier()
        return message
    tilelink.runtime.current_world().barrier()
    try:
        tilelink.finalize()
    except tilelink.WaitTimeout as exc:
        return str(exc)
    return "NO TIMEOUT"


def capture_without_warm_up() -> str:
    """A first call with new shapes, captured: refused (it would allocate and load kernels)."""
    from tilelink.runtime.graphs import EmulatedGraph

    graph = EmulatedGraph()
    try:
        with graph.capture():
            _launch_ag(torch.randn(8, 16), torch.randn(16, 8), torch.empty(8, 8), 8, False)
    except tilelink.LaunchError as exc:
        return str(exc)
    return "NO ERROR"


def moe_under_capture() -> str:
    """ag_moe captured on a routing made outside the capture (its counts read on the host): refused, saying why."""
    from tilelink.ops import ag_moe
    from tilelink.ops.moe_routing import route
    from tilelink.runtime.graphs import EmulatedGraph

    routing = route(torch.zeros(4, 1, dtype=torch.int64), 2)
    graph = EmulatedGraph()
    try:
        with graph.capture():
            ag_moe(torch.randn(4, 16), torch.randn(2, 16, 8), routing)
    except tilelink.LaunchError as exc:
        return str(exc)
    return "NO ERROR"


def gemm_ar_without_warm_up() -> str:
    """gemm_ar's first call with new shapes, captured: refused (it would allocate and load kernels)."""
    from tilelink.ops import gemm_ar
    from tilelink.runtime.graphs import EmulatedGraph

    a, b = torch.randn(4, 16), torch.randn(16, 8)
    graph = EmulatedGraph()
    try:
        with graph.capture():
            gemm_ar(a, b)
    except tilelink.LaunchError as exc:
        return str(exc)
    return "NO ERROR"


def refusals() -> list[str]:
    return [capture_without_warm_up(), moe_under_capture(), gemm_ar_without_warm_up()]


#: the captured operators of the GPU tests: ag_gemm and gemm_rs in their GPU modes (the default persistent kernels,
#: copy engine and hybrid; the pointer kernels, SM pull), sp_attention and TPMLP
CUDA_FORMS = ("ag_gemm", "ag_gemm sm_pull", "gemm_rs", "gemm_rs sm_pull", "sp_attention", "TPMLP")


def _cuda_replays_error(run, new, device, replays: int) -> float:
    """``run()`` (a call returning its output) captured in a CUDA graph after an uncaptured call (the warm-up: it
    makes the contexts and loads every kernel of the call), replayed ``replays`` times with ``new()`` (which copies
    new data into the captured inputs and returns the reference) before each, then two uncaptured calls and a replay
    again: the contexts serve both. The largest relative error against the references (``inf`` for NaN: rows never
    written)."""
    new()
    run()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = run()
    worst = 0.0
    for step in ("replay",) * replays + ("call", "call", "replay"):
        ref = new()
        if step == "replay":
            graph.replay()
            got = y.double().cpu()
        else:
            got = run().double().cpu()
        err = ((got - ref).norm() / max(ref.norm(), 1e-30)).item() if ref.numel() else 0.0
        worst = max(worst, err if err == err else float("inf"))
    return worst


def cuda_replays_match_torch(M: int, N: int, K: int, replays: int, forms: tuple[str, ...] = CUDA_FORMS
                             ) -> dict[str, float]:
    """Each form captured in a CUDA graph once (after an uncaptured call, the warm-up) and replayed ``replays``
    times, new bf16 data copied into the captured inputs before each replay; returns each form's largest relative
    error against torch over the replays and two uncaptured calls and a replay after them (``inf`` if a wait timed
    out: raised by the next check)."""
    from tilelink.nn import TPMLP
    from tilelink.ops import SPContext, TPContext, ag_gemm, attention_kernels, gemm_rs, sp_attention, tp_kernels

    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    dtype = torch.bfloat16
    lo, hi = bounds(M, r, R)
    klo, khi = bounds(K, r, R)
    g = torch.Generator().manual_seed(11)
    out: dict[str, float] = {}

    def rand(*shape, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    for label in forms:
        if label.startswith("ag_gemm"):
            persistent = None if label == "ag_gemm" else False
            x, w = rand(hi - lo, K).to(device), rand(K, N).to(device)

            def run(x=x, w=w, persistent=persistent):
                return ag_gemm(x, w, TPContext(M), persistent=persistent)

            def new(x=x, w=w):
                a, b = rand(M, K), rand(K, N)
                x.copy_(a[lo:hi])
                w.copy_(b)
                return a.double() @ b.double()
        elif label.startswith("gemm_rs"):
            persistent = None if label == "gemm_rs" else False
            x, w = rand(M, khi - klo).to(device), rand(khi - klo, N).to(device)

            def run(x=x, w=w, persistent=persistent):
                return gemm_rs(x, w, persistent=persistent)

            def new(x=x, w=w):
                a, b = rand(M, K), rand(K, N)
                x.copy_(a[:, klo:khi])
                w.copy_(b[klo:khi])
                return (a.double() @ b.double())[lo:hi]
        elif label == "sp_attention":
            B, H, Hkv, D = 1, 4, 2, 64
            q, k, v = (rand(B, h, hi - lo, D).to(device) for h in (H, Hkv, Hkv))

            def run(q=q, k=k, v=v):
                return sp_attention(q, k, v, causal=True, ctx=SPContext(M))

            def new(q=q, k=k, v=v, B=B, H=H, Hkv=Hkv, D=D):
                qf, kf, vf = rand(B, H, M, D), rand(B, Hkv, M, D), rand(B, Hkv, M, D)
                for shard, full in ((q, qf), (k, kf), (v, vf)):
                    shard.copy_(full[:, :, lo:hi])
                kf, vf = (t.repeat_interleave(H // Hkv, dim=1) for t in (kf, vf))
                ref = torch.nn.functional.scaled_dot_product_attention(qf.double(), kf.double(), vf.double(),
                                                                       is_causal=True)
                return ref[:, :, lo:hi]
        else:  # TPMLP: hidden K, intermediate N
            gate, up = rand(N, K, scale=K**-0.5), rand(N, K, scale=K**-0.5)
            down = rand(K, N, scale=N**-0.5)
            mlp = TPMLP(gate, up, down)
            x = rand(hi - lo, K).to(device)

            def run(x=x, mlp=mlp):
                return mlp(x, TPContext(M))

            def new(x=x, gate=gate, up=up, down=down):
                a = rand(M, K)
                x.copy_(a[lo:hi])
                a, gd, ud, dd = (t.double() for t in (a, gate, up, down))
                return ((torch.nn.functional.silu(a @ gd.t()) * (a @ ud.t())) @ dd.t())[lo:hi]

        worst = _cuda_replays_error(run, new, device, replays)
        try:
            for kernel in (tp_kernels.ag_gemm_persistent_kernel, tp_kernels.ag_gemm_kernel,
                           tp_kernels.gemm_rs_persistent_kernel, tp_kernels.gemm_rs_kernel,
                           attention_kernels.sp_attention_fwd_kernel):
                kernel.check()
        except tilelink.WaitTimeout:
            worst = float("inf")
        out[label] = worst
    return out


def operators_replay_their_own_tensor_work(M: int, N: int, K: int) -> dict[str, float]:
    """The operators themselves captured (not only their kernels' launches): what they do to tensors around the
    launches runs again on each replay, as a CUDA graph replays those copies too. bf16 ``ag_gemm`` and ``gemm_rs``
    (cast to fp32 for the interpreter and back) and FP8 ``ag_gemm`` with a per-tensor scale (sent as one value per
    row, expanded per call), each replayed with new inputs and a new scale. Returns each one's relative error."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs
    from tilelink.ops.tp_fp8 import quantize_fp8
    from tilelink.runtime.graphs import EmulatedGraph

    r, R = tilelink.rank(), tilelink.world_size()
    lo, hi = bounds(M, r, R)
    klo, khi = bounds(K, r, R)
    g = torch.Generator().manual_seed(9)
    x, w = torch.empty(hi - lo, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16)
    h, v = torch.empty(M, khi - klo, dtype=torch.bfloat16), torch.empty(khi - klo, N, dtype=torch.bfloat16)
    wq, ws = quantize_fp8(torch.randn(N, K, generator=g))
    own = torch.Generator().manual_seed(r)  # this rank's FP8 rows (g stays alike on every rank)
    xq = quantize_fp8(torch.randn(hi - lo, K, generator=own), rowwise=False)[0]
    xs = torch.ones(())
    ctx = TPContext(M)

    def calls():
        return (ag_gemm(x, w, ctx), gemm_rs(h, v),
                ag_gemm(xq, wq.t(), ctx, a_scale=xs, b_scale=ws, out_dtype=torch.float32))

    calls()  # the warm-up
    graph = EmulatedGraph()
    with graph.capture():
        outs = calls()
    errors = {"ag_gemm": 0.0, "gemm_rs": 0.0, "ag_gemm fp8": 0.0}
    for scale in (2.0, 0.5):
        a, b = torch.randn(M, K, generator=g).bfloat16(), torch.randn(K, N, generator=g).bfloat16()
        x.copy_(a[lo:hi]), w.copy_(b), h.copy_(a[:, klo:khi]), v.copy_(b[klo:khi])
        xs.fill_(scale)
        graph.replay()
        ref = a.double() @ b.double()
        scales = torch.tensor(tilelink.runtime.current_world().control.exchange(scale, "scales")).double()
        shards = torch.cat([torch.full((bounds(M, p, R)[1] - bounds(M, p, R)[0],), scales[p]) for p in range(R)])
        mine = xq.double() @ (wq.double() * ws.double()[:, None]).t()
        fp8_ref = torch.cat(tilelink.runtime.current_world().control.exchange(mine, "rows")) * shards[:, None]
        for (label, reference), out in zip((("ag_gemm", ref), ("gemm_rs", ref[lo:hi]), ("ag_gemm fp8", fp8_ref)),
                                           outs, strict=True):
            err = ((out.double() - reference).norm() / reference.norm()).item() if reference.numel() else 0.0
            errors[label] = max(errors[label], err if err == err else float("inf"))  # NaN: rows never written
    return errors


def cuda_all_reduce_replays_match_torch(shapes: list[tuple[int, int, int]], replays: int,
                                        forms: tuple[str, ...] = AR_FORMS) -> dict[str, float]:
    """Each GEMM + all-reduce form (:data:`AR_FORMS`) at each (M, N, K), in bf16: captured in a CUDA graph once
    (after an uncaptured call, the warm-up) and replayed ``replays`` times, new data copied into the captured inputs
    before each replay; then two uncaptured calls and a replay again. Returns each form and shape's largest relative
    error against torch (``inf`` if a wait timed out: raised by the kernel's next check)."""
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(17)
    out: dict[str, float] = {}
    for M, N, K in shapes:
        for label in forms:
            run, new, kernel = _all_reduce_form(label, M, N, K, g, device)
            worst = _cuda_replays_error(run, new, device, replays)
            try:
                kernel.check()
            except tilelink.WaitTimeout:
                worst = float("inf")
            out[f"{label} M={M}"] = worst
    return out
