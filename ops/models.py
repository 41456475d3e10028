"""LLaMA-style tensor-parallel decoder, dense or mixture-of-experts, on TileLink's layers (paper §7.3).

Layout between layers: activations are **sequence sharded**. With T = batch·seq tokens and R ranks,
rank r holds rows ``[r·⌈T/R⌉, min(T, (r+1)·⌈T/R⌉))`` of the (T, hidden) activations, tokens in
batch-major order (token ``b·seq + s``). One decoder layer, on rank r:

1. ``h = rms_norm(x)`` on the local rows;
2. attention: ``qkv = ag_gemm(h, W_qkv_r)`` gathers the sequence while multiplying by this rank's
   columns of the fused QKV weight (its heads' Q columns, then their K and V columns); the
   attention of those heads runs locally (:func:`attention_core`: optional RoPE, causal
   ``scaled_dot_product_attention``, GQA by repeating K/V heads); ``gemm_rs(o, W_o_r)`` multiplies by
   this rank's rows of W_o and reduce-scatters back to the sequence shard; residual add;
3. ``x = x + TPMLP(rms_norm(x))`` (:class:`tilelink.nn.TPMLP`: AG+GEMM, SiLU·mul, GEMM+RS).

The MoE decoder (``config.experts > 0``; Mixtral / Qwen1.5-MoE style) is the same layer with step 3
replaced by ``x = x + TPMoE(rms_norm(x))`` (:class:`tilelink.nn.TPMoE`: replicated router, every
expert TP-sharded along its intermediate dimension, ``ag_moe`` / ``moe_rs``; Qwen's gated shared
expert inside the same TPMoE).

A final RMSNorm closes the stack. There is no embedding and no LM head: the input is the (T, hidden)
hidden state, as in the paper's end-to-end layer stack (vocabulary-parallel layers have no overlap
of the kind TileLink generates).

Heads are split evenly: ``heads % R == 0`` and either ``kv_heads % R == 0`` (each rank its own KV
heads) or ``R % kv_heads == 0`` (each KV head replicated on the ``R / kv_heads`` ranks whose Q heads
use it). Anything else raises :class:`tilelink.LaunchError` before a kernel runs.

The paper's models (:data:`MODELS`) are reproduced by their shapes — hidden, intermediate, heads, KV
heads, head size, layers; for the MoE models also experts, top-k and the shared expert. Model-specific
details are left out on purpose: Gemma-2's GeGLU (SiLU·mul here), logit soft-capping, sandwich norms and
sliding windows, Qwen-2's and Qwen1.5-MoE's QKV biases, Mixtral's sliding window. Weights are random,
generated from a seed identically on every rank (:func:`layer_weights`) and sharded by one helper
(:func:`shard_layer`) that :mod:`tilelink.ops.models_reference` uses too, so the two models compute the
same function and their outputs can be compared.

Data parallel across groups with TP inside (the paper's 2-node run) is described in ``docs/E2E.md``;
:func:`data_parallel_groups` builds the torch process groups for it.
"""

from __future__ import annotations

import dataclasses
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from tilelink.errors import LaunchError
from tilelink.mapping import shard_range


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shapes of a LLaMA-style decoder (``head_dim`` defaults to hidden / heads).

    MoE models (``experts > 0``): ``intermediate`` is each routed expert's intermediate size; each token
    goes to its ``top_k`` experts (router softmax in fp32, weights renormalised to sum to 1 when
    ``normalize_topk``, as Mixtral; Qwen1.5-MoE does not renormalise); ``shared_intermediate > 0`` adds a
    shared expert every token goes through, scaled by ``sigmoid(x · w_gate)`` when ``shared_expert_gate``
    (Qwen1.5-MoE). ``experts == 0``: the dense SiLU·mul MLP.
    """

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    layers: int
    head_dim: int = 0
    rope: bool = True
    rope_theta: float = 10000.0
    eps: float = 1e-5
    source: str = ""
    experts: int = 0
    top_k: int = 0
    shared_intermediate: int = 0
    shared_expert_gate: bool = False
    normalize_topk: bool = True

    def __post_init__(self) -> None:
        if self.head_dim == 0 and self.heads > 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def with_layers(self, layers: int) -> DecoderConfig:
        """The same model with ``layers`` decoder layers (benchmarks that cannot hold them all)."""
        return dataclasses.replace(self, layers=layers)

    @property
    def moe(self) -> bool:
        """Whether the layers' MLP is a mixture of experts."""
        return self.experts > 0

    @property
    def qkv_width(self) -> int:
        """Columns of the fused, unsharded QKV projection."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim


MODELS: dict[str, DecoderConfig] = {c.name: c for c in (
    DecoderConfig("llama-2-7b", 4096, 11008, 32, 32, 32, rope_theta=10000.0, source="LLaMA-2-7B"),
    DecoderConfig("llama-3.1-8b", 4096, 14336, 32, 8, 32, rope_theta=500000.0, source="LLaMA-3.1-8B"),
    DecoderConfig("gemma-2-9b", 3584, 14336, 16, 8, 42, head_dim=256, eps=1e-6, source="Gemma-2-9B"),
    DecoderConfig("gemma-2-27b", 4608, 36864, 32, 16, 46, head_dim=128, eps=1e-6, source="Gemma-2-27B"),
    DecoderConfig("llama-3.1-70b", 8192, 28672, 64, 8, 80, rope_theta=500000.0, source="LLaMA-3.1-70B"),
    DecoderConfig("qwen-2-72b", 8192, 29568, 64, 8, 80, rope_theta=1000000.0, eps=1e-6, source="Qwen-2-72B"),
    # MoE: intermediate is one routed expert's
    DecoderConfig("mixtral-8x7b", 4096, 14336, 32, 8, 32, rope_theta=1000000.0, experts=8, top_k=2,
                  source="Mixtral-8x7B"),
    DecoderConfig("qwen1.5-moe-a2.7b", 2048, 1408, 16, 16, 24, rope_theta=1000000.0, eps=1e-6, experts=60,
                  top_k=4, shared_intermediate=5632, shared_expert_gate=True, normalize_topk=False,
                  source="Qwen1.5-MoE-A2.7B"),
    # test and smoke configurations
    DecoderConfig("tiny", 32, 48, 4, 2, 2, head_dim=8, source="tests (GQA, 2 layers)"),
    DecoderConfig("small", 512, 1376, 8, 4, 2, head_dim=64, source="GPU tests (LLaMA-2-7B / 8 scaled)"),
    DecoderConfig("tiny-moe", 32, 24, 4, 2, 2, head_dim=8, experts=8, top_k=2,
                  source="tests (Mixtral style: 8 experts, top-2, 2 layers)"),
    DecoderConfig("tiny-qwen-moe", 32, 16, 4, 4, 2, head_dim=8, experts=6, top_k=4, shared_intermediate=40,
                  shared_expert_gate=True, normalize_topk=False,
                  source="tests (Qwen1.5-MoE style: 6 experts, top-4, gated shared expert, 2 layers)"),
)}


def get_config(name: str) -> DecoderConfig:
    """The configuration called ``name`` (case-insensitive), or a LaunchError listing the known ones."""
    config = MODELS.get(name.lower())
    if config is None:
        raise LaunchError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return config


# ------------------------------------------------------------------------------------------------
# weights: full (unsharded) per layer from a seed, then one rank's shard


@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """One layer's unsharded weights, ``nn.Linear`` layout (out_features, in_features).

    MoE layers stack the experts' MLPs: ``gate`` and ``up`` (E, I, H), ``down`` (E, H, I) —
    :class:`tilelink.nn.TPMoE`'s layout — with the ``router`` (E, H) and, when the config has one, the
    shared expert ``shared_gate``, ``shared_up`` (I_s, H), ``shared_down`` (H, I_s) and its gate
    ``shared_expert_gate`` (1, H). Dense layers leave those None.
    """

    attn_norm: torch.Tensor  # (H,)
    wq: torch.Tensor  # (heads*d, H)
    wk: torch.Tensor  # (kv_heads*d, H)
    wv: torch.Tensor  # (kv_heads*d, H)
    wo: torch.Tensor  # (H, heads*d)
    mlp_norm: torch.Tensor  # (H,)
    gate: torch.Tensor  # (I, H); MoE (E, I, H)
    up: torch.Tensor  # (I, H); MoE (E, I, H)
    down: torch.Tensor  # (H, I); MoE (E, H, I)
    router: torch.Tensor | None = None  # (E, H)
    shared_gate: torch.Tensor | None = None  # (I_s, H)
    shared_up: torch.Tensor | None = None  # (I_s, H)
    shared_down: torch.Tensor | None = None  # (H, I_s)
    shared_expert_gate: torch.Tensor | None = None  # (1, H)


@dataclasses.dataclass(frozen=True)
class LayerShard:
    """One rank's slice of a layer, ``x @ W`` layout, contiguous.

    ``w_qkv`` (H, (heads_r + 2·kv_heads_r)·d): this rank's Q columns, then its K and V columns.
    ``w_o`` (heads_r·d, H): the rows of W_o that multiply this rank's heads. ``w_gate_up`` (H, 2·I_r)
    and ``w_down`` (I_r, H): the MLP's slice in :class:`tilelink.nn.TPMLP`'s layout.

    MoE layers, in :class:`tilelink.nn.TPMoE`'s layout: ``w_gate_up`` (E, H, 2·I_r) and ``w_down``
    (E, I_r, H) every expert's slice; ``router`` (E, H) replicated; the shared expert's slice
    ``shared_gate_up`` (H, 2·I_s,r), ``shared_down`` (I_s,r, H) and its gate ``shared_expert_gate``
    (1, H) replicated. Dense layers leave those None.
    """

    attn_norm: torch.Tensor
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor | None
    w_down: torch.Tensor | None
    heads: int
    kv_heads: int
    router: torch.Tensor | None = None
    shared_gate_up: torch.Tensor | None = None
    shared_down: torch.Tensor | None = None
    shared_expert_gate: torch.Tensor | None = None


def _seeded(seed: int, *names: object) -> int:
    return zlib.crc32(repr((seed, *names)).encode()) & 0x7FFF_FFFF


def _randn(shape: tuple[int, ...], seed: int, device, dtype, scale: float) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)


def layer_weights(config: DecoderConfig, layer: int, seed: int = 0, device="cpu",
                  dtype: torch.dtype = torch.float32) -> LayerWeights:
    """Layer ``layer``'s random weights: the same on every rank for the same seed and device type.

    Linear weights are N(0, 1/fan_in) so that activations keep their scale through the stack (the router's
    too: its logits are about N(0, 1)); norm weights are 1 + N(0, 0.1²). MoE configs get the stacked
    experts, the router and the shared expert (:class:`LayerWeights`); every tensor has its own seed, so
    the dense weights do not depend on the MoE fields.
    """
    H, I, d = config.hidden, config.intermediate, config.head_dim  # noqa: E741 - the paper's names
    shapes = {"wq": (config.heads * d, H), "wk": (config.kv_heads * d, H), "wv": (config.kv_heads * d, H),
              "wo": (H, config.heads * d), "gate": (I, H), "up": (I, H), "down": (H, I)}
    fan_in = {name: shape[1] for name, shape in shapes.items()}
    if config.moe:
        E, Is = config.experts, config.shared_intermediate
        shapes.update(gate=(E, I, H), up=(E, I, H), down=(E, H, I), router=(E, H))
        fan_in.update(gate=H, up=H, down=I, router=H)
        if Is:
            shapes.update(shared_gate=(Is, H), shared_up=(Is, H), shared_down=(H, Is))
            fan_in.update(shared_gate=H, shared_up=H, shared_down=Is)
            if config.shared_expert_gate:
                shapes["shared_expert_gate"], fan_in["shared_expert_gate"] = (1, H), H
    tensors = {name: _randn(shape, _seeded(seed, layer, name), device, dtype, fan_in[name] ** -0.5)
               for name, shape in shapes.items()}
    for name in ("attn_norm", "mlp_norm"):
        tensors[name] = (1.0 + _randn((H,), _seeded(seed, layer, name), device, torch.float32, 0.1)).to(dtype)
    return LayerWeights(**tensors)


def final_norm_weight(config: DecoderConfig, seed: int = 0, device="cpu",
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The final RMSNorm's weight (same rule as the layers' norms)."""
    return (1.0 + _randn((config.hidden,), _seeded(seed, "final_norm"), device, torch.float32, 0.1)).to(dtype)


#: rows ``[r·⌈size/R⌉, min(size, (r+1)·⌈size/R⌉))``: the split of the sequence and of I
row_bounds = shard_range


def head_bounds(config: DecoderConfig, rank: int, world: int) -> tuple[int, int, int, int]:
    """This rank's Q heads ``[q_lo, q_hi)`` and the KV heads they use ``[kv_lo, kv_hi)``."""
    check_config(config, world)
    per_q = config.heads // world
    q_lo, q_hi = rank * per_q, (rank + 1) * per_q
    group = config.heads // config.kv_heads
    return q_lo, q_hi, q_lo // group, (q_hi - 1) // group + 1


def check_config(config: DecoderConfig, world: int) -> None:
    """Raise LaunchError unless ``config`` can be split over ``world`` ranks."""
    for field in ("hidden", "intermediate", "heads", "kv_heads", "layers", "head_dim"):
        if getattr(config, field) < 1:
            raise LaunchError(f"{config.name}: {field} must be positive, got {getattr(config, field)}")
    if config.heads % config.kv_heads:
        raise LaunchError(f"{config.name}: heads ({config.heads}) must be a multiple of kv_heads "
                          f"({config.kv_heads})")
    if config.heads % world:
        raise LaunchError(f"{config.name}: {config.heads} heads cannot be split over {world} ranks; "
                          f"use a world size that divides {config.heads}")
    if config.kv_heads % world and world % config.kv_heads:
        raise LaunchError(f"{config.name}: {config.kv_heads} KV heads over {world} ranks: one must divide "
                          f"the other")
    if config.rope and config.head_dim % 2:
        raise LaunchError(f"{config.name}: RoPE needs an even head_dim, got {config.head_dim}")
    if config.experts < 0 or config.shared_intermediate < 0:
        raise LaunchError(f"{config.name}: experts and shared_intermediate must not be negative")
    if config.moe and not 1 <= config.top_k <= config.experts:
        raise LaunchError(f"{config.name}: top_k={config.top_k} must be between 1 and the {config.experts} "
                          f"experts")
    if not config.moe and (config.top_k or config.shared_intermediate or config.shared_expert_gate):
        raise LaunchError(f"{config.name}: top_k, shared_intermediate and shared_expert_gate need experts > 0")
    if config.shared_expert_gate and not config.shared_intermediate:
        raise LaunchError(f"{config.name}: shared_expert_gate needs a shared expert (shared_intermediate > 0)")


def shard_layer(config: DecoderConfig, w: LayerWeights, rank: int, world: int, *, mlp: bool = True,
                device=None) -> LayerShard:
    """Rank ``rank``'s slice of ``w`` (both models shard with this; see :class:`LayerShard`).

    ``mlp=False`` leaves the MLP out (the TileLink model's :class:`tilelink.nn.TPMLP` or
    :class:`tilelink.nn.TPMoE` slices it itself, with the same :func:`row_bounds` split of the
    intermediate dimension — every expert's, and the shared expert's).
    """
    d = config.head_dim
    q_lo, q_hi, kv_lo, kv_hi = head_bounds(config, rank, world)
    q, k, v = w.wq[q_lo * d:q_hi * d], w.wk[kv_lo * d:kv_hi * d], w.wv[kv_lo * d:kv_hi * d]
    move = (lambda t: t.contiguous().to(device)) if device is not None else (lambda t: t.contiguous())
    mlp_parts: dict[str, torch.Tensor | None] = {"w_gate_up": None, "w_down": None}
    if mlp and config.moe:
        lo, hi = row_bounds(config.intermediate, rank, world)
        mlp_parts = {"w_gate_up": move(torch.cat([w.gate[:, lo:hi].transpose(1, 2), w.up[:, lo:hi].transpose(1, 2)],
                                                 dim=2)),
                     "w_down": move(w.down[:, :, lo:hi].transpose(1, 2)), "router": move(w.router)}
        if w.shared_gate is not None:
            lo, hi = row_bounds(w.shared_gate.shape[0], rank, world)
            mlp_parts["shared_gate_up"] = move(torch.cat([w.shared_gate[lo:hi].t(), w.shared_up[lo:hi].t()], dim=1))
            mlp_parts["shared_down"] = move(w.shared_down[:, lo:hi].t())
            if w.shared_expert_gate is not None:
                mlp_parts["shared_expert_gate"] = move(w.shared_expert_gate)
    elif mlp:
        lo, hi = row_bounds(config.intermediate, rank, world)
        mlp_parts = {"w_gate_up": move(torch.cat([w.gate[lo:hi].t(), w.up[lo:hi].t()], dim=1)),
                     "w_down": move(w.down[:, lo:hi].t())}
    return LayerShard(attn_norm=move(w.attn_norm), w_qkv=move(torch.cat([q, k, v], dim=0).t()),
                      w_o=move(w.wo[:, q_lo * d:q_hi * d].t()), mlp_norm=move(w.mlp_norm),
                      heads=q_hi - q_lo, kv_heads=kv_hi - kv_lo, **mlp_parts)


# ------------------------------------------------------------------------------------------------
# the local computations both models share


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in fp32, returned in ``x``'s dtype (contiguous)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype).contiguous()


def rope_tables(config: DecoderConfig, seq: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """cos and sin (seq, head_dim/2) of the rotary embedding at positions 0..seq-1; None without RoPE."""
    if not config.rope:
        return None
    d = config.head_dim
    inv_freq = config.rope_theta ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    angles = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # "rotate half" (the Hugging Face LLaMA convention): pairs (i, i + d/2) turn by position·freq_i
    cos, sin = rope
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def attention_core(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, batch: int, seq: int,
                   rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Causal self-attention of ``heads`` local heads: ``qkv`` (T, (heads + 2·kv_heads)·d), T = batch·seq
    batch-major; returns (T, heads·d) contiguous. GQA repeats each KV head for its group of Q heads."""
    d = head_dim
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=1)

    def split_heads(t: torch.Tensor, n: int) -> torch.Tensor:
        return t.reshape(batch, seq, n, d).transpose(1, 2)  # (batch, n, seq, d)

    q, k, v = split_heads(q, heads), split_heads(k, kv_heads), split_heads(v, kv_heads)
    if rope is not None:
        q, k = _rotate(q, rope), _rotate(k, rope)
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(batch * seq, heads * d)


def check_input(config: DecoderConfig, x_shard: torch.Tensor, batch: int, seq: int, rank: int,
                world: int, what: str) -> None:
    """Raise LaunchError unless ``x_shard`` is this rank's rows of a (batch·seq, hidden) activation."""
    if not isinstance(x_shard, torch.Tensor) or x_shard.dim() != 2 or x_shard.shape[1] != config.hidden:
        shape = tuple(x_shard.shape) if isinstance(x_shard, torch.Tensor) else type(x_shard).__name__
        raise LaunchError(f"{what}: input must be (rows, hidden={config.hidden}) for {config.name}, got {shape}")
    if batch < 1 or seq < 1:
        raise LaunchError(f"{what}: batch and seq must be positive, got batch={batch}, seq={seq}")
    lo, hi = row_bounds(batch * seq, rank, world)
    if x_shard.shape[0] != hi - lo:
        raise LaunchError(f"{what}: rank {rank} must hold rows [{lo}, {hi}) of the {batch * seq} tokens "
                          f"({hi - lo} rows), got {x_shard.shape[0]}")


# ------------------------------------------------------------------------------------------------
# the TileLink model


class TPAttention(nn.Module):
    """Tensor-parallel attention on TileLink: ``ag_gemm`` (QKV) → local heads → ``gemm_rs`` (W_o)."""

    def __init__(self, config: DecoderConfig, shard: LayerShard) -> None:
        super().__init__()
        self.config, self.heads, self.kv_heads = config, shard.heads, shard.kv_heads
        self.w_qkv = nn.Parameter(shard.w_qkv, requires_grad=False)
        self.w_o = nn.Parameter(shard.w_o, requires_grad=False)

    def forward(self, h_shard: torch.Tensor, ctx, batch: int, seq: int, rope) -> torch.Tensor:
        from tilelink.ops.library import ag_gemm, gemm_rs  # custom ops while torch.compile traces

        qkv = ag_gemm(h_shard, self.w_qkv, ctx)
        o = attention_core(qkv, self.heads, self.kv_heads, self.config.head_dim, batch, seq, rope)
        return gemm_rs(o, self.w_o)


class TPDecoderLayer(nn.Module):
    """Pre-norm decoder layer: ``x += attn(norm(x)); x += mlp(norm(x))`` on sequence-sharded rows.

    The MLP is a :class:`tilelink.nn.TPMLP`, or for an MoE config a :class:`tilelink.nn.TPMoE` (with the
    shared expert when the config has one).
    """

    def __init__(self, config: DecoderConfig, weights: LayerWeights, rank: int, world: int, device) -> None:
        super().__init__()
        shard = shard_layer(config, weights, rank, world, mlp=False, device=device)
        self.config = config
        self.attn_norm = nn.Parameter(shard.attn_norm, requires_grad=False)
        self.mlp_norm = nn.Parameter(shard.mlp_norm, requires_grad=False)
        self.attn = TPAttention(config, shard)
        if config.moe:
            from tilelink.ops.moe_layers import TPMoE  # tilelink.nn's TPMoE

            self.mlp = TPMoE(weights.router, weights.gate, weights.up, weights.down, config.top_k,
                             normalize=config.normalize_topk, shared_gate=weights.shared_gate,
                             shared_up=weights.shared_up, shared_down=weights.shared_down,
                             shared_expert_gate=weights.shared_expert_gate)
        else:
            from tilelink.ops.layers import TPMLP  # tilelink.nn's TPMLP, without importing the other layers

            self.mlp = TPMLP(weights.gate, weights.up, weights.down)

    def shard(self) -> LayerShard:
        """This layer's weights as a :class:`LayerShard` (shared, not copied)."""
        moe = {}
        if self.config.moe:
            moe["router"] = self.mlp.router.data
            if self.mlp.shared is not None:
                moe["shared_gate_up"], moe["shared_down"] = self.mlp.shared.w_gate_up.data, self.mlp.shared.w_down.data
            if self.mlp.shared_expert_gate is not None:
                moe["shared_expert_gate"] = self.mlp.shared_expert_gate.data
        return LayerShard(self.attn_norm.data, self.attn.w_qkv.data, self.attn.w_o.data, self.mlp_norm.data,
                          self.mlp.w_gate_up.data, self.mlp.w_down.data, self.attn.heads, self.attn.kv_heads, **moe)

    def forward(self, x: torch.Tensor, ctx, batch: int, seq: int, rope) -> torch.Tensor:
        eps = self.config.eps
        x = x + self.attn(rms_norm(x, self.attn_norm, eps), ctx, batch, seq, rope)
        h = rms_norm(x, self.mlp_norm, eps)
        return x + (self.mlp(h) if self.config.moe else self.mlp(h, ctx))


class TPDecoder(nn.Module):
    """The LLaMA-style decoder (dense, or MoE when ``config.experts``) on TileLink layers, for the world
    :func:`tilelink.init` joined.

    ``TPDecoder(config, seed=0, dtype=torch.bfloat16)`` generates each layer's weights from ``seed``
    (on the rank's device), keeps this rank's shard and drops the rest, one layer at a time.
    ``forward(x_shard, batch, seq)``: ``x_shard`` is this rank's rows of the (batch·seq, hidden)
    hidden state; returns this rank's rows of the output.
    """

    def __init__(self, config: DecoderConfig, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        from tilelink.runtime import current_world

        world = current_world()
        self.rank, self.world_size, self.device = world.rank, world.world_size, world.device
        check_config(config, self.world_size)
        self.config, self.dtype = config, dtype
        self.layers = nn.ModuleList(
            TPDecoderLayer(config, layer_weights(config, i, seed, self.device, dtype), self.rank, self.world_size,
                           self.device)
            for i in range(config.layers))
        self.final_norm = nn.Parameter(final_norm_weight(config, seed, self.device, dtype), requires_grad=False)

    def shards(self) -> tuple[list[LayerShard], torch.Tensor]:
        """Every layer's :class:`LayerShard` and the final norm weight (shared tensors): what
        :meth:`tilelink.ops.models_reference.TorchTPDecoder.from_shards` takes."""
        return [layer.shard() for layer in self.layers], self.final_norm.data

    def forward(self, x_shard: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        from tilelink.ops.tp import TPContext

        check_input(self.config, x_shard, batch, seq, self.rank, self.world_size, "TPDecoder")
        if x_shard.dtype != self.dtype:
            raise LaunchError(f"TPDecoder: input dtype {x_shard.dtype}, the model's weights are {self.dtype}")
        ctx = TPContext(M=batch * seq)
        rope = rope_tables(self.config, seq, x_shard.device)
        x = x_shard
        for layer in self.layers:
            x = layer(x, ctx, batch, seq, rope)
        return rms_norm(x, self.final_norm, self.config.eps)


# ------------------------------------------------------------------------------------------------
# data parallel across groups of TP ranks (the paper's two-node run)


def data_parallel_groups(tp_size: int):
    """Split the ``torch.distributed`` world into TP groups of ``tp_size`` consecutive ranks (one node
    each, under ``torchrun --nproc-per-node tp_size``) and DP groups of the ranks with the same TP
    index; returns ``(tp_group, dp_group, tp_rank, dp_rank)`` for this rank.

    Every rank must call it (``new_group`` is collective). The PyTorch baseline runs TP inside
    ``tp_group`` directly, and ``tilelink.init(group=tp_group)`` makes TileLink's world the TP group; a
    forward pass needs no DP communication at all (each group takes its own batch), so the DP group only
    matters for gradients or for gathering results. See docs/E2E.md.
    """
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    if tp_size < 1 or world % tp_size:
        raise LaunchError(f"data_parallel_groups: tp_size {tp_size} must divide the world size {world}")
    tp_group = dp_group = None
    for g in range(world // tp_size):
        ranks = list(range(g * tp_size, (g + 1) * tp_size))
        group = dist.new_group(ranks)
        if rank in ranks:
            tp_group = group
    for t in range(tp_size):
        ranks = list(range(t, world, tp_size))
        group = dist.new_group(ranks)
        if rank in ranks:
            dp_group = group
    return tp_group, dp_group, rank % tp_size, rank // tp_size
