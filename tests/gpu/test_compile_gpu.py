"""``torch.compile`` with its default backend, Inductor, over TileLink's layers on the GPU: the layer compiles as
one graph (``fullgraph=True``) around the custom ops, Inductor generating the GPU code between them, and matches
the eager layer, at 1 and 2 ranks on one GPU, bf16, with the token count changing between calls.

The same rank function as the emulated ``aot_eager`` tests (``tests/ops/test_compile.py``)."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops import test_compile as compiled

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


@pytest.mark.parametrize("kind", ["mlp", "decoder", "moe_decoder"])
@pytest.mark.parametrize("world", [1, 2])
def test_inductor_compiles_the_layers(kind: str, world: int, heap_for_ranks) -> None:
    heap_for_ranks(world)
    tokens = (7, 9) if kind == "mlp" else (5, 7)  # odd counts: see tests/ops/test_compile.py
    results = tilelink.spawn(compiled.compiled_follows_new_sizes, world, kind, "inductor", tokens, "bfloat16",
                             backend="nvshmem", timeout=500)
    for r, result in enumerate(results):
        assert max(result["errs"]) < 3e-2, (kind, r, result)  # bf16 rounding in Inductor's fused code vs eager's
        assert 1 <= result["graphs"] <= len(tokens), (kind, r, result)


@pytest.mark.parametrize("kind", ["mlp_ctx", "decoder"])
@pytest.mark.parametrize("world", [1, 2])
def test_reduce_overhead_replays_the_layers_in_cuda_graphs(kind: str, world: int, heap_for_ranks) -> None:
    """``mode="reduce-overhead"``, the compiled layer called first (its warm-up makes the operators' contexts):
    Inductor records the layer, the custom ops inside, into one CUDA graph (nothing skipped, no partition) and
    replays it with new inputs, each call matching eager; the host time per call is printed."""
    heap_for_ranks(world)
    results = tilelink.spawn(compiled.graphed_matches_eager, world, kind, 9, 8, "bfloat16",
                             backend="nvshmem", timeout=500)
    for r, result in enumerate(results):
        print(f"reduce-overhead {kind} world {world} rank {r}: host us a call {result['host_us']}")
        assert result["skips"] == 0 and result["partitions"] == 0 and result["graphs"] == 1, (kind, r, result)
        assert max(result["errs"]) < 3e-2, (kind, r, result)
