"""The routing's host side (tilelink.ops.moe_routing): one copy to the host per call carries the checks
and the per-expert counts; the alignment takes the counts from it."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tilelink.ops.moe_routing import align_tokens, most_blocks, route, route_fixed


def test_route_counts_every_expert_and_checks_the_ids_in_one_pass():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 6, (37, 3), generator=g)
    ids[:, 0] = 2  # expert 2 most; some expert may get none
    r = route(ids, 7)
    ref = torch.bincount(ids.flatten(), minlength=7)
    assert torch.equal(r.counts, ref) and torch.equal(r.host_counts, ref) and r.counts[6] == 0
    assert r.host_counts.device.type == "cpu" and r.flat.dtype == torch.int64
    assert route(ids.to(torch.int32), 7).host_counts.tolist() == ref.tolist()
    assert r.count_list == tuple(ref.tolist())  # the host's ints: tile counts without torch ops
    for block in (1, 4, 16):
        assert r.blocks(block) == sum(-(-c // block) for c in ref.tolist())
    for bad, words in ((ids - 1, "min -1"), (ids + 2, "max 7"), (ids.float(), "integer tensor"),
                       (ids.flatten(), "(tokens, top_k)"), (torch.zeros(3, 8, dtype=torch.int64), "top_k=8")):
        with pytest.raises(tilelink.LaunchError, match=words.replace("(", r"\(").replace(")", r"\)")):
            route(bad, 7)


def test_align_tokens_from_a_routing_or_from_the_ids_alike():
    g = torch.Generator().manual_seed(2)
    ids = torch.stack([torch.randperm(5, generator=g)[:2] for _ in range(23)])
    ids[ids == 3] = 0  # expert 3 receives nothing
    for block in (1, 4, 16):
        sorted_a, experts_a = align_tokens(ids, 5, block)
        sorted_b, experts_b = align_tokens(route(ids, 5), 5, block)
        assert torch.equal(sorted_a, sorted_b) and torch.equal(experts_a, experts_b)
        counts = torch.bincount(ids.flatten(), minlength=5)
        blocks = (counts + block - 1) // block
        assert sorted_a.numel() == int(blocks.sum()) * block and experts_a.tolist() == torch.repeat_interleave(
            torch.arange(5), blocks).tolist()
        for b, e in enumerate(experts_a.tolist()):  # each block's real slots are its expert's, in slot order
            slots = [s for s in sorted_a[b * block:(b + 1) * block].tolist() if s < ids.numel()]
            assert all(ids.flatten()[s] == e for s in slots) and slots == sorted(slots)
        real = sorted(s for s in sorted_a.tolist() if s < ids.numel())
        assert real == list(range(ids.numel()))  # every slot exactly once


def test_no_tokens():
    r = route(torch.zeros(0, 2, dtype=torch.int64), 4)
    assert r.host_counts.tolist() == [0, 0, 0, 0]
    sorted_ids, expert_ids = align_tokens(r, 4, 16)
    assert sorted_ids.numel() == 0 and expert_ids.numel() == 0


def test_a_routing_serves_only_its_expert_count():
    r = route(torch.tensor([[0, 1], [2, 0]]), 3)
    align_tokens(r, 3, 4)
    with pytest.raises(tilelink.LaunchError, match="made for 3 experts, not 4"):
        align_tokens(r, 4, 4)


def _reference(ids: torch.Tensor, E: int, block: int) -> tuple[list[int], list[int]]:
    flat = ids.flatten().tolist()
    sorted_ids, experts = [], []
    for e in range(E):
        mine = [s for s, x in enumerate(flat) if x == e]
        padded = -(-len(mine) // block) * block
        sorted_ids += mine + [len(flat)] * (padded - len(mine))
        experts += [e] * (padded // block)
    return sorted_ids, experts


@pytest.mark.parametrize(("tokens", "top_k", "E", "block", "dtype"), [
    (4500, 2, 7, 16, torch.int64),  # 9000 slots: the kernels read the ids in three chunks
    (5, 3, 40, 4, torch.int32),  # most experts without a slot; 40 experts (not a power of two)
    (64, 1, 1, 128, torch.int64),  # one expert, one block mostly padding
])
def test_the_kernels_match_a_plain_reference(tokens, top_k, E, block, dtype):
    g = torch.Generator().manual_seed(tokens + E)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(tokens)]).to(dtype)
    r = route(ids, E)
    assert r.host_counts.tolist() == torch.bincount(ids.flatten().long(), minlength=E).tolist()
    sorted_ids, experts = align_tokens(r, E, block)
    ref_sorted, ref_experts = _reference(ids, E, block)
    assert sorted_ids.tolist() == ref_sorted and experts.tolist() == ref_experts


def test_most_blocks_bounds_every_routing_of_the_shape():
    """The worst case that a captured call's buffers and grid are sized by: no routing of n slots over E experts
    takes more blocks (random ones, and one slot on each of as many experts as can take one, the rest on one)."""
    g = torch.Generator().manual_seed(4)
    for n, E, block in ((1, 4, 16), (7, 3, 4), (40, 8, 16), (64, 2, 16), (33, 33, 1), (5, 64, 64)):
        bound = most_blocks(n, E, block)
        for _ in range(20):
            counts = torch.bincount(torch.randint(0, E, (n,), generator=g), minlength=E)
            assert sum(-(-c // block) for c in counts.tolist()) <= bound
        # the worst: as many experts as can take one slot past a multiple of block, the rest on one expert
        experts = min(E, n)
        worst = [1] * experts
        worst[0] += n - experts
        assert sum(-(-c // block) for c in worst) <= bound


def test_the_fixed_routing_aligns_as_the_counted_one_then_pads():
    """route_fixed (a captured call's routing: no copy to the host) places every slot where route's alignment does,
    then fills the rest of the worst case with padding of expert -1; an id out of range is clamped and recorded for
    the next route to raise."""
    from tilelink.ops import moe_routing

    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 5, (23, 2), generator=g)
    ids[:, 1] = 4  # expert 4 the most; a gap likely
    route(ids, 6)  # outside a capture first: it makes the device's record of the replays' ids
    fixed = route_fixed(ids, 6)
    assert fixed.fixed and fixed.count_list is None
    with pytest.raises(tilelink.LaunchError, match="on the device"):
        _ = fixed.host_counts
    for block in (1, 4, 16):
        want_ids, want_experts = align_tokens(route(ids, 6), 6, block)
        got_ids, got_experts = align_tokens(fixed, 6, block)
        assert got_experts.numel() == most_blocks(46, 6, block) >= want_experts.numel()
        assert torch.equal(got_ids[:want_ids.numel()], want_ids) and (got_ids[want_ids.numel():] == 46).all()
        assert torch.equal(got_experts[:want_experts.numel()], want_experts)
        assert (got_experts[want_experts.numel():] == -1).all()
    bad = ids.clone()
    bad[0, 0] = 9
    clamped = route_fixed(bad, 6)
    assert clamped.counts[5] == torch.bincount(ids.flatten(), minlength=6)[5] + 1  # 9 counted as expert 5
    moe_routing._captured_on.add(str(bad.device))  # as a capture does: the next route checks the record
    try:
        with pytest.raises(tilelink.LaunchError, match=r"replay of a captured MoE call.*max 9"):
            route(ids, 6)
        assert route(ids, 6).count_list == tuple(torch.bincount(ids.flatten(), minlength=6).tolist())  # cleared
    finally:
        moe_routing._captured_on.discard(str(bad.device))


def test_the_replays_record_is_read_without_a_later_route():
    """check_replays (what tilelink.finalize() raises) reads the record that a replay's clamped ids left on a device
    captured on, names the range of the captured routings' experts, and clears it."""
    from tilelink.ops import moe_routing

    ids = torch.tensor([[0, 1], [2, 3]])
    route(ids, 4)  # outside a capture first: it makes the device's record
    key = str(ids.device)
    moe_routing._captured_on.add(key)  # as a capture does
    moe_routing._captured_experts[key] = 4
    try:
        assert moe_routing.check_replays() is None  # nothing out of range yet
        route_fixed(torch.tensor([[0, 5], [2, 3]]), 4)
        error = moe_routing.check_replays()
        assert isinstance(error, tilelink.LaunchError) and "outside [0, 4)" in str(error) and "max 5" in str(error)
        assert moe_routing.check_replays() is None  # cleared
        moe_routing._captured_experts[key] = None  # captures of two expert counts: the excess alone
        route_fixed(torch.tensor([[0, 6], [-1, 3]]), 4)
        assert "min -1, up to 3 past the last expert" in str(moe_routing.check_replays())
    finally:
        moe_routing._captured_on.discard(key)
        moe_routing._captured_experts.pop(key, None)


def test_loading_the_fixed_routing_runs_none_of_its_kernels(monkeypatch):
    """route_fixed and align_tokens with load=True (a captured call's kernels, loaded before the capture) compile and
    load the fixed form's kernels (tilelink.runtime.preload) and launch nothing: an id out of range is not
    recorded, and the blocks stay padding."""
    import sys

    from tilelink.ops import moe_routing

    loaded = []
    monkeypatch.setattr(sys.modules["tilelink.runtime.preload"], "preload", lambda kernel, grid, *args, **kwargs:
                        loaded.append((kernel, grid, kwargs)))
    ids = torch.tensor([[0, 1], [2, 3], [4, 5]])
    route(ids, 6)  # outside a capture first: it makes the device's record
    word = moe_routing._ranges[str(ids.device)]
    bad = ids.clone()
    bad[1, 0] = 9
    fixed = route_fixed(bad, 6, load=True)
    sorted_ids, expert_ids = align_tokens(fixed, 6, 4, load=True)
    assert [(k, grid) for k, grid, _ in loaded] == [(moe_routing.routing_stats_kernel, (6,)),
                                                    (moe_routing.align_kernel, (6,))]
    assert loaded[0][2]["FIXED"] is True
    assert word.tolist() == [0, 0]  # the clamping kernel did not run
    assert (expert_ids == -1).all() and (sorted_ids == 6).all()  # padding only: the alignment did not run
