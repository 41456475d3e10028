"""Rank functions of the captured-layer tests: ``TPMLP``, ``sp_attention`` and ``SPAttention``, ``TPDecoderLayer``
and ``TPDecoder`` (dense, and MoE) captured once and replayed with new data written into the captured inputs, every
replay against torch (emulated worlds: :class:`tilelink.runtime.graphs.EmulatedGraph`; on a GPU a CUDA graph)."""

from __future__ import annotations

import dataclasses

import torch

import tilelink
import tilelink.runtime
from tests.ops.graph_worlds import replay_errors
from tests.ops.tp_worlds import bounds

#: the captured layers: the MLP with a context, without (its M exchanged on the host at the capture) and FP8 (its
#: tokens and activation quantised per row in the capture), the attention operator with a context and the layer
#: without (S exchanged), one decoder layer (the caller's RoPE tables), and the decoder whole, dense and MoE
LAYER_FORMS = ("TPMLP", "TPMLP without context", "TPMLP fp8", "sp_attention", "SPAttention", "TPDecoderLayer",
               "TPDecoder", "TPDecoder moe")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The shapes of the forms: ``tokens`` rows of the sequence, the MLP's ``hidden`` and ``intermediate``, the
    attention's ``heads``, ``kv_heads`` and ``head_dim``, and the decoders' configurations (by name, with
    ``layers`` layers; ``moe`` overrides fields of the MoE one) over ``batch`` sequences of ``tokens // batch``."""

    tokens: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    dense: str
    moe: str
    batch: int = 2
    layers: int = 2
    moe_overrides: tuple = ()


#: the emulated world's shapes (the interpreter is slow): tokens not a multiple of 2 or 3 ranks' rows
EMULATED = Sizes(tokens=14, hidden=16, intermediate=20, heads=2, kv_heads=1, head_dim=16, dense="tiny", moe="tiny-moe")
#: the GPU's: the decoders on the "small" configuration; the MoE decoder takes every expert for every token (top-k of
#: all 4), so a bf16 near-tie in the router cannot send a token elsewhere than the fp64 reference does
CUDA = Sizes(tokens=202, hidden=512, intermediate=512, heads=4, kv_heads=2, head_dim=64, dense="small", moe="small",
             moe_overrides=(("name", "small-moe"), ("intermediate", 256), ("experts", 4), ("top_k", 4)))


def _config(sizes: Sizes, moe: bool):
    from tilelink.ops import models

    if moe:
        return dataclasses.replace(models.get_config(sizes.moe), **dict(sizes.moe_overrides)).with_layers(sizes.layers)
    return models.get_config(sizes.dense).with_layers(sizes.layers)


def _form(label: str, sizes: Sizes, g: torch.Generator, device: torch.device, dtype: torch.dtype):
    """``(run, new)`` of a captured form on this rank: ``run()`` calls the layer on the captured inputs and returns
    its output; ``new()`` writes new data into those inputs (alike on every rank: ``g`` is) and returns the
    reference of this rank's output in float64 on the CPU."""
    from tilelink.nn import TPMLP, SPAttention
    from tilelink.ops import SPContext, TPContext, sp_attention

    r, R = tilelink.rank(), tilelink.world_size()
    M = sizes.tokens
    lo, hi = bounds(M, r, R)

    def rand(*shape, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    if label.startswith("TPMLP"):
        H, inter = sizes.hidden, sizes.intermediate
        gate, up = rand(inter, H, scale=H**-0.5), rand(inter, H, scale=H**-0.5)
        down = rand(H, inter, scale=inter**-0.5)
        fp8 = label == "TPMLP fp8"
        mlp = TPMLP(gate, up, down, fp8=fp8)
        x = torch.empty(hi - lo, H, dtype=dtype, device=device)
        ctx = None if label == "TPMLP without context" else TPContext(M)

        def run():
            return mlp(x, ctx)

        def new():
            a = rand(M, H)
            x.copy_(a[lo:hi])
            if fp8:
                return _fp8_mlp_reference(a, gate, up, down)[lo:hi]
            a, gd, ud, dd = (t.double() for t in (a, gate, up, down))
            return ((torch.nn.functional.silu(a @ gd.t()) * (a @ ud.t())) @ dd.t())[lo:hi]

        return run, new
    if label in ("sp_attention", "SPAttention"):
        B, Hq, Hkv, D = 1, sizes.heads, sizes.kv_heads, sizes.head_dim
        q, k, v = (torch.empty(B, h, hi - lo, D, dtype=dtype, device=device) for h in (Hq, Hkv, Hkv))
        if label == "SPAttention":
            layer = SPAttention(Hq, Hkv, causal=True)  # no seq_len: S exchanged on the host per call

            def run():
                return layer(q, k, v)
        else:
            def run():
                return sp_attention(q, k, v, causal=True, ctx=SPContext(M))

        def new():
            qf, kf, vf = rand(B, Hq, M, D), rand(B, Hkv, M, D), rand(B, Hkv, M, D)
            for shard, full in ((q, qf), (k, kf), (v, vf)):
                shard.copy_(full[:, :, lo:hi])
            kf, vf = (t.double().repeat_interleave(Hq // Hkv, dim=1) for t in (kf, vf))
            ref = torch.nn.functional.scaled_dot_product_attention(qf.double(), kf, vf, is_causal=True)
            return ref[:, :, lo:hi]

        return run, new
    return _decoder_form(label, sizes, g, device, dtype)


def _fp8_mlp_reference(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """``TPMLP(..., fp8=True)``'s output on all rows of ``x`` in float64, quantised as the layer quantises: the
    tokens and each rank's activation per row, each rank's weights per output column."""
    from tilelink.ops.tp_fp8 import quantize_fp8

    def deq(t: torch.Tensor) -> torch.Tensor:
        q, s = quantize_fp8(t)
        return q.double() * s.double()[:, None]

    R, inter = tilelink.world_size(), gate.shape[0]
    h = deq(x) @ torch.cat([deq(gate), deq(up)]).t()
    act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    out = torch.zeros(x.shape[0], down.shape[0], dtype=torch.float64)
    for rank in range(R):
        ilo, ihi = bounds(inter, rank, R)
        out += deq(act[:, ilo:ihi].float()) @ deq(down[:, ilo:ihi].contiguous()).t()
    return out


def _decoder_form(label: str, sizes: Sizes, g: torch.Generator, device: torch.device, dtype: torch.dtype):
    """``(run, new)`` of ``TPDecoderLayer`` (layer 0 of the dense configuration, its RoPE tables computed once by the
    caller) or of ``TPDecoder`` (dense, or ``"TPDecoder moe"``), against the unsharded model in float64."""
    from tilelink.ops import TPContext, models
    from tilelink.ops.models_reference import unsharded_forward, unsharded_layer

    r, R = tilelink.rank(), tilelink.world_size()
    config = _config(sizes, label == "TPDecoder moe")
    batch = sizes.batch
    seq = sizes.tokens // batch
    T = batch * seq
    lo, hi = models.row_bounds(T, r, R)
    seed = 5

    def full(w: models.LayerWeights) -> models.LayerWeights:  # the reference's: the model's weights in float64
        return models.LayerWeights(**{f.name: None if getattr(w, f.name) is None else getattr(w, f.name).double().cpu()
                                      for f in dataclasses.fields(w)})

    x = torch.empty(hi - lo, config.hidden, dtype=dtype, device=device)
    if label == "TPDecoderLayer":
        weights = models.layer_weights(config, 0, seed, device, dtype)
        layer = models.TPDecoderLayer(config, weights, r, R, device)
        ctx, rope = TPContext(T), models.rope_tables(config, seq, device)
        ref_w, ref_rope = full(weights), models.rope_tables(config, seq, "cpu")
        ref_rope = tuple(t.double() for t in ref_rope) if ref_rope is not None else None

        def run():
            return layer(x, ctx, batch, seq, rope)

        def reference(a: torch.Tensor) -> torch.Tensor:
            return unsharded_layer(config, ref_w, a, batch, seq, ref_rope)
    else:
        model = models.TPDecoder(config, seed=seed, dtype=dtype)
        ref_ws = [full(models.layer_weights(config, i, seed, device, dtype)) for i in range(config.layers)]
        ref_norm = models.final_norm_weight(config, seed, device, dtype).double().cpu()

        def run():
            return model(x, batch, seq)

        def reference(a: torch.Tensor) -> torch.Tensor:
            return unsharded_forward(config, ref_ws, ref_norm, a, batch, seq)

    def new():
        a = torch.randn(T, config.hidden, generator=g).to(dtype)
        x.copy_(a[lo:hi])
        return reference(a.double())[lo:hi]

    return run, new


def _kernels():
    """The overlapped kernels the forms launch (their checks raise a replay's timed-out wait)."""
    from tilelink.ops import attention_kernels, tp_fp8_kernels, tp_kernels

    return (tp_kernels.ag_gemm_persistent_kernel, tp_kernels.ag_gemm_kernel, tp_kernels.gemm_rs_persistent_kernel,
            tp_kernels.gemm_rs_kernel, attention_kernels.sp_attention_fwd_kernel,
            *(getattr(tp_fp8_kernels, f"{part}_fp8{form}_kernel") for part in ("ag_gemm", "gemm_rs")
              for form in ("", "_persistent")))


def layer_replays_match_torch(forms: tuple[str, ...], replays: int, late_s: float = 0.0,
                              cuda: bool = False) -> dict[str, list[float]]:
    """Each form (:data:`LAYER_FORMS`): one uncaptured call (the warm-up that makes the contexts and loads the
    kernels), one call captured (an :class:`~tilelink.runtime.graphs.EmulatedGraph`, or with ``cuda`` a
    ``torch.cuda.CUDAGraph``, on the shapes of :data:`EMULATED` or :data:`CUDA`), then ``replays`` replays, each
    after new data is written into the captured inputs (the output filled with NaN before, so a replay that writes
    nothing is seen); on the second replay rank 1 writes its data ``late_s`` late, so a peer that did not wait for it
    would read its last data; then two uncaptured calls and a replay again. Returns each one's relative error
    against torch, then ``inf`` if a wait timed out."""
    from tilelink.runtime.graphs import EmulatedGraph

    r = tilelink.rank()
    device = tilelink.runtime.current_world().device
    sizes, dtype = (CUDA, torch.bfloat16) if cuda else (EMULATED, torch.float32)
    g = torch.Generator().manual_seed(23)
    out: dict[str, list[float]] = {}
    for label in forms:
        run, new = _form(label, sizes, g, device, dtype)
        new()
        run()  # uncaptured: makes the contexts
        if cuda:
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = run()
        else:
            graph = EmulatedGraph()
            with graph.capture():
                y = run()
        steps = [("replay", late_s if i == 1 else 0.0) for i in range(replays)]
        steps += [("call", 0.0), ("call", 0.0), ("replay", 0.0)]
        out[label] = replay_errors(graph, y, run, new, steps, r, _kernels())
    return out
