"""Tensor-parallel MoE on dynamic mappings: AG + gather + GroupGEMM, then GroupGEMM + scatter + top-k
reduce + RS (paper Figure 5, §7.2).

The kernels are plain fused-MoE grouped GEMMs with one annotation each (see
``tlxform show ops/moe_kernels.py::ag_group_gemm_kernel``): ``all_gather("x_ptr", index=...)`` makes
each tile wait only for the ranks holding the tokens it gathers, a mapping known only at run time from
the router; ``reduce_scatter("out_ptr", index=..., topk=...)`` notifies the channels of the tokens a
tile scattered, and a partner kernel sums each token's top-k expert slots over all ranks.

    tlxform run -n 3 --emulate examples/moe.py
"""

import torch

import tilelink
from tilelink.ops import ag_moe, moe_rs


def main(M: int = 29, H: int = 32, I: int = 48, E: int = 4, top_k: int = 2) -> None:  # noqa: E741
    world = tilelink.init()
    rank, size = world.rank, world.world_size
    gen = torch.Generator().manual_seed(0)  # every rank builds the same full problem
    x = torch.randn(M, H, generator=gen)
    w_up = torch.randn(E, H, I, generator=gen) / H**0.5
    w_down = torch.randn(E, I, H, generator=gen) / I**0.5
    topk_ids = torch.stack([torch.randperm(E - 1, generator=gen)[:top_k] for _ in range(M)])  # expert E-1: no token
    topk_weights = torch.softmax(torch.randn(M, top_k, generator=gen), dim=-1)
    per, iper = -(-M // size), -(-I // size)
    lo, hi = min(M, rank * per), min(M, (rank + 1) * per)  # this rank's tokens
    ilo, ihi = min(I, rank * iper), min(I, (rank + 1) * iper)  # this rank's slice of every expert
    h = ag_moe(x[lo:hi].contiguous(), w_up[:, :, ilo:ihi].contiguous(), topk_ids)  # (M*top_k, I_r)
    y = moe_rs(torch.relu(h).contiguous(), w_down[:, ilo:ihi].contiguous(), topk_ids, topk_weights)
    ref = torch.zeros(M, H)
    for t in range(M):
        for k in range(top_k):
            e = int(topk_ids[t, k])
            ref[t] += topk_weights[t, k] * (torch.relu(x[t] @ w_up[e]) @ w_down[e])
    err = (y - ref[lo:hi]).abs().max().item() if hi > lo else 0.0
    assert err < 1e-3, f"rank {rank}: max error {err}"
    print(f"rank {rank}/{size}: MoE {M} tokens x {E} experts top-{top_k} (tokens {lo}..{hi}) equals torch, "
          f"max error {err:.2e}")
    tilelink.finalize()


if __name__ == "__main__":
    main()
