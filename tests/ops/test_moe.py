"""AG + gather + GroupGEMM, GroupGEMM + scatter + top-k reduce + RS and TPMoE in emulated worlds of 1-4
ranks against a torch loop over experts (fp32, tiny odd shapes), and the errors raised before running.

Routings: random; "skewed" (one expert receives no token, expert 0 most); "one" (every token's first
choice is expert 0).
"""

from __future__ import annotations

import pytest

import tilelink
from tests.ops.moe_worlds import (
    bad_inputs,
    experts_one_after_another,
    hybrid_calls_back_to_back,
    layer_matches_torch,
    parts_match_torch,
    parts_with_sweep_spans,
)


@pytest.mark.parametrize(("world", "M", "kinds", "calls"), [
    (1, 13, ["random", "skewed", "one"], 2),
    pytest.param(2, 11, ["skewed", "one"], 2, marks=pytest.mark.slow),
    pytest.param(3, 10, ["random"], 1, marks=pytest.mark.slow),
    pytest.param(4, 9, ["skewed"], 2, marks=pytest.mark.slow),
])
def test_parts_match_torch(world: int, M: int, kinds: list[str], calls: int) -> None:
    # H=16, I=24 split over the ranks (a rank of world 4 holds 6 columns), E=5 experts, top-2
    for per_rank in tilelink.spawn(parts_match_torch, world, M, 16, 24, 5, 2, kinds, "float32", calls):
        assert set(per_rank) == {f"{p}/{k}" for p in ("ag_moe", "moe_rs") for k in kinds}
        assert all(err < 1e-5 for err in per_rank.values()), per_rank


@pytest.mark.slow
@pytest.mark.parametrize(("world", "M", "H", "inter", "persistent"), [
    (1, 13, 16, 24, True), (2, 11, 16, 24, True), (3, 10, 16, 24, True),
    (3, 10, 16, 10, True),  # columns 4, 4, 2: the last rank's weight rows are not 16 bytes long (padded)
    (3, 9, 16, 2, True),  # columns 1, 1, 0: the last rank has none and still serves its tokens to the others
    (3, 9, 16, 2, False),
    # moe_rs's sweep: intermediate slices 33, 33, 31 (the first two loop over K, the last gathers its rows once),
    # 40 output columns in 3 column tiles of 16, swept in 2 runs (the last one partial)
    (3, 10, 40, 97, True),
])
def test_persistent_kernels_match_torch(world: int, M: int, H: int, inter: int, persistent: bool) -> None:
    # the tensor-descriptor kernels the operators take on a GPU (ag_moe: persistent, expert weights through a
    # tensor descriptor, the gather on the copy engine; moe_rs: the column sweep notified once per program),
    # forced here in the interpreter; every rank must take the same kernel whatever its own slice, or the
    # ranks would wait on different protocols
    from tilelink.ops import moe_kernels

    for per_rank in tilelink.spawn(parts_match_torch, world, M, H, inter, 5, 2, ["random", "skewed"], "float32",
                                   2, persistent):
        assert all(err < 1e-5 for err in per_rank.values()), per_rank
    assert moe_kernels.ag_group_gemm_persistent_kernel.plan.launch.via == "copy_engine"


@pytest.mark.slow
def test_moe_rs_sweep_in_spans_across_m_tiles() -> None:
    # the sweep's last wave shared out in spans of column tiles (what a large routing's partial wave takes on a
    # GPU): 40 output columns in 3 column tiles of 16, the M tiles after the first in spans of 2, so spans
    # cross from one M tile into the next; 2 ranks (each notifies the rows it scattered), random and skewed
    for per_rank, plans in tilelink.spawn(parts_with_sweep_spans, 2, 2, 13, 40, 24, 5, 2, ["random", "skewed"],
                                          "float32", 2, True):
        assert all(err < 1e-5 for err in per_rank.values()), per_rank
        assert plans and all(p == (1, 1, 3, 2) for p in plans), plans


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [True, False])
def test_no_hidden_size_and_a_rank_without_columns(persistent: bool) -> None:
    # H = 0 (K == 0 on every rank) with columns 1, 1, 0: every rank still gathers the same shapes
    for per_rank in tilelink.spawn(parts_match_torch, 3, 7, 0, 2, 3, 2, ["random"], "float32", 1, persistent):
        assert set(per_rank) == {"ag_moe/random", "moe_rs/random"} and all(e == 0.0 for e in per_rank.values())


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_hybrid_calls_back_to_back_with_new_data(world: int) -> None:
    # no barrier between calls: each call's receive slots by its parity; every call's own data checked
    for errors in tilelink.spawn(hybrid_calls_back_to_back, world, 13, 24, 20, 4, 2, 4):
        assert len(errors) == 8 and all(e < 1e-5 for e in errors), errors


@pytest.mark.slow
def test_top1_all_tokens_on_one_expert() -> None:
    for per_rank in tilelink.spawn(parts_match_torch, 2, 7, 16, 16, 3, 1, ["one"], "float32", 1):
        assert all(err < 1e-5 for err in per_rank.values()), per_rank


@pytest.mark.slow
@pytest.mark.parametrize(("world", "shared"), [(1, False), (2, True), (3, False)])
def test_tp_moe_matches_torch(world: int, shared: bool) -> None:
    for err in tilelink.spawn(layer_matches_torch, world, 11, 16, 24, 4, 2, shared):
        assert err < 1e-5


def test_bad_inputs_raise_before_running() -> None:
    (messages,) = tilelink.spawn(bad_inputs, 1)
    assert "NO ERROR" not in messages, messages
    expected = ["top_k=5 is larger than the 4 experts", "outside [0, 4)", "integer tensor", "expects hidden size 16",
                "different dtypes", "must hold rows [0, 6)", "3-D", "one row per slot", "shape of topk_ids",
                "contiguous", "topk_ids is on meta", "routing was made for 5 experts, not 4"]
    for message, words in zip(messages, expected, strict=True):
        assert words in message and message.startswith(("ag_moe:", "moe_rs:")), (words, message)


def test_persistent_kernel_reads_each_experts_weights_only() -> None:
    # K = 20 is not a multiple of BLOCK_K = 16: the last K step of a tile must read zeros past its
    # expert's rows, not the next expert's (0 * inf would be NaN)
    import torch

    from tilelink.ops.moe import grouped_gemm
    from tilelink.ops.moe_routing import align_tokens

    E, K, N, M, top_k = 3, 20, 16, 9, 1
    g = torch.Generator().manual_seed(5)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(E, K, N, generator=g)
    w[1] = float("inf")  # no token is routed to expert 1
    topk_ids = torch.zeros(M, top_k, dtype=torch.int64)
    topk_ids[::2] = 2
    meta = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    sorted_ids, expert_ids = align_tokens(topk_ids, E, meta["BLOCK_M"])
    out = torch.full((M * top_k, N), float("nan"))
    okernel, grid, args, launch_meta = grouped_gemm("ag_moe", x, w, out, None, sorted_ids, expert_ids, M * top_k, top_k,
                                                    meta, persistent=True)
    okernel.kernel[grid](*args, **launch_meta)
    ref = torch.stack([x[t] @ w[topk_ids[t, 0]] for t in range(M)])
    assert torch.allclose(out, ref, atol=1e-4), (out - ref).abs().max()


def test_persistent_kernel_splits_its_last_wave() -> None:
    # 3 M tiles (24 + 16 tokens, 16-row tiles) x 2 N tiles = 6 tiles on the interpreter's 4 programs: one
    # wave, then the last 2 tiles as two 8-column pieces each; as written and rewritten (channels satisfied)
    import torch

    from tilelink.ops.moe import grouped_gemm
    from tilelink.ops.moe_routing import align_tokens

    E, K, N, M, top_k = 2, 24, 32, 40, 1
    g = torch.Generator().manual_seed(6)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(E, K, N, generator=g)
    topk_ids = torch.zeros(M, top_k, dtype=torch.int64)
    topk_ids[24:] = 1
    meta = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    sorted_ids, expert_ids = align_tokens(topk_ids, E, meta["BLOCK_M"])
    ref = torch.stack([x[t] @ w[topk_ids[t, 0]] for t in range(M)])
    out = torch.full((M * top_k, N), float("nan"))
    okernel, grid, args, launch_meta = grouped_gemm("ag_moe", x, w, out, None, sorted_ids, expert_ids, M * top_k, top_k,
                                                    meta, persistent=True)
    assert launch_meta["TAIL_SPLIT"] == 2 and grid == (4,)
    assert launch_meta["TAIL_STAGES"] == 4  # the pieces' own pipeline: 3 * (16 + 16) // (16 + 8) stages
    for kernel, extra in ((okernel.kernel, {}),
                          (getattr(okernel.module, okernel.name), okernel.launcher.satisfied_args(M, 2, x.device))):
        out.fill_(float("nan"))
        kernel[grid](*args, **launch_meta, **extra)
        assert torch.allclose(out, ref, atol=1e-4), (out - ref).abs().max()


def test_persistent_kernel_keeps_its_pipeline_depth_without_pieces() -> None:
    # 2 M tiles x 2 N tiles = 4 tiles on the interpreter's 4 programs: one whole wave, no pieces, and no
    # explicit depth for the pieces' loop (Triton 3.6 would then keep both loops' buffers apart on a GPU)
    import torch

    from tilelink.ops.moe import grouped_gemm
    from tilelink.ops.moe_routing import align_tokens

    E, K, N, M = 2, 16, 32, 32
    x, w = torch.randn(M, K), torch.randn(E, K, N)
    topk_ids = (torch.arange(M) >= 16).long()[:, None]
    meta = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    sorted_ids, expert_ids = align_tokens(topk_ids, E, meta["BLOCK_M"])
    out = torch.empty(M, N)
    _, grid, _, launch_meta = grouped_gemm("ag_moe", x, w, out, None, sorted_ids, expert_ids, M, 1, meta,
                                           persistent=True)
    assert launch_meta["TAIL_SPLIT"] == 1 and "TAIL_STAGES" not in launch_meta and grid == (4,)


def test_last_wave_pieces_pipeline_deeper_in_the_same_shared_memory() -> None:
    from tilelink.ops.moe import TAIL_STAGES, tail_stages

    def meta(bm, bn, stages, split):
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_stages=stages, TAIL_SPLIT=split)
    assert tail_stages(meta(128, 256, 4, 4)) == TAIL_STAGES == 6  # 128x64 pieces: 8 would fit, 6 is the most
    assert tail_stages(meta(128, 256, 4, 2)) == 6  # 128x128 pieces: 4 * 384 // 256
    assert tail_stages(meta(64, 512, 3, 2)) == 5  # 64x256 pieces: 3 * 576 // 320
    assert tail_stages(meta(128, 256, 4, 1)) is None  # whole tiles: the kernel's own depth
    assert tail_stages(meta(128, 256, 8, 2)) is None  # the kernel's own depth is deeper already


def test_sweep_plan_fills_the_waves() -> None:
    # the column sweep's runs: whole sweeps while they fill the SMs; a last, partial wave cut in more runs
    from tilelink.ops.moe import SWEEP_OVERHEAD, sweep_plan, sweep_programs

    assert sweep_plan(132, 132, 64) == (132, 1, 1, 1)  # MoE-4 at world 8: one wave of whole sweeps
    assert sweep_plan(144, 132, 64) == (132, 1, 66, 6)  # MoE-5: 12 tiles left, each in 11 runs of 6 columns
    assert sweep_programs(144, (132, 1, 66, 6)) == 264
    # MoE-6 (random routing): 75 left, no room for a second run of each; their 4800 column tiles in spans of 37
    assert sweep_plan(339, 132, 64) == (264, 1, 64, 37)
    assert sweep_programs(339, (264, 1, 64, 37)) == 264 + 130
    assert sweep_plan(320, 132, 64) == (264, 1, 64, 32)  # MoE-6 (equal counts): 56 left, in 2 runs each
    assert sweep_plan(100, 132, 64) == (100, 1, 1, 1)  # one wave
    assert sweep_plan(140, 132, 3) == (132, 1, 3, 1)  # no more runs than column tiles
    assert sweep_plan(117, 116, 64, most=1) == (116, 1, 64, 1)  # 1 tile left: one program per column tile

    def model(tiles: int, plan: tuple[int, int, int, int], programs: int, n: int = 64) -> float:
        body, body_runs, width, span = plan
        t = -(-body * body_runs // programs) * (SWEEP_OVERHEAD + 1 / body_runs)
        if tiles == body:
            return t
        spans = -(-(tiles - body) * width // span)
        return t + -(-spans // programs) * ((1 if width % span == 0 else 2) * SWEEP_OVERHEAD + span / n)

    for tiles in range(1, 400, 7):  # every M tile once, and never slower by the model than whole sweeps
        plan = sweep_plan(tiles, 132, 64)
        body, body_runs, width, span = plan
        assert 0 < body <= tiles and body_runs >= 1 and width >= 1 and span >= 1, (tiles, plan)
        if body < tiles:  # every column tile of the tail in some span, no span longer than a tile's columns
            assert width >= 64 and span <= 64, (tiles, plan)
        assert model(tiles, plan, 132) <= model(tiles, (tiles, 1, 1, 1), 132) + 1e-9, (tiles, plan)


@pytest.mark.parametrize("plan", [None, "tail", (1, 1, 3, 2), (0, 1, 3, 2), (2, 1, 3, 2)])
def test_sweep_kernel_as_written_and_rewritten_matches_torch(plan, monkeypatch) -> None:
    # moe_rs's column sweep in one process: 3 M tiles x 3 column tiles (40 columns, the last tile partial)
    # rows gathered once (K = 24) and per K step (K = 40); rewritten with every channel satisfied. Every M
    # tile in 2 runs, or (plan "tail", on 2 programs) 2 tiles swept whole and the last in 2 runs (a width of
    # 4 column tiles, the 4th empty), or a plan given: spans of 2 column tiles over the M tiles after the
    # first (one span crosses from the 2nd M tile into the 3rd), over all three (the last span is clipped),
    # over the last M tile alone
    import torch

    from tilelink.ops.moe import grouped_gemm, sweep_config
    from tilelink.ops.moe_routing import align_tokens

    E, N, M, top_k = 3, 40, 20, 2
    g = torch.Generator().manual_seed(7)
    topk_ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(M)])
    weights = torch.rand(M * top_k, generator=g)
    if plan == "tail":
        import tilelink.ops.tp as tp

        monkeypatch.setattr(tp, "_compute_sms", lambda device, kernel: 2)
    elif plan is not None:
        import tilelink.ops.moe as moe

        monkeypatch.setattr(moe, "sweep_plan", lambda m_tiles, programs, n_tiles: plan)
    from tilelink.ops import moe_kernels

    pull = sm_pull_sweep(moe_kernels.group_gemm_rs_sweep_kernel)
    for K in (24, 40):
        h = torch.randn(M * top_k, K, generator=g)
        w = torch.randn(E, K, N, generator=g)
        meta = sweep_config(K)
        if plan is not None:
            meta = {**meta, "N_CHUNKS": None}
        assert meta["ONE_K"] == (K == 24)
        sorted_ids, expert_ids = align_tokens(topk_ids, E, meta["BLOCK_M"])
        m_tiles = sorted_ids.numel() // 16
        ref = torch.stack([h[s] @ w[topk_ids.flatten()[s]] for s in range(M * top_k)]) * weights[:, None]
        out = torch.full((M * top_k, N), float("nan"))
        okernel, grid, args, launch_meta = grouped_gemm("moe_rs", h, w, out, weights, sorted_ids, expert_ids,
                                                        M * top_k, top_k, meta, persistent=True)
        if plan is None:  # a fixed number of runs must be a positive int
            for bad in (0, -1, 1.5):
                with pytest.raises(tilelink.LaunchError, match="N_CHUNKS must be a positive int"):
                    grouped_gemm("moe_rs", h, w, out, weights, sorted_ids, expert_ids, M * top_k, top_k,
                                 {**meta, "N_CHUNKS": bad}, persistent=True)
        if plan == "tail":
            assert m_tiles == 3 and args[-5:] == (3, 2, 1, 4, 2) and grid == (4,), (m_tiles, args[-5:], grid)
        elif plan is not None:
            assert m_tiles == 3 and args[-5:] == (3, *plan), args[-5:]
            assert grid == (plan[0] + -(-(3 - plan[0]) * 3 // 2),), grid
        else:
            assert args[-5:] == (m_tiles, m_tiles, 2, 1, 1) and grid == (m_tiles * 2,)
        assert "N_CHUNKS" not in launch_meta
        # as written; rewritten as the operator's (the hybrid with top-k: no notify, the top-k reduce follows it
        # on its stream); and rewritten for the SM pull, whose notifies count the swept, spanned stores
        for kernel, counted in ((okernel.kernel, None), (getattr(okernel.module, okernel.name), False),
                                (pull, True)):
            extra = {} if counted is None else okernel.launcher.satisfied_args(M, 2, h.device)
            out.fill_(float("nan"))
            kernel[grid](*args, **launch_meta, **extra)
            assert torch.allclose(out, ref, atol=1e-4), (K, (out - ref).abs().max())
            if counted is not None:  # each of the 2 channels (a rank's 10 tokens): its tokens' top_k slot rows of N
                added = extra["tlk_barriers"] - (1 << 40)
                assert added.tolist() == ([10 * top_k * N] * 2 if counted else [0, 0]), added


def sm_pull_sweep(okernel):
    """moe_rs's sweep kernel rewritten for the SM pull reduce-scatter (the copy engine's needs no notify)."""
    spec = okernel.plan.spec
    return getattr(tilelink.overlap(spec, channels_per_rank=1)(okernel.kernel).module, okernel.name)


@pytest.mark.slow
def test_layers_with_other_expert_counts_reuse_the_contexts() -> None:
    """Equal shapes, 3 experts then 6: one context per operator serves both (the GPU run loads the second
    kernel variant first, tests/gpu/test_moe_gpu.py; the interpreter has none to load)."""
    for errors, variants in tilelink.spawn(experts_one_after_another, 2, [3, 6], 9, 16, 24, 2):
        assert len(errors) == 4 and all(err < 1e-5 for err in errors.values()), errors
        assert variants == {"ag_group_gemm_persistent_kernel": [0], "group_gemm_rs_sweep_kernel": [0]}
