"""``torch.nn`` layers on TileLink's overlapped operators (public as ``tilelink.nn``)."""

from __future__ import annotations

import torch
from torch import nn

from tilelink.errors import LaunchError
from tilelink.mapping import shard_range


class TPMLP(nn.Module):
    """LLaMA-style MLP, tensor parallel: ``down(silu(gate(x)) * up(x))``.

    Loads ordinary (unsharded) ``nn.Linear``-layout weights — ``gate`` and ``up`` (I, H), ``down``
    (H, I) — and keeps this rank's slice of the intermediate dimension I: gate and up fused into one
    (H, 2*I_r) weight for the AG+GEMM, down as (I_r, H) for the GEMM+RS.

    ``forward(x_shard)``: ``x_shard`` is this rank's rows of the (S, H) input (rows
    ``[r*ceil(S/R), min(S, (r+1)*ceil(S/R)))``); returns this rank's rows of the (S, H) output.
    """

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> None:
        super().__init__()
        from tilelink.runtime import current_world

        world = current_world()
        if gate.shape != up.shape or gate.dim() != 2 or down.shape != (gate.shape[1], gate.shape[0]):
            raise LaunchError(f"TPMLP: expected gate and up (I, H) and down (H, I), got {tuple(gate.shape)}, "
                              f"{tuple(up.shape)}, {tuple(down.shape)}")
        intermediate, hidden = gate.shape
        lo, hi = shard_range(intermediate, world.rank, world.world_size)
        self.hidden, self.intermediate = hidden, intermediate
        fused = torch.cat([gate[lo:hi].t(), up[lo:hi].t()], dim=1).contiguous()
        self.w_gate_up = nn.Parameter(fused.to(world.device), requires_grad=False)
        self.w_down = nn.Parameter(down[:, lo:hi].t().contiguous().to(world.device), requires_grad=False)

    def forward(self, x_shard: torch.Tensor, ctx=None) -> torch.Tensor:
        from tilelink.ops.library import ag_gemm, gemm_rs, silu_mul  # custom ops while torch.compile traces

        if x_shard.dim() != 2 or x_shard.shape[1] != self.hidden:
            raise LaunchError(f"TPMLP: input must be (rows, {self.hidden}), got {tuple(x_shard.shape)}")
        h = ag_gemm(x_shard, self.w_gate_up.to(x_shard.dtype), ctx)
        act = silu_mul(h)
        return gemm_rs(act, self.w_down.to(x_shard.dtype))
