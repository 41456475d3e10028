"""The launch side of the all_gather rule: buffers, channels and streams per shape."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tilelink.errors import LaunchError, WaitTimeout
from tilelink.mapping import RowSharding
from tilelink.plan import AllGatherLaunch
from tilelink.rules.direct import DirectKernel
from tilelink.rules.launch import (
    Launcher,
    Streams,
    bound_launch,
    copy_address,
    described,
    grid_axis,
    kept_form_may_run,
    on_stream,
    rebuilt,
    vector_peer_table,
)
from tilelink.runtime import (
    Channel,
    Diagnostics,
    peer_tensor,
    races,
    rank_copy_data,
    rank_notify,
    symmetric_empty,
)


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
    twin: AllGatherContext | None = None  # the context of captured calls (Launcher.make_twin)
    captured: bool = False  # a twin on which a call was captured
    fence: Channel | None = None  # a twin's barrier words (Launcher.device_barrier)


class AllGatherLauncher(Launcher):
    """``kernel[grid](a_shard, ...)``: gather the shards, then run the rewritten consumer."""

    plan: AllGatherLaunch

    @property
    def resets_channels(self) -> bool:
        """A captured copy-engine gather starts its channels from zero and its flags store the call's own count
        with the stream's memory operations, as uncaptured: a flag set by a kernel would need an SM, and the
        consumer, launched first, keeps every SM while it waits for the flags (Launcher.begin_captured)."""
        return self.plan.via == "copy_engine"

    def launched_shapes(self, bound: dict, size: int) -> dict[str, tuple[int, ...]]:
        """The gathered tensors: the shard's shape with ``size`` rows along the gathered dim."""
        dim, shapes = self.plan.dim, {}
        for name in self.plan.tensors:
            t = described(bound.get(name))
            if isinstance(t, torch.Tensor) and t.dim() > dim:
                shapes[name] = (*t.shape[:dim], size, *t.shape[dim + 1:])
        return shapes

    def checked_context(self, bound: dict, grid=None) -> AllGatherContext:
        world = self.world()
        size = self.size_of(bound, grid)
        sharding = self.sharding(world, size)
        dim = self.plan.dim
        lo, hi = sharding.rank_range(world.rank)
        shapes = []
        for name in self.plan.tensors:
            t = self.tensor_arg(bound, name, world)
            # a flat shard of blocks (rows z * H * S_r + h * S_r + s) passed for a gather of the blocks' inner dim
            flat = (f": pass its view with the sharded dim as dim {dim}, e.g. `{name}.view(Z * H, S_r, D)` for a "
                    f"flat (Z * H * S_r, D) shard of heads gathered along S (the same memory)"
                    if dim >= 1 and t.dim() <= dim + 1 else "")
            if t.dim() <= dim:
                raise LaunchError(f"{self.okernel.name}: {name} has {t.dim()} dims; all_gather is over dim {dim}{flat}")
            if t.shape[dim] != hi - lo:
                raise LaunchError(
                    f"{self.okernel.name}: rank {world.rank} must pass rows [{lo}, {hi}) of {name} along dim "
                    f"{dim} ({hi - lo} rows, for {self.size_said(size)} over {world.world_size} "
                    f"ranks), got {t.shape[dim]}{flat}"
                    + ("; the grid counts the rows here: launch one program a row, or, for a grid of more programs "
                       "than rows, pass size= to the annotation (an int parameter holding the full row count)"
                       if grid_axis(self.plan.size_param) is not None else ""))
            shapes.append((*t.shape[:dim], size, *t.shape[dim + 1:]))
        key = (size, tuple(shapes), tuple(str(described(bound[n]).dtype) for n in self.plan.tensors))
        ctx = self.contexts.get(key)
        if ctx is None:
            self.refuse_capture(world, "its first call with these shapes allocates symmetric buffers and loads "
                                       "kernels, which cannot happen while a stream captures; call it once outside "
                                       "the capture with the same shapes first")
            alone = world.world_size == 1
            sets = () if alone else tuple(
                tuple(symmetric_empty(s, described(bound[n]).dtype)
                      for s, n in zip(shapes, self.plan.tensors, strict=True))
                for _parity in range(2))
            ctx = AllGatherContext(sharding, tuple(shapes), sets,
                                   tuple(tuple(vector_peer_table(f) for f in fulls) for fulls in sets),
                                   Channel(sharding.num_channels), None if alone else Channel(world.world_size),
                                   Diagnostics(), Streams.for_world(world),
                                   torch.zeros(sharding.num_channels, dtype=torch.int64, device=world.device))
            self.contexts[key] = ctx
            if not alone:
                self.make_twin(ctx, world, channel=Channel(sharding.num_channels), ready=Channel(world.world_size))
        return ctx

    def _producer(self, ctx: AllGatherContext, world, epoch: int, barriers, barrier_table, own: bool = True) -> None:
        """Issue the communication of every gathered tensor of call ``epoch`` (SM kernel or copy engine) into
        the set of its parity; ``barrier_table`` is the peer table of ``barriers`` (push mode notifies the
        peers' copies). Epoch 0 is the dry run of ``warm_up``. ``own``: as :meth:`_copy_engine`'s (the copy
        engine names its stream to each copy and flag: no stream context is needed around it)."""
        if self.plan.via == "copy_engine":
            self._copy_engine(ctx, world, epoch, own)
            return
        dim = self.plan.dim
        sh = ctx.sharding
        fulls, tables = ctx.sets[epoch % 2], ctx.tables[epoch % 2]
        for full, table, shape in zip(fulls, tables, ctx.shapes, strict=True):
            row_elems = math.prod(shape[dim + 1:])
            args = dict(tlk_rank=world.rank, tlk_world=world.world_size, tlk_rows=sh.size,
                        tlk_rows_per_rank=sh.rows_per_rank, tlk_rows_per_channel=sh.rows_per_channel,
                        tlk_channels_per_rank=sh.channels_per_rank, row_elems=row_elems,
                        outer=math.prod(shape[:dim]), outer_stride=sh.size * row_elems)
            grid = (min(self.plan.comm_sms, sh.num_channels),)
            if self.plan.mode == "pull":
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
        dim, sh, fulls = self.plan.dim, ctx.sharding, ctx.sets[parity]
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

    def _copy_addresses(self, ctx: AllGatherContext, world, parity: int) -> list:
        """:meth:`_copy_plan` as the copy engine's driver calls take it, made once per context: for each channel,
        the (destination, source, bytes) of each of its copies, checked here as ``rank_copy_data`` checks a copy."""
        plan = ctx.copy_plans.get(("addresses", parity))
        if plan is None:
            plan = []
            for ch, pairs in self._copy_plan(ctx, world, parity):
                what = f"{self.okernel.name}, channel {ch}"
                plan.append((ch, tuple(copy_address(src_view, dst_view, what) for src_view, dst_view in pairs)))
            ctx.copy_plans[("addresses", parity)] = plan
        return plan

    def _copy_engine(self, ctx: AllGatherContext, world, epoch: int, own: bool = True) -> None:
        """Pull every peer's channels of every tensor into the set of ``epoch``'s parity (ring order), one
        notify of ``ctx.channel`` per channel once every tensor's rows of it have landed (the copy engine has no
        dry run: its barriers are always the context's, or its twin's). A captured call's flags are the call's own
        counts too (``resets_channels``). The backend's copies and flags are given addresses read once per context
        (``_copy_addresses``, the Channel's words): a copy or a flag is then one driver call on the host. Without
        ``own``, this rank's own channels are left to the handshake, which set them (an uncaptured call on a GPU)."""
        sh, k = ctx.sharding, len(ctx.shapes)
        stream, impl, value = ctx.streams.side, world.impl, epoch * k
        words = ctx.channel.word_address(0, world.rank, "the copy engine's flags")  # a live Channel of this world
        first = world.rank * sh.channels_per_rank
        for ch in range(first, first + sh.channels_per_rank) if own else ():  # its shard is in place: first
            impl.write_value_at(words + 8 * ch, value, stream)
        for ch, copies in self._copy_addresses(ctx, world, epoch % 2):
            for dst, src, nbytes in copies:
                impl.copy_at(dst, src, nbytes, stream)
            impl.write_value_at(words + 8 * ch, value, stream)

    def _race(self, ctx: AllGatherContext, world, epoch: int, grid, call: dict, consumer_args: dict) -> None:
        """Run the consumer on the race-exposing schedule (:mod:`tilelink.runtime.races`): the peers' rows of
        this call's set are poison until a wait of the consumer asks for their channel, which is delivered then
        (copied from its rank's set and notified), and not before."""
        dim, sh, k = self.plan.dim, ctx.sharding, len(ctx.shapes)
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

    def kernel_call(self, bound: dict, ctx: AllGatherContext) -> dict:
        """The gathered tensors over the set of an odd call (a captured call's; both sets are alike)."""
        call = dict(bound)
        for name, full in zip(self.plan.tensors, ctx.sets[1], strict=True):
            call[name] = rebuilt(bound[name], full)  # a host descriptor: the same one over the gathered rows
        return call

    def _launch_captured(self, grid, bound: dict, ctx: AllGatherContext, world) -> None:
        """A captured call (:mod:`tilelink.runtime.graphs`): the twin's channels and one set of gathered copies (a
        replay cannot alternate them), so two barriers of the ranks' main streams, on the device, take the place
        of the alternation: at the start every peer is past its previous call (none still reads this rank's set
        when its shard is copied in), at the end every peer is done with this one (an uncaptured call next may
        write either set before its handshake)."""
        from tilelink.runtime import graphs

        dim, k = self.plan.dim, len(ctx.shapes)
        lo, hi = ctx.sharding.rank_range(world.rank)
        fulls = ctx.sets[1]  # the set of an odd call: with epoch 1, every helper below picks it
        call = self.kernel_call(bound, ctx)
        twin = self.begin_captured(ctx, world, grid, call)
        main, side = twin.streams.main, twin.streams.side
        self.device_barrier(twin, world, main)
        if self.resets_channels:  # nothing reads them now: the last call's consumer is behind on this stream
            graphs.enqueue(twin.channel.barriers.zero_)

        def shards() -> None:
            for name, full in zip(self.plan.tensors, fulls, strict=True):
                if hi > lo:
                    full.narrow(dim, lo, hi - lo).copy_(described(bound[name]))

        graphs.enqueue(shards)
        self.device_handshake(twin, twin.ready, world, main, main)
        # the kernels get the per-call multiple (k notifies a channel per call); the count is on the device
        consumer_args = self.channel_args(twin.channel.barriers, k, world, twin.sharding, twin.diag)

        def producer() -> None:
            self._producer(twin, world, 1, twin.channel.barriers, twin.channel.peer_table)

        def consumer() -> None:
            self.kernel[grid](**call, **consumer_args)

        if side is None:  # emulated: the producer first, as in an uncaptured call
            graphs.enqueue(producer)
            graphs.enqueue(consumer)
        else:  # the same order as an uncaptured call's
            side.wait_stream(main)
            if self.plan.via == "copy_engine" and not self.plan.index:
                consumer()
                with on_stream(side):
                    producer()
            else:
                with on_stream(side):
                    producer()
                consumer()
            self.finish_captured(twin)
        self.device_barrier(twin, world, main, last=True)

    def prepared_with_peers(self, world, grid, bound: dict, names: tuple[str, ...]) -> GatherLaunch | None:
        """A call with peers made ready to launch again (:class:`GatherLaunch`), where each gathered tensor is a plain
        tensor among ``names`` and, on a GPU, the rewritten kernel is launched directly; not for a gather by index
        (MoE: its copies go first, and its calls' shapes follow the routing)."""
        if self.plan.index or (type(self.kernel) is not DirectKernel and world.backend != "emulated") or any(
                name not in names or type(bound.get(name)) is not torch.Tensor for name in self.plan.tensors):
            return None
        ctx = self.context(bound, grid)
        if not ctx.variants and world.backend != "emulated":  # no call of these shapes has run: its first call
            return None  # warms every kernel up (the interpreter has nothing to load)
        return GatherLaunch(self, world, ctx, grid, bound, names)

    def launch(self, grid, bound: dict) -> None:
        world = self.world()
        ctx = self.context(bound, grid)
        ctx.streams.follow_caller(world.device)
        if world.world_size == 1:  # the shard is the whole tensor
            self.alone(grid, dict(bound), ctx, world)
            return
        from tilelink.runtime import graphs

        if graphs.capturing(world.device):
            self._launch_captured(grid, bound, ctx, world)
            return
        dim, k = self.plan.dim, len(ctx.shapes)
        lo, hi = ctx.sharding.rank_range(world.rank)
        copy_engine = self.plan.via == "copy_engine"
        epoch = ctx.channel.advance()
        fulls = ctx.sets[epoch % 2]
        call = dict(bound)
        for name, full in zip(self.plan.tensors, fulls, strict=True):
            call[name] = rebuilt(bound[name], full)  # a host descriptor: the same one over the gathered rows
        self.warm_up(ctx, world, grid, call, partners=lambda: None if copy_engine else self._producer(
            ctx, world, 0, ctx.scratch, self.scratch_table(ctx, world)))  # the copy engine has no kernel
        side = ctx.streams.side
        # No barrier: this call's shard goes into the set of its parity, then every peer is told, and the call's
        # kernels and copies start once every peer has said the same (Launcher.handshake). A peer reads (or,
        # pushing, writes) this rank's set only after that word, and this rank writes the set again at call
        # epoch + 2, behind its wait for every peer's word of epoch + 1, which each peer sets only once its streams
        # are past call epoch: the set's readers and writers of call epoch are done (ARCHITECTURE.md). Stream
        # barriers here would make every rank wait for the slowest rank's host on every call.
        shards = [(described(bound[name]), full.narrow(dim, lo, hi - lo))
                  for name, full in zip(self.plan.tensors, fulls, strict=True) if hi > lo]
        fused = shards[0] if len(shards) == 1 and copied_by_handshake(*shards[0]) else None
        for shard, place in shards:
            if fused is None:
                place.copy_(shard)
        # on the main stream (a GPU's current one: follow_caller); on a GPU its kernel also sets the copy engine's
        # flags of this rank's own channels, whose rows the shard's copy put in place (the kernel's own copy, where
        # one shard goes into a contiguous place)
        own = (world.rank * ctx.sharding.channels_per_rank, ctx.sharding.channels_per_rank, epoch * k)
        self.handshake(ctx, ctx.ready, world, epoch, own if copy_engine and side is not None else (0, 0, 0), fused)
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
        ctx.streams.fork()  # the side stream behind the shard and the handshake, never behind the consumer
        if copy_engine and not self.plan.index:
            # the copies need no SM: the consumer is launched first (its first tiles are this rank's own
            # rows), so that the host's enqueueing of the copies overlaps with the consumer's work
            self.kernel[grid](**call, **consumer_args)
            self._producer(ctx, world, epoch, ctx.channel.barriers, ctx.channel.peer_table, False)
        elif copy_engine:
            # a gather by index (MoE: a tile's tokens come from every rank, so the consumer's first tiles wait for
            # the copies anyway; launched second, the copies start up to 0.2 ms after the GEMM on two H200s when the
            # host is behind the GPU): the copies go first
            self._producer(ctx, world, epoch, ctx.channel.barriers, ctx.channel.peer_table, False)
            self.kernel[grid](**call, **consumer_args)
        else:  # SM producers go first too
            with on_stream(side):
                self._producer(ctx, world, epoch, ctx.channel.barriers, ctx.channel.peer_table)
            self.kernel[grid](**call, **consumer_args)
        self.finish(ctx)


def copied_by_handshake(shard, place: torch.Tensor) -> bool:
    """Whether the handshake's kernel can copy ``shard`` into ``place`` (``Launcher.handshake``'s ``copy``): a plain
    contiguous tensor of the place's shape, dtype and device, into a contiguous place, both at 16-byte aligned
    addresses (the kernel's one variant; a shard at another address is copied by the driver, one call)."""
    return (type(shard) is torch.Tensor and shard.dtype == place.dtype and shard.shape == place.shape
            and shard.device == place.device and shard.is_contiguous() and place.is_contiguous()
            and place.numel() > 0 and shard.data_ptr() % 16 == 0 and place.data_ptr() % 16 == 0)


def _shard_place(place: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Where this rank's shard goes in a gathered set, its address and its bytes; address 0 where the place is not
    contiguous (then torch copies into it)."""
    nbytes = place.numel() * place.element_size()
    return place, place.data_ptr() if place.is_contiguous() and nbytes else 0, nbytes


class GatherLaunch:
    """One form of an all-gather call with peers, ready to launch (``AllGatherLauncher.prepared_with_peers``):
    ``launch(*tensors)`` is ``launcher.launch(grid, bound)`` with the tensors ``names`` given ``tensors``, every other
    argument ``bound``'s, in the steps of an uncaptured call (the shard into the set of the call's parity, the
    handshake, the side stream's fork, the consumer and the producer in the launch path's order, ``finish``) without
    what the caller's key and the ints already fixed: the binding and the row-fact checks, the context's key, the
    rebuilt arguments, the channel arguments but the count, the variant's terms of the ints and constexprs. The
    consumer is a bound launch per set (:class:`tilelink.rules.direct.Bound` on a GPU: the call's other tensors and
    ``tlk_epoch``), the shards' places in each set views made once (a contiguous shard is copied into its place with
    one driver call on the caller's stream). It returns ``False``, launching nothing, where
    the call must take ``launch``: a new world, an earlier wait that timed out, a capture, a variant of the
    consumer not compiled yet (an operand at another alignment: the launch path compiles and loads it before
    anything of the call is enqueued), or, emulated, the race-exposing schedule (``launch`` runs it). The caller
    keeps what else decides the call (its tensors' shapes, strides, dtypes and devices) in its own key."""

    __slots__ = ("capturing", "copy_at", "copy_engine", "ctx", "device", "gathered", "k", "launcher", "others", "own",
                 "runs", "shards", "world")

    def __init__(self, launcher: AllGatherLauncher, world, ctx: AllGatherContext, grid, bound: dict,
                 names: tuple[str, ...]) -> None:
        from tilelink.runtime import graphs

        plan = launcher.plan
        self.launcher, self.world, self.ctx, self.device = launcher, world, ctx, world.device
        self.capturing = graphs.capturing
        self.k, self.copy_engine = len(ctx.shapes), plan.via == "copy_engine"
        self.gathered = tuple(names.index(name) for name in plan.tensors)
        self.others = tuple(i for i, name in enumerate(names) if name not in plan.tensors)
        lo, hi = ctx.sharding.rank_range(world.rank)
        self.shards = tuple(tuple(_shard_place(full.narrow(plan.dim, lo, hi - lo)) for full in fulls)
                            if hi > lo else () for fulls in ctx.sets)
        self.copy_at = world.impl.copy_at
        cpr = ctx.sharding.channels_per_rank
        self.own = (world.rank * cpr, cpr)
        channels = launcher.channel_args(ctx.channel.barriers, 1, world, ctx.sharding, ctx.diag)
        changing = (*(names[i] for i in self.others), "tlk_epoch")
        self.runs = tuple(bound_launch(launcher.kernel, grid, {**bound, **dict(zip(plan.tensors, fulls, strict=True)),
                                                               **channels}, changing)
                          for fulls in ctx.sets)

    def __call__(self, *tensors) -> bool:
        launcher, ctx, world = self.launcher, self.ctx, self.world
        side = ctx.streams.side
        if not kept_form_may_run(self) or side is None and races.enabled():
            return False
        ctx.streams.follow_caller(self.device)
        epoch = ctx.channel.epoch + 1
        parity, value = epoch % 2, epoch * self.k  # a channel is notified once per call per gathered tensor
        run = self.runs[parity]
        found = run.find(*(tensors[i] for i in self.others), value)
        if found is None:
            return False
        ctx.channel.advance()
        try:
            # this rank's shards into the set of the call's parity (none for an empty shard), the handshake behind
            # them: launch's reasons
            places = self.shards[parity]
            fused = None
            if len(places) == 1 and copied_by_handshake(tensors[self.gathered[0]], places[0][0]):
                fused = (tensors[self.gathered[0]], places[0][0])  # the handshake's kernel copies it
            else:
                for (place, address, nbytes), i in zip(places, self.gathered, strict=False):
                    shard = tensors[i]
                    if address and shard.dtype == place.dtype and shard.shape == place.shape and shard.is_contiguous():
                        # one driver call on the caller's stream: torch's copy_ took 10-30 µs of the call's host time
                        self.copy_at(address, shard.data_ptr(), nbytes, ctx.streams.main)
                    else:
                        place.copy_(shard)
            launcher.handshake(ctx, ctx.ready, world, epoch, (*self.own, value) if self.copy_engine else (0, 0, 0),
                               fused)
            # the copy engine's own flags were set with the handshake (an SM producer sets its own)
            args = (ctx, world, epoch, ctx.channel.barriers, ctx.channel.peer_table, False)
            if side is None:  # emulated: kernels are synchronous, the producer first
                launcher._producer(*args)
                run.launch(found)
            elif self.copy_engine:  # the consumer first, then the copies (launch's order)
                ctx.streams.fork()
                run.launch(found)
                launcher._producer(*args)
            else:
                ctx.streams.fork()
                with on_stream(side):
                    launcher._producer(*args)
                run.launch(found)
            launcher.finish(ctx)
        except WaitTimeout as exc:  # later calls refuse to run (OverlappedKernel's launch)
            launcher.timed_out = exc
            raise
        return True
