"""Sequence-parallel attention: the K/V all-gather on the copy engine overlapped with flash attention
(paper Figure 6). Each rank holds rows [r*ceil(S/R), min(S, (r+1)*ceil(S/R))) of Q, K and V and gets
the attention of its query rows over the whole sequence; the kernel visits its own K/V first and waits
for each other rank's shard only when it reaches it (``tlxform show ops/attention_kernels.py::
sp_attention_fwd_kernel``).

    tlxform run -n 3 --emulate examples/sp_attention.py
"""

import torch

import tilelink
from tilelink.ops import sp_attention


def main(B: int = 1, H: int = 4, H_KV: int = 2, S: int = 50, D: int = 16) -> None:
    world = tilelink.init()
    rank, size = world.rank, world.world_size
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, S, D, generator=gen) for h in (H, H_KV, H_KV))
    per = -(-S // size)
    lo, hi = min(S, rank * per), min(S, (rank + 1) * per)
    shard = lambda t: t[:, :, lo:hi].contiguous()  # noqa: E731
    out = sp_attention(shard(q), shard(k), shard(v), causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    err = (out - ref[:, :, lo:hi]).abs().max().item() if hi > lo else 0.0
    assert err < 1e-3, f"rank {rank}: max error {err}"
    print(f"rank {rank}/{size}: causal GQA attention, sequence rows {lo}..{hi} of {S}, equals SDPA, "
          f"max error {err:.2e}")
    tilelink.finalize()


if __name__ == "__main__":
    main()
