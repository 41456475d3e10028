"""MoE routing on the host side of the fused-MoE kernels: tokens sorted by expert, padded per block.

Slot ``s = t * top_k + k`` is token ``t``'s ``k``-th choice. ``align_tokens`` lists the slots expert by
expert, each expert's list padded to a multiple of ``block`` with the value ``num_slots`` (an invalid
slot the kernels mask out), and gives each block of ``block`` entries its expert.

Two small Triton kernels do it (one program per expert; under ``TRITON_INTERPRET=1`` on CPU tensors):
:func:`routing_stats_kernel` counts each expert's slots and finds the id range, and
:func:`align_kernel` places each expert's slots in slot order (a prefix sum of its matches, chunk by
chunk), its padding and its blocks' expert. They replace some fifteen torch ops (a stable sort, cumulative
sums, gathers, ``repeat_interleave``): on two H200s the sort, ``repeat_interleave`` and the gathers alone took
about 0.6 ms of host time per call, more than the GPU work of the grouped GEMM they fed.

**One transfer to the host per call.** The host needs the routing's per-expert counts (the padded length,
the blocks' experts, the tile config chosen from the waves) and its smallest and largest id (the checks).
:func:`route` brings all of them over in one copy; every later step takes the :class:`Routing`. A copy to
the host waits for the GPU to finish what was queued before it, so each is a stall of the host (asking for
the values one by one takes nine: ``int(t.min())``, ``bincount``'s own checks, ``repeat_interleave``'s length,
...). The one left still keeps the host from running ahead of the GPU across calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilelink.errors import LaunchError

#: ids read per step by the routing kernels (each program reads all of them: MoE-6's 40960 slots in 10
#: steps), and their warps
CHUNK = 4096
WARPS = 8


@dataclass(frozen=True)
class Routing:
    """What the host knows of ``topk_ids`` (M, top_k) after :func:`route`. It describes the ids as they
    were then (``flat`` may be a view of them): make a new one after changing the ids in place."""

    topk_ids: torch.Tensor
    num_experts: int
    flat: torch.Tensor  # the ids in slot order (contiguous), on their device
    counts: torch.Tensor  # slots per expert (num_experts,), int64, on the ids' device
    count_list: tuple[int, ...]  # the same on the host, as Python ints (host arithmetic without torch ops)

    @property
    def host_counts(self) -> torch.Tensor:
        """The slots per expert as an int64 CPU tensor."""
        return torch.tensor(self.count_list, dtype=torch.int64)

    def blocks(self, block: int) -> int:
        """Blocks of ``block`` slots once each expert's slots are padded to a multiple of ``block``."""
        return sum(-(-c // block) for c in self.count_list)


def check_shape(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Clear errors for a routing tensor no kernel could serve (its values are checked by :func:`route`)."""
    if topk_ids.dim() != 2:
        raise LaunchError(f"topk_ids must be (tokens, top_k), got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[1] > num_experts:
        raise LaunchError(f"top_k={topk_ids.shape[1]} is larger than the {num_experts} experts")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise LaunchError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")


@triton.jit
def routing_stats_kernel(ids_ptr, n, stats_ptr, CHUNK: tl.constexpr):
    """Program ``e``: ``stats[2 + e]`` = the slots routed to expert ``e``; program 0 also ``stats[0]``,
    ``stats[1]`` = the smallest and largest id (``stats`` int64)."""
    e = tl.program_id(0)
    count = tl.zeros((), dtype=tl.int64)
    lo = tl.full((), 1 << 62, tl.int64)
    hi = tl.full((), -(1 << 62), tl.int64)
    for off in range(0, n, CHUNK):
        idx = off + tl.arange(0, CHUNK)
        live = idx < n
        v = tl.load(ids_ptr + idx, mask=live, other=0).to(tl.int64)
        count += tl.sum((live & (v == e)).to(tl.int64), axis=0)
        lo = tl.minimum(lo, tl.min(tl.where(live, v, 1 << 62), axis=0))
        hi = tl.maximum(hi, tl.max(tl.where(live, v, -(1 << 62)), axis=0))
    tl.store(stats_ptr + 2 + e, count)
    if e == 0:
        tl.store(stats_ptr, lo)
        tl.store(stats_ptr + 1, hi)


@triton.jit
def align_kernel(ids_ptr, n, counts_ptr, num_experts, block, sorted_ptr, expert_ids_ptr, E_POW2: tl.constexpr,
                 CHUNK: tl.constexpr):
    """Program ``e``: expert ``e``'s slots, in slot order, at its place in ``sorted_ptr`` (experts one after
    the other, each padded to a multiple of ``block`` with ``n``), and ``e`` as the expert of its blocks."""
    e = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    counts = tl.load(counts_ptr + experts, mask=experts < num_experts, other=0).to(tl.int32)
    padded = (counts + block - 1) // block * block
    start = tl.sum(tl.where(experts < e, padded, 0), axis=0)
    mine = tl.sum(tl.where(experts == e, counts, 0), axis=0)
    mine_padded = tl.sum(tl.where(experts == e, padded, 0), axis=0)
    placed = tl.zeros((), dtype=tl.int32)
    for off in range(0, n, CHUNK):
        idx = off + tl.arange(0, CHUNK)
        live = idx < n
        hit = (live & (tl.load(ids_ptr + idx, mask=live, other=-1) == e)).to(tl.int32)
        rank = tl.cumsum(hit, axis=0) - hit  # the matches before this one in the chunk
        tl.store(sorted_ptr + start + placed + rank, idx.to(tl.int32), mask=hit != 0)
        placed += tl.sum(hit, axis=0)
    for off in range(mine, mine_padded, CHUNK):  # the padding after the expert's slots
        idx = off + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + start + idx, tl.full((CHUNK,), 0, tl.int32) + n, mask=idx < mine_padded)
    for off in range(0, mine_padded // block, CHUNK):
        b = off + tl.arange(0, CHUNK)
        tl.store(expert_ids_ptr + start // block + b, tl.full((CHUNK,), 0, tl.int32) + e,
                 mask=b < mine_padded // block)


#: why the MoE operators refuse to be captured in a CUDA graph, and what to do instead
CAPTURE_REFUSED = ("its routing crosses to the host once per call (the per-expert counts decide the padded slot "
                   "count, the blocks' experts and the tile shape, and a graph would replay the captured routing's "
                   "on every new one); capture the layers before and after the MoE layer in graphs of their own and "
                   "call the MoE layer between their replays, outside any capture")


def refuse_capture(op: str, device: torch.device) -> None:
    """Raise :class:`LaunchError` when ``op`` is called while ``device``'s current stream captures."""
    from tilelink.runtime import graphs

    if graphs.capturing(device):
        raise LaunchError(f"{op} cannot be captured in a CUDA graph: {CAPTURE_REFUSED}")


def route(topk_ids: torch.Tensor, num_experts: int) -> Routing:
    """Check ``topk_ids`` and count the slots of each expert, with one copy to the host (the ids' range
    and the counts together). Raises :class:`LaunchError` for ids outside ``[0, num_experts)``, and while a
    CUDA graph captures (a graph cannot cross to the host)."""
    check_shape(topk_ids, num_experts)
    refuse_capture("MoE routing", topk_ids.device)
    flat = topk_ids.contiguous().view(-1)
    stats = torch.zeros(2 + num_experts, dtype=torch.int64, device=flat.device)
    if flat.numel():
        routing_stats_kernel[(num_experts,)](flat, flat.numel(), stats, CHUNK=CHUNK, num_warps=WARPS)
    lo, hi, *counts = stats.tolist()
    if lo < 0 or hi >= num_experts:
        raise LaunchError(f"topk_ids has expert ids outside [0, {num_experts}): min {lo}, max {hi}")
    return Routing(topk_ids, num_experts, flat, stats[2:], tuple(counts))


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
    flat = routing.flat
    device = flat.device
    blocks = routing.blocks(block)  # from the host's counts: no copy
    sorted_ids = torch.empty(blocks * block, dtype=torch.int32, device=device)
    expert_ids = torch.empty(blocks, dtype=torch.int32, device=device)
    if blocks:  # every entry of both is written
        align_kernel[(num_experts,)](flat, flat.numel(), routing.counts, num_experts, block, sorted_ids, expert_ids,
                                     E_POW2=triton.next_power_of_2(num_experts), CHUNK=CHUNK, num_warps=WARPS)
    return sorted_ids, expert_ids
