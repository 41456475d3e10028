"""``tilelink.runtime.graphs.kept``: what an operator's call keeps is allocated outside the pool of Inductor's CUDA
graph trees while they warm a compiled function up, and nowhere else does it touch the allocator's routing.

The allocator's routing calls and the trees' manager are stood in for here (they need a GPU); the GPU test
``tests/gpu/test_compile_gpu.py::test_reduce_overhead_replays_the_layers_in_cuda_graphs`` runs the real ones."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tilelink.runtime import graphs

POOL = (0, 7)
GPU = torch.device("cuda", 0)


class _Manager:
    def __init__(self, warming: bool, stream: object) -> None:
        self.in_warmup, self.stream, self.cuda_graphs_thread_pool = warming, stream, POOL


@pytest.fixture
def trees(monkeypatch):
    """A stand-in for the trees' module and the allocator's routing: ``state.calls`` lists the routing calls,
    ``state.routed`` whether the thread's allocations go to the pool now."""
    state = types.SimpleNamespace(calls=[], routed=True, manager=_Manager(True, "trees' stream"),
                                  current="trees' stream")
    module = types.ModuleType(graphs._TREES)
    module.get_manager = lambda index, create_if_none_exists=True: state.manager
    monkeypatch.setitem(sys.modules, graphs._TREES, module)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: state.current)

    def end(index, pool):
        if not state.routed:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        state.calls.append(("end", index, pool))
        state.routed = False

    def begin(index, pool):
        state.calls.append(("begin", index, pool))
        state.routed = True

    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool", begin, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda index, pool: state.calls.append(("release", index, pool)),
                        raising=False)
    return state


def test_a_warm_up_is_stepped_out_of_and_back_into(trees) -> None:
    with graphs.kept(GPU):
        assert not trees.routed
        with graphs.kept(GPU):  # nested: nothing more
            assert not trees.routed
        assert not trees.routed
    assert trees.routed
    assert trees.calls == [("end", 0, POOL), ("begin", 0, POOL), ("release", 0, POOL)]


def test_one_kept_is_entered_once(trees) -> None:
    step = graphs.kept(GPU)
    with step, pytest.raises(RuntimeError, match="entered again"), step:
        pass
    assert trees.routed and [c[0] for c in trees.calls] == ["end", "begin", "release"]


def test_an_error_inside_still_routes_back(trees) -> None:
    with pytest.raises(ValueError, match="inside"), graphs.kept(GPU):
        raise ValueError("inside")
    assert trees.routed and [c[0] for c in trees.calls] == ["end", "begin", "release"]
    with graphs.kept(GPU):  # and the next one steps out again
        assert not trees.routed
    assert trees.routed


@pytest.mark.parametrize("case", ["no warm-up", "another stream", "no manager", "no trees", "the CPU"])
def test_nothing_is_touched_outside_a_warm_up(trees, monkeypatch, case: str) -> None:
    """After a warm-up the manager stays in its warm-up state while the thread's allocations are routed nowhere:
    the current stream (not the trees' own) tells."""
    device = GPU
    if case == "no warm-up":
        trees.manager = _Manager(False, "trees' stream")
    elif case == "another stream":
        trees.current = "the caller's stream"
    elif case == "no manager":
        trees.manager = None
    elif case == "no trees":
        monkeypatch.delitem(sys.modules, graphs._TREES)
    else:
        device = torch.device("cpu")
    with graphs.kept(device):
        assert trees.routed
    assert trees.calls == []
