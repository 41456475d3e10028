"""Rank functions of the MoE tests (run in spawned worlds, emulated or NVSHMEM; imported by name)."""

from __future__ import annotations

import torch

import tilelink
import tilelink.runtime


def bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per)


def routing(M: int, E: int, top_k: int, kind: str, g: torch.Generator) -> torch.Tensor:
    """``topk_ids`` (M, top_k) of distinct experts per token. ``kind``: "random"; "skewed" (the last
    expert receives nothing, expert 0 most); "one" (every token's first choice is expert 0)."""
    if kind == "one" and top_k == 1:
        return torch.zeros(M, 1, dtype=torch.int64)
    usable = E - 1 if kind == "skewed" and E > top_k else E
    ids = torch.stack([torch.randperm(usable, generator=g)[:top_k] for _ in range(M)])
    if kind in ("skewed", "one"):
        first = ids[:, :1].clone()
        ids[ids == 0] = first.expand_as(ids)[ids == 0]  # move expert 0 out of the way, then give it column 0
        ids[:, 0] = 0
        if kind == "skewed":
            ids[M // 2:, 0] = first[M // 2:, 0]  # half the tokens keep their random first choice
    return ids


def reference_moe(x, w_gate_up, w_down, topk_ids, topk_weights):
    """Loop over experts, float64: ``sum_k weight * down(silu(gate(x)) * up(x))`` of each token's experts.
    ``w_gate_up`` (E, H, 2I) columns gate | up, ``w_down`` (E, I, H)."""
    x = x.double()
    out = torch.zeros(x.shape[0], w_down.shape[2], dtype=torch.float64, device=x.device)
    inter = w_down.shape[1]
    for e in range(w_down.shape[0]):
        tok, k = (topk_ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = x[tok] @ w_gate_up[e].double()
        act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        out.index_add_(0, tok, (act @ w_down[e].double()) * topk_weights[tok, k].double()[:, None])
    return out


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / max(ref.double().norm().item(), 1e-30)).item()


def parts_match_torch(M: int, H: int, inter: int, E: int, top_k: int, kinds: list[str], dtype_name: str = "float32",
                      calls: int = 2, persistent: bool | None = None) -> dict[str, float]:
    """ag_moe and moe_rs, each rank holding its slice of every expert's intermediate dim, against a loop
    over experts, for each routing kind; every call twice (a context is reused at epoch 2).
    ``persistent``: force (True) or forbid (False) the tensor-descriptor kernels (ag_moe's persistent
    kernel, moe_rs's column sweep)."""
    from tilelink.ops import ag_moe, moe_rs

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, H, generator=g)
    w_up = torch.randn(E, H, inter, generator=g) / H**0.5
    w_down = torch.randn(E, inter, H, generator=g) / inter**0.5
    ilo, ihi = bounds(inter, r, R)
    lo, hi = bounds(M, r, R)
    out: dict[str, float] = {}
    for kind in kinds:
        topk_ids = routing(M, E, top_k, kind, g)
        weights = torch.rand(M, top_k, generator=g)
        dev = {n: t.to(dtype).to(device) for n, t in (("x", x), ("w_up", w_up), ("w_down", w_down))}
        ids = topk_ids.to(device)
        for _ in range(calls):
            up = ag_moe(dev["x"][lo:hi].contiguous(), dev["w_up"][:, :, ilo:ihi].contiguous(), ids,
                        persistent=persistent)
        assert up.shape == (M * top_k, ihi - ilo) and up.dtype == dtype
        ref_up = torch.einsum("sh,shi->si", x.double().repeat_interleave(top_k, 0),
                              w_up.double()[topk_ids.flatten()])[:, ilo:ihi]
        out[f"ag_moe/{kind}"] = _rel(up.cpu(), ref_up)
        h = torch.randn(M * top_k, inter, generator=g)
        for _ in range(calls):
            y = moe_rs(h[:, ilo:ihi].contiguous().to(dtype).to(device), dev["w_down"][:, ilo:ihi].contiguous(), ids,
                       weights.to(device), persistent=persistent)
        assert y.shape == (hi - lo, H) and y.dtype == dtype
        per_slot = torch.einsum("si,sih->sh", h.double(), w_down.double()[topk_ids.flatten()])
        ref_y = (per_slot * weights.double().flatten()[:, None]).view(M, top_k, H).sum(1)
        out[f"moe_rs/{kind}"] = _rel(y.cpu(), ref_y[lo:hi]) if hi > lo else 0.0
    if persistent is not None:  # the kernel that ran is the one asked for (it gathered with its own contexts)
        from tilelink.ops import moe_kernels

        assert bool(moe_kernels.ag_group_gemm_persistent_kernel.launcher.contexts) == persistent
        assert bool(moe_kernels.ag_group_gemm_kernel.launcher.contexts) == (not persistent)
        if H > 0:  # moe_rs launches nothing without columns
            assert bool(moe_kernels.group_gemm_rs_sweep_kernel.launcher.contexts) == persistent
            assert bool(moe_kernels.group_gemm_rs_kernel.launcher.contexts) == (not persistent)
    return out


def parts_with_sweep_spans(span: int, *args) -> tuple[dict[str, float], list[tuple[int, int, int, int]]]:
    """:func:`parts_match_torch` (``*args``, persistent kernels) with moe_rs's column sweep planned as its
    first M tile swept whole and the other M tiles' column tiles in spans of ``span`` (crossing from one M
    tile into the next where ``span`` does not divide the column tiles), whatever the SM count: the plan
    :func:`tilelink.ops.moe.sweep_plan` gives the last, partial wave of a large routing. Returns the errors
    and the plans the sweep ran with."""
    from tilelink.ops import moe

    plans: list[tuple[int, int, int, int]] = []
    planner, config = moe.sweep_plan, moe.sweep_config

    def plan(m_tiles: int, programs: int, n_tiles: int) -> tuple[int, int, int, int]:
        plans.append((1, 1, n_tiles, span))
        return plans[-1]

    moe.sweep_plan = plan
    moe.sweep_config = lambda K: {**config(K), "N_CHUNKS": None}  # planned, not a fixed number of runs
    try:
        return parts_match_torch(*args), plans
    finally:
        moe.sweep_plan, moe.sweep_config = planner, config


def experts_one_after_another(expert_counts: list[int], M: int, H: int, inter: int, top_k: int,
                              dtype_name: str = "float32") -> tuple[dict[str, float], dict[str, list[int]]]:
    """Two MoE layers of equal shapes but different expert counts, one after the other (``parts_match_torch``
    for each ``E``): the operators reuse their contexts (same buffers), but the kernels may need other
    variants (other constexprs, ``E`` specialised). Returns the errors, and for each overlapped kernel the
    number of variants each of its contexts loaded (``Launcher.warm_up``; none in the emulated world)."""
    from tilelink.ops import moe_kernels

    errors: dict[str, float] = {}
    for E in expert_counts:
        got = parts_match_torch(M, H, inter, E, top_k, ["random"], dtype_name, 2, True)
        errors |= {f"E={E} {name}": err for name, err in got.items()}
    variants = {}
    for name in ("ag_group_gemm_persistent_kernel", "group_gemm_rs_sweep_kernel"):
        variants[name] = [len(c.variants) for c in getattr(moe_kernels, name).launcher.contexts.values()]
    return errors, variants


def host_syncs_per_call(M: int, H: int, inter: int, E: int, top_k: int) -> dict[str, int]:
    """The synchronising CUDA operations (``torch.cuda.set_sync_debug_mode``) of one ag_moe and one moe_rs
    call after a first one (bf16): the routing's one copy to the host (``moe_routing.route``)."""
    import warnings

    from tilelink.ops import ag_moe, moe_rs

    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(9)
    lo, hi = bounds(M, r, R)
    ilo, ihi = bounds(inter, r, R)
    x = torch.randn(hi - lo, H, generator=g).to(torch.bfloat16).to(device)
    w_up = torch.randn(E, H, ihi - ilo, generator=g).to(torch.bfloat16).to(device)
    w_down = torch.randn(E, ihi - ilo, H, generator=g).to(torch.bfloat16).to(device)
    h = torch.randn(M * top_k, ihi - ilo, generator=g).to(torch.bfloat16).to(device)
    ids = routing(M, E, top_k, "random", g).to(device)
    weights = torch.rand(M, top_k, generator=g).to(device)
    calls = {"ag_moe": lambda: ag_moe(x, w_up, ids), "moe_rs": lambda: moe_rs(h, w_down, ids, weights)}
    syncs = {}
    for name, call in calls.items():
        call()  # the first call creates the context and loads the kernels
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs[name] = sum("synchroniz" in str(w.message) for w in caught)
    torch.cuda.synchronize()
    return syncs


def layer_matches_torch(M: int, H: int, inter: int, E: int, top_k: int, shared: bool,
                        dtype_name: str = "float32") -> float:
    """TPMoE (router, softmax top-k renormalised, TP experts, optional gated shared expert) vs torch."""
    from tilelink.nn import TPMoE

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(5)
    x = torch.randn(M, H, generator=g).to(dtype).float()  # the reference routes the very tokens the layer sees
    router = torch.randn(E, H, generator=g)
    gate = torch.randn(E, inter, H, generator=g) / H**0.5
    up = torch.randn(E, inter, H, generator=g) / H**0.5
    down = torch.randn(E, H, inter, generator=g) / inter**0.5
    kwargs = {}
    if shared:
        si = inter + 8
        kwargs = dict(shared_gate=torch.randn(si, H, generator=g) / H**0.5,
                      shared_up=torch.randn(si, H, generator=g) / H**0.5,
                      shared_down=torch.randn(H, si, generator=g) / si**0.5,
                      shared_expert_gate=torch.randn(1, H, generator=g) / H**0.5)
    moe = TPMoE(router, gate, up, down, top_k=top_k, **{k: v.to(device) for k, v in kwargs.items()})
    lo, hi = bounds(M, r, R)
    y = moe(x[lo:hi].contiguous().to(dtype).to(device))
    assert y.shape == (hi - lo, H) and y.dtype == dtype
    # the reference: torch on the full problem, routing from the same router
    logits = x.double() @ router.double().t()
    probs = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    gate_up = torch.cat([gate.transpose(1, 2), up.transpose(1, 2)], dim=2)
    ref = reference_moe(x, gate_up, down.transpose(1, 2), ids, w)
    if shared:
        sg, su, sd, seg = (kwargs[k].double() for k in ("shared_gate", "shared_up", "shared_down",
                                                          "shared_expert_gate"))
        xs = x.double()
        ref = ref + torch.sigmoid(xs @ seg.t()) * ((torch.nn.functional.silu(xs @ sg.t()) * (xs @ su.t())) @ sd.t())
    return _rel(y.cpu(), ref[lo:hi]) if hi > lo else 0.0


def bad_inputs() -> list[str]:
    """Each bad call must raise LaunchError before any kernel runs; returns the messages in order."""
    from tilelink.ops import ag_moe, moe_rs
    from tilelink.ops.moe_routing import route

    M, H, inter, E, k = 6, 16, 8, 4, 2
    x, w_up, w_down = torch.randn(M, H), torch.randn(E, H, inter), torch.randn(E, inter, H)
    ids, weights = torch.randint(0, E, (M, k)), torch.rand(M, k)
    h = torch.randn(M * k, inter)
    calls = [
        lambda: ag_moe(x, w_up, torch.randint(0, E, (M, E + 1))),  # top-k larger than the experts
        lambda: ag_moe(x, w_up, ids + E),  # ids out of range
        lambda: ag_moe(x, w_up, ids.float()),  # not integer ids
        lambda: ag_moe(x[:, :8].contiguous(), w_up, ids),  # hidden sizes differ
        lambda: ag_moe(x.half(), w_up, ids),  # dtypes differ
        lambda: ag_moe(x[:4], w_up, ids),  # not this rank's rows of the routed tokens
        lambda: ag_moe(x, w_up[0], ids),  # w not 3-D
        lambda: moe_rs(h[:5], w_down, ids, weights),  # not one row per slot
        lambda: moe_rs(h, w_down, ids, weights[:, :1].contiguous()),  # weights' shape
        lambda: moe_rs(h, w_down.transpose(1, 2), ids, weights),  # not contiguous
        lambda: ag_moe(x, w_up, ids.to("meta")),  # routing on another device
        lambda: moe_rs(h, w_down, route(ids, E + 1), weights),  # a routing made for other experts
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


def hybrid_calls_back_to_back(M: int, H: int, inter: int, E: int, top_k: int, calls: int,
                              dtype_name: str = "float32") -> list[float]:
    """The hybrid reduce-scatters (``moe_rs`` with top-k, ``gemm_rs`` without), ``calls`` calls of each with new
    data every call, queued one after another and checked only at the end: nothing waits between calls, so a
    call that read a receive slot the next call was already writing, or the slot of the call before, would
    give a wrong sum. The descriptor kernels are forced (the hybrid is theirs). Returns the relative error of
    every call, moe_rs's then gemm_rs's."""
    from tilelink.ops import gemm_rs, moe_kernels, moe_rs, tp_kernels

    for okernel in (moe_kernels.group_gemm_rs_sweep_kernel, tp_kernels.gemm_rs_persistent_kernel):
        assert okernel.plan.launch.via == "copy_engine", okernel

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    ilo, ihi = bounds(inter, r, R)
    lo, hi = bounds(M, r, R)
    g = torch.Generator().manual_seed(11)
    topk_ids = routing(M, E, top_k, "random", g)
    ids = topk_ids.to(device)
    w_down = torch.randn(E, inter, H, generator=g) / inter**0.5
    b = torch.randn(inter, H, generator=g) / inter**0.5
    w_dev = w_down[:, ilo:ihi].contiguous().to(dtype).to(device)
    b_dev = b[ilo:ihi].contiguous().to(dtype).to(device)
    inputs, outputs = [], []
    for _ in range(calls):
        h = torch.randn(M * top_k, inter, generator=g)
        weights = torch.rand(M, top_k, generator=g)
        a = torch.randn(M, inter, generator=g)
        inputs.append((h, weights, a))
        outputs.append((moe_rs(h[:, ilo:ihi].contiguous().to(dtype).to(device), w_dev, ids, weights.to(device),
                               persistent=True),
                        gemm_rs(a[:, ilo:ihi].contiguous().to(dtype).to(device), b_dev, persistent=True)))
    errors = []
    for (h, weights, a), (y, c) in zip(inputs, outputs, strict=True):
        per_slot = torch.einsum("si,sih->sh", h.double(), w_down.double()[topk_ids.flatten()])
        ref_y = (per_slot * weights.double().flatten()[:, None]).view(M, top_k, H).sum(1)[lo:hi]
        ref_c = (a.double() @ b.double())[lo:hi]
        errors.append((_rel(y.cpu(), ref_y), _rel(c.cpu(), ref_c)))
    for okernel in (moe_kernels.group_gemm_rs_sweep_kernel, tp_kernels.gemm_rs_persistent_kernel):
        assert okernel.launcher.contexts, f"{okernel} did not run"
    return [e for pair in zip(*errors, strict=True) for e in pair]
