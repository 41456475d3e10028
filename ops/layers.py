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

    ``fp8=True``: the weights are kept as ``float8_e4m3fn`` with one fp32 scale per output column (quantised once,
    here), and ``forward`` quantises its input and the activation per row (one scale per token) before each GEMM;
    both GEMMs accumulate in fp32 and return the input's dtype (:mod:`tilelink.ops.tp_fp8`).

    ``output="all_reduce"`` is the decode form: every rank passes all S rows of the input (a few tokens), gate
    and up are a local GEMM, and down is the GEMM + AllReduce (:func:`tilelink.ops.gemm_ar`); ``forward``
    returns the whole (S, H) output on every rank.
    """

    OUTPUTS = ("reduce_scatter", "all_reduce")

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                 output: str = "reduce_scatter", *, fp8: bool = False) -> None:
        super().__init__()
        from tilelink.runtime import current_world

        world = current_world()
        if gate.shape != up.shape or gate.dim() != 2 or down.shape != (gate.shape[1], gate.shape[0]):
            raise LaunchError(f"TPMLP: expected gate and up (I, H) and down (H, I), got {tuple(gate.shape)}, "
                              f"{tuple(up.shape)}, {tuple(down.shape)}")
        if output not in self.OUTPUTS:
            raise LaunchError(f"TPMLP: output={output!r} is not one of {', '.join(map(repr, self.OUTPUTS))}")
        self.output = output
        intermediate, hidden = gate.shape
        lo, hi = shard_range(intermediate, world.rank, world.world_size)
        self.hidden, self.intermediate = hidden, intermediate
        fused = torch.cat([gate[lo:hi].t(), up[lo:hi].t()], dim=1).contiguous()
        self.w_gate_up = nn.Parameter(fused.to(world.device), requires_grad=False)
        self.w_down = nn.Parameter(down[:, lo:hi].t().contiguous().to(world.device), requires_grad=False)
        self.fp8 = bool(fp8)
        if self.fp8:
            self._quantize_weights()

    def forward(self, x_shard: torch.Tensor, ctx=None) -> torch.Tensor:
        from tilelink.ops.library import ag_gemm, gemm_ar, gemm_rs, silu_mul  # custom ops while torch.compile traces

        if x_shard.dim() != 2 or x_shard.shape[1] != self.hidden:
            raise LaunchError(f"TPMLP: input must be (rows, {self.hidden}), got {tuple(x_shard.shape)}")
        if self.fp8:
            return self._forward_fp8(x_shard, ctx)
        if self.output == "all_reduce":  # every rank holds every row: nothing to gather
            act = silu_mul(x_shard @ self.w_gate_up.to(x_shard.dtype))
            return gemm_ar(act, self.w_down.to(x_shard.dtype), ctx)
        h = ag_gemm(x_shard, self.w_gate_up.to(x_shard.dtype), ctx)
        act = silu_mul(h)
        return gemm_rs(act, self.w_down.to(x_shard.dtype))

    def _quantize_weights(self) -> None:
        """The weights as e4m3, each (K, N) weight the transpose of its row-major (N, K) copy (the layout the FP8
        kernels read), with one scale per column of the GEMM's output."""
        from tilelink.ops.tp_fp8 import quantize_fp8

        if getattr(self, "output", "reduce_scatter") != "reduce_scatter":
            raise LaunchError("TPMLP: fp8=True is for the AllGather/ReduceScatter form (output='reduce_scatter')")
        for name in ("w_gate_up", "w_down"):
            q, scale = quantize_fp8(getattr(self, name).t())
            setattr(self, name, nn.Parameter(q.t(), requires_grad=False))
            self.register_buffer(f"{name}_scale", scale)

    def _forward_fp8(self, x_shard: torch.Tensor, ctx) -> torch.Tensor:
        from tilelink.ops.library import ag_gemm, gemm_rs, silu_mul
        from tilelink.ops.tp_fp8 import quantize_fp8

        x, x_scale = quantize_fp8(x_shard)  # one scale per token: its rows travel with it in the all-gather
        h = ag_gemm(x, self.w_gate_up, ctx, a_scale=x_scale, b_scale=self.w_gate_up_scale, out_dtype=x_shard.dtype)
        act, act_scale = quantize_fp8(silu_mul(h))
        return gemm_rs(act, self.w_down, a_scale=act_scale, b_scale=self.w_down_scale, out_dtype=x_shard.dtype)
