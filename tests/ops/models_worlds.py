"""Rank functions of the end-to-end model tests (run in spawned worlds; imported by name)."""

from __future__ import annotations

import dataclasses

import torch

import tilelink
import tilelink.runtime


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / max(b.double().norm().item(), 1e-30)).item()


def decoder_matches_references(model: str, batch: int, seq: int, dtype_name: str, layers: int = 0,
                               **overrides) -> dict:
    """TPDecoder vs TorchTPDecoder (same seed, own weights) vs the unsharded single-process model;
    ``overrides`` replace fields of the named configuration. MoE models also return each layer's
    tokens per expert (``expert_tokens``, from the unsharded model's routing)."""
    from tilelink.ops import models
    from tilelink.ops.models_reference import TorchTPDecoder, unsharded_forward

    config = models.get_config(model)
    if layers:
        config = config.with_layers(layers)
    config = dataclasses.replace(config, **overrides)
    dtype = getattr(torch, dtype_name)
    world = tilelink.runtime.current_world()
    r, R, device = world.rank, world.world_size, world.device
    tl_model = models.TPDecoder(config, seed=3, dtype=dtype)
    torch_model = TorchTPDecoder(config, seed=3, dtype=dtype, device=device)
    T = batch * seq
    g = torch.Generator().manual_seed(11)
    x = torch.randn(T, config.hidden, generator=g).to(dtype).to(device)
    lo, hi = models.row_bounds(T, r, R)
    x_shard = x[lo:hi].contiguous()
    y_tl = tl_model(x_shard, batch, seq)
    y_torch = torch_model(x_shard, batch, seq)
    # the unsharded model, in fp32 from the same weights
    weights = [models.layer_weights(config, i, 3, device, dtype) for i in range(config.layers)]
    weights = [models.LayerWeights(**{f.name: None if getattr(w, f.name) is None else getattr(w, f.name).float()
                                      for f in dataclasses.fields(w)}) for w in weights]
    routing: list[torch.Tensor] = []
    ref = unsharded_forward(config, weights, models.final_norm_weight(config, 3, device, dtype).float(),
                            x.float(), batch, seq, routing)[lo:hi]
    # TPMLP / TPMoE must slice the MLP exactly as shard_layer does (the baseline's MLP shard)
    same_mlp = True
    for i, layer in enumerate(tl_model.layers):
        shard, mine = models.shard_layer(config, models.layer_weights(config, i, 3, device, dtype), r, R), layer.shard()
        for f in ("w_gate_up", "w_down", "router", "shared_gate_up", "shared_down", "shared_expert_gate"):
            a, b = getattr(shard, f), getattr(mine, f)
            same_mlp &= (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
    shared = TorchTPDecoder.from_shards(config, tl_model.shards())(x_shard, batch, seq)
    expert_tokens = [torch.bincount(ids.flatten().cpu(), minlength=config.experts).tolist() for ids in routing]
    return {"rows": (lo, hi), "shape": tuple(y_tl.shape), "dtype": str(y_tl.dtype), "same_mlp": bool(same_mlp),
            "tl_vs_torch": _rel(y_tl, y_torch), "tl_vs_unsharded": _rel(y_tl, ref),
            "torch_vs_unsharded": _rel(y_torch, ref), "shared_vs_torch": _rel(shared, y_torch),
            "expert_tokens": expert_tokens}


def bad_model_inputs() -> list[str]:
    """Each bad construction or call must raise LaunchError; returns the messages."""
    from tilelink.ops import models
    from tilelink.ops.models_reference import TorchTPDecoder

    tiny = models.get_config("tiny")
    model = models.TPDecoder(tiny.with_layers(1), dtype=torch.float32)
    R = tilelink.world_size()
    lo, hi = models.row_bounds(13, tilelink.rank(), R)
    n = hi - lo
    calls = [
        lambda: model(torch.randn(n, tiny.hidden + 1), 1, 13),  # wrong hidden size
        lambda: model(torch.randn(n + 1, tiny.hidden), 1, 13),  # not this rank's share of 13 rows
        lambda: models.TPDecoder(dataclasses.replace(tiny, heads=3, kv_heads=1, layers=1)),  # 3 heads over 2
        lambda: TorchTPDecoder(dataclasses.replace(tiny, heads=3, kv_heads=1, layers=1)),
        lambda: models.get_config("no-such-model"),
        lambda: model(torch.randn(n, tiny.hidden, dtype=torch.float64), 1, 13),  # dtype not the weights'
        lambda: models.TPDecoder(dataclasses.replace(models.get_config("tiny-moe"), top_k=9, layers=1)),  # > 8 experts
        lambda: TorchTPDecoder(dataclasses.replace(tiny, top_k=2, layers=1)),  # top_k on a dense model
    ]
    messages = [f"world {R}"]
    for call in calls:
        try:
            call()
        except tilelink.LaunchError as exc:
            messages.append(str(exc))
        else:
            messages.append("NO ERROR")
    return messages


def dp_tp_baseline(tp_size: int) -> dict:
    """Data parallel over TP groups: each TP group runs the PyTorch TP baseline on its own batch."""
    from tilelink.ops import models
    from tilelink.ops.models_reference import TorchTPDecoder, unsharded_forward

    tp_group, dp_group, tp_rank, dp_rank = models.data_parallel_groups(tp_size)
    config = models.get_config("tiny").with_layers(1)
    batch, seq = 1, 9
    x = torch.randn(batch * seq, config.hidden, generator=torch.Generator().manual_seed(100 + dp_rank))
    lo, hi = models.row_bounds(batch * seq, tp_rank, tp_size)
    y = TorchTPDecoder(config, seed=5, dtype=torch.float32, group=tp_group)(x[lo:hi].contiguous(), batch, seq)
    weights = [models.layer_weights(config, i, 5) for i in range(config.layers)]
    ref = unsharded_forward(config, weights, models.final_norm_weight(config, 5), x, batch, seq)[lo:hi]
    return {"tp_rank": tp_rank, "dp_rank": dp_rank, "tp_size": torch.distributed.get_world_size(tp_group),
            "dp_size": torch.distributed.get_world_size(dp_group), "err": _rel(y, ref)}
