"""Rank side of test_operator_mutations.py: every operator of :mod:`tilelink.ops` run with ONE inserted wait or
notify taken out of one of the overlapped kernels it launches (``tests.rules.mutations.mutant``).

Each operator has a runner made once per rank (inputs and the float64 torch reference, the same on every rank)
that calls it on one of its kernels (``persistent``: the persistent tensor-descriptor kernel on the copy engine,
forced in the interpreter, or the pointer kernel; ``None`` for sp_attention, which has one kernel) and returns
this rank's relative error. Shapes are small and odd, chosen so that each inserted call guards rows some rank
reads from a peer before any other wait of the call has asked for their channel (the race-exposing schedule
delivers a channel once, at its first wait, and the interpreter runs a launch's programs one after another):

- ag_gemm persistent, M=37 (rows 19 + 18), N=20: six 16x16 tiles on four programs, the last two in
  ``TAIL_SPLIT=2`` column pieces. Rank 1's first main-loop tile reads rank 0's rows; rank 0's program 0 reads
  only its own rows in the main loop, then rank 1's rows (32-36) in its tail piece: each of the two waits is
  the first to ask for a peer's channel on some rank.
- ag_moe persistent: the routing sends rank 0's tokens to experts 0-3 and rank 1's to experts 4 and 5, one
  16-slot block each: six M tiles of one column tile, four in the main loop, the last two (experts 4, 5) in
  tail pieces. Rank 0 meets rank 1's tokens in the tail only, rank 1 meets rank 0's in program 0's main loop.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable

import torch

import tilelink
import tilelink.runtime
from tests.rules.mutations import mutant, mutation_points
from tilelink.mapping import shard_range

#: the overlapped kernels each operator launches: (module of tilelink.ops, kernel, ``persistent=`` that selects it)
VARIANTS: dict[str, list[tuple[str, str, bool | None]]] = {
    "ag_gemm": [("tp_kernels", "ag_gemm_kernel", False), ("tp_kernels", "ag_gemm_persistent_kernel", True)],
    "gemm_rs": [("tp_kernels", "gemm_rs_kernel", False), ("tp_kernels", "gemm_rs_persistent_kernel", True)],
    "ag_moe": [("moe_kernels", "ag_group_gemm_kernel", False),
               ("moe_kernels", "ag_group_gemm_persistent_kernel", True)],
    "moe_rs": [("moe_kernels", "group_gemm_rs_kernel", False), ("moe_kernels", "group_gemm_rs_sweep_kernel", True)],
    "sp_attention": [("attention_kernels", "sp_attention_fwd_kernel", None)],
    "ag_gemm_fp8": [("tp_fp8_kernels", "ag_gemm_fp8_kernel", False),
                    ("tp_fp8_kernels", "ag_gemm_fp8_persistent_kernel", True)],
    "gemm_rs_fp8": [("tp_fp8_kernels", "gemm_rs_fp8_kernel", False),
                    ("tp_fp8_kernels", "gemm_rs_fp8_persistent_kernel", True)],
}

#: a result at least this far from torch (relative, float32 inputs) is wrong
TOLERANCE = 1e-4


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error of ``x`` against the float64 ``ref``; NaN when ``x`` holds a NaN or an infinity (poison
    read)."""
    x = x.double().cpu()
    if not bool(torch.isfinite(x).all()):
        return float("nan")
    return ((x - ref).norm() / max(ref.norm().item(), 1e-30)).item()


def _split_last_wave(tiles: int) -> None:
    """The persistent kernel's ``tiles`` 16x16 tiles (the interpreter's) leave two for a last wave in two column
    pieces: its tail loop runs, after one main-loop tile on each program (see the module's docstring)."""
    from tilelink.ops.contract import tail_split
    from tilelink.ops.tp import INTERPRETED_SMS

    assert tiles % INTERPRETED_SMS == 2 and tiles > INTERPRETED_SMS, (tiles, INTERPRETED_SMS)
    assert tail_split(tiles, INTERPRETED_SMS, 16) == 2, tiles


def _setup():
    r, R = tilelink.rank(), tilelink.world_size()
    return r, R, tilelink.runtime.current_world().device


def _ag_gemm() -> Callable[[bool | None], float]:
    from tilelink.ops import TPContext, ag_gemm

    r, R, device = _setup()
    M, N, K = 37, 20, 12
    _split_last_wave(-(-M // 16) * -(-N // 16))
    g = torch.Generator().manual_seed(31)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    lo, hi = shard_range(M, r, R)
    ref = a.double() @ b.double()
    shard, b_dev = a[lo:hi].contiguous().to(device), b.to(device)
    return lambda persistent: _rel(ag_gemm(shard, b_dev, TPContext(M), persistent=persistent), ref)


def _gemm_rs() -> Callable[[bool | None], float]:
    from tilelink.ops import gemm_rs

    r, R, device = _setup()
    M, N, K = 37, 20, 11
    g = torch.Generator().manual_seed(32)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    lo, hi = shard_range(M, r, R)
    klo, khi = shard_range(K, r, R)
    ref = (a.double() @ b.double())[lo:hi]
    a_dev, b_dev = a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device)
    return lambda persistent: _rel(gemm_rs(a_dev, b_dev, persistent=persistent), ref)


#: tokens, hidden size, intermediate size, experts, top-k of the MoE operators
MOE = dict(M=13, H=24, inter=20, E=6, top_k=2)


def moe_routing() -> torch.Tensor:
    """``topk_ids`` (13, 2): rank 0's tokens (0-6) to two of experts 0-3, rank 1's (7-12) to experts 4 and 5
    (see the module's docstring)."""
    M, E = MOE["M"], MOE["E"]
    lo, hi = shard_range(M, 1, 2)
    ids = [[t % 4, (t + 1) % 4] if t < lo else [4 + t % 2, 5 - t % 2] for t in range(M)]
    topk_ids = torch.tensor(ids, dtype=torch.int64)
    counts = torch.bincount(topk_ids.flatten(), minlength=E)
    assert hi == M and len(counts) == E and bool(((counts > 0) & (counts <= 16)).all()), counts  # a block each
    return topk_ids


def _ag_moe() -> Callable[[bool | None], float]:
    from tilelink.ops import ag_moe

    r, R, device = _setup()
    M, H, inter, E, top_k = MOE["M"], MOE["H"], MOE["inter"], MOE["E"], MOE["top_k"]
    g = torch.Generator().manual_seed(33)
    x = torch.randn(M, H, generator=g)
    w = torch.randn(E, H, inter, generator=g) / H**0.5
    topk_ids = moe_routing()
    lo, hi = shard_range(M, r, R)
    ilo, ihi = shard_range(inter, r, R)
    _split_last_wave(E)  # one 16-slot block per expert, one column tile (at most 16 columns a rank)
    assert -(-inter // R) <= 16
    ref = torch.einsum("sh,shi->si", x.double().repeat_interleave(top_k, 0),
                       w.double()[topk_ids.flatten()])[:, ilo:ihi]
    x_dev, w_dev, ids = x[lo:hi].contiguous().to(device), w[:, :, ilo:ihi].contiguous().to(device), topk_ids.to(device)
    return lambda persistent: _rel(ag_moe(x_dev, w_dev, ids, persistent=persistent), ref)


def _moe_rs() -> Callable[[bool | None], float]:
    from tilelink.ops import moe_rs

    r, R, device = _setup()
    M, H, inter, top_k = MOE["M"], MOE["H"], MOE["inter"], MOE["top_k"]
    g = torch.Generator().manual_seed(34)
    h = torch.randn(M * top_k, inter, generator=g)
    w = torch.randn(MOE["E"], inter, H, generator=g) / inter**0.5
    weights = torch.rand(M, top_k, generator=g)
    topk_ids = moe_routing()
    lo, hi = shard_range(M, r, R)
    ilo, ihi = shard_range(inter, r, R)
    per_slot = torch.einsum("si,sih->sh", h.double(), w.double()[topk_ids.flatten()])
    ref = (per_slot * weights.double().flatten()[:, None]).view(M, top_k, H).sum(1)[lo:hi]
    h_dev, w_dev = h[:, ilo:ihi].contiguous().to(device), w[:, ilo:ihi].contiguous().to(device)
    ids, weights_dev = topk_ids.to(device), weights.to(device)
    return lambda persistent: _rel(moe_rs(h_dev, w_dev, ids, weights_dev, persistent=persistent), ref)


def _sp_attention() -> Callable[[bool | None], float]:
    from tilelink.ops import SPContext, sp_attention

    r, R, device = _setup()
    B, H, Hkv, S, D = 1, 4, 2, 21, 16  # grouped-query heads; ranks of 11 and 10 rows
    g = torch.Generator().manual_seed(35)
    q, k, v = (torch.randn(B, heads, S, D, generator=g) for heads in (H, Hkv, Hkv))
    lo, hi = shard_range(S, r, R)
    kr, vr = (t.double().repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), kr, vr)[:, :, lo:hi]
    shards = [t[:, :, lo:hi].contiguous().to(device) for t in (q, k, v)]
    return lambda persistent: _rel(sp_attention(*shards, causal=False, ctx=SPContext(S)), ref)


def _fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` quantised to e4m3 per row: ``(q, scales, dequantised float64)``."""
    from tilelink.ops.tp_fp8 import quantize_fp8

    q, s = quantize_fp8(x)
    return q, s, q.double() * s.double()[:, None]


def _ag_gemm_fp8() -> Callable[[bool | None], float]:
    """As :func:`_ag_gemm` on e4m3 operands with row scales (gathered with A's rows), fp32 out. The FP8 kernels'
    interpreter tiles are 16 x 32: N = 40 (padded to 48) makes the same six tiles, the last two in pieces."""
    from tilelink.ops import TPContext, ag_gemm
    from tilelink.ops.contract import tail_split
    from tilelink.ops.tp import INTERPRETED_SMS

    r, R, device = _setup()
    M, N, K = 37, 40, 16
    assert tail_split(3 * 2, INTERPRETED_SMS, 32) == 2
    g = torch.Generator().manual_seed(36)
    lo, hi = shard_range(M, r, R)
    a, a_s, a_deq = _fp8(torch.randn(M, K, generator=g))
    w, w_s, w_deq = _fp8(torch.randn(N, K, generator=g))
    ref = a_deq @ w_deq.t()
    args = (a[lo:hi].contiguous().to(device), w.t().to(device))
    scales = dict(a_scale=a_s[lo:hi].contiguous().to(device), b_scale=w_s.to(device), out_dtype=torch.float32)
    return lambda persistent: _rel(ag_gemm(*args, TPContext(M), persistent=persistent, **scales), ref)


def _gemm_rs_fp8() -> Callable[[bool | None], float]:
    """As :func:`_gemm_rs` on e4m3 operands, each rank's slice of K quantised with its own row scales, fp32 out."""
    from tilelink.ops import gemm_rs

    r, R, device = _setup()
    M, N, K = 37, 20, 11
    g = torch.Generator().manual_seed(37)
    a, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    lo, hi = shard_range(M, r, R)
    ref, mine = torch.zeros(M, N, dtype=torch.float64), None
    for s in range(R):
        klo, khi = shard_range(K, s, R)
        (qa, sa, da), (qw, sw, dw) = _fp8(a[:, klo:khi].contiguous()), _fp8(w[:, klo:khi].contiguous())
        ref += da @ dw.t()
        if s == r:
            mine = (qa.to(device), qw.t().to(device), sa.to(device), sw.to(device))
    qa, qw, sa, sw = mine
    ref = ref[lo:hi]
    return lambda persistent: _rel(gemm_rs(qa, qw, persistent=persistent, a_scale=sa, b_scale=sw,
                                           out_dtype=torch.float32), ref)


RUNNERS: dict[str, Callable[[], Callable[[bool | None], float]]] = {
    "ag_gemm": _ag_gemm, "gemm_rs": _gemm_rs, "ag_moe": _ag_moe, "moe_rs": _moe_rs, "sp_attention": _sp_attention,
    "ag_gemm_fp8": _ag_gemm_fp8, "gemm_rs_fp8": _gemm_rs_fp8}


def _launched(okernel) -> bool:
    """Whether ``okernel``'s current launcher ran a call (made a context) in this world."""
    return okernel._launcher is not None and bool(okernel._launcher.contexts)


def _outcome(run: Callable[[], float], okernel) -> str:
    """``"failed: ..."`` when the call was caught (a wrong result, or a timed-out wait, or a refused launch),
    ``"passed"`` when its result is right, ``"not launched"`` when the kernel did not run, ``"error: ..."`` for
    any other exception (not a catch: the mutant or the test is broken)."""
    try:
        err = run()
    except (tilelink.WaitTimeout, tilelink.LaunchError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        return f"failed: {type(exc).__name__}: {first}"
    except Exception as exc:  # noqa: BLE001 - reported with its traceback
        return f"error: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
    if not _launched(okernel):
        return "not launched"
    return "passed" if err <= TOLERANCE else f"failed: relative error {err}"


def run_operator_mutants(op: str) -> dict:
    """On this rank (every rank runs the same calls in the same order): for each overlapped kernel ``op``
    launches, its inserted waits and notifies (``points``), the unmutated call's outcome (``baseline``, which
    must pass) and, for each mutant, the dropped call and the outcome (``mutants``: (label, outcome))."""
    run = RUNNERS[op]()
    result: dict = {"points": {}, "baseline": {}, "mutants": []}
    for module, name, persistent in VARIANTS[op]:
        okernel = getattr(importlib.import_module(f"tilelink.ops.{module}"), name)
        points = mutation_points(okernel.generated, name)
        result["points"][name] = points
        if not points:
            continue
        result["baseline"][name] = _outcome(lambda p=persistent: run(p), okernel)
        original = (okernel.generated, okernel._module, okernel._launcher)
        for index in range(points):
            okernel.generated, dropped = mutant(original[0], name, index)
            okernel._module = None
            okernel._launcher = None  # a new launcher: new contexts, no timed-out wait of an earlier mutant
            try:
                result["mutants"].append((f"{name}#{index} ({dropped})",
                                          _outcome(lambda p=persistent: run(p), okernel)))
            finally:
                okernel.generated, okernel._module, okernel._launcher = original
    return result
