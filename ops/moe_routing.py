"""MoE routing on the host side of the fused-MoE kernels: tokens sorted by expert, padded per block.

Slot ``s = t * top_k + k`` is token ``t``'s ``k``-th choice. ``align_tokens`` lists the slots expert by
expert, each expert's list padded to a multiple of ``block`` with the value ``num_slots`` (an invalid
slot the kernels mask out), and gives each block of ``block`` entries its expert. All torch ops: the
same code runs on CPU and GPU tensors.
"""

from __future__ import annotations

import torch

from tilelink.errors import LaunchError


def check_routing(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Clear errors for routing that no kernel could serve."""
    if topk_ids.dim() != 2:
        raise LaunchError(f"topk_ids must be (tokens, top_k), got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[1] > num_experts:
        raise LaunchError(f"top_k={topk_ids.shape[1]} is larger than the {num_experts} experts")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise LaunchError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise LaunchError(f"topk_ids has expert ids outside [0, {num_experts}): min {int(topk_ids.min())}, "
                          f"max {int(topk_ids.max())}")


def align_tokens(topk_ids: torch.Tensor, num_experts: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sorted_slot_ids, expert_ids)``: slots sorted by expert and padded per expert to a
    multiple of ``block`` (padding = ``topk_ids.numel()``), and the expert of each block (int32)."""
    flat = topk_ids.flatten().to(torch.int64)
    n = flat.numel()
    device = flat.device
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block - 1) // block * block
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    dest = starts[experts] + torch.arange(n, device=device) - first_of_expert[experts]
    total = int(padded.sum())
    sorted_ids = torch.full((total,), n, dtype=torch.int32, device=device)
    sorted_ids[dest] = order.to(torch.int32)
    expert_ids = torch.repeat_interleave(torch.arange(num_experts, device=device, dtype=torch.int32),
                                         padded // block)
    return sorted_ids, expert_ids
