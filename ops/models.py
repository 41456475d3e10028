"""LLaMA-style tensor-parallel dense decoder on TileLink's layers (paper §7.3, DESIGN.md §8).

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

A final RMSNorm closes the stack. There is no embedding and no LM head: the input is the (T, hidden)
hidden state, as in the paper's end-to-end layer stack (vocabulary-parallel layers have no overlap
of the kind TileLink generates).

Heads are split evenly: ``heads % R == 0`` and either ``kv_heads % R == 0`` (each rank its own KV
heads) or ``R % kv_heads == 0`` (each KV head replicated on the ``R / kv_heads`` ranks whose Q heads
use it). Anything else raises :class:`tilelink.LaunchError` before a kernel runs.

The paper's models (:data:`MODELS`) are reproduced by their shapes — hidden, intermediate, heads, KV
heads, head size, layers. Model-specific details are left out on purpose: Gemma-2's GeGLU (SiLU·mul
here), logit soft-capping, sandwich norms and sliding windows, Qwen-2's QKV biases. Weights are random,
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


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shapes of a LLaMA-style decoder (``head_dim`` defaults to hidden / heads)."""

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

    def __post_init__(self) -> None:
        if self.head_dim == 0 and self.heads > 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def with_layers(self, layers: int) -> DecoderConfig:
        """The same model with ``layers`` decoder layers (benchmarks that cannot hold them all)."""
        return dataclasses.replace(self, layers=layers)

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
    # test and smoke configurations
    DecoderConfig("tiny", 32, 48, 4, 2, 2, head_dim=8, source="tests (GQA, 2 layers)"),
    DecoderConfig("small", 512, 1376, 8, 4, 2, head_dim=64, source="GPU tests (LLaMA-2-7B / 8 scaled)"),
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
    """One layer's unsharded weights, ``nn.Linear`` layout (out_features, in_features)."""

    attn_norm: torch.Tensor  # (H,)
    wq: torch.Tensor  # (heads*d, H)
    wk: torch.Tensor  # (kv_heads*d, H)
    wv: torch.Tensor  # (kv_heads*d, H)
    wo: torch.Tensor  # (H, heads*d)
    mlp_norm: torch.Tensor  # (H,)
    gate: torch.Tensor  # (I, H)
    up: torch.Tensor  # (I, H)
    down: torch.Tensor  # (H, I)


@dataclasses.dataclass(frozen=True)
class LayerShard:
    """One rank's slice of a layer, ``x @ W`` layout, contiguous.

    ``w_qkv`` (H, (heads_r + 2·kv_heads_r)·d): this rank's Q columns, then its K and V columns.
    ``w_o`` (heads_r·d, H): the rows of W_o that multiply this rank's heads. ``w_gate_up`` (H, 2·I_r)
    and ``w_down`` (I_r, H): the MLP's slice in :class:`tilelink.nn.TPMLP`'s layout.
    """

    attn_norm: torch.Tensor
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor | None
    w_down: torch.Tensor | None
    heads: int
    kv_heads: int


def _seeded(seed: int, *names: object) -> int:
    return zlib.crc32(repr((seed, *names)).encode()) & 0x7FFF_FFFF


def _randn(shape: tuple[int, ...], seed: int, device, dtype, scale: float) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)


def layer_weights(config: DecoderConfig, layer: int, seed: int = 0, device="cpu",
                  dtype: torch.dtype = torch.float32) -> LayerWeights:
    """Layer ``layer``'s random weights: the same on every rank for the same seed and device type.

    Linear weights are N(0, 1/fan_in) so that activations keep their scale through the stack; norm
    weights are 1 + N(0, 0.1²).
    """
    H, I, d = config.hidden, config.intermediate, config.head_dim  # noqa: E741 - the paper's names
    shapes = {"wq": (config.heads * d, H), "wk": (config.kv_heads * d, H), "wv": (config.kv_heads * d, H),
              "wo": (H, config.heads * d), "gate": (I, H), "up": (I, H), "down": (H, I)}
    tensors = {name: _randn(shape, _seeded(seed, layer, name), device, dtype, shape[1] ** -0.5)
               for name, shape in shapes.items()}
    for name in ("attn_norm", "mlp_norm"):
        tensors[name] = (1.0 + _randn((H,), _seeded(seed, layer, name), device, torch.float32, 0.1)).to(dtype)
    return LayerWeights(**tensors)


def final_norm_weight(config: DecoderConfig, seed: int = 0, device="cpu",
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The final RMSNorm's weight (same rule as the layers' norms)."""
    return (1.0 + _randn((config.hidden,), _seeded(seed, "final_norm"), device, torch.float32, 0.1)).to(dtype)


def row_bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[r·⌈size/R⌉, min(size, (r+1)·⌈size/R⌉))``: the split of the sequence and of I."""
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per)


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


def shard_layer(config: DecoderConfig, w: LayerWeights, rank: int, world: int, *, mlp: bool = True,
                device=None) -> LayerShard:
    """Rank ``rank``'s slice of ``w`` (both models shard with this; see :class:`LayerShard`).

    ``mlp=False`` leaves the MLP out (the TileLink model's :class:`tilelink.nn.TPMLP` slices it
    itself, with the same :func:`row_bounds` split of the intermediate dimension).
    """
    d = config.head_dim
    q_lo, q_hi, kv_lo, kv_hi = head_bounds(config, rank, world)
    q, k, v = w.wq[q_lo * d:q_hi * d], w.wk[kv_lo * d:kv_hi * d], w.wv[kv_lo * d:kv_hi * d]
    move = (lambda t: t.contiguous().to(device)) if device is not None else (lambda t: t.contiguous())
    gate_up = down = None
    if mlp:
        lo, hi = row_bounds(config.intermediate, rank, world)
        gate_up = move(torch.cat([w.gate[lo:hi].t(), w.up[lo:hi].t()], dim=1))
        down = move(w.down[:, lo:hi].t())
    return LayerShard(attn_norm=move(w.attn_norm), w_qkv=move(torch.cat([q, k, v], dim=0).t()),
                      w_o=move(w.wo[:, q_lo * d:q_hi * d].t()), mlp_norm=move(w.mlp_norm),
                      w_gate_up=gate_up, w_down=down, heads=q_hi - q_lo, kv_heads=kv_hi - kv_lo)


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
        from tilelink.ops.tp import ag_gemm, gemm_rs

        qkv = ag_gemm(h_shard, self.w_qkv, ctx)
        o = attention_core(qkv, self.heads, self.kv_heads, self.config.head_dim, batch, seq, rope)
        return gemm_rs(o, self.w_o)


class TPDecoderLayer(nn.Module):
    """Pre-norm decoder layer: ``x += attn(norm(x)); x += mlp(norm(x))`` on sequence-sharded rows."""

    def __init__(self, config: DecoderConfig, weights: LayerWeights, rank: int, world: int, device) -> None:
        super().__init__()
        from tilelink.ops.layers import TPMLP  # tilelink.nn's TPMLP, without importing the other layers

        shard = shard_layer(config, weights, rank, world, mlp=False, device=device)
        self.config = config
        self.attn_norm = nn.Parameter(shard.attn_norm, requires_grad=False)
        self.mlp_norm = nn.Parameter(shard.mlp_norm, requires_grad=False)
        self.attn = TPAttention(config, shard)
        self.mlp = TPMLP(weights.gate, weights.up, weights.down)

    def shard(self) -> LayerShard:
        """This layer's weights as a :class:`LayerShard` (shared, not copied)."""
        return LayerShard(self.attn_norm.data, self.attn.w_qkv.data, self.attn.w_o.data, self.mlp_norm.data,
                          self.mlp.w_gate_up.data, self.mlp.w_down.data, self.attn.heads, self.attn.kv_heads)

    def forward(self, x: torch.Tensor, ctx, batch: int, seq: int, rope) -> torch.Tensor:
        eps = self.config.eps
        x = x + self.attn(rms_norm(x, self.attn_norm, eps), ctx, batch, seq, rope)
        return x + self.mlp(rms_norm(x, self.mlp_norm, eps), ctx)


class TPDecoder(nn.Module):
    """The LLaMA-style decoder on TileLink layers, for the world :func:`tilelink.init` joined.

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
# MoE: the hook for issue 6


def moe_layer_available() -> bool:
    """Whether ``tilelink.nn.TPMoE`` (issue 6) exists; the MoE decoder variant needs it.

    Hook: an MoE decoder layer is :class:`TPDecoderLayer` with ``self.mlp`` replaced by a TPMoE
    (Mixtral style) or by ``TPMLP`` (shared expert) + ``TPMoE`` summed on the same sequence shard
    (Qwen-MoE style); the attention half is unchanged.
    """
    try:
        import tilelink.nn
    except ImportError:
        return False
    return hasattr(tilelink.nn, "TPMoE")


# ------------------------------------------------------------------------------------------------
# data parallel across groups of TP ranks (the paper's two-node run)


def data_parallel_groups(tp_size: int):
    """Split the ``torch.distributed`` world into TP groups of ``tp_size`` consecutive ranks (one node
    each, under ``torchrun --nproc-per-node tp_size``) and DP groups of the ranks with the same TP
    index; returns ``(tp_group, dp_group, tp_rank, dp_rank)`` for this rank.

    Every rank must call it (``new_group`` is collective). The PyTorch baseline runs TP inside
    ``tp_group`` directly; a forward pass needs no DP communication at all (each group takes its own
    batch), so the DP group only matters for gradients or for gathering results. See docs/E2E.md.
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
