"""What the launch path reads once and reuses, call after call (the host cost of a call, ARCHITECTURE.md): a call
like one seen before finds its context without the checks (``Launcher.fast_key``), while anything that could
change the checks' outcome takes the checked way; the variant key's inline path gives the key the generic one
gives."""

from __future__ import annotations

import types

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

import tilelink
from tilelink.plan import ReduceScatterLaunch
from tilelink.rules.launch import _kernel_params, _value_key, variant_key
from tilelink.rules.reduce_scatter.launcher import ReduceScatterLauncher


def _launcher(size_param: str = "M", tensors=("a_ptr",), topk: str | None = None) -> ReduceScatterLauncher:
    launcher = ReduceScatterLauncher.__new__(ReduceScatterLauncher)  # the keys read only the launch plan
    launcher.plan = ReduceScatterLaunch(tensors=tensors, dim=0, size_param=size_param, index=None, topk=topk,
                                        atomic_axes=None, via="sm", mode="pull", order="ring", comm_sms=16,
                                        comm_block=None, channels_per_rank=None)
    return launcher


def test_the_fast_key_names_what_the_context_depends_on() -> None:
    launcher = _launcher()
    a = torch.zeros(8, 4)
    key = launcher.fast_key(dict(a_ptr=a, M=16, K=4))
    assert key == launcher.fast_key(dict(a_ptr=torch.ones(8, 4), M=16, K=5))  # another tensor of the same kind
    for other in (dict(M=24), dict(a_ptr=torch.zeros(8, 5)), dict(a_ptr=a.half()), dict(a_ptr=torch.zeros(16, 4))):
        assert launcher.fast_key({**dict(a_ptr=a, M=16, K=4), **other}) != key, other
    # the checked way for what the checks must see every time: a strided view, a tensor descriptor or anything not
    # a plain tensor, a size that is not an int (a 0-d tensor's value may change in place)
    assert launcher.fast_key(dict(a_ptr=torch.zeros(4, 8).t(), M=16)) is None
    assert launcher.fast_key(dict(a_ptr=types.SimpleNamespace(base=a, block_shape=[4, 4]), M=16)) is None
    assert launcher.fast_key(dict(a_ptr=torch.nn.Parameter(a), M=16)) is None
    assert launcher.fast_key(dict(a_ptr=a, M=torch.tensor(16))) is None
    assert launcher.fast_key(dict(a_ptr=a, M=True)) is None


def test_a_size_expression_and_the_top_k_are_in_the_key() -> None:
    launcher = _launcher("num_valid_tokens // top_k", ("c_ptr",), topk="top_k")
    c = torch.zeros(4, 8)
    key = launcher.fast_key(dict(c_ptr=c, num_valid_tokens=32, top_k=2, N=8))
    assert launcher.fast_key(dict(c_ptr=c, num_valid_tokens=32, top_k=2, N=8)) == key
    assert launcher.fast_key(dict(c_ptr=c, num_valid_tokens=64, top_k=2, N=8)) != key
    assert launcher.fast_key(dict(c_ptr=c, num_valid_tokens=32, top_k=4, N=8)) != key


def test_a_size_the_grid_counts_is_in_the_key() -> None:
    launcher = _launcher("tl.num_programs(0)")
    a = torch.zeros(8, 4)
    key = launcher.fast_key(dict(a_ptr=a, K=4), (16, 2))
    assert launcher.fast_key(dict(a_ptr=a, K=4), [16, 3]) == key  # the other axes do not count the rows
    assert launcher.fast_key(dict(a_ptr=a, K=4), (24, 2)) != key
    # a grid function, or programs that are not plain ints, take the checked way (which evaluates the grid)
    assert launcher.fast_key(dict(a_ptr=a, K=4), lambda meta: (16,)) is None
    assert launcher.fast_key(dict(a_ptr=a, K=4), (torch.tensor(16),)) is None
    assert _launcher("tl.num_programs(1)").fast_key(dict(a_ptr=a), (16,)) != _launcher("tl.num_programs(1)").fast_key(
        dict(a_ptr=a), (16, 2))


def _body(x_ptr, n, flag, tlk_epoch, scale, BLOCK: tl.constexpr):
    pass


KERNEL = JITFunction(_body, do_not_specialize=["tlk_epoch"])


def test_the_inline_variant_key_is_the_generic_one() -> None:
    params, _ints, wrapped = _kernel_params(KERNEL)
    assert not wrapped
    x = torch.zeros(64)
    for call in (dict(x_ptr=x, n=3, flag=True, tlk_epoch=2, scale=0.5, BLOCK=64),
                 dict(x_ptr=x[1:], n=1, flag=None, tlk_epoch=1, scale=2.0, BLOCK=32, num_warps=4),
                 dict(x_ptr=x.half(), n=1 << 40, flag=False, tlk_epoch=32, scale=1, BLOCK=16, extra=(3, x)),
                 dict(x_ptr=torch.nn.Parameter(x), n=-(1 << 63), flag=1, tlk_epoch=0, scale=None, BLOCK=1)):
        generic = tuple((name, _value_key(value, params.get(name), False)) for name, value in call.items())
        assert variant_key(KERNEL, call) == generic, call


def _contexts_are_reused() -> list[str]:
    from tilelink.errors import LaunchError
    from tilelink.ops import TPContext, ag_gemm, tp_kernels

    a, b = torch.randn(16, 8), torch.randn(8, 12)
    first = ag_gemm(a, b, TPContext(M=16), persistent=False)
    launcher = tp_kernels.ag_gemm_kernel.launcher
    ctx = next(iter(launcher.contexts.values()))
    again = ag_gemm(torch.randn(16, 8), b, TPContext(M=16), persistent=False)
    seen = [f"{len(launcher.contexts)} {len(launcher.fast_contexts)} {next(iter(launcher.contexts.values())) is ctx}"]
    assert torch.allclose(first, a @ b, atol=1e-5) and again.shape == first.shape
    ag_gemm(torch.randn(32, 8), b, TPContext(M=32), persistent=False)  # another shape: its own context
    seen.append(f"{len(launcher.contexts)} {len(launcher.fast_contexts)}")
    bound = launcher.okernel.bind((torch.randn(8, 16).t(), b, torch.empty(16, 12), 16, 12, 8, 1, 16, 12, 1, 12, 1),
                                  {})
    try:  # the kernel itself with a strided shard: refused by the checked way, the context seen before or not
        launcher.context(bound)
    except LaunchError as exc:
        seen.append(str(exc))
    return seen


@pytest.mark.slow  # a spawned rank with the interpreter's kernels: 10-20 s on two busy cores
def test_a_call_like_an_earlier_one_reuses_its_context() -> None:
    (seen,) = tilelink.spawn(_contexts_are_reused, 1)
    assert seen[:2] == ["1 1 True", "2 2"]
    assert "must be contiguous" in seen[2]


def test_on_stream_sets_the_stream_by_id_and_restores_the_callers(monkeypatch) -> None:
    """``on_stream`` (what a reduce-scatter's side-stream blocks enter, cheaper than ``torch.cuda.stream``): a stream
    of the current device is set by id and the caller's stream set back on leaving, also when the block raises; a
    stream of another device takes ``torch.cuda.stream``, which switches the device too; ``None`` changes nothing."""
    from tilelink.rules import launch

    current = {0: (7, 0, 1), 1: (9, 1, 1)}  # device -> (stream id, device index, device type)
    entered = []

    def set_stream(stream_id, device_index, device_type):
        current[device_index] = (stream_id, device_index, device_type)

    class TorchStream:  # torch.cuda.stream's context manager
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            entered.append(("enter", self.stream.stream_id))

        def __exit__(self, *exc):
            entered.append(("exit", self.stream.stream_id))

    monkeypatch.setattr(launch, "_cuda_set_stream", set_stream)
    monkeypatch.setattr(launch, "_cuda_current_stream", lambda index: current[index])
    monkeypatch.setattr(launch, "_cuda_get_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "stream", TorchStream)
    side = types.SimpleNamespace(stream_id=42, device_index=0, device_type=1)
    with launch.on_stream(side):
        assert current[0] == (42, 0, 1)
    assert current[0] == (7, 0, 1)
    with pytest.raises(RuntimeError), launch.on_stream(side):
        assert current[0] == (42, 0, 1)
        raise RuntimeError("the block failed")
    assert current[0] == (7, 0, 1)
    assert not entered
    other = types.SimpleNamespace(stream_id=43, device_index=1, device_type=1)
    with launch.on_stream(other):
        assert entered == [("enter", 43)]
    assert entered == [("enter", 43), ("exit", 43)] and current == {0: (7, 0, 1), 1: (9, 1, 1)}
    with launch.on_stream(None):
        pass
    assert current == {0: (7, 0, 1), 1: (9, 1, 1)}
