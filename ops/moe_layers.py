"""``tilelink.nn.TPMoE``: a tensor-parallel mixture-of-experts layer on the overlapped MoE operators."""

from __future__ import annotations

import torch
from torch import nn

from tilelink.errors import LaunchError
from tilelink.mapping import shard_range


def _gather_rows(local: torch.Tensor, world) -> torch.Tensor:
    """Concatenate every rank's rows of ``local`` in rank order (torch.distributed on the plain path's group,
    :func:`tilelink.ops.plain.group`: the world's group, or on GPUs an NCCL group of its ranks; through host
    memory where ranks share a GPU), on ``local``'s device. The shards may differ in length. The ranks' row counts
    are exchanged through the world's store (host values: also while a graph captures, whose replays then gather
    the counts every rank captured)."""
    if world.world_size == 1:
        return local
    import torch.distributed as dist

    from tilelink.ops import plain
    from tilelink.runtime import graphs

    group, staged = plain.group(world)
    on = "cpu" if staged else local.device
    if staged and graphs.capturing(local.device):
        raise LaunchError("TPMoE: the routing's all-gather cannot be captured in a CUDA graph here: ranks that "
                          "share a GPU cannot form an NCCL group, and the gloo collective goes through host "
                          "copies; give each rank its own GPU, or capture the layers around the MoE layer")
    sizes = world.control.exchange(int(local.shape[0]), "all_gather_shards (the rows of each rank)")
    padded = torch.zeros((max(sizes), *local.shape[1:]), dtype=local.dtype, device=on)
    padded[:local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world.world_size)]
    # a step of the capture (an emulated graph's replay runs it whole, its wait included); else now
    graphs.enqueue(lambda: dist.all_gather(parts, padded, group=group))
    return torch.cat([p[:size] for p, size in zip(parts, sizes, strict=True)]).to(local.device)


class TPMoE(nn.Module):
    """Mixture of experts, tensor parallel (paper §7.2; Mixtral / Qwen1.5-MoE style):
    ``sum_k p_k * down_e(silu(gate_e(x)) * up_e(x))`` over each token's top-k experts ``e``, plus an
    optional shared expert scaled by ``sigmoid(shared_expert_gate(x))`` as in Qwen1.5-MoE.

    Loads ordinary (unsharded) weights in ``nn.Linear`` layout, stacked over the E experts: ``router``
    (E, H), ``gate`` and ``up`` (E, I, H), ``down`` (E, H, I); shared expert ``shared_gate``,
    ``shared_up`` (I_s, H), ``shared_down`` (H, I_s), ``shared_expert_gate`` (1, H). Each rank keeps
    every expert's slice of the intermediate dimension I (gate | up fused into (E, H, 2*I_r)); the
    router is replicated; the shared expert is a :class:`tilelink.nn.TPMLP`.

    ``forward(x_shard)``: ``x_shard`` is this rank's rows of the (S, H) tokens (rows
    ``[r*ceil(S/R), min(S, (r+1)*ceil(S/R)))``); returns this rank's rows of the (S, H) output.
    Routing: each rank applies the router (softmax in fp32, top-k, weights renormalised to sum to 1
    when ``normalize``) to its own rows, then the top-k ids and weights of all S tokens are
    all-gathered with ``torch.distributed`` on the world's group (the default one unless ``tilelink.init`` was
    given a group) — a few bytes per token —
    so that every rank holds the replicated routing that ``ag_moe`` and ``moe_rs`` take.
    """

    def __init__(self, router: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, top_k: int,
                 *, normalize: bool = True, shared_gate: torch.Tensor | None = None,
                 shared_up: torch.Tensor | None = None, shared_down: torch.Tensor | None = None,
                 shared_expert_gate: torch.Tensor | None = None) -> None:
        super().__init__()
        from tilelink.runtime import current_world

        world = current_world()
        if gate.dim() != 3 or up.shape != gate.shape or down.shape != (gate.shape[0], gate.shape[2], gate.shape[1]):
            raise LaunchError(f"TPMoE: expected gate and up (E, I, H) and down (E, H, I), got {tuple(gate.shape)}, "
                              f"{tuple(up.shape)}, {tuple(down.shape)}")
        experts, intermediate, hidden = gate.shape
        if tuple(router.shape) != (experts, hidden):
            raise LaunchError(f"TPMoE: router must be (E, H) = {(experts, hidden)}, got {tuple(router.shape)}")
        if not 1 <= top_k <= experts:
            raise LaunchError(f"TPMoE: top_k={top_k} must be between 1 and the {experts} experts")
        self.hidden, self.intermediate, self.num_experts, self.top_k = hidden, intermediate, experts, top_k
        self.normalize = normalize
        lo, hi = shard_range(intermediate, world.rank, world.world_size)
        fused = torch.cat([gate[:, lo:hi].transpose(1, 2), up[:, lo:hi].transpose(1, 2)], dim=2).contiguous()
        self.router = nn.Parameter(router.detach().to(world.device), requires_grad=False)
        self.w_gate_up = nn.Parameter(fused.to(world.device), requires_grad=False)
        self.w_down = nn.Parameter(down[:, :, lo:hi].transpose(1, 2).contiguous().to(world.device),
                                   requires_grad=False)
        shared = (shared_gate, shared_up, shared_down)
        if any(t is not None for t in shared) and any(t is None for t in shared):
            raise LaunchError("TPMoE: the shared expert needs shared_gate, shared_up and shared_down together")
        self.shared = None
        self.shared_expert_gate = None
        if shared_gate is not None:
            from tilelink.ops.layers import TPMLP

            if shared_gate.shape[1] != hidden:
                raise LaunchError(f"TPMoE: shared_gate must be (I_s, {hidden}), got {tuple(shared_gate.shape)}")
            self.shared = TPMLP(shared_gate, shared_up, shared_down)
            if shared_expert_gate is not None:
                if tuple(shared_expert_gate.shape) != (1, hidden):
                    raise LaunchError(f"TPMoE: shared_expert_gate must be (1, {hidden}), got "
                                      f"{tuple(shared_expert_gate.shape)}")
                self.shared_expert_gate = nn.Parameter(shared_expert_gate.detach().to(world.device),
                                                       requires_grad=False)

    def route(self, x_shard: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert ids (int64) and fp32 weights of *every* token, from this rank's rows."""
        from tilelink.ops.library import all_gather_shards

        logits = torch.nn.functional.linear(x_shard.float(), self.router.float())
        weights, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        packed = all_gather_shards(torch.cat([ids.double(), weights.double()], dim=1))
        return packed[:, :self.top_k].long().contiguous(), packed[:, self.top_k:].float().contiguous()

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        from tilelink.ops.library import ag_moe, moe_rs, route, silu_mul  # custom ops while torch.compile traces

        if x_shard.dim() != 2 or x_shard.shape[1] != self.hidden:
            raise LaunchError(f"TPMoE: input must be (rows, {self.hidden}), got {tuple(x_shard.shape)}")
        topk_ids, topk_weights = self.route(x_shard)
        routing = route(topk_ids, self.w_down.shape[0])  # checked and counted once for both parts
        h = ag_moe(x_shard, self.w_gate_up.to(x_shard.dtype), routing)
        y = moe_rs(silu_mul(h), self.w_down.to(x_shard.dtype), routing, topk_weights)
        if self.shared is not None:
            s = self.shared(x_shard)
            if self.shared_expert_gate is not None:
                s = s * torch.sigmoid(torch.nn.functional.linear(x_shard, self.shared_expert_gate.to(x_shard.dtype)))
            y = y + s
        return y
