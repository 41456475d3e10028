"""``torch.compile`` over TileLink's layers (``tilelink.ops.library``: the operators as ``torch.library`` custom
ops): ``TPMLP``, ``TPMoE``, ``SPAttention`` and the decoders trace whole (``fullgraph=True``, no graph break in
``torch._dynamo.explain``) with the ``aot_eager`` backend and match the eager layer, in emulated worlds of 1 and
2 ranks; each op's fake implementation gives the real output's shape, dtype, device and strides.

The rank functions live here too (spawned ranks import them by name). Shapes are tiny: the interpreter is slow.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import tilelink
import tilelink.ops  # registers torch.ops.tilelink.*
import tilelink.runtime


def _rows(size: int) -> tuple[int, int]:
    from tilelink.mapping import shard_range

    return shard_range(size, tilelink.rank(), tilelink.world_size())


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def _on_world(*tensors: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """The tensors on this rank's device (a GPU under NVSHMEM, the CPU when emulated), as ``dtype``."""
    from tilelink.runtime import current_world

    return tuple(t.to(current_world().device, dtype) for t in tensors)


def _layer(kind: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The layer ``kind``: every rank builds the same one from the same seeds."""
    from tilelink.nn import TPMLP, SPAttention, TPMoE
    from tilelink.ops import models

    H, I = 16, 32  # noqa: E741 - the paper's names
    if kind in ("mlp", "mlp_ctx"):
        return TPMLP(_randn(I, H, seed=2, scale=0.25), _randn(I, H, seed=3, scale=0.25),
                     _randn(H, I, seed=4, scale=0.2))
    if kind == "moe":  # Qwen1.5-MoE style: a gated shared expert beside the routed ones
        E, k = 4, 2
        return TPMoE(_randn(E, H, seed=5), _randn(E, I, H, seed=6, scale=0.25), _randn(E, I, H, seed=7, scale=0.25),
                     _randn(E, H, I, seed=8, scale=0.2), k, shared_gate=_randn(24, H, seed=9, scale=0.25),
                     shared_up=_randn(24, H, seed=10, scale=0.25), shared_down=_randn(H, 24, seed=11, scale=0.2),
                     shared_expert_gate=_randn(1, H, seed=12, scale=0.25))
    if kind in ("attention", "attention_len"):  # GQA, causal; with seq_len the layer holds an SPContext
        return SPAttention(2, 1, causal=True, seq_len=8 if kind == "attention_len" else None)
    if kind in ("decoder", "moe_decoder"):
        config = models.get_config("tiny" if kind == "decoder" else "tiny-moe").with_layers(1)
        return models.TPDecoder(config, seed=3, dtype=dtype)
    raise ValueError(kind)


def _args(kind: str, tokens: int = 0, dtype: torch.dtype = torch.float32) -> tuple:
    """This rank's arguments of the layer ``kind`` for ``tokens`` tokens (0: 7, 8 for attention, 5 for a decoder),
    on the rank's device as ``dtype``."""
    from tilelink.ops.tp import TPContext

    if kind in ("attention", "attention_len"):
        S, D = tokens or 8, 16
        lo, hi = _rows(S)
        return _on_world(*(_randn(1, heads, S, D, seed=seed)[:, :, lo:hi].contiguous()
                           for heads, seed in ((2, 13), (1, 14), (1, 15))), dtype=dtype)
    if kind in ("decoder", "moe_decoder"):
        batch, seq = 1, tokens or 5
        lo, hi = _rows(batch * seq)
        return *_on_world(_randn(batch * seq, 32, seed=16)[lo:hi].contiguous(), dtype=dtype), batch, seq
    S = tokens or 7
    lo, hi = _rows(S)
    (x,) = _on_world(_randn(S, 16, seed=1)[lo:hi].contiguous(), dtype=dtype)
    return (x, TPContext(M=S)) if kind == "mlp_ctx" else (x,)


def compiled_matches_eager(*kinds: str) -> dict[str, dict]:
    """For each layer of ``kinds`` on this rank: eager, ``torch._dynamo.explain`` and
    ``torch.compile(backend="aot_eager", fullgraph=True)`` called twice; the graph breaks, the graphs, the
    tilelink ops in the graph, the shapes and the largest difference from eager (relative to its largest value)."""
    return {kind: _compiled_matches_eager(kind) for kind in kinds}


def _compiled_matches_eager(kind: str) -> dict:
    torch._dynamo.reset()
    layer, args = _layer(kind), _args(kind)
    eager = layer(*args)
    explained = torch._dynamo.explain(layer)(*args)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    outs = [compiled(*args) for _ in range(2)]
    scale = max(eager.abs().max().item(), 1e-30) if eager.numel() else 1.0
    return {"breaks": explained.graph_break_count, "graphs": explained.graph_count,
            "reasons": [str(r.reason)[:300] for r in explained.break_reasons],
            "ops": sorted({str(n.target).removeprefix("tilelink.") for g in explained.graphs for n in g.graph.nodes
                           if n.op == "call_function" and str(n.target).startswith("tilelink.")}),
            "shape": tuple(eager.shape), "compiled_shapes": [tuple(o.shape) for o in outs],
            "dtypes": {str(o.dtype) for o in (eager, *outs)},
            "err": max(((o - eager).abs().max().item() / scale if o.numel() else 0.0) for o in outs)}


def compiled_follows_new_sizes(kind: str, backend: str, tokens: tuple[int, ...], dtype: str = "float32") -> dict:
    """One compiled layer (``fullgraph=True``) called with ``tokens`` tokens in turn, on ``dtype`` inputs: the
    largest difference from eager at each, relative to its largest value, and the graphs Dynamo compiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    layer = _layer(kind, getattr(torch, dtype))
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    errs = []
    for n in tokens:
        args = _args(kind, n, getattr(torch, dtype))
        eager, out = layer(*args), compiled(*args)
        assert out.shape == eager.shape, (n, out.shape, eager.shape)
        errs.append((out - eager).abs().max().item() / max(eager.abs().max().item(), 1e-30))
    return {"errs": errs, "graphs": counters["stats"]["unique_graphs"]}


def _meta(t: torch.Tensor) -> tuple:
    return tuple(int(s) for s in t.shape), t.dtype, t.device.type, tuple(int(s) for s in t.stride())


def fake_shapes_match_real(opcheck: bool = False) -> dict:
    """Each custom op called for real and on fake tensors of the same inputs: (real, fake) metadata by op. A size
    the fake cannot know (the gathered rows without a context, in a world of several ranks) comes back as the
    string of its symbol. Also: a call traced for another world is refused; with ``opcheck``,
    ``torch.library.opcheck``'s failures by op (its schema, fake, autograd-registration and AOT checks)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from tilelink.errors import LaunchError

    ops = torch.ops.tilelink
    r, R = tilelink.rank(), tilelink.world_size()
    M, K, N, E, k = 7, 16, 24, 4, 2
    lo, hi = _rows(M)
    a = _randn(M, K, seed=1)
    b = _randn(K, N, seed=2)
    ids = torch.stack([torch.arange(M) % E, (torch.arange(M) + 1) % E], dim=1)
    weights = torch.full((M, k), 0.5)
    q, kv = _randn(1, 2, 8, 16, seed=3), _randn(1, 1, 8, 16, seed=4)
    slo, shi = _rows(8)
    q, kv = q[:, :, slo:shi].contiguous(), kv[:, :, slo:shi].contiguous()
    w_up, w_down = _randn(E, K, N, seed=5), _randn(E, N, K, seed=6)
    cases = {
        "ag_gemm": (ops.ag_gemm, (a[lo:hi].contiguous(), b, None, r, R, None)),
        "ag_gemm_ctx": (ops.ag_gemm, (a[lo:hi].contiguous(), b, M, r, R, None)),
        "gemm_rs": (ops.gemm_rs, (a, b, r, R, None)),
        "gemm_ar": (ops.gemm_ar, (a[:, lo:hi].contiguous(), b[lo:hi].contiguous(), None, r, R, None)),
        "moe_route": (ops.moe_route, (ids, E)),
        "ag_moe": (ops.ag_moe, (a[lo:hi].contiguous(), w_up, ids, None, None, r, R, None)),
        "moe_rs": (ops.moe_rs, (_randn(M * k, N, seed=7), w_down, ids, weights, None, None, r, R, None)),
        "sp_attention": (ops.sp_attention, (q, kv, kv.clone(), True, None, r, R)),
        "sp_attention_len": (ops.sp_attention, (q, kv, kv.clone(), False, 8, r, R)),
        "silu_mul": (ops.silu_mul, (_randn(M, 2 * N, seed=8),)),
        "all_gather_shards": (ops.all_gather_shards, (a[lo:hi].contiguous(), r, R)),
    }
    counts, host_counts = ops.moe_route(ids, E)  # ag_moe and moe_rs on the routing moe_route made
    cases["ag_moe_routed"] = (ops.ag_moe, (a[lo:hi].contiguous(), w_up, ids, counts, host_counts, r, R, None))
    cases["moe_rs_routed"] = (ops.moe_rs, (_randn(M * k, N, seed=7), w_down, ids, weights, counts, host_counts, r, R,
                                           None))
    result: dict = {}
    for name, (op, op_args) in cases.items():
        real = op(*op_args)
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            fake = op(*(mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x for x in op_args))
        reals, fakes = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
        result[name] = ([_meta(t) for t in reals],
                        [_meta(t) if all(isinstance(s, int) for s in t.shape) else str(t.shape[0]) for t in fakes])
    if opcheck:
        result["opcheck"] = {name: {test: outcome for test, outcome in torch.library.opcheck(op, op_args).items()
                                    if outcome != "SUCCESS"} for name, (op, op_args) in cases.items()}
    try:
        ops.gemm_rs(a, b, r, R + 1, None)
        result["other_world"] = "NO ERROR"
    except LaunchError as exc:
        result["other_world"] = str(exc)
    return result


# ------------------------------------------------------------------------------------------------
# in this process: the registrations and the fake implementations (no world needed)


_OPS = ("ag_gemm", "gemm_rs", "gemm_ar", "ag_moe", "moe_rs", "moe_route", "sp_attention", "silu_mul",
        "all_gather_shards")
_COLLECTIVES = ("ag_gemm", "gemm_rs", "gemm_ar", "ag_moe", "moe_rs", "sp_attention", "all_gather_shards")


def test_ops_mutate_nothing_and_collectives_keep_their_order() -> None:
    from torch._higher_order_ops.effects import _get_effect
    from torch._library.effects import EffectType

    for name in _OPS:
        op = getattr(torch.ops.tilelink, name).default
        assert not any(arg.alias_info is not None for arg in op._schema.arguments), op._schema
        assert not any(ret.alias_info is not None for ret in op._schema.returns), op._schema
        assert _get_effect(op) is (EffectType.ORDERED if name in _COLLECTIVES else None), name


def test_eager_calls_skip_the_dispatch_and_traced_calls_take_it() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tilelink.ops.library import _traced

    assert not _traced(torch.ones(2), torch.nn.Parameter(torch.ones(2), requires_grad=False), None)
    with FakeTensorMode() as mode:
        assert _traced(mode.from_tensor(torch.ones(2)))


def test_fake_rows_follow_the_rank_and_the_world() -> None:
    """Rank 1 of 2 holds 3 of 7 rows. Without a context, the gathered M is an unbacked size, and the reduce-scatter
    of it is known to have this rank's 3 rows (a residual add with the input traces)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols, statically_known_true

    ops = torch.ops.tilelink
    with FakeTensorMode(shape_env=ShapeEnv()):
        a, b, b_down = torch.empty(3, 16), torch.empty(16, 24), torch.empty(24, 16)
        assert ops.ag_gemm(a, b, 7, 1, 2, None).shape == (7, 24)
        assert ops.ag_gemm(a, b, None, 0, 1, None).shape == (3, 24)
        assert ops.gemm_rs(torch.empty(7, 24), b_down, 1, 2, None).shape == (3, 16)
        assert ops.gemm_rs(torch.empty(7, 24), b_down, 0, 2, None).shape == (4, 16)
        assert ops.gemm_rs(torch.empty(2, 24), b_down, 3, 4, None).shape == (0, 16)
        h = ops.ag_gemm(a, b, None, 1, 2, None)
        assert free_unbacked_symbols(h.shape[0]) and h.shape[1] == 24
        y = ops.gemm_rs(h, b_down, 1, 2, None)
        assert statically_known_true(y.shape[0] == 3) and (y + a).shape[1] == 16
        ids, w_up, w_down = torch.empty(7, 2, dtype=torch.int64), torch.empty(4, 16, 24), torch.empty(4, 24, 16)
        assert ops.ag_moe(a, w_up, ids, None, None, 1, 2, None).shape == (14, 24)
        assert ops.moe_rs(torch.empty(14, 24), w_down, ids, torch.empty(7, 2), None, None, 1, 2, None).shape == (3, 16)
        counts, host_counts = ops.moe_route(ids, 4)
        assert counts.shape == host_counts.shape == (4,) and host_counts.device.type == "cpu"
        q, kv = torch.empty(1, 4, 3, 16, dtype=torch.bfloat16), torch.empty(1, 2, 3, 16, dtype=torch.bfloat16)
        o = ops.sp_attention(q, kv, kv, True, None, 1, 2)
        assert o.shape == q.shape and o.dtype == torch.bfloat16 and o.is_contiguous()
        assert ops.silu_mul(torch.empty(5, 8)).shape == (5, 4)
        gathered = ops.all_gather_shards(torch.empty(3, 4), 1, 2)
        assert free_unbacked_symbols(gathered.shape[0]) and gathered.shape[1] == 4


# ------------------------------------------------------------------------------------------------
# in emulated worlds


@pytest.mark.slow
def test_fake_shapes_match_the_real_outputs_in_one_rank() -> None:
    (result,) = tilelink.spawn(fake_shapes_match_real, 1, True)
    assert "traced for rank 0 of 2 ranks, but this process is rank 0 of 1" in result.pop("other_world")
    assert result.pop("opcheck") == {name: {} for name in result}
    for name, (real, fake) in result.items():
        assert real == fake, (name, real, fake)


@pytest.mark.slow
def test_fake_shapes_match_the_real_outputs_in_two_ranks() -> None:
    for r, result in enumerate(tilelink.spawn(fake_shapes_match_real, 2)):
        assert f"traced for rank {r} of 3 ranks" in result.pop("other_world")
        for name in ("ag_gemm", "all_gather_shards"):  # the gathered rows: an unbacked size while tracing
            real, fake = result.pop(name)
            assert real[0][0][0] == 7 and fake[0].startswith("u"), (r, name, real, fake)
        for name, (real, fake) in result.items():
            assert real == fake, (r, name, real, fake)


_OPS_OF = {"mlp": ["ag_gemm", "gemm_rs", "silu_mul"], "attention": ["sp_attention"],
           "moe": ["ag_gemm", "ag_moe", "gemm_rs", "moe_route", "moe_rs", "silu_mul"]}
_OPS_OF.update(mlp_ctx=_OPS_OF["mlp"], attention_len=_OPS_OF["attention"], decoder=_OPS_OF["mlp"],
               moe_decoder=_OPS_OF["moe"])


@pytest.mark.slow
@pytest.mark.parametrize("kinds", [("mlp", "mlp_ctx"), ("moe",), ("attention", "attention_len"), ("decoder",),
                                   ("moe_decoder",)], ids="+".join)
@pytest.mark.parametrize("world", [1, 2])
def test_compiled_layer_traces_whole_and_matches_eager(kinds: tuple[str, ...], world: int) -> None:
    for r, results in enumerate(tilelink.spawn(compiled_matches_eager, world, *kinds)):
        for kind, result in results.items():
            gathers = ["all_gather_shards"] if world > 1 and "moe" in kind else []  # the routing of every token
            assert result["breaks"] == 0 and result["graphs"] == 1, (kind, r, result)
            assert result["ops"] == sorted(_OPS_OF[kind] + gathers), (kind, r, result)
            assert result["compiled_shapes"] == [result["shape"]] * 2, (kind, r, result)
            assert result["dtypes"] == {"torch.float32"} and result["err"] < 1e-5, (kind, r, result)


@pytest.mark.slow
def test_compiled_layers_follow_new_token_counts() -> None:
    """Serving: the token count changes between calls. Dynamo recompiles once with dynamic sizes (the unbacked M
    of a call without a context, the routing's gathered rows and the context's M are symbolic then). Odd counts
    only: the decoder's input check (``shard_range``, Python ``min``) guards on the count's parity at rank 1."""
    for kind in ("mlp", "moe_decoder"):
        for r, result in enumerate(tilelink.spawn(compiled_follows_new_sizes, 2, kind, "aot_eager", (7, 9, 13))):
            assert result["graphs"] == 2 and max(result["errs"]) < 1e-5, (kind, r, result)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="Inductor on CPU needs a C++ compiler")
def test_inductor_compiles_the_moe_decoder_on_cpu() -> None:
    """The default backend (Inductor, CPU code around the custom ops) over the decoder with every op in it."""
    for r, result in enumerate(tilelink.spawn(compiled_follows_new_sizes, 2, "moe_decoder", "inductor", (5,))):
        assert result["graphs"] == 1 and result["errs"][0] < 1e-5, (r, result)


def graphed_matches_eager(kind: str, tokens: int, calls: int, dtype: str = "bfloat16") -> dict:
    """``torch.compile(mode="reduce-overhead", fullgraph=True)``: Inductor's code with its CUDA graphs (CUDA graph
    trees) around the layer, called ``calls`` times with new inputs of ``tokens`` tokens; each call's largest
    difference from eager (relative to its largest value), the CUDA graphs Inductor skipped (with why), and the
    launching thread's time per call (µs, ``calls`` back-to-back calls, eager and compiled). Inductor skips its CUDA
    graphs where it cannot record them (a CPU tensor, a dynamic shape) and partitions the graph around what it cannot
    record (a size only known at run time: a layer without a ``TPContext`` in a world of several ranks)."""
    import time

    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    inductor_config.triton.cudagraph_trees_history_recording = True  # a leak's message says where it was made
    dt = getattr(torch, dtype)
    layer = _layer(kind, dt)
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    base = _args(kind, tokens, dt)
    errs = []
    for i in range(calls):  # new data in the same shapes: the graph's inputs are copied in at each replay
        args = tuple(a * (1.0 + 0.05 * i) if isinstance(a, torch.Tensor) else a for a in base)
        out = compiled(*args)  # first: the warm-up makes the operators' contexts, as in a program that only compiles
        eager = layer(*args)
        errs.append((out.float() - eager.float()).abs().max().item() / max(eager.float().abs().max().item(), 1e-30))
    host = {}
    for name, fn in (("eager", layer), ("compiled", compiled)):
        fn(*base)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*base)
        host[name] = (time.perf_counter() - start) / calls * 1e6
        torch.cuda.synchronize()
    return {"errs": errs, "skips": counters["inductor"]["cudagraph_skips"], "host_us": host,
            "partitions": counters["inductor"]["cudagraph_partitions"], "graphs": counters["stats"]["unique_graphs"]}
