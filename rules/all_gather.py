"""All-gather consumer: the kernel reads a tensor that is sharded across ranks (paper Fig. 2, §4.1).

Spec: ``tilelink.all_gather("a_ptr", dim=0)``. Rank ``r`` passes its shard (rows
``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))``); every other argument is the full problem's.

Rewrite of the user's kernel (the consumer):
- before the first statement that reads the tensor, in the block where the tile is known, wait for
  the channels holding the tile's rows (``consumer_tile_wait``) and offset the tensor's pointers by
  the wait's token, so software pipelining cannot hoist the loads above the wait (paper §4.2);
- rotate the tile index so that the local shard's tiles come first (``order="local_first"``);
- add the channel parameters (``tlk_*``).

Partner kernels (the producer), chosen by ``via``/``mode``:
- ``sm`` + ``pull``: :func:`ag_pull_producer` copies every peer's channels into the local buffer on
  ``comm_sms`` programs, in ring order, notifying each channel when its rows have landed;
- ``sm`` + ``push``: :func:`ag_push_producer` writes this rank's channels into every peer and
  notifies the peer's barrier (p2p);
- ``copy_engine``: no kernel; the host copies each peer's channels on a side stream and sets the
  barrier word after each copy (``rank_copy_data`` + ``rank_notify``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

import tilelink.language as tll
import tilelink.mapping as tlm
from tilelink.analysis import KernelAnalysis
from tilelink.errors import AnnotationError, LaunchError
from tilelink.mapping import RowSharding
from tilelink.plan import Insertion, ReportEntry, RewritePlan
from tilelink.rules.emit import (
    CHANNEL_PARAMS,
    MAPPING_ARGS,
    channels_of_row_vector,
    channels_of_tile,
    describe_rows,
    remap_order,
    tile_end,
)
from tilelink.rules.launch import Launcher, Streams, vector_peer_table
from tilelink.runtime import (
    Channel,
    Diagnostics,
    peer_tensor,
    races,
    rank_copy_data,
    rank_notify,
    symmetric_empty,
)
from tilelink.spec import AllGatherSpec, Options

RULE = "all_gather"
DEFAULTS = dict(via="sm", mode="pull", order="local_first", comm_sms=16)


def rewrite(an: KernelAnalysis, spec: AllGatherSpec, options: Options) -> RewritePlan:
    """Plan the consumer-side rewrite of ``an`` for ``spec``."""
    opts = options.resolved(**DEFAULTS)
    report: list[ReportEntry] = []
    insertions: list[Insertion] = []
    loads = [a for t in spec.tensors for a in an.accesses_of(t, "load")]
    if not loads:
        names = " or ".join(repr(t) for t in spec.tensors)
        raise AnnotationError(
            f"kernel {an.name!r} never loads from {names} (through tl.load or a tensor descriptor)",
            file=an.file, line=an.where.line, column=an.where.column,
            hint="annotate the pointer the kernel reads, or remove the all_gather spec")
    writes = [a for t in spec.tensors for a in an.accesses_of(t, "store")]
    if writes:
        a = writes[0]
        raise AnnotationError(
            f"kernel {an.name!r} stores to {a.tensor!r}, which all_gather replaces by the gathered buffer that the "
            f"peers read this rank's rows from: the caller's tensor would not be written",
            file=a.where.file, line=a.where.line, column=a.where.column,
            hint="write the kernel's output to another parameter; the gathered tensor is read-only in the kernel")
    untiled = [a for a in loads if a.tile is None]
    if untiled:
        a = untiled[0]
        indexed = None if spec.index else an.index_behind(a)
        raise AnnotationError(
            f"cannot tell which rows along dim {spec.dim} of {a.tensor!r} this load reads "
            f"(pointer `{a.pointer}`)", file=a.where.file, line=a.where.line, column=a.where.column,
            hint=f"the rows come from `{indexed[0]}`, loaded from {indexed[1]!r}: pass index=\"{indexed[1]}\" and "
                 f"size=\"<the full row count>\" to all_gather(...)" if indexed else
                 "compute the offsets as `offs = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)` and index "
                 "with offs[:, None], or pass tile=(\"<start>\", \"<size>\") to all_gather(...)")
    first = loads[0]
    tile = first.tile
    assert tile is not None and first.anchor is not None
    if tile.dynamic and spec.size is None:
        raise AnnotationError(
            f"all_gather with index={spec.index!r} needs the full row count of {first.tensor!r}",
            file=first.where.file, line=first.where.line, column=first.where.column,
            hint="pass size=\"<parameter or expression of parameters>\", e.g. size=\"num_valid_tokens // top_k\"")
    if tile.size_param is None and spec.size is None:
        raise AnnotationError(
            f"cannot find the parameter holding the full size of dim {spec.dim} of {first.tensor!r}",
            file=first.where.file, line=first.where.line, column=first.where.column,
            hint=f"mask the load with `{tile.offsets or 'offs'}[:, None] < M`, or pass size=\"M\" to "
                 f"all_gather(...)")
    size_param = spec.size or tile.size_param
    # one wait per tile: loads of the same tile (the same start defined by the same statement, so in the
    # same block) share the wait placed before the first of them
    groups: dict = {}
    for a in loads:
        t = a.tile
        key = (t.start, t.size, t.defined_at)
        if t.dynamic:
            key = ("dynamic", t.start, t.defined_at)
        groups.setdefault(key, []).append(a)
    for group in groups.values():
        a = group[0]
        t = a.tile
        tokens = sorted({n for x in group for n in x.earlier_aliases})
        if t.dynamic:
            lines = [
                f"# tilelink: wait for the channels holding the rows {t.start} this tile gathers from "
                f"{', '.join(spec.tensors)} (all_gather, dynamic mapping through {spec.index})",
                *channels_of_row_vector(t.start),
                "tlk_token = tll.consumer_tile_wait_channels(tlk_barriers, tlk_channel, tlk_epoch, tlk_diag, "
                "tlk_budget)",
            ]
        else:
            lines = [
                f"# tilelink: wait until rows [{t.start}, {t.start} + {t.size}) of "
                f"{', '.join(spec.tensors)} have arrived (all_gather, dim {spec.dim})",
                channels_of_tile(t),
                "tlk_token = tll.consumer_tile_wait(tlk_barriers, tlk_first, tlk_count, tlk_epoch, tlk_diag, "
                "tlk_budget)",
            ]
            if t.wraps:  # the rows past the end read the first rows again: wait for those too
                lines += [
                    "# tilelink: and for the rows its offsets wrap to, at the start",
                    f"tlk_first, tlk_count = tlm.tl_channels_of_rows(\n    0, {tile_end(t)} - tlk_rows,\n"
                    f"    {MAPPING_ARGS})",
                    "tlk_token += tll.consumer_tile_wait(tlk_barriers, tlk_first, tlk_count, tlk_epoch, tlk_diag, "
                    "tlk_budget)",
                ]
        lines += [f"{n} = {n} + tlk_token" for n in tokens]
        if any(x.descriptor for x in group) and not tokens:
            report.append(ReportEntry(an.name, RULE, "note",
                                      "the tensor-descriptor load's offset is an expression: no token carried; "
                                      "assign the tile start to a variable so that it can carry one", a.where))
        insertions.append(Insertion(a.anchor, "before", tuple(lines)))
        rows = describe_rows(t)
        report.append(ReportEntry(
            an.name, RULE, "applied",
            f"consumer_tile_wait before line {a.anchor.line} (guards the reads of "
            f"{', '.join(sorted({x.tensor for x in group}))} at line(s) "
            f"{', '.join(str(x.where.line) for x in group)}; {rows})", a.anchor))
    shift = f"(tlk_rank * tlk_rows_per_rank) // ({tile.size})"
    if tile.dynamic:
        report.append(ReportEntry(an.name, RULE, "note", f"dynamic mapping through {spec.index}: each tile "
                                  "waits for the channels of the rows it gathers; tiles keep the kernel's order"))
    elif opts.order in ("local_first", "ring"):
        more, entry = remap_order(an, first, RULE, opts.order, shift)
        insertions += more
        report.append(entry)
    else:
        report.append(remap_order(an, first, RULE, opts.order, shift)[1])
    partners = {"copy_engine": (), "sm": ("ag_pull_producer",) if opts.mode == "pull" else ("ag_push_producer",)}
    launch = {
        "rule": RULE, "tensors": list(spec.tensors), "dim": spec.dim, "size_param": size_param,
        "index": spec.index,
        "via": opts.via, "mode": opts.mode, "order": opts.order, "comm_block": opts.comm_block,
        "comm_sms": opts.comm_sms, "channels_per_rank": opts.channels_per_rank,
    }
    report.append(ReportEntry(an.name, RULE, "note",
                              f"producer: {opts.via}" + (f" {opts.mode}" if opts.via == "sm" else "")
                              + f", {opts.comm_sms if opts.via == 'sm' else 'no'} SMs, comm tile "
                              + (f"{opts.comm_block} rows" if opts.comm_block
                                 else "a rank's rows" if opts.via == "copy_engine" else "128 rows")))
    return RewritePlan(an.name, RULE, spec, opts, CHANNEL_PARAMS, tuple(insertions), partners[opts.via],
                       launch, tuple(report))


# --------------------------------------------------------------------------- partner kernels
@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def ag_pull_producer(full_ptr, peer_table, tlk_barriers, tlk_epoch, tlk_rank, tlk_world, tlk_rows,
                     tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems, outer,
                     outer_stride, BLOCK: tl.constexpr):
    """Pull every peer's channels into this rank's copy of the gathered buffer, ring order.

    ``full_ptr`` is the local (outer, rows, row_elems) contiguous buffer; rank ``r``'s rows are
    already in place on every rank's copy (the launcher copies the shard before this runs).
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    num_channels = tlk_world * tlk_channels_per_rank
    for i in range(pid, num_channels, nprog):
        # this rank's own channels first, then the next rank's: ring order over sources
        ch = (i + tlk_rank * tlk_channels_per_rank) % num_channels
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                      tlk_channels_per_rank)
        src = ch // tlk_channels_per_rank
        if src != tlk_rank:
            n = (hi - lo) * row_elems
            # whole symmetric buffers (checked at launch): the rows move as vectors
            peer = tll.peer_ptr_aligned(peer_table, full_ptr, src)
            for o in range(0, outer):
                base = o * outer_stride + lo * row_elems
                for off in range(0, n, BLOCK):
                    idx = off + tl.arange(0, BLOCK)
                    mask = idx < n
                    x = tl.load(peer + base + idx, mask=mask, other=0)
                    tl.store(full_ptr + base + idx, x, mask=mask)
        tll.producer_tile_notify(tlk_barriers, ch, 1, tlk_barriers, tlk_rank, tlk_world, 0)


@triton.jit(do_not_specialize=["tlk_epoch"])  # one variant for every call
def ag_push_producer(full_ptr, peer_table, tlk_barriers, barrier_table, tlk_epoch, tlk_rank, tlk_world,
                     tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel, tlk_channels_per_rank, row_elems,
                     outer, outer_stride, BLOCK: tl.constexpr):
    """Push this rank's channels into every peer's copy and notify the peer's barrier (p2p)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for i in range(pid, tlk_channels_per_rank * tlk_world, nprog):
        j = i % tlk_channels_per_rank
        dst = (tlk_rank + i // tlk_channels_per_rank) % tlk_world
        ch = tlk_rank * tlk_channels_per_rank + j
        lo, hi = tlm.tl_channel_range(ch, tlk_rows, tlk_rows_per_rank, tlk_rows_per_channel,
                                      tlk_channels_per_rank)
        if dst != tlk_rank:
            n = (hi - lo) * row_elems
            # whole symmetric buffers (checked at launch): the rows are stored as vectors
            peer = tll.peer_ptr_aligned(peer_table, full_ptr, dst)
            for o in range(0, outer):
                base = o * outer_stride + lo * row_elems
                for off in range(0, n, BLOCK):
                    idx = off + tl.arange(0, BLOCK)
                    mask = idx < n
                    x = tl.load(full_ptr + base + idx, mask=mask)
                    tl.store(peer + base + idx, x, mask=mask)
        tll.producer_tile_notify(tlk_barriers, ch, 1, barrier_table, dst, tlk_world, 1)



# --------------------------------------------------------------------------- launch plan
@dataclass
class AllGatherContext:
    """Buffers and channels of one shape: two sets of gathered copies of each tensor, chosen by the call's
    parity (``sets[epoch % 2]``, so that no call waits for the peers to finish reading the last one), the
    data channels, and the ``ready`` words: word ``r`` holds the last call whose shard rank ``r`` has put in
    place (a world of one has neither buffers nor ``ready``: nothing is gathered)."""

    sharding: RowSharding
    shapes: tuple[tuple[int, ...], ...]
    sets: tuple[tuple[torch.Tensor, ...], ...]  # [parity][tensor]: symmetric (.., M, ..) buffers
    tables: tuple[tuple[torch.Tensor, ...], ...]  # their peer tables, the same way
    channel: Channel
    ready: Channel | None
    diag: Diagnostics
    streams: Streams
    scratch: torch.Tensor  # a private barrier array for the dry run
    variants: set = field(default_factory=set)  # the rewritten kernel's variants loaded (warm_up)
    satisfied: torch.Tensor | None = None  # a world of one: every wait passes
    copy_plans: dict = field(default_factory=dict)  # parity -> the copy engine's views (AllGatherLauncher._copy_plan)


class AllGatherLauncher(Launcher):
    """``kernel[grid](a_shard, ...)``: gather the shards, then run the rewritten consumer."""

    def context(self, bound: dict) -> AllGatherContext:
        world = self.world()
        size = self.size_of(bound)
        sharding = self.sharding(world, size)
        dim = self.meta["dim"]
        lo, hi = sharding.rank_range(world.rank)
        shapes = []
        for name in self.meta["tensors"]:
            t = self.tensor_arg(bound, name, world)
            if t.dim() <= dim:
                raise LaunchError(f"{self.okernel.name}: {name} has {t.dim()} dims; all_gather is over dim {dim}")
            if t.shape[dim] != hi - lo:
                raise LaunchError(
                    f"{self.okernel.name}: rank {world.rank} must pass rows [{lo}, {hi}) of {name} along dim "
                    f"{dim} ({hi - lo} rows, for {self.meta['size_param']}={size} over {world.world_size} "
                    f"ranks), got {t.shape[dim]}")
            shapes.append((*t.shape[:dim], size, *t.shape[dim + 1:]))
        key = (size, tuple(shapes), tuple(str(bound[n].dtype) for n in self.meta["tensors"]))
        ctx = self.contexts.get(key)
        if ctx is None:
            alone = world.world_size == 1
            sets = () if alone else tuple(
                tuple(symmetric_empty(s, bound[n].dtype) for s, n in zip(shapes, self.meta["tensors"], strict=True))
                for _parity in range(2))
            ctx = AllGatherContext(sharding, tuple(shapes), sets,
                                   tuple(tuple(vector_peer_table(f) for f in fulls) for fulls in sets),
                                   Channel(sharding.num_channels), None if alone else Channel(world.world_size),
                                   Diagnostics(), Streams.for_world(world),
                                   torch.zeros(sharding.num_channels, dtype=torch.int64, device=world.device))
            self.contexts[key] = ctx
        return ctx

    def _producer(self, ctx: AllGatherContext, world, epoch: int, barriers, barrier_table) -> None:
        """Issue the communication of every gathered tensor of call ``epoch`` (SM kernel or copy engine) into
        the set of its parity; ``barrier_table`` is the peer table of ``barriers`` (push mode notifies the
        peers' copies). Epoch 0 is the dry run of ``warm_up``."""
        if self.meta["via"] == "copy_engine":
            self._copy_engine(ctx, world, epoch, barriers)
            return
        dim = self.meta["dim"]
        sh = ctx.sharding
        fulls, tables = ctx.sets[epoch % 2], ctx.tables[epoch % 2]
        for full, table, shape in zip(fulls, tables, ctx.shapes, strict=True):
            row_elems = math.prod(shape[dim + 1:])
            args = dict(tlk_rank=world.rank, tlk_world=world.world_size, tlk_rows=sh.size,
                        tlk_rows_per_rank=sh.rows_per_rank, tlk_rows_per_channel=sh.rows_per_channel,
                        tlk_channels_per_rank=sh.channels_per_rank, row_elems=row_elems,
                        outer=math.prod(shape[:dim]), outer_stride=sh.size * row_elems)
            grid = (min(self.meta["comm_sms"], sh.num_channels),)
            if self.meta["mode"] == "pull":
                self.partner("ag_pull_producer")[grid](full, table, barriers, epoch, **args,
                                                       **self.pull_meta(world, self.PULL_PRODUCER_GPU))
            else:
                self.partner("ag_push_producer")[grid](full, table, barriers, barrier_table, epoch, **args,
                                                       BLOCK=self.BLOCK)

    def _copy_plan(self, ctx: AllGatherContext, world, parity: int) -> list:
        """The copy engine's work for the set of ``parity``, made once per context: the peers' channels (ring
        order), each with the (peer's view, own view) pairs of every tensor's rows (one pair per outer index
        when the rows lie along an inner dim). Views made per call cost the host microseconds each."""
        plan = ctx.copy_plans.get(parity)
        if plan is not None:
            return plan
        dim, sh, fulls = self.meta["dim"], ctx.sharding, ctx.sets[parity]
        plan = []
        for src in self.peer_order(world):
            peers = [peer_tensor(full, src) for full in fulls]
            for j in range(sh.channels_per_rank):
                ch = src * sh.channels_per_rank + j
                lo, hi = sh.channel_range(ch)
                pairs = []
                for full, peer in zip(fulls, peers, strict=True):
                    if hi <= lo:
                        continue
                    if dim == 0 or math.prod(full.shape[:dim]) == 1:  # the rows are one contiguous range
                        pairs.append((peer.narrow(dim, lo, hi - lo), full.narrow(dim, lo, hi - lo)))
                    else:  # rows along an inner dim: one contiguous range per outer index
                        src3 = peer.reshape(-1, full.shape[dim], math.prod(full.shape[dim + 1:]))
                        dst3 = full.reshape(-1, full.shape[dim], math.prod(full.shape[dim + 1:]))
                        pairs.extend((src3[o, lo:hi], dst3[o, lo:hi]) for o in range(src3.shape[0]))
                plan.append((ch, pairs))
        ctx.copy_plans[parity] = plan
        return plan

    def _copy_engine(self, ctx: AllGatherContext, world, epoch: int, barriers) -> None:
        """Pull every peer's channels of every tensor into the set of ``epoch``'s parity (ring order), one
        notify per channel once every tensor's rows of it have landed."""
        sh, k = ctx.sharding, len(ctx.shapes)
        stream = ctx.streams.side
        for j in range(sh.channels_per_rank):  # this rank's own channels first: its shard is in place
            rank_notify(barriers, world.rank * sh.channels_per_rank + j, epoch * k, world.rank, stream)
        for ch, pairs in self._copy_plan(ctx, world, epoch % 2):
            for src_view, dst_view in pairs:
                rank_copy_data(src_view, dst_view, stream)
            rank_notify(barriers, ch, epoch * k, world.rank, stream)

    def _race(self, ctx: AllGatherContext, world, epoch: int, grid, call: dict, consumer_args: dict) -> None:
        """Run the consumer on the race-exposing schedule (:mod:`tilelink.runtime.races`): the peers' rows of
        this call's set are poison until a wait of the consumer asks for their channel, which is delivered then
        (copied from its rank's set and notified), and not before."""
        dim, sh, k = self.meta["dim"], ctx.sharding, len(ctx.shapes)
        lo, hi = sh.rank_range(world.rank)
        for full in ctx.sets[epoch % 2]:
            if lo > 0:
                races.poison_(full.narrow(dim, 0, lo))
            if hi < sh.size:
                races.poison_(full.narrow(dim, hi, sh.size - hi))
        plan = dict(self._copy_plan(ctx, world, epoch % 2))
        delivered: set[int] = set()

        def deliver(ch: int) -> None:
            if ch in delivered:
                return
            delivered.add(ch)
            for src_view, dst_view in plan.get(ch, ()):
                rank_copy_data(src_view, dst_view)
            rank_notify(ctx.channel.barriers, ch, epoch * k, world.rank)

        def next_program() -> None:  # what another program waited for is not this one's to read
            for ch in delivered:
                for _src_view, dst_view in plan.get(ch, ()):
                    races.poison_(dst_view)
            delivered.clear()

        with races.watch(ctx.channel.barriers, on_wait=deliver), races.program_starts(next_program):
            self.kernel[grid](**call, **consumer_args)

    def launch(self, grid, bound: dict) -> None:
        world = self.world()
        ctx = self.context(bound)
        ctx.streams.follow_caller(world.device)
        if world.world_size == 1:  # the shard is the whole tensor
            self.alone(grid, dict(bound), ctx, world)
            return
        dim, k = self.meta["dim"], len(ctx.shapes)
        lo, hi = ctx.sharding.rank_range(world.rank)
        copy_engine = self.meta["via"] == "copy_engine"
        epoch = ctx.channel.advance()
        fulls = ctx.sets[epoch % 2]
        call = dict(bound)
        for name, full in zip(self.meta["tensors"], fulls, strict=True):
            call[name] = full
        self.warm_up(ctx, world, grid, call, partners=lambda: None if copy_engine else self._producer(
            ctx, world, 0, ctx.scratch, self.scratch_table(ctx, world)))  # the copy engine has no kernel
        main, side = ctx.streams.main, ctx.streams.side
        # No barrier: this call's shard goes into the set of its parity, then every peer is told, and the call's
        # kernels and copies start once every peer has said the same (Launcher.handshake). A peer reads (or,
        # pushing, writes) this rank's set only after that word, and this rank writes the set again at call
        # epoch + 2, behind its wait for every peer's word of epoch + 1, which each peer sets only once its streams
        # are past call epoch: the set's readers and writers of call epoch are done (ARCHITECTURE.md). Stream
        # barriers here would make every rank wait for the slowest rank's host on every call.
        for name, full in zip(self.meta["tensors"], fulls, strict=True):
            if hi > lo:
                full.narrow(dim, lo, hi - lo).copy_(bound[name])
        self.handshake(ctx.ready, world, epoch, main, main)
        # a channel is notified once per call per gathered tensor
        consumer_args = self.channel_args(ctx.channel.barriers, epoch * k, world, ctx.sharding, ctx.diag)
        if side is None and races.enabled():  # emulated, every channel as late as the consumer allows
            self._race(ctx, world, epoch, grid, call, consumer_args)
            self.finish(ctx)
            return
        if side is None:  # emulated: kernels are synchronous, the producer runs first
            self._producer(ctx, world, epoch, ctx.channel.barriers, ctx.channel.peer_table)
            self.kernel[grid](**call, **consumer_args)
            self.finish(ctx)
            return
        side.wait_stream(main)  # behind the shard and the handshake, never behind the consumer
        if copy_engine and not self.meta["index"]:
            # the copies need no SM: the consumer is launched first (its first tiles are this rank's own
            # rows), so that the host's enqueueing of the copies overlaps with the consumer's work
            self.kernel[grid](**call, **consumer_args)
            with torch.cuda.stream(side):
                self._producer(ctx, world, epoch, ctx.channel.barriers, ctx.channel.peer_table)
        else:
            # SM producers, and a gather by index (MoE: a tile's tokens come from every rank, so the consumer's
            # first tiles wait for the copies anyway; launched second, the copies start up to 0.2 ms after the
            # GEMM on two H200s when the host is behind the GPU): the producer goes first
            with torch.cuda.stream(side):
                self._producer(ctx, world, epoch, ctx.channel.barriers, ctx.channel.peer_table)
            self.kernel[grid](**call, **consumer_args)
        self.finish(ctx)
