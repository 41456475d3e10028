"""The launch side of the reduce_scatter rule: buffers, channels and streams per shape."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from tilelink.errors import LaunchError, WaitTimeout
from tilelink.mapping import RowSharding
from tilelink.plan import ReduceScatterLaunch
from tilelink.rules.direct import DirectKernel
from tilelink.rules.launch import (
    Launcher,
    Streams,
    bound_launch,
    cdiv,
    copy_address,
    described,
    kept_form_may_run,
    metas,
    on_stream,
    rebuilt,
    vector_peer_table,
    zeros_in_layout,
)
from tilelink.runtime import (
    Channel,
    Diagnostics,
    peer_tensor,
    races,
    rank_copy_data,
    symmetric_empty,
)
from tilelink.runtime.diagnostics import wait_timeout_s
from tilelink.runtime.host import rank_wait_at

#: the kinds of step of a reduce-scatter's copy-engine half (ReduceScatterLauncher._scatter_steps)
_WAIT, _COPY, _NOTIFY = "wait", "copy", "notify"

#: programs per SM of the hybrid's reduction (it runs after the GEMM, on every SM): enough resident
#: programs that each SM keeps several blocks' loads in flight
REDUCE_PROGRAMS_PER_SM = 8


@functools.cache
def _sm_count(index: int | None) -> int:
    """The GPU's SMs, read once: the properties' query cost every call microseconds."""
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclass
class ReduceScatterContext:
    """The symmetric partial-result buffer of one shape and its channels."""

    sharding: RowSharding
    partial: torch.Tensor  # symmetric (M, row_elems) partial sums of this rank
    table: torch.Tensor
    channel: Channel
    diag: Diagnostics
    streams: Streams
    scratch: torch.Tensor
    recv: torch.Tensor | None = None  # what peers deliver: ring (world, rows_per_rank, ...); hybrid (2, ...) by call
    recv_channel: Channel | None = None
    reduced: torch.Tensor | None = None  # hybrid with top-k: (rows, ...) each token's slots summed (rs_topk_reduce)
    reduced_channel: Channel | None = None  # ... its channels, complete at epoch * rows(channel) * row_elems
    recv_table: torch.Tensor | None = None  # the ring's: every rank's copy of recv (vector stores)
    variants: set = field(default_factory=set)  # the rewritten kernel's variants loaded (warm_up)
    satisfied: torch.Tensor | None = None  # a world of one: every wait passes
    scatter_plans: dict = field(default_factory=dict)  # parity -> the hybrid copy engine's views (_scatter_plan)
    twin: ReduceScatterContext | None = None  # the context of captured calls (Launcher.make_twin)
    captured: bool = False  # a twin on which a call was captured
    fence: Channel | None = None  # a twin's barrier words (Launcher.device_barrier)
    ready: Channel | None = None  # the hybrid's: word r is the last call rank r has reached (Launcher.handshake)
    channel_elems: torch.Tensor | None = None  # a split-K write-back's: each channel's elements (start_sums)

    @property
    def row_elems(self) -> int:
        """Elements of one row of the partial sums."""
        return math.prod(self.partial.shape[1:])

    @property
    def topk(self) -> int:
        """Partial rows per output row: a token's top-k expert slots (MoE, one contiguous range), else 1."""
        return self.partial.shape[0] // self.sharding.size

    @property
    def sent(self) -> torch.Tensor:
        """The rows the hybrid's copy engine sends and its reduction reads for this rank: each token's
        slots summed with top-k, else the partial sums."""
        return self.partial if self.reduced_channel is None else self.reduced

    @property
    def sent_channel(self) -> Channel:
        """The channels that say when rows of :attr:`sent` are complete."""
        return self.channel if self.reduced_channel is None else self.reduced_channel


class ReduceScatterLauncher(Launcher):
    """``kernel[grid](..., c_shard, ...)``: run the rewritten producer into a symmetric buffer and
    reduce this rank's rows from every rank into ``c_shard``."""

    plan: ReduceScatterLaunch

    #: :func:`rs_topk_reduce` on a GPU: 4096-element blocks, 8 warps, 4 programs per SM. On an H200 (MoE-4 and
    #: MoE-6 slot rows, 8192 tokens of 4096) 3.1-3.7 TB/s, against 2.1-2.5 TB/s for 1024-element blocks of 4
    #: warps, 8 per SM
    TOPK_REDUCE_GPU = {"BLOCK": 4096, "num_warps": 8, "per_sm": 4}

    def launched_shapes(self, bound: dict, size: int) -> dict[str, tuple[int, ...]]:
        """The output: the partial sums, ``size`` rows (times the top-k slots) of the output's row shape."""
        (name,) = self.plan.tensors
        t = described(bound.get(name))
        if not isinstance(t, torch.Tensor) or t.dim() < 1:
            return {}
        try:
            topk = self.topk(bound)
        except LaunchError:
            return {}
        return {name: (size * topk, *t.shape[1:])}

    def checked_context(self, bound: dict, grid=None) -> ReduceScatterContext:
        world = self.world()
        size = self.size_of(bound, grid)
        sharding = self.sharding(world, size)
        (name,) = self.plan.tensors
        out = self.tensor_arg(bound, name, world)
        self.check_sums_type(name, out, self.as_launched(bound, grid))
        lo, hi = sharding.rank_range(world.rank)
        if out.dim() < 1 or out.shape[0] != hi - lo:
            raise LaunchError(
                f"{self.okernel.name}: rank {world.rank} must pass its output rows [{lo}, {hi}) as {name} "
                f"({hi - lo} rows, for {self.size_said(size)} over {world.world_size} ranks), "
                f"got shape {list(out.shape)}")
        topk = self.topk(bound)
        shape = (size * topk, *out.shape[1:])
        if math.prod(shape) >= 2**31:  # the partner kernels index the partial sums with 32-bit offsets
            raise LaunchError(f"{self.okernel.name}: the partial sums of one call would hold {math.prod(shape)} "
                              f"elements ({' x '.join(map(str, shape))}), past the 2**31 the reduce-scatter "
                              f"kernels address; split the call along {self.plan.size_param}")
        key = (size, shape, str(out.dtype))
        ctx = self.contexts.get(key)
        if ctx is None:
            self.refuse_capture(world, "its first call with these shapes allocates symmetric buffers and loads "
                                       "kernels, which cannot happen while a stream captures; call it once outside "
                                       "the capture with the same shapes first")
            partial = symmetric_empty(shape, out.dtype)
            ctx = ReduceScatterContext(sharding, partial, vector_peer_table(partial), Channel(sharding.num_channels),
                                       Diagnostics(), Streams.for_world(world),
                                       torch.zeros(sharding.num_channels, dtype=torch.int64, device=world.device))
            if self.plan.via == "copy_engine" or self.plan.mode == "push":
                # the receive slots hold a peer's partial rows of this rank's tokens (top-k slots summed);
                # the hybrid's in two sets, odd and even calls (_launch_hybrid: no barrier between calls)
                sets = (2,) if self.plan.via == "copy_engine" else ()
                if world.world_size > 1:  # alone, nothing is received
                    ctx.recv = symmetric_empty((*sets, world.world_size, sharding.rows_per_rank, *out.shape[1:]),
                                               out.dtype)
                    ctx.recv_table = vector_peer_table(ctx.recv)
                ctx.recv_channel = Channel(sharding.num_channels)
            if self.plan.via == "copy_engine" and world.world_size > 1:
                ctx.ready = Channel(world.world_size)  # word r: the last call rank r has reached (handshake)
            if self.plan.via == "copy_engine" and topk > 1:
                ctx.reduced_channel = Channel(sharding.num_channels)
                if world.world_size > 1:  # alone, the summed slots go straight into the output
                    ctx.reduced = torch.empty((size, *out.shape[1:]), dtype=out.dtype, device=world.device)
            self.contexts[key] = ctx
            if world.world_size > 1 or topk > 1:  # alone without top-k, a call has nothing to count

                def fresh(channel: Channel | None) -> Channel | None:
                    return None if channel is None else Channel(channel.num_channels)

                # the twin's scatter steps address its own channels' words: a cache of its own
                self.make_twin(ctx, world, channel=fresh(ctx.channel), recv_channel=fresh(ctx.recv_channel),
                               reduced_channel=fresh(ctx.reduced_channel), ready=fresh(ctx.ready), scatter_plans={})
        return ctx

    def topk_param(self) -> str | None:
        return self.plan.topk

    def topk(self, bound: dict) -> int:
        """Expert slots per output row (MoE top-k reduction), 1 without."""
        name = self.plan.topk
        if not name:
            return 1
        value = bound.get(name)
        if not isinstance(value, int) or value < 1:
            raise LaunchError(f"{self.okernel.name}: {name}={value!r} must be a positive int (the top-k)")
        return value

    def _consumer(self, ctx: ReduceScatterContext, world, out, barriers, table, epoch: int, dry: bool = False) -> None:
        sh = ctx.sharding
        row_elems = ctx.row_elems
        if self.plan.mode == "push":  # the SM ring
            recv, flags = ctx.recv, ctx.recv_channel.barriers
            recv_table, flag_table = ctx.recv_table, ctx.recv_channel.peer_table
            if dry:  # a private landing buffer and flags: the dry run must not write into a peer
                recv, flags = torch.empty_like(recv), ctx.scratch
                recv_table = torch.full((world.world_size,), recv.data_ptr(), dtype=torch.int64, device=world.device)
                flag_table = table
            self.partner("rs_ring_consumer")[(max(1, min(self.plan.comm_sms, sh.channels_per_rank)),)](
                ctx.partial, out, recv, recv_table, barriers, flags, flag_table, epoch, world.rank,
                world.world_size, sh.size, sh.rows_per_rank, sh.rows_per_channel, sh.channels_per_rank, row_elems,
                ctx.diag.buffer, ctx.diag.budget_ns, BLOCK=self.BLOCK)
            return
        meta = self.pull_meta(world, self.PULL_CONSUMER_GPU)
        grid = (max(1, min(self.plan.comm_sms, sh.channels_per_rank * cdiv(sh.rows_per_channel * row_elems,
                                                                             meta["BLOCK"]))),)
        common = (ctx.partial, ctx.table, out, barriers, table, epoch, world.rank, world.world_size, sh.size,
                  sh.rows_per_rank, sh.rows_per_channel, sh.channels_per_rank, row_elems)
        self.partner("rs_pull_consumer")[grid](*common, ctx.diag.buffer, ctx.diag.budget_ns,
                                               TOPK=ctx.topk, **meta)

    def _programs(self, world, per_sm: int = REDUCE_PROGRAMS_PER_SM) -> int:
        """Programs of the hybrid's SM kernels on a GPU (``per_sm`` per SM: they run when the GEMM is done,
        and on ``comm_sms`` programs they would be latency-bound, one block's loads in flight per SM: 1.05 ms
        for 96 MB on 2 H200s, against the GEMM's 0.48 ms); ``comm_sms`` in the emulated world."""
        if world.device.type == "cuda":
            return per_sm * _sm_count(world.device.index)
        return self.plan.comm_sms

    def _topk_reduce(self, ctx: ReduceScatterContext, world, reduced, barriers) -> None:
        """Sum each token's top-k slots into ``reduced`` (:func:`rs_topk_reduce`), flagging ``barriers``."""
        sh = ctx.sharding
        meta = self.pull_meta(world, self.TOPK_REDUCE_GPU)
        per_sm = meta.pop("per_sm", REDUCE_PROGRAMS_PER_SM)
        blocks = sh.size * cdiv(ctx.row_elems, meta["BLOCK"])
        self.partner("rs_topk_reduce")[(max(1, min(self._programs(world, per_sm), blocks)),)](
            ctx.partial, reduced, barriers, world.rank, world.world_size, sh.size, sh.rows_per_rank,
            sh.rows_per_channel, sh.channels_per_rank, ctx.row_elems, TOPK=ctx.topk, **meta)

    def _reduce(self, ctx: ReduceScatterContext, world, out, recv_barriers, barriers, epoch: int) -> None:
        # launched behind the side stream's wait for this rank's own rows: every SM is free by then
        kernel, grid, call = self._reduce_call(ctx, world, out, recv_barriers, barriers, epoch)
        kernel[grid](**call)

    def _reduce_call(self, ctx: ReduceScatterContext, world, out, recv_barriers, barriers, epoch: int) -> tuple:
        """The hybrid's reduction (:func:`rs_reduce_received`) of call ``epoch`` into ``out``: its kernel, grid and
        arguments."""
        sh = ctx.sharding
        blocks = sh.channels_per_rank * cdiv(sh.rows_per_channel * ctx.row_elems, self.BLOCK)
        call = dict(recv_ptr=ctx.recv[epoch % 2], partial_ptr=ctx.sent, out_ptr=out, recv_barriers=recv_barriers,
                    tlk_barriers=barriers, tlk_epoch=epoch, tlk_rank=world.rank, tlk_world=world.world_size,
                    tlk_rows=sh.size, tlk_rows_per_rank=sh.rows_per_rank, tlk_rows_per_channel=sh.rows_per_channel,
                    tlk_channels_per_rank=sh.channels_per_rank, row_elems=ctx.row_elems, tlk_diag=ctx.diag.buffer,
                    tlk_budget=ctx.diag.budget_ns, BLOCK=self.BLOCK)
        return self.partner("rs_reduce_received"), (max(1, min(self._programs(world), blocks)),), call

    def _scatter_plan(self, ctx: ReduceScatterContext, world, parity: int) -> list:
        """The hybrid copy engine's work for the receive slots of ``parity``, made once per context: for each
        destination rank (ring order: the next rank first, this rank last), for each of its channels, the
        channel, its rows and the (own rows, peer's receive slot) views to copy (``None`` for this rank's
        own rows, which stay where they are). Views made per call cost the host microseconds each."""
        plan = ctx.scatter_plans.get(parity)
        if plan is not None:
            return plan
        sh, sent = ctx.sharding, ctx.sent
        plan = []
        for step in range(1, world.world_size + 1):
            dst = (world.rank + step) % world.world_size
            dst_lo = sh.rank_range(dst)[0]
            peer_recv = peer_tensor(ctx.recv, dst) if dst != world.rank else None
            channels = []
            for j in range(sh.channels_per_rank):
                ch = dst * sh.channels_per_rank + j
                lo, hi = sh.channel_range(ch)
                views = None
                if peer_recv is not None and hi > lo:
                    views = (sent[lo:hi], peer_recv[parity, world.rank, lo - dst_lo:hi - dst_lo])
                channels.append((j, ch, hi - lo, views))
            plan.append((dst, peer_recv is not None, channels))
        ctx.scatter_plans[parity] = plan
        return plan

    def _scatter_steps(self, ctx: ReduceScatterContext, world, parity: int) -> tuple:
        """:meth:`_scatter_plan` as an uncaptured call's driver calls take it, made once per context: each step
        ``(WAIT, address, channel, elements)`` (the side stream waits until this rank's word ``channel`` of the
        sent channel, at ``address``, reaches the call's number times ``elements``), ``(COPY, destination, source,
        bytes)`` or ``(NOTIFY, address, index, 0)`` (a peer's word ``index`` of its receive channel set to the call's
        number). Read per call, the words' addresses and the copies' views cost the host microseconds each. This rank's
        own channels have no step: the stream waits for the GEMM as a whole before the reduction (``_scatter``)."""
        key = ("steps", parity)
        steps = ctx.scatter_plans.get(key)
        if steps is not None:
            return steps
        sh, row_elems, steps = ctx.sharding, ctx.row_elems, []
        for dst, remote, channels in self._scatter_plan(ctx, world, parity):
            for j, ch, rows, views in channels:
                if rows > 0 and remote:
                    steps.append((_WAIT, ctx.sent_channel.word_address(ch, world.rank, "reduce-scatter"), ch,
                                  rows * row_elems))
                    if views is not None:
                        steps.append((_COPY, *copy_address(*views, f"{self.okernel.name}, channel {ch}")))
                if remote:
                    index = world.rank * sh.channels_per_rank + j
                    steps.append((_NOTIFY, ctx.recv_channel.word_address(index, dst, "reduce-scatter"), index, 0))
        steps = ctx.scatter_plans[key] = tuple(steps)
        return steps

    def _scatter(self, ctx: ReduceScatterContext, world, epoch: int) -> None:
        """Hybrid, copy-engine half: as each channel's rows are complete here, copy them into the
        receive slot of the rank that owns them and tell it (ring order: the next rank first). This
        rank's own rows stay where they were written (the reduction reads them there, behind its own waits for
        their channels); the stream only waits for them, so that the reduction, launched next, starts after the
        GEMM's last tile. Uncaptured, that is a wait for the main stream's work so far, the GEMM's (one event, where a
        watched wait on each own channel was a stream wait, two events and the watcher's bookkeeping; the GEMM
        computes this rank's own rows last)."""
        stream = ctx.streams.side
        chained = False  # the first wait's budget starts when the stream reaches it; the next ones', as the last passed
        if not ctx.captured:  # the host goes on enqueueing; a stuck wait is released and raised by finish()
            ctx.sent_channel.word_address(0, world.rank, "reduce-scatter")  # raises for a channel freed since
            impl, budget = world.impl, wait_timeout_s(world.backend == "emulated")
            for kind, address, other, n in self._scatter_steps(ctx, world, epoch % 2):
                if kind is _WAIT:  # other: the channel
                    rank_wait_at(world, address, other, epoch * n, stream, budget, block=False, chained=chained)
                    chained = True
                elif kind is _COPY:  # other: the source
                    impl.copy_at(address, other, n, stream)
                else:
                    impl.write_value_at(address, epoch, stream)
            if stream is not None:  # emulated kernels are done when they return
                ctx.streams.fork()
            return
        sh, row_elems = ctx.sharding, ctx.row_elems
        for dst, remote, channels in self._scatter_plan(ctx, world, epoch % 2):
            for j, ch, rows, views in channels:
                if rows > 0:
                    # the host goes on enqueueing; a stuck wait is released and raised by finish()
                    self.wait(ctx, ctx.sent_channel, ch, epoch * rows * row_elems, stream, chained)
                    chained = True
                    if views is not None:
                        rank_copy_data(*views, stream)
                if remote:
                    self.notify(ctx, ctx.recv_channel, world.rank * sh.channels_per_rank + j, epoch, dst, stream)

    def _launch_hybrid(self, grid, call: dict, ctx: ReduceScatterContext, world, out) -> None:
        alone = world.world_size == 1
        reduced = out if alone else ctx.reduced  # with top-k, where the summed slots go: alone, the result

        def partners() -> None:
            if ctx.reduced_channel is not None:
                self._topk_reduce(ctx, world, reduced, ctx.scratch)
            if not alone:
                self._reduce(ctx, world, out, ctx.scratch, ctx.scratch, 0)

        self.warm_up(ctx, world, grid, call, partners=partners)
        epoch = ctx.channel.advance()
        ctx.recv_channel.advance()
        if ctx.reduced_channel is not None:
            ctx.reduced_channel.advance()
        side = ctx.streams.side
        # No barrier between calls: a peer writes this rank's receive slots only, in the set of its call's
        # parity. Its copy for call n + 2 comes after its reduction of call n + 1, which waited for this rank's
        # copy of n + 1, which this rank's stream runs after its own reduction of call n: the set a peer
        # overwrites has been read. (A barrier here would cost the ranks' skew on every call: 0.1-0.5 ms on 2 H200s.)
        # The copies and the reduction start once every peer has reached this call (Launcher.handshake): the
        # reduction's waits then cover the peers' GPU work, not their hosts' time between calls. The GEMM waits
        # for nobody.
        # The handshake goes on the side stream, behind the main stream's work before the call (the caller's, this
        # context's last join): its word is set at the point of the main stream where the call starts, and the
        # GEMM, launched next on the main stream, waits for nobody.
        args = self.channel_args(ctx.channel.barriers, epoch, world, ctx.sharding, ctx.diag)
        if not alone:
            if side is not None:
                ctx.streams.fork()
            with on_stream(side):
                self.handshake(ctx, ctx.ready, world, epoch)
        self.start_sums(ctx, grid, call)
        self._produce(grid, call, args, ctx, epoch)  # the GEMM keeps every SM
        if ctx.reduced_channel is not None:  # behind the GEMM on its stream: no channel is complete before its end
            self._topk_reduce(ctx, world, reduced, ctx.reduced_channel.barriers)
        if not alone:
            with on_stream(side):
                self._scatter(ctx, world, epoch)
                self._reduce(ctx, world, out, ctx.recv_channel.barriers, ctx.sent_channel.barriers, epoch)
        self.finish(ctx)

    def _launch_captured(self, grid, call: dict, ctx: ReduceScatterContext, world, out) -> None:
        """A captured call (:mod:`tilelink.runtime.graphs`) on the twin's channels. The hybrid uses the receive
        slots of one parity: its handshake already orders a peer's copies into them after this rank's reduction of
        the call before (the handshake's word is set on the main stream, which joined that reduction); its copies
        start when the GEMM is done. The SM reduce-scatters meet at a device-side barrier in place of the stream
        barrier; so does the all-reduce (``AllReduceLauncher``), whose ``_consumer`` this calls."""
        from tilelink.runtime import graphs

        if self.adds(call):
            raise LaunchError(f"{self.okernel.name}: a split-K write-back (tl.atomic_add into the reduced tensor) "
                              f"cannot be captured in a CUDA graph: its per-call start (start_sums: the zeroed sums "
                              f"and the channels lowered by the split count) is host work of each call; call it "
                              f"outside the capture, or store each tile once")
        twin = self.begin_captured(ctx, world, grid, call)
        main, side = twin.streams.main, twin.streams.side
        # the per-call multiple only: the count is on the device (tilelink.language.call_target)
        args = self.channel_args(twin.channel.barriers, 1, world, twin.sharding, twin.diag)

        def produce() -> None:
            self.kernel[grid](**call, **args)

        if self.plan.via == "copy_engine":
            alone = world.world_size == 1
            reduced = out if alone else twin.reduced
            graphs.enqueue(produce)
            if twin.reduced_channel is not None:
                graphs.enqueue(lambda: self._topk_reduce(twin, world, reduced, twin.reduced_channel.barriers))
            if not alone:
                # the copies start once the GEMM is done: a captured flag wait is a kernel, and one spinning on a
                # channel beside a GEMM that keeps every SM could take the SM a GEMM program needs
                if side is not None:
                    side.wait_stream(main)
                self.device_handshake(twin, twin.ready, world, main, side)

                def send_and_reduce() -> None:
                    with self.on(side):
                        self._scatter(twin, world, 1)
                        self._reduce(twin, world, out, twin.recv_channel.barriers, twin.sent_channel.barriers, 1)

                graphs.enqueue(send_and_reduce)
                self.finish_captured(twin)
            return
        if world.world_size > 1:  # every rank is done reading the previous call's partial sums (a top-k world of one
            self.device_barrier(twin, world, main)  # comes here too, with no peer and no fence words)

        def consume() -> None:
            self._consumer(twin, world, out, twin.channel.barriers, twin.channel.peer_table, 1)

        if side is not None:
            side.wait_stream(main)
            with on_stream(side):
                consume()
            produce()
        else:
            graphs.enqueue(produce)
            graphs.enqueue(consume)
        self.finish_captured(twin)

    def refuse_epilogue(self, bound: dict) -> None:
        """Raise the message of a compile-time side the call takes whose epilogue is not linear
        (``ReduceScatterLaunch.refused``), before anything of the call: the interpreter would meet its static assert
        in the middle of the call, after the channels moved on to it, and leave the next call waiting. Once per form
        of the call's constexpr arguments."""
        if not self.plan.refused:
            return
        tests = self.__dict__.get("_refused_tests")
        if tests is None:  # the tests compiled once, with the parameters they read
            tests = self.__dict__["_refused_tests"] = [(compile(t, "<test>", "eval"), m) for t, m in self.plan.refused]
            self._refused_names = sorted({n for c, _ in tests for n in c.co_names})
        args = {**self.okernel.defaults, **bound}
        env = {n: getattr(args[n], "value", args[n]) for n in self._refused_names if n in args}  # tl.constexpr(x): x
        key = tuple((n, type(v), repr(v)) for n, v in env.items())
        cache = self.__dict__.setdefault("_refused_forms", {})
        if key not in cache:
            cache[key] = None
            for test, message in tests:
                try:
                    taken = bool(eval(test, {"__builtins__": {}}, dict(env)))  # noqa: S307 - the kernel's own test
                except Exception:  # noqa: BLE001 - a test the host cannot evaluate: the kernel's static assert refuses
                    continue
                if taken:
                    cache[key] = message
                    break
        if cache[key] is not None:
            raise LaunchError(f"{self.okernel.name}: {cache[key]}")

    def alone_call(self, bound: dict, world) -> bool:
        return world.world_size == 1 and not self.plan.topk  # the output shard is the whole result

    def kernel_call(self, bound: dict, ctx: ReduceScatterContext) -> dict:
        """The partial sums into the symmetric buffer (a host descriptor: the same one over it), and, on every rank
        but the first, zeros in place of what the kernel adds to them once (``first_rank_only``)."""
        (name,) = self.plan.tensors
        return self.first_rank_zeros({**bound, name: rebuilt(bound[name], ctx.partial)})

    def first_rank_zeros(self, call: dict) -> dict:
        """``call`` with zeros of the same layout in place of each ``first_rank_only`` argument, on every rank but the
        first: each rank adds what the kernel loads from them to its partial sums, and the sum over the ranks must
        add it once (a bias, as a row-parallel linear adds it on rank 0 only)."""
        if not self.plan.first_rank_only or self.world().rank == 0:
            return call
        # `None` (an optional bias a launch does not load, `HAS_BIAS=False`) stays as it is
        return {**call, **{name: zeros_in_layout(call[name], self.okernel.name, name)
                           for name in self.plan.first_rank_only if call.get(name) is not None}}

    def prepared_with_peers(self, world, grid, bound: dict, names: tuple[str, ...]) -> ScatterLaunch | None:
        """A hybrid call with peers made ready to launch again (:class:`ScatterLaunch`), where the output is a plain
        tensor among ``names`` and, on a GPU, the rewritten kernel is launched directly (``prepared`` has left out a
        top-k and a split-K write-back)."""
        (name,) = self.plan.tensors
        if self.plan.via != "copy_engine" or (type(self.kernel) is not DirectKernel and world.backend != "emulated") \
                or name not in names or type(bound.get(name)) is not torch.Tensor:
            return None
        ctx = self.context(bound, grid)
        if not ctx.variants and world.backend != "emulated":  # no call of these shapes has run: its first call
            return None  # warms every kernel up (the interpreter has nothing to load)
        return ScatterLaunch(self, world, ctx, grid, bound, names)

    def launch(self, grid, bound: dict) -> None:
        self.refuse_epilogue(bound)
        world = self.world()
        if world.world_size > 1:
            self.check_split_steps(grid, bound)
        ctx = self.context(bound, grid)
        ctx.streams.follow_caller(world.device)
        if self.alone_call(bound, world):  # the output shard is the whole result
            self.start_output(bound)
            self.alone(grid, dict(bound), ctx, world)
            return
        out = described(bound[self.plan.tensors[0]])
        call = self.kernel_call(bound, ctx)  # the kernel writes its partial sums to the symmetric buffer
        from tilelink.runtime import graphs

        if graphs.capturing(world.device):
            self._launch_captured(grid, call, ctx, world, out)
            return
        if self.plan.via == "copy_engine":
            self._launch_hybrid(grid, call, ctx, world, out)
            return
        self.warm_up(ctx, world, grid, call, partners=lambda: self._consumer(
            ctx, world, out, ctx.scratch, self.scratch_table(ctx, world), 0, dry=True))
        epoch = ctx.channel.advance()
        if ctx.recv_channel is not None:
            ctx.recv_channel.advance()
        world.stream_barrier(ctx.streams.main)  # every rank is done reading the previous call's partial sums
        self.start_sums(ctx, grid, call)  # the kernel's arguments: its heuristics and grid see the partial sums
        self.produce_and_pull(grid, call, ctx, world, out, epoch)

    def produce_and_pull(self, grid, call: dict, ctx: ReduceScatterContext, world, out, epoch: int) -> None:
        """The rewritten producer and the SM consumer that pulls its partial sums (``_consumer``), then the end of
        the call: on a GPU the consumer takes its few SMs first, on the side stream, and the producer never waits
        for it; in the emulated world the producer runs first."""
        args = self.channel_args(ctx.channel.barriers, epoch, world, ctx.sharding, ctx.diag)
        main, side = ctx.streams.main, ctx.streams.side
        if side is not None:
            side.wait_stream(main)
            with on_stream(side):
                self._consumer(ctx, world, out, ctx.channel.barriers, ctx.channel.peer_table, epoch)
            self.kernel[grid](**call, **args)
        else:
            self._produce(grid, call, args, ctx, epoch)
            self._consumer(ctx, world, out, ctx.channel.barriers, ctx.channel.peer_table, epoch)
        self.finish(ctx)

    def check_sums_type(self, name: str, out: torch.Tensor, bound: dict) -> None:
        """Into an integer tensor, only integer sums (``ReduceScatterLaunch.sums_dtypes``, an int8 GEMM summing in
        int32): a rank's float partial sums stored there are truncated before the ranks add them, and the sum of the
        truncated parts is not the truncated full sum."""
        if out.dtype.is_floating_point or out.dtype.is_complex:
            return
        import triton.language as tl

        found = []
        try:
            configs = metas(self.kernel, bound)
        except LaunchError as exc:
            raise LaunchError(f"{self.okernel.name}: {exc}") from None
        for meta, _ in configs:
            env = {n: getattr(v, "value", v) for n, v in {**self.okernel.defaults, **meta}.items()}
            for source in self.plan.sums_dtypes:
                try:
                    found.append(eval(source, {"__builtins__": {}, "tl": tl}, env))  # noqa: S307 - the kernel's own
                except Exception:  # noqa: BLE001 - a type the arguments do not give: not known to be an integer
                    found.append(None)
        if self.plan.sums_dtypes and all(
                (isinstance(d, tl.dtype) and d.is_int()) or (isinstance(d, torch.dtype) and not d.is_floating_point
                                                             and not d.is_complex) for d in found):
            return
        started = (f"the partial sums stored into it are started as "
                   f"{', '.join(f'`{s}`' for s in self.plan.sums_dtypes)}" if self.plan.sums_dtypes else
                   "TileLink cannot tell the type of the partial sums stored into it (it reads it only from an "
                   "accumulator started with `tl.zeros(..., dtype=...)` and stored with no float literal, `/`, "
                   "float conversion, loaded factor or argument on the way)")
        raise LaunchError(f"{self.okernel.name}: {name} is {out.dtype}, an integer type, and {started}: if they are "
                          f"float, each rank's sums would be truncated where it stores "
                          f"them, before {self.plan.rule} adds them over the ranks, and the sum of truncated parts "
                          f"is not the full problem's value; reduce into a float tensor, or sum in an integer type "
                          f"(`tl.zeros(..., dtype=tl.int32)` for an int8 GEMM)")

    def adds(self, bound: dict) -> bool:
        """Whether this call takes the kernel's split-K write-back (``ReduceScatterLaunch.atomic_when``): with each
        autotuning configuration's and the heuristics' values, which must agree (the configuration is chosen at the
        launch, after the partial sums are started for one way of writing them)."""
        if self.plan.atomic_axes is None or not self.plan.atomic_when:
            return self.plan.atomic_axes is not None
        found: dict[bool, list[str]] = {}
        for meta, config in metas(self.kernel, bound):
            try:
                taken = self.plan.adds({**self.okernel.defaults, **meta})
            except Exception as exc:  # noqa: BLE001 - reported with the test
                raise LaunchError(f"{self.okernel.name}: cannot tell from the arguments whether this call adds its "
                                  f"tiles with tl.atomic_add or stores them (`{self.plan.atomic_when}`: {exc}); pass "
                                  f"the parameters the test reads to the call") from None
            found.setdefault(taken, []).append(config)
        if len(found) > 1:
            raise LaunchError(f"{self.okernel.name}: the autotuning configurations {'; '.join(found[True])} add their "
                              f"tiles with tl.atomic_add and {'; '.join(found[False])} store them "
                              f"(`{self.plan.atomic_when}`): TileLink starts the partial sums for one of the two "
                              f"before the launch, and the autotuner chooses at the launch; give every configuration "
                              f"the same split count, or pass it as an argument of the call")
        return next(iter(found))

    def splits(self, grid, bound: dict) -> int:
        """The adds each element of a split-K write-back gets per call: the programs along the grid axes its
        address does not tell apart (the K splits), counted from the launch's grid. A grid function is evaluated as
        Triton evaluates it: on the arguments with each autotuning configuration's meta-parameters and the heuristics'
        values (``META.get("SPLIT_K", 1)`` on the arguments alone would count one split where a configuration runs
        four). The configuration is chosen at the launch, after the channels are set for a count: configurations
        that split differently are refused."""
        if not callable(grid):
            return self._split_count(grid)
        counts: dict[int, list[str]] = {}
        for sizes, _, config in self._grid_sizes(grid, bound, "count the K splits of the tl.atomic_add write-back"):
            counts.setdefault(self._split_count(sizes), []).append(config)
        if len(counts) > 1:
            found = ", ".join(f"{n} ({'; '.join(configs)})" for n, configs in sorted(counts.items()))
            raise LaunchError(f"{self.okernel.name}: K splits {found} of the tl.atomic_add write-back by autotuning "
                              f"configuration: TileLink counts the adds of each element before the launch, and the "
                              f"autotuner chooses a configuration at the launch; give every configuration the same "
                              f"split count, or pass it as an argument of the call (SPLIT_K=...) rather than a "
                              f"configuration's")
        return next(iter(counts))

    def check_split_steps(self, grid, bound: dict) -> None:
        """Refuse a call whose grid does not have along a split axis the number of programs the kernel's split-K
        loop steps over (``ReduceScatterLaunch.split_steps``: `pid_k * BLOCK_K + ...` moved by `BLOCK_K * SPLIT_K` a
        step tiles K only with SPLIT_K programs along `pid_k`'s axis). The kernel alone would lose or repeat columns
        of K the same way on the full problem; on each rank's slice it loses or repeats other columns, and the sum
        over the ranks would be neither. With each autotuning configuration's and the heuristics' values, as the
        grid sees them."""
        if not self.plan.split_steps:
            return
        for sizes, meta, config in self._grid_sizes(grid, bound, "check the K splits of its loop"):
            env = {n: getattr(v, "value", v) for n, v in meta.items()}  # tl.constexpr(x): x
            for programs, axis, line, step in self.plan.split_steps:
                try:
                    want = eval(programs, {"__builtins__": {}}, env)  # noqa: S307 - a product of the parameters
                except Exception as exc:  # noqa: BLE001 - reported with the step
                    raise LaunchError(f"{self.okernel.name}: cannot evaluate `{programs}`, the number of K splits "
                                      f"the loop at line {line} steps over, from the arguments ({exc}); pass the "
                                      f"parameters it reads to the call") from None
                if int(sizes[axis]) != want:
                    where = "" if config == "the call's arguments" else f" (configuration {config})"
                    raise LaunchError(
                        f"{self.okernel.name}: the grid has {int(sizes[axis])} programs along axis {axis}, the K "
                        f"splits, while the loop at line {line} steps over {want} of them (it moves each split's "
                        f"columns by `{step}` a step, with `{programs}` = {want}{where}): its splits would leave out "
                        f"or read twice other columns of each rank's slice of K than of the full K, and the sum over "
                        f"the ranks would not be the kernel's value; launch as many programs along axis {axis} as the "
                        f"loop steps over ({want}), or pass the count the grid has")

    def _grid_sizes(self, grid, bound: dict, why: str) -> list[tuple[tuple[int, ...], dict, str]]:
        """The grid's three sizes as Triton evaluates a grid function: on the arguments with each autotuning
        configuration's meta-parameters and the heuristics' values, each with those meta-parameters and the
        configuration's description; ``why``: what they are wanted for, said where the grid cannot be evaluated."""
        found = []
        for meta, config in metas(self.kernel, bound):
            # Triton's grid reads the parameters the call leaves out at their defaults (the autotuner's and the
            # heuristics' values come first): `META.get("SPLIT_K", 1)` under `SPLIT_K: tl.constexpr = 2` is two
            meta = {**self.okernel.defaults, **meta}
            try:
                sizes = (tuple(grid(meta) if callable(grid) else grid) + (1, 1, 1))[:3]
            except Exception as exc:  # noqa: BLE001 - reported with the grid
                raise LaunchError(f"{self.okernel.name}: cannot evaluate the grid from the arguments to {why} ({exc}); "
                                  f"pass the grid as a tuple") from None
            found.append((sizes, meta, config))
        return found

    def _split_count(self, grid) -> int:
        sizes = (tuple(grid) + (1, 1, 1))[:3]
        count = 1
        for axis, n in enumerate(sizes):
            if axis not in self.plan.atomic_axes:
                count *= int(n)
        return count

    def start_output(self, bound: dict) -> None:
        """Alone (the kernel writes the output itself): a split-K write-back adds into it, so it starts at zero."""
        if self.adds(bound):
            described(bound[self.plan.tensors[0]]).zero_()

    def start_sums(self, ctx: ReduceScatterContext, grid, bound: dict) -> None:
        """Before the producer of a split-K write-back (``tl.atomic_add``), on its stream: the partial sums start at
        zero (a memset, a fraction of the GEMM's time), and each channel's word is lowered by ``splits - 1`` times its
        elements, so that the call's adds (each element once per split) raise it by its elements once, as a store's
        would: the consumers' targets (``epoch * rows * row_elems``) stay as they are, for any split count. Nothing
        else writes these words meanwhile: the previous call's adds are behind on the same stream, and its consumers
        are done (the barrier before the pull's producer; the hybrid reads its own channels on a stream joined into
        this one)."""
        if not self.adds(bound):
            return
        splits = self.splits(grid, bound)
        ctx.partial.zero_()
        if ctx.channel_elems is None:
            sh = ctx.sharding
            rows = [hi - lo for lo, hi in map(sh.channel_range, range(sh.num_channels))]
            ctx.channel_elems = torch.tensor(rows, dtype=torch.int64, device=ctx.partial.device) * ctx.row_elems
        if splits > 1:
            ctx.channel.barriers.sub_(ctx.channel_elems * (splits - 1))

    def _produce(self, grid, call: dict, args: dict, ctx: ReduceScatterContext, epoch: int) -> None:
        """Run the rewritten producer. On the race-exposing schedule (emulated, :mod:`tilelink.runtime.races`)
        the partial sums start as poison and each channel's rows are taken at the moment the producer's notifies
        complete it, as a consumer polling that channel would read them; the consumer then reads those: a store
        after the notify that publishes it, or a notify that counts more than was stored, changes the result."""
        if not races.enabled() or ctx.partial.device.type != "cpu":
            self.kernel[grid](**call, **args)
            return
        sh, topk, row_elems, partial = ctx.sharding, ctx.topk, ctx.row_elems, ctx.partial
        barriers = args["tlk_barriers"]
        if not self.adds(call):  # a split-K write-back adds into zeroed sums (start_sums)
            races.poison_(partial)
        taken: dict[int, torch.Tensor] = {}

        def take(ch: int) -> None:
            lo, hi = sh.channel_range(ch)
            if ch not in taken and int(barriers[ch]) >= epoch * (hi - lo) * row_elems * topk:
                taken[ch] = partial[lo * topk:hi * topk].clone()

        with races.watch(barriers, on_release=take):
            self.kernel[grid](**call, **args)
        for ch, rows in taken.items():
            lo, hi = sh.channel_range(ch)
            partial[lo * topk:hi * topk].copy_(rows)


class ScatterLaunch:
    """One form of a hybrid reduce-scatter call with peers, ready to launch (``ReduceScatterLauncher.
    prepared_with_peers``): ``launch(*tensors)`` is ``launcher.launch(grid, bound)`` with the tensors ``names`` given
    ``tensors``, in the steps of ``_launch_hybrid`` (the channels advanced, the side stream forked and the handshake
    on it, the GEMM into the partial sums, the scatter and the reduction into the output on the side stream,
    ``finish``) without what the caller's key and the ints already fixed: the binding and the row-fact checks, the
    context's key, the epilogue's refusals, the channel arguments but the count, the variant's terms of the ints and
    constexprs. The GEMM is a bound launch (:class:`tilelink.rules.direct.Bound` on a GPU: the call's other tensors
    and ``tlk_epoch``). It returns ``False``, launching nothing, where the call must take ``launch``: a new world,
    an earlier wait that timed out, a capture, a variant of the GEMM not compiled yet, or, emulated, the
    race-exposing schedule (``launch`` runs it). The caller keeps what else decides the call (its tensors' shapes,
    strides, dtypes and devices) in its own key."""

    __slots__ = ("capturing", "ctx", "device", "launcher", "others", "out", "reduces", "run", "world", "zeroed")

    def __init__(self, launcher: ReduceScatterLauncher, world, ctx: ReduceScatterContext, grid, bound: dict,
                 names: tuple[str, ...]) -> None:
        from tilelink.runtime import graphs

        (name,) = launcher.plan.tensors
        self.launcher, self.world, self.ctx, self.device = launcher, world, ctx, world.device
        self.capturing = graphs.capturing
        self.out = names.index(name)
        self.others = tuple(i for i, n in enumerate(names) if n != name)
        channels = launcher.channel_args(ctx.channel.barriers, 1, world, ctx.sharding, ctx.diag)
        self.run = bound_launch(launcher.kernel, grid, {**launcher.kernel_call(bound, ctx), **channels},
                                (*(names[i] for i in self.others), "tlk_epoch"))
        # the arguments read by the first rank only (``first_rank_only``), passed as zeros on the others
        self.zeroed = frozenset(i for i, n in enumerate(names) if n in launcher.plan.first_rank_only
                                and world.rank != 0)
        # the reduction of each parity's receive slots: only the output and the call's number change
        # (the context's partial sums stand in for the output: a call's own is read at each find)
        self.reduces = tuple(bound_launch(*launcher._reduce_call(ctx, world, ctx.partial, ctx.recv_channel.barriers,
                                                                 ctx.sent_channel.barriers, parity),
                                          ("out_ptr", "tlk_epoch"))
                             for parity in (2, 1))  # a call number of each parity (0 is the dry run's)

    def __call__(self, *tensors) -> bool:
        launcher, ctx, world = self.launcher, self.ctx, self.world
        side = ctx.streams.side
        if not kept_form_may_run(self) or side is None and races.enabled():
            return False
        ctx.streams.follow_caller(self.device)
        epoch = ctx.channel.epoch + 1
        out = tensors[self.out]
        reduce = self.reduces[epoch % 2]
        name = launcher.okernel.name
        found = self.run.find(*(zeros_in_layout(tensors[i], name, "") if i in self.zeroed and tensors[i] is not None
                                else tensors[i] for i in self.others), epoch)
        reduction = reduce.find(out, epoch) if found is not None else None
        if reduction is None:  # a kernel to compile or load first: the launch path does it before enqueueing
            return False
        ctx.channel.advance()
        ctx.recv_channel.advance()
        try:
            if side is not None:
                ctx.streams.fork()  # the handshake on the side stream, behind the call's start (_launch_hybrid)
            with on_stream(side):
                launcher.handshake(ctx, ctx.ready, world, epoch)
            self.run.launch(found)  # the GEMM keeps every SM
            launcher._scatter(ctx, world, epoch)  # names the side stream to each copy, flag and wait
            with on_stream(side):
                reduce.launch(reduction)
            launcher.finish(ctx)
        except WaitTimeout as exc:  # later calls refuse to run (OverlappedKernel's launch)
            launcher.timed_out = exc
            raise
        return True
