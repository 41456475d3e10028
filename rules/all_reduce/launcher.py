"""The launch side of the all_reduce rule: buffers, channels and streams per shape."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from tilelink.errors import LaunchError
from tilelink.plan import AllReduceLaunch
from tilelink.rules.launch import Streams, cdiv, described, vector_peer_table
from tilelink.rules.reduce_scatter.launcher import ReduceScatterContext, ReduceScatterLauncher
from tilelink.runtime import Channel, Diagnostics, symmetric_empty

#: bytes a rank may pull from its peers for the one-shot all-reduce, ``(world - 1)`` times the message: larger
#: messages go two-shot, whose ranks each pull ``2 (world - 1) / world`` of it in two steps with a flag between.
#: 1.5 MiB: the one-shot takes messages up to 1.5 MiB on 2 ranks, 512 KiB on 4, 219 KiB on 8
#: (``tlxform bench decode`` times both on the decode shapes)
ONE_SHOT_PULL_BYTES = 3 << 19


def choose_mode(nbytes: int, world_size: int) -> str:
    """The all-reduce algorithm for a message of ``nbytes`` over ``world_size`` ranks, when the annotation leaves
    it open: ``"one_shot"`` while a rank pulls at most :data:`ONE_SHOT_PULL_BYTES`, else ``"two_shot"``."""
    return "one_shot" if nbytes * max(world_size - 1, 1) <= ONE_SHOT_PULL_BYTES else "two_shot"


@dataclass
class AllReduceContext(ReduceScatterContext):
    """The symmetric partial sums of one shape, their channels, and the two-shot's shared rows."""

    mode: str = "one_shot"
    share: torch.Tensor | None = None  # two-shot: symmetric (rows, ...), this rank's reduced rows for its peers
    share_table: torch.Tensor | None = None
    share_channel: Channel | None = None  # ... word ch reaches epoch * elements(ch) when they are all written


class AllReduceLauncher(ReduceScatterLauncher):
    """``kernel[grid](..., c, ...)``: run the rewritten producer into a symmetric buffer of partial sums and sum
    every rank's into ``c``, the whole output, on every rank."""

    plan: AllReduceLaunch

    def _steps(self, world, elements: int) -> dict:
        """The partners' launch options for ``elements`` to move on this rank. On a GPU the pull's large steps
        (``PULL_CONSUMER_GPU``) while there are enough to give each of the ``comm_sms`` programs one, else
        smaller ones (down to 1024 elements, fewer warps) so that a decode message (one token: 8192 elements) is
        pulled by several SMs at once, not one."""
        meta = self.pull_meta(world, self.PULL_CONSUMER_GPU)
        if world.device.type != "cuda":
            return meta
        block = max(1024, min(meta["BLOCK"], triton.next_power_of_2(cdiv(elements, self.plan.comm_sms))))
        if block < meta["BLOCK"]:
            meta = {"BLOCK": block, "num_warps": 4 if block <= 2048 else 8}
        return meta

    def checked_context(self, bound: dict, grid=None) -> AllReduceContext:
        world = self.world()
        size = self.size_of(bound, grid)
        sharding = self.sharding(world, size)
        (name,) = self.plan.tensors
        out = self.tensor_arg(bound, name, world)
        self.check_sums_type(name, out, bound)
        if out.dim() < 1 or out.shape[0] != size:
            raise LaunchError(
                f"{self.okernel.name}: every rank passes the whole output as {name} ({size} rows, for "
                f"{self.size_said(size)}): all_reduce writes the sum over the ranks on every rank; got shape "
                f"{list(out.shape)}")
        shape = tuple(out.shape)
        if math.prod(shape) >= 2**31:  # the partner kernels index the partial sums with 32-bit offsets
            raise LaunchError(f"{self.okernel.name}: the partial sums of one call would hold {math.prod(shape)} "
                              f"elements ({' x '.join(map(str, shape))}), past the 2**31 the all-reduce kernels "
                              f"address; split the call along {self.plan.size_param}")
        key = (size, shape, str(out.dtype))
        ctx = self.contexts.get(key)
        if ctx is None:
            self.refuse_capture(world, "its first call with these shapes allocates symmetric buffers and loads "
                                       "kernels, which cannot happen while a stream captures; call it once outside "
                                       "the capture with the same shapes first")
            partial = symmetric_empty(shape, out.dtype)
            mode = self.plan.algorithm or choose_mode(partial.numel() * partial.element_size(),
                                                             world.world_size)
            ctx = AllReduceContext(sharding, partial, vector_peer_table(partial), Channel(sharding.num_channels),
                                   Diagnostics(), Streams.for_world(world),
                                   torch.zeros(sharding.num_channels, dtype=torch.int64, device=world.device),
                                   mode=mode)
            if mode == "two_shot" and world.world_size > 1:  # every rank decides the same: from the shape alone
                ctx.share = symmetric_empty(shape, out.dtype)
                ctx.share_table = vector_peer_table(ctx.share)
                ctx.share_channel = Channel(sharding.num_channels)
            self.contexts[key] = ctx
            if world.world_size > 1:  # alone, a captured call counts nothing (every wait passes)
                # the twin's own partial-sum channels and two-shot share flags: both are waited for at the call's
                # multiple times the twin's count on the device, which its captured calls advance
                self.make_twin(ctx, world, channel=Channel(sharding.num_channels),
                               share_channel=None if ctx.share_channel is None else Channel(sharding.num_channels))
        return ctx

    def _consumer(self, ctx: AllReduceContext, world, out, barriers, table, epoch: int, dry: bool = False) -> None:
        """The reduction: one-shot, every channel pulled from every rank; two-shot, this rank's channels, then the
        other ranks' reduced channels. ``dry`` (the warm-up): no write into a buffer a peer reads, no flag a
        peer waits for."""
        sh = ctx.sharding
        row_elems = ctx.row_elems
        rows = sh.size if ctx.mode == "one_shot" else sh.rows_per_rank  # this rank's rows to sum
        meta = self._steps(world, rows * row_elems)
        blocks = cdiv(sh.rows_per_channel * row_elems, meta["BLOCK"])  # of a channel
        common = (world.rank, world.world_size, sh.size, sh.rows_per_rank, sh.rows_per_channel, sh.channels_per_rank,
                  row_elems)
        own = world.rank * sh.channels_per_rank
        if ctx.mode == "one_shot":
            channels = sh.num_channels
            grid = (max(1, min(self.plan.comm_sms, channels * blocks)),)
            self.partner("ar_pull_reduce")[grid](
                ctx.partial, ctx.table, out, out, ctx.scratch, barriers, table, epoch, *common, own, channels,
                ctx.diag.buffer, ctx.diag.budget_ns, SHARE=False, **meta)
            return
        share, flags, share_table, flag_table = ctx.share, ctx.share_channel.barriers, ctx.share_table, \
            ctx.share_channel.peer_table
        if dry:  # a private copy of the shared rows and the scratch flags
            share, flags = torch.empty_like(share), ctx.scratch
            flag_table = self.scratch_table(ctx, world)
        grid = (max(1, min(self.plan.comm_sms, sh.channels_per_rank * blocks)),)
        self.partner("ar_pull_reduce")[grid](
            ctx.partial, ctx.table, out, share, flags, barriers, table, epoch, *common, own, sh.channels_per_rank,
            ctx.diag.buffer, ctx.diag.budget_ns, SHARE=True, **meta)
        grid = (max(1, min(self.plan.comm_sms, (sh.num_channels - sh.channels_per_rank) * blocks)),)
        self.partner("ar_gather_rows")[grid](
            share, share_table, out, flags, flag_table, epoch, *common, ctx.diag.buffer, ctx.diag.budget_ns, **meta)

    def launch(self, grid, bound: dict) -> None:
        self.refuse_epilogue(bound)
        world = self.world()
        if world.world_size > 1:
            self.check_split_steps(grid, bound)
        ctx = self.context(bound, grid)
        ctx.streams.follow_caller(world.device)
        if world.world_size == 1:  # the output is the whole result (captured too: every wait passes)
            self.start_output(bound)
            self.alone(grid, dict(bound), ctx, world)
            return
        (name,) = self.plan.tensors
        out = described(bound[name])
        # the kernel writes its partial sums to the symmetric buffer (a host descriptor: the same one over it)
        call = self.kernel_call(bound, ctx)
        from tilelink.runtime import graphs

        if graphs.capturing(world.device):
            # the reduce-scatter's SM pull, captured (its _consumer is this launcher's): on the twin, the count on
            # the device, a device barrier in place of the stream barrier below
            self._launch_captured(grid, call, ctx, world, out)
            return
        self.warm_up(ctx, world, grid, call, partners=lambda: self._consumer(
            ctx, world, out, ctx.scratch, self.scratch_table(ctx, world), 0, dry=True))
        epoch = ctx.channel.advance()
        # every rank is done reading the previous call's partial sums and shared rows
        world.stream_barrier(ctx.streams.main)
        self.start_sums(ctx, grid, call)
        self.produce_and_pull(grid, call, ctx, world, out, epoch)
