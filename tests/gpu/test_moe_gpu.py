"""The overlapped MoE operators on the GPU: two ranks sharing one H200 through NVSHMEM, bf16, compiled
kernels (Hopper configs of ``tilelink.ops.moe``: the persistent AG kernel and the RS column sweep), against a
torch loop over experts.

Same rank functions as the emulated tests (``tests/ops/moe_worlds.py``).
"""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.moe_worlds import (
    experts_one_after_another,
    host_syncs_per_call,
    hybrid_calls_back_to_back,
    layer_matches_torch,
    parts_match_torch,
    parts_with_sweep_spans,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs an NVIDIA GPU (run tests/gpu/run.sh on the device)")]


def test_ag_moe_and_moe_rs_two_ranks_bf16() -> None:
    """M=333 tokens (odd), H=256, I=384 (192 per rank; gate|up 2*I fused is not modelled here), E=8, top-2;
    random routing and a skewed one (an expert with no token, expert 0 most), each called twice."""
    for per_rank in tilelink.spawn(parts_match_torch, 2, 333, 256, 384, 8, 2, ["random", "skewed"], "bfloat16", 2,
                                   backend="nvshmem"):
        assert all(err < 2e-2 for err in per_rank.values()), per_rank


@pytest.mark.parametrize("world", [4, 8])
def test_ag_moe_and_moe_rs_more_ranks_bf16(world: int, heap_for_ranks) -> None:
    """4 and 8 ranks on the one GPU: M=333 tokens (not a multiple of either), H=256, I=384 (48 rows per rank
    at 8), E=8, top-2, random and skewed routings, each called twice."""
    heap_for_ranks(world)
    for per_rank in tilelink.spawn(parts_match_torch, world, 333, 256, 384, 8, 2, ["random", "skewed"], "bfloat16",
                                   2, backend="nvshmem"):
        assert all(err < 2e-2 for err in per_rank.values()), per_rank


def test_tp_moe_two_ranks_bf16_shared_expert() -> None:
    for err in tilelink.spawn(layer_matches_torch, 2, 300, 256, 320, 8, 2, True, "bfloat16", backend="nvshmem"):
        assert err < 3e-2


def test_moe_rs_sweep_with_long_and_short_inner_slices_bf16() -> None:
    """I=513 over 2 ranks: rank 0 holds 257 intermediate rows (the column sweep loops over K), rank 1 holds
    256 (it gathers its rows once): one kernel in two specialisations, one protocol. H=200 output columns
    (the last 64-column tile partial); the tensor-descriptor kernels asked for (persistent=True) and checked."""
    for per_rank in tilelink.spawn(parts_match_torch, 2, 257, 200, 513, 4, 2, ["random"], "bfloat16", 2, True,
                                   backend="nvshmem"):
        assert all(err < 2e-2 for err in per_rank.values()), per_rank


def test_moe_rs_sweep_in_spans_across_m_tiles_bf16() -> None:
    """moe_rs's column sweep with the plan a large routing's last, partial wave takes (the M tiles after the
    first in equal spans of column tiles, crossing from one M tile into the next: here spans of 3 of the
    4 column tiles of H=256), forced at this small shape: M=333, I=384 over 2 ranks, E=8, top-2."""
    for per_rank, plans in tilelink.spawn(parts_with_sweep_spans, 2, 3, 333, 256, 384, 8, 2, ["random", "skewed"],
                                          "bfloat16", 2, True, backend="nvshmem"):
        assert all(err < 2e-2 for err in per_rank.values()), per_rank
        assert plans and all(p == (1, 1, 4, 3) for p in plans), plans


def test_hybrid_calls_back_to_back_with_new_data_bf16() -> None:
    """moe_rs and gemm_rs, 5 calls each with new data, queued without a wait between calls (no barrier: each
    call's receive slots by its parity) and checked at the end, on 2 ranks sharing the GPU."""
    for errors in tilelink.spawn(hybrid_calls_back_to_back, 2, 333, 256, 384, 8, 2, 5, "bfloat16",
                                 backend="nvshmem"):
        assert len(errors) == 10 and all(e < 2e-2 for e in errors), errors


def test_a_second_layer_with_other_experts_loads_its_kernels_before_anything_spins() -> None:
    """An MoE layer with 16 experts after one with 5, equal shapes: the operators reuse their buffers, but
    the kernels need other variants (E is specialised on). A variant compiled at the launch, while the partner
    kernel already spins for it, times the wait out; so each variant is loaded (run dry) before the call is
    enqueued, and the contexts must show the second one."""
    for errors, variants in tilelink.spawn(experts_one_after_another, 2, [5, 16], 300, 256, 384, 2, "bfloat16",
                                           backend="nvshmem"):
        assert all(err < 2e-2 for err in errors.values()), errors
        assert len(errors) == 4, errors
        assert all(len(n) == 1 and n[0] >= 2 for n in variants.values()), variants


def test_one_host_sync_per_call() -> None:
    """Each synchronising copy keeps the host from running ahead of the GPU (with nine per MoE call, the host
    time was the whole time on two H200s): the routing crosses to the host once per call."""
    for syncs in tilelink.spawn(host_syncs_per_call, 2, 300, 256, 384, 8, 2, backend="nvshmem"):
        assert syncs == {"ag_moe": 1, "moe_rs": 1}, syncs
