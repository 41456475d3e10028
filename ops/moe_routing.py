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

**Captured calls** (a CUDA graph, :mod:`tilelink.runtime.graphs`) cannot cross to the host: a replay would
reuse the captured call's counts for every new routing. While ``topk_ids``' device captures, :func:`route`
makes a routing of fixed sizes instead (:func:`route_fixed`, vLLM's ``moe_align_block_size`` pattern): the
counts stay on the device, and every size the host needs comes from the shapes alone. ``n`` slots of ``E``
experts padded per expert to ``block`` take at most ``n + min(E, n) * (block - 1)`` entries, so at most
:func:`most_blocks` blocks; the sorted slots and the blocks' experts are buffers of that size, and the blocks
past the routing's own are all padding (``n``) of expert -1: a grouped GEMM's tile there skips its K loop, stores,
gathers and counts nothing, waits for no channel and notifies none. Ids outside ``[0, E)`` cannot raise inside a
capture: they are clamped into range (every slot is still placed once, so no channel waits for a slot that never
comes) and recorded on the device; the next uncaptured :func:`route` on that device raises it, and
``tilelink.finalize()`` does where no such call came after (:func:`check_replays`).
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
    flat: torch.Tensor  # the ids in slot order (contiguous), on their device; clamped into range, int32, if fixed
    counts: torch.Tensor  # slots per expert (num_experts,), int64, on the ids' device
    #: the same on the host, as Python ints (host arithmetic without torch ops); None for a routing of fixed
    #: sizes (:func:`route_fixed`), whose counts stay on the device
    count_list: tuple[int, ...] | None

    @property
    def fixed(self) -> bool:
        """Whether the sizes are the shapes' worst case (:func:`route_fixed`), not this routing's own."""
        return self.count_list is None

    @property
    def host_counts(self) -> torch.Tensor:
        """The slots per expert as an int64 CPU tensor."""
        if self.count_list is None:
            raise LaunchError("this routing of fixed sizes keeps its counts on the device (it was made for a "
                              "captured call): read Routing.counts, or route the ids outside the capture")
        return torch.tensor(self.count_list, dtype=torch.int64)

    def blocks(self, block: int) -> int:
        """Blocks of ``block`` slots once each expert's slots are padded to a multiple of ``block``; for a
        routing of fixed sizes the most any routing of its shape can take (:func:`most_blocks`)."""
        if self.count_list is None:
            return most_blocks(self.flat.numel(), self.num_experts, block)
        return sum(-(-c // block) for c in self.count_list)


def most_blocks(num_slots: int, num_experts: int, block: int) -> int:
    """The most blocks of ``block`` slots that ``num_slots`` slots of ``num_experts`` experts take, each expert
    padded to a multiple of ``block``: at most ``min(num_experts, num_slots)`` experts have a slot, each adds at
    most ``block - 1`` padding, and a block holds at least one slot."""
    padded = num_slots + min(num_experts, num_slots) * (block - 1)
    return min(num_slots, padded // block)


def check_shape(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Clear errors for a routing tensor no kernel could serve (its values are checked by :func:`route`)."""
    if topk_ids.dim() != 2:
        raise LaunchError(f"topk_ids must be (tokens, top_k), got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[1] > num_experts:
        raise LaunchError(f"top_k={topk_ids.shape[1]} is larger than the {num_experts} experts")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise LaunchError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")


@triton.jit
def routing_stats_kernel(ids_ptr, n, num_experts, stats_ptr, range_ptr, clamped_ptr, CHUNK: tl.constexpr,
                         FIXED: tl.constexpr):
    """Program ``e``: ``stats[2 + e]`` = the slots routed to expert ``e``; program 0 also ``stats[0]``,
    ``stats[1]`` = the smallest and largest id (``stats`` int64).

    ``FIXED`` (a routing of fixed sizes, for a captured call, which cannot raise): the ids are clamped into
    ``[0, num_experts)`` (program 0 stores them, int32, in ``clamped_ptr``) and counted so, and program 0 lowers
    ``range_ptr[0]`` to the smallest id and raises ``range_ptr[1]`` to the largest one's excess over
    ``num_experts - 1`` (both stay 0 while every id is in range). Otherwise ``range_ptr`` and ``clamped_ptr`` are
    not read."""
    e = tl.program_id(0)
    count = tl.zeros((), dtype=tl.int64)
    lo = tl.full((), 1 << 62, tl.int64)
    hi = tl.full((), -(1 << 62), tl.int64)
    for off in range(0, n, CHUNK):
        idx = off + tl.arange(0, CHUNK)
        live = idx < n
        v = tl.load(ids_ptr + idx, mask=live, other=0).to(tl.int64)
        lo = tl.minimum(lo, tl.min(tl.where(live, v, 1 << 62), axis=0))
        hi = tl.maximum(hi, tl.max(tl.where(live, v, -(1 << 62)), axis=0))
        if FIXED:
            v = tl.minimum(tl.maximum(v, 0), num_experts - 1)
            if e == 0:
                tl.store(clamped_ptr + idx, v.to(tl.int32), mask=live)
        count += tl.sum((live & (v == e)).to(tl.int64), axis=0)
    tl.store(stats_ptr + 2 + e, count)
    if e == 0:
        tl.store(stats_ptr, lo)
        tl.store(stats_ptr + 1, hi)
        if FIXED:  # the record starts at 0: an id in range moves neither end (n > 0: lo and hi are ids)
            tl.atomic_min(range_ptr, lo)
            tl.atomic_max(range_ptr + 1, hi - (num_experts - 1))


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


#: per device: the range of the ids that captured calls' replays routed (:func:`routing_stats_kernel`), kept until
#: the next uncaptured :func:`route` there checks it
_ranges: dict[str, torch.Tensor] = {}
#: the devices a routing of fixed sizes was captured on: their uncaptured routes check the replays' range
_captured_on: set[str] = set()
#: per device: the number of experts of the routings captured there (None once captures of two numbers were)
_captured_experts: dict[str, int | None] = {}


def _replayed_out_of_range(low: int, over: int, num_experts: int | None) -> LaunchError:
    """The error for a record of replays that routed ids down to ``low`` and up to ``over`` past the last expert."""
    if num_experts is None:
        where, high = "outside the range of their experts", f"up to {over} past the last expert"
    else:
        where, high = f"outside [0, {num_experts})", f"max {num_experts - 1 + over}"
    return LaunchError(f"a replay of a captured MoE call routed expert ids {where} (min {low}, {high}); it computed "
                       f"those slots with the id clamped into range, so its results are void: check the router's "
                       f"output, or the ids copied into the captured topk_ids")


def check_replays() -> LaunchError | None:
    """The error for the expert ids outside their range that captured calls' replays routed since the last check,
    on any device, or None; clears the records. ``tilelink.finalize()`` raises it (the next uncaptured :func:`route`
    on the device does too, for its device). Synchronises with the devices captured on."""
    found = None
    for key in sorted(_captured_on):
        word = _ranges.get(key)
        if word is None:
            continue
        low, over = word.tolist()
        if low < 0 or over > 0:
            word.zero_()
            found = found or _replayed_out_of_range(low, over, _captured_experts.get(key))
    return found


def _range_word(device: torch.device) -> torch.Tensor:
    """``device``'s record of the ids that captured calls routed, made by the first call outside a capture."""
    from tilelink.runtime import graphs

    key = str(device)
    if key not in _ranges:
        if graphs.capturing(device):
            raise LaunchError("an MoE routing cannot start being captured before one has run outside the capture "
                              "on this device (it keeps a device record of the ids that replays route): call the "
                              "MoE operator or layer once outside the capture with the same shapes first")
        with graphs.kept(device):
            _ranges[key] = torch.zeros(2, dtype=torch.int64, device=device)
    return _ranges[key]


def route(topk_ids: torch.Tensor, num_experts: int) -> Routing:
    """Check ``topk_ids`` and count the slots of each expert, with one copy to the host (the ids' range
    and the counts together). Raises :class:`LaunchError` for ids outside ``[0, num_experts)``, and for ids
    outside the range that a captured call's replays routed on this device since the last check. While
    ``topk_ids``' device captures a CUDA graph: :func:`route_fixed` (no copy)."""
    from tilelink.runtime import graphs

    check_shape(topk_ids, num_experts)
    if graphs.capturing(topk_ids.device):
        return route_fixed(topk_ids, num_experts)
    flat = topk_ids.contiguous().view(-1)
    key = str(flat.device)
    word = _range_word(flat.device)  # made here, outside any capture, once per device
    replayed = key in _captured_on  # the replays' record travels in the same copy
    stats = torch.zeros(2 + num_experts + (2 if replayed else 0), dtype=torch.int64, device=flat.device)
    if replayed:
        stats[2 + num_experts:].copy_(word)
    if flat.numel():
        routing_stats_kernel[(num_experts,)](flat, flat.numel(), num_experts, stats, stats, stats, CHUNK=CHUNK,
                                             FIXED=False, num_warps=WARPS)
    lo, hi, *counts = stats.tolist()
    if replayed and (counts[num_experts] < 0 or counts[num_experts + 1] > 0):
        word.zero_()
        raise _replayed_out_of_range(*counts[num_experts:], num_experts)
    if lo < 0 or hi >= num_experts:
        raise LaunchError(f"topk_ids has expert ids outside [0, {num_experts}): min {lo}, max {hi}")
    return Routing(topk_ids, num_experts, flat, stats[2:2 + num_experts], tuple(counts[:num_experts]))


def _step(load: bool, kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` as a step of a capture (:func:`tilelink.runtime.graphs.enqueue`), or with
    ``load`` only compiled and loaded (:func:`tilelink.runtime.preload`: nothing under the interpreter)."""
    from tilelink.runtime import graphs
    from tilelink.runtime.preload import preload

    if load:
        preload(kernel, grid, *args, **kwargs)
    else:
        graphs.enqueue(lambda: kernel[grid](*args, **kwargs))


def route_fixed(topk_ids: torch.Tensor, num_experts: int, *, load: bool = False) -> Routing:
    """The routing of a captured call: counted on the device with no copy to the host, its sizes the worst case
    of its shape (:attr:`Routing.fixed`, :func:`most_blocks`). Ids outside ``[0, num_experts)`` are clamped into
    range and recorded for the next uncaptured :func:`route` on the device to raise. Its kernel launches are
    steps of the capture (:func:`tilelink.runtime.graphs.enqueue`). ``load``: its kernel is compiled and loaded,
    not run (a capture to come cannot load it); the routing's ids and counts are then not written."""
    from tilelink.runtime import graphs

    check_shape(topk_ids, num_experts)
    flat = topk_ids.contiguous().view(-1)
    device, n = flat.device, flat.numel()
    word = _range_word(device)
    if graphs.capturing(device):
        key = str(device)
        _captured_on.add(key)
        _captured_experts[key] = num_experts if _captured_experts.get(key, num_experts) == num_experts else None
        graphs.read_at_finalize(check_replays)  # a user whose last calls were replays hears of it there
    stats = torch.zeros(2 + num_experts, dtype=torch.int64, device=device)
    clamped = torch.empty(n, dtype=torch.int32, device=device)
    if n:
        _step(load, routing_stats_kernel, (num_experts,), flat, n, num_experts, stats, word, clamped, CHUNK=CHUNK,
              FIXED=True, num_warps=WARPS)
    return Routing(topk_ids, num_experts, clamped, stats[2:], None)


def as_routing(topk_ids: torch.Tensor | Routing, num_experts: int) -> Routing:
    """``topk_ids`` itself when it is a :class:`Routing` of ``num_experts`` experts already, else
    :func:`route` of it. A routing made outside a capture is refused inside one (its counts are the host's,
    frozen: a replay would reuse them for every new routing)."""
    from tilelink.runtime import graphs

    if not isinstance(topk_ids, Routing):
        return route(topk_ids, num_experts)
    if topk_ids.num_experts != num_experts:
        raise LaunchError(f"the routing was made for {topk_ids.num_experts} experts, not {num_experts}")
    if not topk_ids.fixed and graphs.capturing(topk_ids.flat.device):
        raise LaunchError("a routing made outside the capture cannot be captured (its per-expert counts were read "
                          "on the host: every replay would reuse them): pass topk_ids itself, or call route() "
                          "inside the capture")
    return topk_ids


def align_tokens(topk_ids: torch.Tensor | Routing, num_experts: int, block: int, *,
                 load: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sorted_slot_ids, expert_ids)``: slots sorted by expert and padded per expert to a
    multiple of ``block`` (padding = ``topk_ids.numel()``), and the expert of each block (int32).
    ``topk_ids`` may be its :class:`Routing` (no copy to the host then). ``load``: its kernel is compiled and
    loaded, not run (:func:`route_fixed`); the routing's own entries are then not written."""
    routing = as_routing(topk_ids, num_experts)
    flat = routing.flat
    device, n = flat.device, flat.numel()
    blocks = routing.blocks(block)  # from the host's counts (no copy), or the shape's worst case
    if routing.fixed:  # the blocks past the routing's own: padding, of expert -1 (the kernels skip their K loops)
        sorted_ids = torch.full((blocks * block,), n, dtype=torch.int32, device=device)
        expert_ids = torch.full((blocks,), -1, dtype=torch.int32, device=device)
    else:  # every entry of both is written
        sorted_ids = torch.empty(blocks * block, dtype=torch.int32, device=device)
        expert_ids = torch.empty(blocks, dtype=torch.int32, device=device)
    if blocks:
        _step(load, align_kernel, (num_experts,), flat, n, routing.counts, num_experts, block, sorted_ids,
              expert_ids, E_POW2=triton.next_power_of_2(num_experts), CHUNK=CHUNK, num_warps=WARPS)
    return sorted_ids, expert_ids
