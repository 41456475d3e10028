"""Rank functions of the captured MoE tests: ``ag_moe`` and ``moe_rs`` captured once and replayed with new tokens
and a new routing each time (emulated worlds: :class:`tilelink.runtime.graphs.EmulatedGraph`; on a GPU a CUDA
graph)."""

from __future__ import annotations

import torch

import tilelink
import tilelink.runtime
from tests.ops.moe_worlds import bounds

#: the routings a replay takes, in turn: every expert some tokens; the last expert none; every token's first
#: choice expert 0; every token on experts 0 and 1 alone (the others none); every token on expert 0 (top_k 1)
ROUTINGS = ("random", "one empty", "all first on 0", "all on 0 and 1", "random")


def new_routing(M: int, E: int, top_k: int, kind: str, g: torch.Generator) -> torch.Tensor:
    """``topk_ids`` (M, top_k) of distinct experts per token, of the routing ``kind`` (:data:`ROUTINGS`)."""
    usable = E - 1 if kind == "one empty" else E
    ids = torch.stack([torch.randperm(usable, generator=g)[:top_k] for _ in range(M)])
    if kind == "all first on 0":
        ids = torch.stack([torch.cat([torch.zeros(1, dtype=torch.int64), 1 + torch.randperm(E - 1, generator=g)])
                           [:top_k] for _ in range(M)])
    if kind == "all on 0 and 1":
        ids = torch.arange(top_k).repeat(M, 1)
    return ids


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    if not ref.numel():
        return 0.0
    err = ((x.double().cpu() - ref.double()).norm() / max(ref.double().norm().item(), 1e-30)).item()
    return err if err == err else float("inf")  # NaN: rows never written


def moe_replays_match_torch(M: int, H: int, inter: int, E: int, top_k: int, replays: int,
                            persistent: bool | None = None, graph_factory=None, path: str = "overlap"
                            ) -> dict[str, list[float]]:
    """``ag_moe`` and ``moe_rs`` called once uncaptured (the warm-up), captured once each, then replayed
    ``replays`` times, new tokens, activations, weights and routing (:data:`ROUTINGS` in turn) copied into the
    captured inputs before each; then one uncaptured call and a replay again. Returns each one's relative error
    against torch, in order. ``graph_factory``: a CUDA graph's capture (``None``: the emulated graph). ``path``:
    the operators' (``"plain"``: the grouped GEMM as written, around torch.distributed collectives)."""
    from tilelink.ops import ag_moe, moe_rs
    from tilelink.runtime.graphs import EmulatedGraph

    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(11)
    lo, hi = bounds(M, r, R)
    ilo, ihi = bounds(inter, r, R)
    x = torch.empty(hi - lo, H, dtype=dtype, device=device)
    w_up = torch.empty(E, H, ihi - ilo, dtype=dtype, device=device)
    h = torch.empty(M * top_k, ihi - ilo, dtype=dtype, device=device)
    w_down = torch.empty(E, ihi - ilo, H, dtype=dtype, device=device)
    ids = torch.empty(M, top_k, dtype=torch.int64, device=device)
    weights = torch.empty(M, top_k, dtype=torch.float32, device=device)

    def new(kind: str):
        """New data and routing copied into the captured inputs (the same on every rank); the references."""
        a = torch.randn(M, H, generator=g).to(dtype)
        wu = (torch.randn(E, H, inter, generator=g) / H**0.5).to(dtype)
        act = torch.randn(M * top_k, inter, generator=g).to(dtype)
        wd = (torch.randn(E, inter, H, generator=g) / inter**0.5).to(dtype)
        topk = new_routing(M, E, top_k, kind, g)
        wt = torch.rand(M, top_k, generator=g)
        x.copy_(a[lo:hi]), w_up.copy_(wu[:, :, ilo:ihi]), h.copy_(act[:, ilo:ihi]), w_down.copy_(wd[:, ilo:ihi])
        ids.copy_(topk), weights.copy_(wt)
        flat = topk.flatten()
        ref_up = torch.zeros(M * top_k, ihi - ilo, dtype=torch.float64)
        per_slot = torch.zeros(M * top_k, H, dtype=torch.float64)
        for e in range(E):  # expert by expert: a gathered copy of the weights per slot would not fit at GPU sizes
            slots = (flat == e).nonzero(as_tuple=True)[0]
            ref_up[slots] = a.double()[slots // top_k] @ wu.double()[e, :, ilo:ihi]
            per_slot[slots] = act.double()[slots] @ wd.double()[e]
        per_slot *= wt.double().flatten()[:, None]
        return ref_up, per_slot.view(M, top_k, H).sum(1)[lo:hi]

    def calls():
        return (ag_moe(x, w_up, ids, persistent=persistent, path=path),
                moe_rs(h, w_down, ids, weights, persistent=persistent, path=path))

    new("random")
    calls()  # the warm-up: contexts, kernels
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    errors: dict[str, list[float]] = {"ag_moe": [], "moe_rs": []}
    if graph_factory is None:
        graph = EmulatedGraph()
        with graph.capture():
            outs = calls()
        replay = graph.replay
    else:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = calls()
        replay = graph.replay
    steps = [("replay", ROUTINGS[i % len(ROUTINGS)]) for i in range(replays)] + [("call", "random"),
                                                                                  ("replay", "one empty")]
    for step, kind in steps:
        refs = new(kind)
        if step == "replay":
            replay()
            got = outs
        else:
            got = calls()
        for label, out, ref in zip(("ag_moe", "moe_rs"), got, refs, strict=True):
            errors[label].append(_rel(out, ref))
    return errors


def warm_up_launches_once(M: int, H: int, inter: int, E: int, top_k: int, persistent: bool | None = None
                          ) -> tuple[dict[str, int], dict[str, list[float]]]:
    """:func:`moe_replays_match_torch` with one replay on a CUDA graph, counting the host launches of each MoE
    grouped GEMM: the warm-up's, the capture's and the uncaptured call's, one each (the warm-up loads the captured
    form's kernels without running them). Returns the counts and the errors."""
    from tilelink.ops import moe_kernels

    counts: dict[str, int] = {}
    for name in ("ag_group_gemm_kernel", "ag_group_gemm_persistent_kernel", "group_gemm_rs_kernel",
                 "group_gemm_rs_sweep_kernel"):
        launcher = getattr(moe_kernels, name).launcher

        def counted(grid, bound, launch=launcher.launch, name=name):
            counts[name] = counts.get(name, 0) + 1
            return launch(grid, bound)

        launcher.launch = counted
    errors = moe_replays_match_torch(M, H, inter, E, top_k, 1, persistent, True)
    return counts, errors


def _replay_out_of_range(M: int, H: int, E: int, bad: int):
    """``ag_moe`` called, captured, and replayed once with token 1 routed to expert id ``bad`` on every rank (the
    replay finishes, the id clamped into range). Returns the call (run it again uncaptured) and the ids."""
    from tilelink.ops import ag_moe
    from tilelink.runtime.graphs import EmulatedGraph

    r, R = tilelink.rank(), tilelink.world_size()
    lo, hi = bounds(M, r, R)
    x = torch.randn(hi - lo, H)
    w = torch.randn(E, H, 8)
    ids = torch.zeros(M, 1, dtype=torch.int64)

    def call():
        return ag_moe(x, w, ids, path="overlap")

    call()
    graph = EmulatedGraph()
    with graph.capture():
        call()
    ids[1, 0] = bad
    graph.replay()
    return call, ids


def captured_ids_out_of_range(M: int, H: int, E: int) -> list[str]:
    """A replay routed to an expert id outside ``[0, E)``: it finishes (the id clamped into range), and the next
    uncaptured call raises it; the one after runs. Returns the messages (``"no error"`` where none)."""
    call, ids = _replay_out_of_range(M, H, E, E + 2)
    messages = []
    for _ in range(2):
        ids[1, 0] = 1
        try:
            call()
            messages.append("no error")
        except tilelink.LaunchError as exc:
            messages.append(str(exc))
    return messages


def out_of_range_then_finalize(M: int, H: int, E: int) -> str:
    """A replay routed to an expert id outside ``[0, E)`` is the last call: ``tilelink.finalize()`` raises it.
    Returns the message (``"no error"`` where none)."""
    _replay_out_of_range(M, H, E, -3)
    try:
        tilelink.finalize()
    except tilelink.LaunchError as exc:
        return str(exc)
    return "no error"


def layer_replays_match_torch(M: int, H: int, inter: int, E: int, top_k: int, replays: int,
                              graph_factory=None) -> list[float]:
    """``TPMoE`` (router, top-k, both grouped GEMMs) called once uncaptured, captured once, then replayed
    ``replays`` times with new tokens and a new router each time (copied into the captured input and the layer's
    parameter), so the routing changes too: in turn a random router; one whose last expert no token picks; one
    whose expert 0 every token picks first (every token's column 0 is 1, and the router's column 0 sends it there or
    away); then one uncaptured call and a replay again. Returns each one's relative error against torch."""
    from tests.ops.moe_worlds import reference_moe
    from tilelink.nn import TPMoE
    from tilelink.runtime.graphs import EmulatedGraph

    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(13)
    gate = torch.randn(E, inter, H, generator=g) / H**0.5
    up = torch.randn(E, inter, H, generator=g) / H**0.5
    down = torch.randn(E, H, inter, generator=g) / inter**0.5
    moe = TPMoE(torch.zeros(E, H), gate, up, down, top_k=top_k)
    lo, hi = bounds(M, r, R)
    x = torch.empty(hi - lo, H, dtype=dtype, device=device)
    kinds = ("random", "last unused", "all first on 0")

    def new(kind: str) -> torch.Tensor:
        a = torch.randn(M, H, generator=g).to(dtype).float()
        a[:, 0] = 1.0
        router = torch.randn(E, H, generator=g)
        router[:, 0] = 0.0
        # the other columns' logits spread about sqrt(H): a margin of 10 H keeps the forced choice at any H
        if kind == "last unused":
            router[E - 1, 0] = -10.0 * H
        if kind == "all first on 0":
            router[0, 0] = 10.0 * H
        x.copy_(a[lo:hi])
        moe.router.data.copy_(router)
        probs = torch.softmax(a.double() @ router.double().t(), dim=-1)
        w, ids = torch.topk(probs, top_k, dim=-1)
        if kind == "last unused":
            assert not (ids == E - 1).any()
        if kind == "all first on 0":
            assert (ids[:, 0] == 0).all()
        w = w / w.sum(-1, keepdim=True)
        gate_up = torch.cat([gate.transpose(1, 2), up.transpose(1, 2)], dim=2)
        return reference_moe(a, gate_up, down.transpose(1, 2), ids, w)[lo:hi]

    new("random")
    moe(x)  # the warm-up
    if graph_factory is None:
        graph = EmulatedGraph()
        with graph.capture():
            y = moe(x)
    else:
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = moe(x)
    errors = []
    for step, kind in [("replay", kinds[i % len(kinds)]) for i in range(replays)] + [("call", "random"),
                                                                                    ("replay", "last unused")]:
        ref = new(kind)
        if step == "replay":
            graph.replay()
            got = y
        else:
            got = moe(x)
        errors.append(_rel(got, ref))
    return errors


def layer_captured_after_other_shapes(sizes: tuple[int, ...], H: int, inter: int, E: int, top_k: int,
                                      replays: int) -> list[float]:
    """``TPMoE`` called uncaptured on ``sizes[:-1]`` tokens in turn (each rank its rows of them), then captured on
    ``sizes[-1]`` tokens and replayed ``replays`` times with new tokens. With sizes (8, 7, 8) at 2 ranks, rank 0
    holds 4 rows in every call and rank 1 holds 4, then 3, then 4: a rank cannot tell the ranks' counts at the
    capture from its own. Returns the errors of the uncaptured calls, then of each replay, against torch."""
    from tests.ops.moe_worlds import reference_moe
    from tilelink.nn import TPMoE
    from tilelink.runtime.graphs import EmulatedGraph

    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(17)
    router = torch.randn(E, H, generator=g)
    gate = torch.randn(E, inter, H, generator=g) / H**0.5
    up = torch.randn(E, inter, H, generator=g) / H**0.5
    down = torch.randn(E, H, inter, generator=g) / inter**0.5
    gate_up = torch.cat([gate.transpose(1, 2), up.transpose(1, 2)], dim=2)
    moe = TPMoE(router, gate, up, down, top_k=top_k)

    def tokens(M: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of M new tokens, and the reference output of those rows."""
        a = torch.randn(M, H, generator=g)
        w, ids = torch.topk(torch.softmax(a.double() @ router.double().t(), dim=-1), top_k, dim=-1)
        lo, hi = bounds(M, r, R)
        ref = reference_moe(a, gate_up, down.transpose(1, 2), ids, w / w.sum(-1, keepdim=True))[lo:hi]
        return a[lo:hi].to(device), ref

    errors = []
    for M in sizes[:-1]:
        x, ref = tokens(M)
        errors.append(_rel(moe(x), ref))
    x, _ = tokens(sizes[-1])
    graph = EmulatedGraph()
    with graph.capture():
        y = moe(x)
    for _ in range(replays):
        new, ref = tokens(sizes[-1])
        x.copy_(new)
        graph.replay()
        errors.append(_rel(y, ref))
    return errors
