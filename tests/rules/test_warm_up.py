"""Every variant of a rewritten kernel is compiled and loaded before the call that needs it is enqueued.

On a GPU, Triton compiles and loads a kernel's module at its first launch with new constexprs or
differently specialised arguments, and loading waits for the running kernels: a variant first launched
while its partner kernel spins for it deadlocks until the wait's budget runs out (an MoE layer with 32
experts after one with 8, on buffers of the same shape, timed out so on two H200s). ``Launcher.warm_up``
keys what it has loaded per context on :func:`variant_key`. These tests run its logic on the CPU with a
stand-in kernel; ``tests/gpu/test_moe_gpu.py`` runs the real case.
"""

from __future__ import annotations

import types

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from tilelink.mapping import RowSharding
from tilelink.plan import ReduceScatterLaunch
from tilelink.rules.launch import Launcher, variant_key


def _body(x_ptr, n, tlk_epoch, BLOCK: tl.constexpr):
    pass


# a compiled-mode JITFunction whatever TRITON_INTERPRET says: the key reads its parameters
KERNEL = JITFunction(_body, do_not_specialize=["tlk_epoch"])


def test_the_key_follows_what_triton_specializes_on():
    x = torch.zeros(64)
    base = variant_key(KERNEL, dict(x_ptr=x, n=3, tlk_epoch=2, BLOCK=64))
    # another int with the same properties (not 1, not a multiple of 16, 32 bits), another epoch: one variant
    assert variant_key(KERNEL, dict(x_ptr=x, n=5, tlk_epoch=17, BLOCK=64)) == base
    assert variant_key(KERNEL, dict(x_ptr=x, n=5, tlk_epoch=1, BLOCK=64)) == base  # the epoch: do_not_specialize
    for other in (dict(n=1), dict(n=32), dict(n=1 << 40), dict(BLOCK=128), dict(x_ptr=x[1:]),
                  dict(x_ptr=x.half())):
        assert variant_key(KERNEL, {**dict(x_ptr=x, n=3, tlk_epoch=2, BLOCK=64), **other}) != base, other


def test_an_autotuned_kernel_is_keyed_on_every_int_value_and_tensor_shape():
    tuned = triton.autotune(configs=[triton.Config({}, num_warps=4)], key=["n"])(KERNEL)
    x = torch.zeros(64)
    assert variant_key(tuned, dict(x_ptr=x, n=3, BLOCK=64)) != variant_key(tuned, dict(x_ptr=x, n=5, BLOCK=64))
    # a heuristic or a pruning function may read a tensor's shape
    assert variant_key(tuned, dict(x_ptr=x, n=3, BLOCK=64)) != variant_key(tuned, dict(x_ptr=x[:32], n=3, BLOCK=64))


def test_floats_sequences_and_other_values():
    def body(x_ptr, scale, dims, BLOCK: tl.constexpr):
        pass

    kernel = JITFunction(body)
    x = torch.zeros(8)
    base = variant_key(kernel, dict(x_ptr=x, scale=0.5, dims=(3, x), BLOCK=2))
    # a float argument is one type to Triton, whatever its value
    assert variant_key(kernel, dict(x_ptr=x, scale=2.0, dims=(3, x), BLOCK=2)) == base
    # a sequence is keyed element by element (a tensor in it by dtype and alignment, an int by value), and
    # may be unhashable
    assert variant_key(kernel, dict(x_ptr=x, scale=0.5, dims=(3, torch.ones(8)), BLOCK=2)) == base
    assert variant_key(kernel, dict(x_ptr=x, scale=0.5, dims=(4, x), BLOCK=2)) != base
    assert variant_key(kernel, dict(x_ptr=x, scale=0.5, dims=(3, x.half()), BLOCK=2)) != base
    key = variant_key(kernel, dict(x_ptr=x, scale=0.5, dims=[3, [x]], BLOCK=2))
    assert key in {key}  # hashable


class _Recorder(Launcher):
    """A launcher whose kernel records its launches instead of running."""

    def __init__(self) -> None:
        self.plan = ReduceScatterLaunch(tensors=("c",), dim=0, size_param="n", index=None, topk=None, atomic_axes=None,
                                        via="sm", mode="pull", order="ring", comm_sms=16, comm_block=None,
                                        channels_per_rank=None)
        self.launches: list[dict] = []
        recorder = self

        class _Kernel:
            params = KERNEL.params

            def __getitem__(self, grid):
                return lambda **kw: recorder.launches.append(kw)

        self._kernel = _Kernel()

    @property
    def kernel(self):
        return self._kernel


def test_warm_up_runs_each_new_variant_dry_once_and_never_touches_the_symmetric_buffer_again():
    launcher = _Recorder()
    world = types.SimpleNamespace(backend="nvshmem", device=torch.device("cpu"), rank=0, world_size=2)
    ctx = types.SimpleNamespace(variants=set(), scratch=torch.ones(4, dtype=torch.int64),
                                sharding=RowSharding(64, 2), diag=types.SimpleNamespace(buffer=None, budget_ns=1))
    partial = torch.full((64, 8), 7.0)  # the symmetric buffer the rewritten kernel writes
    partners = []

    def call(n, block, c=partial):
        return dict(x_ptr=torch.zeros(8), n=n, c=c, BLOCK=block)

    launcher.warm_up(ctx, world, (1,), call(3, 64), partners=lambda: partners.append(1))
    assert len(launcher.launches) == 1 and partners == [1]  # the first call: the kernel and its partners
    first = launcher.launches[0]
    assert first["c"] is partial and first["tlk_epoch"] == 0 and first["tlk_barriers"] is ctx.scratch
    assert int(ctx.scratch.sum()) == 0  # against a zeroed scratch channel: no wait can block

    launcher.warm_up(ctx, world, (1,), call(5, 64), partners=lambda: partners.append(2))
    assert len(launcher.launches) == 1  # the same variant: nothing to load

    launcher.warm_up(ctx, world, (1,), call(5, 128), partners=lambda: partners.append(3))
    assert len(launcher.launches) == 2 and partners == [1]  # a new constexpr: the kernel again, dry
    again = launcher.launches[1]
    # peers may still read this rank's partial sums of the last call: the dry run writes a stand-in
    assert again["c"] is not partial and again["c"].shape == partial.shape and not again["c"].any()
    assert again["tlk_epoch"] == 0 and again["tlk_barriers"] is ctx.scratch
    assert bool((partial == 7.0).all())
    assert len(ctx.variants) == 2

    launcher.warm_up(ctx, world, (1,), call(7, 128), partners=lambda: partners.append(4))
    launcher.warm_up(ctx, world, (1,), call(9, 64), partners=lambda: partners.append(5))
    assert len(launcher.launches) == 2  # both variants loaded already


def test_the_emulated_world_warms_nothing():
    launcher = _Recorder()
    world = types.SimpleNamespace(backend="emulated", device=torch.device("cpu"))
    ctx = types.SimpleNamespace(variants=set())
    launcher.warm_up(ctx, world, (1,), dict(x_ptr=torch.zeros(1), n=3, c=torch.zeros(1), BLOCK=64))
    assert launcher.launches == [] and ctx.variants == set()
