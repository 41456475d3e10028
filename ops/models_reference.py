"""The baseline of the end-to-end benchmark: the decoder of :mod:`tilelink.ops.models` in plain PyTorch TP.

Same weights (generated and sharded by the same helpers, or shared outright with
:meth:`TorchTPDecoder.from_shards`), same layout (sequence-sharded activations), same local compute
(:func:`~tilelink.ops.models.rms_norm`, :func:`~tilelink.ops.models.attention_core`); only the
communication differs: collectives and matmuls one after the other, nothing overlapped.

- gather: ``all_gather_into_tensor`` of the row shards (padded to ⌈T/R⌉ rows, the padding dropped),
  then ``matmul``;
- reduce-scatter: ``matmul``, then ``reduce_scatter_tensor`` of the (padded) partial sums.

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


class TorchTPDecoderLayer(torch.nn.Module):
    """One decoder layer in plain PyTorch TP on a :class:`~tilelink.ops.models.LayerShard`."""

    def __init__(self, config: DecoderConfig, shard: LayerShard, comm: RowCollectives) -> None:
        super().__init__()
        if shard.w_gate_up is None or shard.w_down is None:
            raise LaunchError("TorchTPDecoderLayer: the shard has no MLP weights (shard_layer(..., mlp=True))")
        self.config, self.shard, self.comm = config, shard, comm

    def forward(self, x: torch.Tensor, batch: int, seq: int, rope) -> torch.Tensor:
        s, eps, total = self.shard, self.config.eps, batch * seq
        h = self.comm.all_gather_rows(rms_norm(x, s.attn_norm, eps), total)
        o = attention_core(h @ s.w_qkv, s.heads, s.kv_heads, self.config.head_dim, batch, seq, rope)
        x = x + self.comm.reduce_scatter_rows(o @ s.w_o)
        h = self.comm.all_gather_rows(rms_norm(x, s.mlp_norm, eps), total)
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


def unsharded_forward(config: DecoderConfig, weights: list[LayerWeights], final_norm: torch.Tensor,
                      x: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """The whole model in one process on the full (batch·seq, hidden) input, ``nn.Linear`` weights."""
    rope = rope_tables(config, seq, x.device)
    d, eps = config.head_dim, config.eps
    for w in weights:
        h = rms_norm(x, w.attn_norm, eps)
        qkv = torch.cat([F.linear(h, w.wq), F.linear(h, w.wk), F.linear(h, w.wv)], dim=1)
        x = x + F.linear(attention_core(qkv, config.heads, config.kv_heads, d, batch, seq, rope), w.wo)
        h = rms_norm(x, w.mlp_norm, eps)
        x = x + F.linear(F.silu(F.linear(h, w.gate)) * F.linear(h, w.up), w.down)
    return rms_norm(x, final_norm, eps)
