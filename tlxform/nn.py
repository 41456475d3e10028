"""``tilelink.nn``: ``torch.nn`` layers built on TileLink's overlapped operators."""

from tilelink.ops.attention_layers import SPAttention
from tilelink.ops.layers import TPMLP
from tilelink.ops.moe_layers import TPMoE

__all__ = ["SPAttention", "TPMLP", "TPMoE"]
