"""The baseline of the end-to-end benchmark: the decoder of :mod:`tilelink.ops.models` in plain PyTorch TP.

Same weights (generated and sharded by the same helpers, or shared outright with
:meth:`TorchTPDecoder.from_shards`), same layout (sequence-sharded activations), same local compute
(:func:`~tilelink.ops.models.rms_norm`, :func:`~tilelink.ops.models.attention_core`); only the
communication differs: collectives and matmuls one after the other, nothing overlapped.

- gather: ``all_gather_into_tensor`` of the row shards (padded to ⌈T/R⌉ rows, the padding dropped),
  then ``matmul``;
- reduce-scatter: ``matmul``, then ``reduce_scatter_tensor`` of the (padded) partial sums.

The MoE layer (``config.experts > 0``) in the same style: gather the normed rows, route every token
with the replicated router (softmax in fp32, top-k, optional renormalisation: the rule of
:class:`tilelink.nn.TPMoE`), then a loop over the experts, each on its tokens with this rank's slice of
the expert's intermediate dimension, the routing weight applied, plus this rank's slice of the shared
expert (times its sigmoid gate); one reduce-scatter of the summed partial outputs.

Those are NCCL's. On a gloo group — the one :func:`tilelink.init` brings up on the CPU, also the only
group available when several ranks share one GPU (NCCL refuses two ranks on one device) — gloo has no
``reduce_scatter_tensor``, so the reduce-scatter is an ``all_reduce`` followed by slicing this rank's
rows, and the gather is ``all_gather`` into a list; gloo tensors go through host memory. Numbers from a
gloo group are for correctness only, never for timing.

:func:`unsharded_forward` is the third reference: one process, full weights, no parallelism at all.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tilelink.errors import LaunchError
from tilelink.ops.models import (
    DecoderConfig,
    LayerShard,
    LayerWeights,
    attention_core,
    check_config,
    check_input,
    final_norm_weight,
    layer_weights,
    rms_norm,
    rope_tables,
    row_bounds,
    shard_layer,
)


class RowCollectives:
    """Gather and reduce-scatter of sequence-sharded rows on one ``torch.distributed`` group."""

    def __init__(self, group=None) -> None:
        self.group = group
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.nccl = self.world > 1 and dist.get_backend(group) == "nccl"

    def all_gather_rows(self, x: torch.Tensor, total: int) -> torch.Tensor:
        """This rank's rows of a (total, N) tensor → the whole tensor on every rank."""
        if self.world == 1:
            return x
        per = -(-total // self.world)
        padded = x if x.shape[0] == per else torch.cat([x, x.new_zeros(per - x.shape[0], x.shape[1])])
        if self.nccl:
            out = x.new_empty(per * self.world, x.shape[1])
            dist.all_gather_into_tensor(out, padded.contiguous(), group=self.group)
            return out[:total]
        host = padded.cpu()
        parts = [torch.empty_like(host) for _ in range(self.world)]
        dist.all_gather(parts, host, group=self.group)
        return torch.cat(parts)[:total].to(x.device)

    def reduce_scatter_rows(self, partial: torch.Tensor) -> torch.Tensor:
        """This rank's partial (total, N) sum → this rank's rows of the sum over ranks."""
        total = partial.shape[0]
        lo, hi = row_bounds(total, self.rank, self.world)
        if self.world == 1:
            return partial
        per = -(-total // self.world)
        if self.nccl:
            padded = partial
            if per * self.world != total:
                padded = torch.cat([partial, partial.new_zeros(per * self.world - total, partial.shape[1])])
            out = partial.new_empty(per, partial.shape[1])
            dist.reduce_scatter_tensor(out, padded.contiguous(), group=self.group)
            return out[:hi - lo]
        # gloo: no reduce_scatter_tensor; sum everywhere, keep this rank's rows (reduced in fp32 on the host)
        host = partial.float().cpu()
        dist.all_reduce(host, group=self.group)
        return host[lo:hi].to(partial.dtype).to(partial.device).contiguous()


def route(h: torch.Tensor, router: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k expert ids (T, top_k) and fp32 weights of the rows of ``h``: softmax of the fp32 logits,
    renormalised over the top k when ``normalize`` (:class:`tilelink.nn.TPMoE`'s rule)."""
    weights, ids = torch.topk(torch.softmax(F.linear(h.float(), router.float()), dim=-1), top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def moe_partial(config: DecoderConfig, shard: LayerShard, h: torch.Tensor) -> torch.Tensor:
    """This rank's partial MoE output (T, H) on the gathered rows ``h``: a loop over the experts (slots
    sorted by expert, one host sync for the counts), each expert's slice of I, weighted by the routing,
    plus this rank's slice of the shared expert; accumulated in fp32, returned in ``h``'s dtype."""
    ids, weights = route(h, shard.router, config.top_k, config.normalize_topk)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=config.experts).tolist()
    tokens = order // config.top_k
    rows = h[tokens]
    out = torch.empty((rows.shape[0], h.shape[1]), dtype=h.dtype, device=h.device)
    start = 0
    for e, count in enumerate(counts):
        if count:
            gate, up = (rows[start:start + count] @ shard.w_gate_up[e]).chunk(2, dim=1)
            out[start:start + count] = (F.silu(gate) * up) @ shard.w_down[e]
        start += count
    acc = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    acc.index_add_(0, tokens, out.float() * weights.flatten()[order, None])
    if shard.shared_gate_up is not None:
        gate, up = (h @ shard.shared_gate_up).chunk(2, dim=1)
        shared = (F.silu(gate) * up) @ shard.shared_down
        if shard.shared_expert_gate is not None:
            shared = shared * torch.sigmoid(F.linear(h, shard.shared_expert_gate))
        acc += shared.float()
    return acc.to(h.dtype)


class TorchTPDecoderLayer(torch.nn.Module):
    """One decoder layer in plain PyTorch TP on a :class:`~tilelink.ops.models.LayerShard` (dense or MoE)."""

    def __init__(self, config: DecoderConfig, shard: LayerShard, comm: RowCollectives) -> None:
        super().__init__()
        if shard.w_gate_up is None or shard.w_down is None:
            raise LaunchError("TorchTPDecoderLayer: the shard has no MLP weights (shard_layer(..., mlp=True))")
        if config.moe and (shard.router is None or shard.w_gate_up.dim() != 3):
            raise LaunchError(f"TorchTPDecoderLayer: {config.name} is an MoE model but the shard has no experts")
        if config.moe and config.shared_intermediate and shard.shared_gate_up is None:
            raise LaunchError(f"TorchTPDecoderLayer: {config.name} has a shared expert but the shard has none")
        self.config, self.shard, self.comm = config, shard, comm

    def forward(self, x: torch.Tensor, batch: int, seq: int, rope) -> torch.Tensor:
        s, eps, total = self.shard, self.config.eps, batch * seq
        h = self.comm.all_gather_rows(rms_norm(x, s.attn_norm, eps), total)
        o = attention_core(h @ s.w_qkv, s.heads, s.kv_heads, self.config.head_dim, batch, seq, rope)
        x = x + self.comm.reduce_scatter_rows(o @ s.w_o)
        h = self.comm.all_gather_rows(rms_norm(x, s.mlp_norm, eps), total)
        if self.config.moe:
            return x + self.comm.reduce_scatter_rows(moe_partial(self.config, s, h))
        gate, up = (h @ s.w_gate_up).chunk(2, dim=1)
        return x + self.comm.reduce_scatter_rows((F.silu(gate) * up) @ s.w_down)


class TorchTPDecoder(torch.nn.Module):
    """The baseline decoder: ``TorchTPDecoder(config, seed, dtype, device, group)`` builds the same weights
    as ``TPDecoder(config, seed, dtype)`` on a rank of the same device type; ``forward(x_shard, batch,
    seq)`` has the same contract (this rank's rows in, this rank's rows out)."""

    def __init__(self, config: DecoderConfig, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                 device="cpu", group=None, *, shards: tuple[list[LayerShard], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.comm = RowCollectives(group)
        check_config(config, self.comm.world)
        self.config, self.dtype = config, dtype
        if shards is None:
            layers = [shard_layer(config, layer_weights(config, i, seed, device, dtype), self.comm.rank,
                                  self.comm.world) for i in range(config.layers)]
            shards = (layers, final_norm_weight(config, seed, device, dtype))
        if len(shards[0]) != config.layers:
            raise LaunchError(f"TorchTPDecoder: {len(shards[0])} layer shards for {config.layers} layers")
        self.layers = torch.nn.ModuleList(TorchTPDecoderLayer(config, s, self.comm) for s in shards[0])
        self.final_norm = shards[1]

    @classmethod
    def from_shards(cls, config: DecoderConfig, shards: tuple[list[LayerShard], torch.Tensor],
                    group=None) -> TorchTPDecoder:
        """The baseline on weights already in memory (``TPDecoder.shards()``): no second copy."""
        return cls(config, dtype=shards[1].dtype, group=group, shards=shards)

    def forward(self, x_shard: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        check_input(self.config, x_shard, batch, seq, self.comm.rank, self.comm.world, "TorchTPDecoder")
        rope = rope_tables(self.config, seq, x_shard.device)
        x = x_shard
        for layer in self.layers:
            x = layer(x, batch, seq, rope)
        return rms_norm(x, self.final_norm, self.config.eps)


def unsharded_moe(config: DecoderConfig, w: LayerWeights, h: torch.Tensor,
                  routing: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The MoE MLP on all rows with the full weights: for each expert, ``nonzero`` of its tokens, its
    SiLU·mul MLP, weighted by the routing; plus the (gated) shared expert. ``routing``: a list to which
    the top-k ids (T, top_k) are appended."""
    ids, weights = route(h, w.router, config.top_k, config.normalize_topk)
    if routing is not None:
        routing.append(ids)
    out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    for e in range(config.experts):
        token, k = (ids == e).nonzero(as_tuple=True)
        if token.numel():
            x = h[token]
            y = F.linear(F.silu(F.linear(x, w.gate[e])) * F.linear(x, w.up[e]), w.down[e])
            out.index_add_(0, token, y.float() * weights[token, k, None])
    if w.shared_gate is not None:
        shared = F.linear(F.silu(F.linear(h, w.shared_gate)) * F.linear(h, w.shared_up), w.shared_down)
        if w.shared_expert_gate is not None:
            shared = shared * torch.sigmoid(F.linear(h, w.shared_expert_gate))
        out += shared.float()
    return out.to(h.dtype)


def unsharded_forward(config: DecoderConfig, weights: list[LayerWeights], final_norm: torch.Tensor,
                      x: torch.Tensor, batch: int, seq: int, routing: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The whole model in one process on the full (batch·seq, hidden) input, ``nn.Linear`` weights.
    For an MoE model, ``routing`` (a list) receives each layer's top-k expert ids."""
    rope = rope_tables(config, seq, x.device)
    for w in weights:
        x = unsharded_layer(config, w, x, batch, seq, rope, routing)
    return rms_norm(x, final_norm, config.eps)


def unsharded_layer(config: DecoderConfig, w: LayerWeights, x: torch.Tensor, batch: int, seq: int, rope,
                    routing: list[torch.Tensor] | None = None) -> torch.Tensor:
    """One decoder layer in one process on the full (batch·seq, hidden) input, ``nn.Linear`` weights (what
    :class:`~tilelink.ops.models.TPDecoderLayer` computes over every rank's rows); ``rope`` from
    :func:`~tilelink.ops.models.rope_tables`."""
    h = rms_norm(x, w.attn_norm, config.eps)
    qkv = torch.cat([F.linear(h, w.wq), F.linear(h, w.wk), F.linear(h, w.wv)], dim=1)
    x = x + F.linear(attention_core(qkv, config.heads, config.kv_heads, config.head_dim, batch, seq, rope), w.wo)
    h = rms_norm(x, w.mlp_norm, config.eps)
    if config.moe:
        return x + unsharded_moe(config, w, h, routing)
    return x + F.linear(F.silu(F.linear(h, w.gate)) * F.linear(h, w.up), w.down)
