"""MoE routing on the host side of the fused-MoE kernels: tokens sorted by expert, padded per block.

Slot ``s = t * top_k + k`` is token ``t``'s ``k``-th choice. ``align_tokens`` lists the slots expert by
expert, each expert's list padded to a multiple of ``block`` with the value ``num_slots`` (an invalid
slot the kernels mask out), and gives each block of ``block`` entries its expert. All torch ops: the
same code runs on CPU and GPU tensors.

**One transfer to the host per call.** The host needs the routing's per-expert counts (the padded length,
the blocks' experts, the tile config chosen from the waves) and its smallest and largest id (the checks).
:func:`route` brings all of them over in one copy; every later step takes the :class:`Routing`. A copy to
the host waits for the GPU to finish what was queued before it: an MoE call made nine (``int(t.min())``,
``bincount``'s own checks, ``repeat_interleave``'s length, ...), each a stall of the host. The one left
still keeps the host from running ahead of the GPU across calls (docs/PERFORMANCE.md, session 7).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilelink.errors import LaunchError


@dataclass(frozen=True)
class Routing:
    """What the host knows of ``topk_ids`` (M, top_k) after :func:`route`. It describes the ids as they
    were then (``flat`` may be a view of them): make a new one after changing the ids in place."""

    topk_ids: torch.Tensor
    num_experts: int
    flat: torch.Tensor  # the ids as int64, slot order, on their device
    counts: torch.Tensor  # slots per expert (num_experts,), int64, on the ids' device
    host_counts: torch.Tensor  # the same on the CPU


def check_shape(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Clear errors for a routing tensor no kernel could serve (its values are checked by :func:`route`)."""
    if topk_ids.dim() != 2:
        raise LaunchError(f"topk_ids must be (tokens, top_k), got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[1] > num_experts:
        raise LaunchError(f"top_k={topk_ids.shape[1]} is larger than the {num_experts} experts")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise LaunchError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")


def route(topk_ids: torch.Tensor, num_experts: int) -> Routing:
    """Check ``topk_ids`` and count the slots of each expert, with one copy to the host (the ids' range
    and the counts together). Raises :class:`LaunchError` for ids outside ``[0, num_experts)``."""
    check_shape(topk_ids, num_experts)
    flat = topk_ids.flatten().to(torch.int64)
    device = flat.device
    # out-of-range ids are counted clamped (never indexed out of bounds) and refused below
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    if flat.numel():
        counts.scatter_add_(0, flat.clamp(0, num_experts - 1), torch.ones_like(flat))
        lo_hi = torch.stack([flat.min(), flat.max()])
    else:
        lo_hi = torch.zeros(2, dtype=torch.int64, device=device)
    host = torch.cat([lo_hi, counts]).cpu()
    lo, hi = int(host[0]), int(host[1])
    if lo < 0 or hi >= num_experts:
        raise LaunchError(f"topk_ids has expert ids outside [0, {num_experts}): min {lo}, max {hi}")
    return Routing(topk_ids, num_experts, flat, counts, host[2:])


def as_routing(topk_ids: torch.Tensor | Routing, num_experts: int) -> Routing:
    """``topk_ids`` itself when it is a :class:`Routing` of ``num_experts`` experts already, else
    :func:`route` of it."""
    if not isinstance(topk_ids, Routing):
        return route(topk_ids, num_experts)
    if topk_ids.num_experts != num_experts:
        raise LaunchError(f"the routing was made for {topk_ids.num_experts} experts, not {num_experts}")
    return topk_ids


def align_tokens(topk_ids: torch.Tensor | Routing, num_experts: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sorted_slot_ids, expert_ids)``: slots sorted by expert and padded per expert to a
    multiple of ``block`` (padding = ``topk_ids.numel()``), and the expert of each block (int32).
    ``topk_ids`` may be its :class:`Routing` (no copy to the host then)."""
    routing = as_routing(topk_ids, num_experts)
    flat, counts = routing.flat, routing.counts
    n = flat.numel()
    device = flat.device
    padded = (counts + block - 1) // block * block
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    dest = starts[experts] + torch.arange(n, device=device) - first_of_expert[experts]
    blocks = int(((routing.host_counts + block - 1) // block).sum())  # from the host's counts: no copy
    sorted_ids = torch.full((blocks * block,), n, dtype=torch.int32, device=device)
    sorted_ids[dest] = order.to(torch.int32)
    # built on the device, its length given: without output_size repeat_interleave reads the repeats' sum
    # back, and a copy of a host-built list to the device waited for the GPU too (7 ms on two H200s)
    expert_ids = torch.repeat_interleave(torch.arange(num_experts, dtype=torch.int32, device=device),
                                         padded // block, output_size=blocks)
    return sorted_ids, expert_ids
