"""The baselines of ``tlxform bench attention --mode dist`` compute the right thing: the ring attention
(K/V passed around the ring, partial results merged by log-sum-exp) and the torch all-gather + SDPA,
each rank's query rows against the whole sequence, on CPU ranks of a gloo group; and the overlap ratio."""

from __future__ import annotations

import pytest
import torch

from tests.benchmarks.gloo_ranks import run_on_gloo_ranks
from tilelink.benchmarks.attention import overlap_ratio


def _compare(rank: int, world: int, shard: int) -> dict:
    from tilelink.benchmarks.attention import allgather_sdpa, gather_kv, ring_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, world * shard, 16, generator=g) for _ in range(3))
    rows = slice(rank * shard, (rank + 1) * shard)
    ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, rows], k, v)
    kf, vf = gather_kv(k[:, :, rows].contiguous(), v[:, :, rows].contiguous())
    errs = {"gather_k": (kf - k).abs().max().item(), "gather_v": (vf - v).abs().max().item()}
    for name, fn in (("ring", ring_attention), ("allgather_sdpa", allgather_sdpa)):
        out = fn(q[:, :, rows].contiguous(), k[:, :, rows].contiguous(), v[:, :, rows].contiguous())
        errs[name] = (out - ref).abs().max().item()
    return errs


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ring_attention_and_allgather_sdpa_match_full_attention(world: int) -> None:
    for rank, errs in run_on_gloo_ranks(_compare, world, 5).items():
        assert all(e < 1e-5 for e in errs.values()), (rank, errs)


def test_overlap_ratio_is_the_share_of_communication_hidden() -> None:
    assert overlap_ratio(comp_ms=10.0, comm_ms=4.0, overlapped_ms=14.0) == 0.0  # nothing hidden
    assert overlap_ratio(comp_ms=10.0, comm_ms=4.0, overlapped_ms=10.0) == 1.0  # all hidden
    assert overlap_ratio(comp_ms=10.0, comm_ms=4.0, overlapped_ms=11.0) == 0.75


def test_the_baseline_is_the_fastest_sdpa_backend_that_runs() -> None:
    from tilelink.benchmarks.attention import SDPA_BACKENDS, best_sdpa, sdpa_candidates

    assert best_sdpa({"sdpa_cudnn": 2.0, "sdpa_flash": 1.5, "sdpa_efficient": 3.0, "tilelink": 1.0}) == "sdpa_flash"
    q = k = v = torch.randn(1, 2, 8, 16)
    fns, refused = sdpa_candidates(q, k, v)  # a backend that cannot run the shape is reported, not fatal
    assert set(fns) | set(refused) == {"sdpa_" + b.split("_")[0].lower() for b in SDPA_BACKENDS}
    assert all(reason for reason in refused.values())
    for fn in fns.values():
        assert torch.allclose(fn(), torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-5)


@pytest.mark.parametrize("world, keys", [(4, 64), (3, 50)])
def test_the_chunked_plain_kernel_is_attention_over_every_chunk(world: int, keys: int) -> None:
    """``chunked`` (the plain kernel in the rewritten one's chunks of keys, no wait) is timed against both: it must
    compute the same attention, whole chunks or a ragged last one."""
    from tilelink.benchmarks.attention import _chunked
    from tilelink.ops.attention import attention_config

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (keys // world, keys, keys))
    out = _chunked(q, k, v, world, attention_config(16, torch.float32, "cpu"))()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - ref).abs().max().item() < 1e-4
