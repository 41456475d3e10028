"""Rank functions of the FP8 operator tests (run in spawned emulated worlds; imported by name).

Every rank quantises what it holds itself (its rows of A for ``ag_gemm``, its slice of K for ``gemm_rs``), with
scales of its own, and every rank can make every other rank's quantised operands (the inputs come from one
seeded generator): the reference is the float64 product of the dequantised operands, ``q * scale``.
"""

from __future__ import annotations

import torch

import tilelink
import tilelink.runtime
from tests.ops.tp_worlds import bounds


def _quantized(x: torch.Tensor, scaling: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, scale, dequantised float64)`` of ``x``: row-wise (one scale per row) or per-tensor."""
    from tilelink.ops.tp_fp8 import quantize_fp8

    q, s = quantize_fp8(x, rowwise=scaling == "rowwise")
    return q, s, q.double() * (s.double()[:, None] if s.dim() else s.double())


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x = x.double().cpu()
    if not bool(torch.isfinite(x).all()):
        return float("nan")
    return ((x - ref).norm() / max(ref.norm().item(), 1e-30)).item()


def fp8_ops_match_reference(M: int, N: int, K: int, scaling: str, persistent: bool | None,
                            out_dtype_name: str = "float32", b_layout: str = "nk") -> dict[str, float]:
    """``ag_gemm`` and ``gemm_rs`` on e4m3 operands against the dequantised reference; ``scaling`` "rowwise"
    (A per row, B per column) or "tensor" (one scale per operand, per rank); ``b_layout`` "nk" (B the transpose of
    a row-major (N, K) weight) or "kn" (row-major B). Returns each operator's relative error on this rank."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs

    out_dtype = getattr(torch, out_dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(11)
    a = torch.randn(M, K, generator=g) * 3
    w = torch.randn(N, K, generator=g)  # the (N, K) weight
    # ag_gemm: rank r quantises its rows of A (a per-tensor scale is then its own), the weight whole
    shards = [_quantized(a[slice(*bounds(M, s, R))], scaling) for s in range(R)]
    wq, ws, wd = _quantized(w, scaling)
    lo, hi = bounds(M, r, R)
    aq, a_s, _ = shards[r]

    def b_of(q: torch.Tensor) -> torch.Tensor:
        return q.t() if b_layout == "nk" else q.t().contiguous()

    c = ag_gemm(aq.to(device), b_of(wq).to(device), TPContext(M), a_scale=a_s.to(device), b_scale=ws.to(device),
                out_dtype=out_dtype, persistent=persistent)
    assert c.dtype == out_dtype and c.shape == (M, N), (c.dtype, c.shape)
    ref = torch.cat([d for _, _, d in shards]) @ wd.t()
    out = {"ag_gemm": _rel(c, ref)}
    # gemm_rs: rank s holds columns [klo, khi) of A and of the weight, quantised by it
    ref = torch.zeros(M, N, dtype=torch.float64)
    mine = None
    for s in range(R):
        klo, khi = bounds(K, s, R)
        qa, sa, da = _quantized(a[:, klo:khi], scaling)
        qw, sw, dw = _quantized(w[:, klo:khi].contiguous(), scaling)
        ref += da @ dw.t()
        if s == r:
            mine = (qa, sa, qw, sw)
    qa, sa, qw, sw = mine
    y = gemm_rs(qa.to(device), b_of(qw).to(device), a_scale=sa.to(device), b_scale=sw.to(device),
                out_dtype=out_dtype, persistent=persistent)
    assert y.dtype == out_dtype and y.shape == (hi - lo, N), (y.dtype, y.shape)
    out["gemm_rs"] = _rel(y, ref[lo:hi]) if hi > lo else 0.0
    return out


def fp8_mlp_matches_reference(S: int, H: int, I: int) -> float:  # noqa: E741 - the intermediate size
    """``TPMLP(..., fp8=True)`` against the float64 MLP with the same quantisation of weights and activations."""
    from tilelink.nn import TPMLP
    from tilelink.ops.tp_fp8 import quantize_fp8

    r, R = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(8)
    gate, up = torch.randn(I, H, generator=g) / H**0.5, torch.randn(I, H, generator=g) / H**0.5
    down = torch.randn(H, I, generator=g) / I**0.5
    x = torch.randn(S, H, generator=g)
    device = tilelink.runtime.current_world().device
    mlp = TPMLP(*(t.to(device) for t in (gate, up, down)), fp8=True)
    assert mlp.w_gate_up.dtype == torch.float8_e4m3fn and mlp.w_down.dtype == torch.float8_e4m3fn
    lo, hi = bounds(S, r, R)
    y = mlp(x[lo:hi].contiguous().to(device))
    assert y.dtype == x.dtype and y.shape == (hi - lo, H)

    def deq(t: torch.Tensor) -> torch.Tensor:
        q, s = quantize_fp8(t)
        return q.double() * s.double()[:, None]

    # the reference quantises what the layer does: x per row, each rank's weight rows, each rank's activation
    h = deq(x) @ torch.cat([deq(gate), deq(up)]).t()
    act = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    ref = torch.zeros(S, H, dtype=torch.float64)
    for s in range(R):
        ilo, ihi = bounds(I, s, R)
        ref += deq(act[:, ilo:ihi].float()) @ deq(down[:, ilo:ihi].contiguous()).t()
    return _rel(y, ref[lo:hi]) if hi > lo else 0.0


def fp8_bad_inputs() -> list[str]:
    """Each bad FP8 call must raise LaunchError before any kernel runs; returns the messages."""
    from tilelink.ops import ag_gemm, gemm_rs

    f8 = torch.float8_e4m3fn
    a, b = torch.randn(8, 16).to(f8), torch.randn(4, 16).to(f8).t()
    one = torch.tensor(1.0)
    calls = [
        lambda: ag_gemm(a.to(torch.float8_e5m2), b.to(torch.float8_e5m2), a_scale=one, b_scale=one),  # e5m2
        lambda: ag_gemm(a, b, b_scale=one),  # a_scale missing
        lambda: ag_gemm(a, b, a_scale=torch.ones(3), b_scale=one),  # a scale for 3 rows, A has 8
        lambda: gemm_rs(a, b, a_scale=one, b_scale=torch.ones(4, 1)),  # B's column scales as a column
        lambda: gemm_rs(a, b, a_scale=one.double(), b_scale=one),  # fp64 scale
        lambda: ag_gemm(a, b.float(), a_scale=one, b_scale=one),  # one operand fp8, the other not
        lambda: ag_gemm(a.float(), b.float(), a_scale=one, b_scale=one),  # scales for fp32 operands
        lambda: gemm_rs(a, b, a_scale=one, b_scale=one, out_dtype=torch.int32),  # an out dtype that is no float
        lambda: ag_gemm(a.float(), b.float(), out_dtype=torch.bfloat16),  # out_dtype without fp8
        lambda: gemm_rs(a, b),  # no scale at all
        lambda: ag_gemm(a, b, a_scale=one, b_scale=one, path="plain"),  # the plain path has no FP8 form
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


def fp8_compiled_mlp_matches_eager() -> dict:
    """``TPMLP(fp8=True)`` eager, explained by Dynamo and compiled (``aot_eager``, ``fullgraph=True``): its graph
    breaks, graphs and tilelink ops, the compiled result's largest difference from eager (relative), and each FP8
    op's output metadata called for real and on fake tensors of the same inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from tilelink.nn import TPMLP
    from tilelink.ops.tp import TPContext
    from tilelink.ops.tp_fp8 import quantize_fp8

    r, R = tilelink.rank(), tilelink.world_size()
    S, H, I = 7, 16, 32  # noqa: E741 - the intermediate size
    g = torch.Generator().manual_seed(5)
    gate, up = torch.randn(I, H, generator=g) / 4, torch.randn(I, H, generator=g) / 4
    down = torch.randn(H, I, generator=g) / 5
    x = torch.randn(S, H, generator=g)
    lo, hi = bounds(S, r, R)
    layer = TPMLP(gate, up, down, fp8=True)
    args = (x[lo:hi].contiguous(), TPContext(S))
    torch._dynamo.reset()
    eager = layer(*args)
    explained = torch._dynamo.explain(layer)(*args)
    torch._dynamo.reset()
    out = torch.compile(layer, backend="aot_eager", fullgraph=True)(*args)
    ops = torch.ops.tilelink
    aq, a_s = quantize_fp8(torch.randn(S, H, generator=g)[lo:hi].contiguous())
    hq, h_s = quantize_fp8(torch.randn(S, layer.w_down.shape[0], generator=g))  # this rank's slice of I
    real, fake = {}, {}
    for name, op, op_args in (
            ("ag_gemm_fp8", ops.ag_gemm_fp8, (aq, layer.w_gate_up, a_s, layer.w_gate_up_scale, torch.float32, S, r,
                                              R, None)),
            ("gemm_rs_fp8", ops.gemm_rs_fp8, (hq, layer.w_down, h_s, torch.tensor(0.5), torch.bfloat16, r, R, None))):
        y = op(*op_args)
        real[name] = (tuple(y.shape), y.dtype)
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            f = op(*(mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in op_args))
        fake[name] = (tuple(int(s) for s in f.shape), f.dtype)
    nodes = [n for graph in explained.graphs for n in graph.graph.nodes if n.op == "call_function"]
    return {"breaks": explained.graph_break_count, "graphs": explained.graph_count,
            "ops": sorted({str(n.target).removeprefix("tilelink.").split(".")[0] for n in nodes
                           if str(n.target).startswith("tilelink.")}),
            "err": (out - eager).abs().max().item() / max(eager.abs().max().item(), 1e-30) if eager.numel() else 0.0,
            "real": real, "fake": fake}
