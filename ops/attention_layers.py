"""``tilelink.nn.SPAttention``: sequence-parallel attention as a ``torch.nn`` module.

A thin module over :func:`tilelink.ops.attention.sp_attention`: it holds the head counts and the
causal flag and checks every call's tensors against them. Projections stay outside (the caller's
``nn.Linear`` layers produce q, k, v in SDPA layout from this rank's rows of the sequence).
"""

from __future__ import annotations

import torch
from torch import nn

from tilelink.errors import LaunchError
from tilelink.ops.attention import SPContext
from tilelink.ops.library import sp_attention  # a custom op while torch.compile traces


class SPAttention(nn.Module):
    """Attention of this rank's query rows over the whole sequence, K/V gathered across ranks.

    Args:
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention); defaults to ``num_heads``.
        causal: mask keys after each query's global position.
        seq_len: the full sequence length, when fixed (saves a host all-gather per call).

    ``forward(q, k, v)``: this rank's (batch, heads, rows, head_dim) shards; returns q's shape.
    """

    def __init__(self, num_heads: int, num_kv_heads: int | None = None, causal: bool = False,
                 seq_len: int | None = None) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a positive multiple of num_kv_heads={num_kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.causal = causal
        self.ctx = SPContext(seq_len) if seq_len is not None else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.dim() != 4 or q.shape[1] != self.num_heads:
            raise LaunchError(f"SPAttention: expected q of shape (batch, {self.num_heads} query heads, rows, "
                              f"head_dim), got {tuple(q.shape)}")
        for what, t in (("k", k), ("v", v)):
            if t.dim() != 4 or t.shape[1] != self.num_kv_heads:
                raise LaunchError(f"SPAttention: expected {what} of shape (batch, {self.num_kv_heads} kv heads, "
                                  f"rows, head_dim), got {tuple(t.shape)}")
        return sp_attention(q, k, v, causal=self.causal, ctx=self.ctx)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, causal={self.causal}"
