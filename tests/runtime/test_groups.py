"""TileLink worlds of ``torch.distributed`` groups (``tilelink.init(group=...)``, ``mesh=``/``mesh_dim=``): a job of
4 ranks in two groups of 2, each group's operators and symmetric buffers its own, running at the same time."""

from __future__ import annotations

import pytest

import tilelink
from tests.runtime import group_worlds as worlds
from tilelink import runtime

M, N, K = 10, 8, 12  # 5 rows and 6 of K per rank of a group of 2


# -- no world -----------------------------------------------------------------------------------------------------
def test_init_refuses_what_is_not_a_group():
    with pytest.raises(tilelink.TileLinkError, match=r"mesh_dim='tp'\) needs the DeviceMesh too"):
        tilelink.init(mesh_dim="tp")
    with pytest.raises(tilelink.TileLinkError, match="expected a torch.distributed DeviceMesh, got list"):
        tilelink.init(mesh=[[0, 1], [2, 3]], mesh_dim="tp")
    with pytest.raises(tilelink.TileLinkError, match="expected a torch.distributed ProcessGroup or a 1-D DeviceMesh, "
                                                     "got list"):
        tilelink.init(group=[0, 1])
    assert not tilelink.is_initialized()


def test_spawn_refuses_groups_that_do_not_split_the_job():
    for groups in ([[0, 1], [1, 2]], [[0, 1]], [[0, 1], [2, 3], []], [[0, 1], [2, 5]]):
        with pytest.raises(tilelink.TileLinkError, match="must hold each rank of the 4 once"):
            tilelink.spawn(worlds.group_ops, 4, M, N, K, groups=groups)
    with pytest.raises(tilelink.TileLinkError, match="groups must be a list of lists of ranks"):
        tilelink.spawn(worlds.group_ops, 4, M, N, K, groups=[0, 1, 2, 3])


# -- two groups of a job of 4 ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("groups", [[[0, 1], [2, 3]], [[0, 2], [1, 3]]], ids=["consecutive", "interleaved"])
def test_two_groups_run_their_operators_at_once(groups):
    """Each group's ag_gemm and gemm_rs (two calls each, with and without a context) match torch on the group's
    own matrices; ranks, world sizes and symmetric buffers are the group's."""
    reports = tilelink.spawn(worlds.group_ops, 4, M, N, K, groups=groups)
    for job_rank, report in enumerate(reports):
        group = next(g for g in groups if job_rank in g)
        assert report["global_rank"] == job_rank
        assert (report["rank"], report["world_size"], report["ranks"]) == (group.index(job_rank), 2, group)
        assert report["peers"] == group, report  # each peer copy of the buffer is a member's of this group
        assert all(report[op] < 1e-5 for op in ("ag_gemm", "ag_gemm_ctx", "gemm_rs")), report


@pytest.mark.slow
def test_device_mesh_dimension_is_the_world():
    """A 2 x 2 DeviceMesh ("dp", "tp"): along "tp" the worlds are {0, 1} and {2, 3}, along "dp" {0, 2} and
    {1, 3}; a rank's TileLink rank is its mesh coordinate; group=mesh[dim] and init() give the same world."""
    reports = tilelink.spawn(worlds.mesh_dims_ops, 4, M, N, K, groups=[[0, 1], [2, 3]])
    expected = {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]]}
    for job_rank, report in enumerate(reports):
        assert report["job_rank"] == job_rank
        assert report["no_dim"] == (
            "TileLinkError: tilelink.init: the DeviceMesh has 2 dimensions (dimensions ['dp', 'tp']): pass the one "
            "whose groups are TileLink's worlds, tilelink.init(mesh=mesh, mesh_dim='tp') (the tensor-parallel one), "
            "or a 1-D mesh such as group=mesh['tp']"), report
        assert report["unknown_dim"] == ("TileLinkError: tilelink.init: mesh_dim='pp' is not a dimension of the "
                                         "DeviceMesh; its dimensions are ['dp', 'tp']"), report
        for dim, groups in expected.items():
            group = next(g for g in groups if job_rank in g)
            got = report[dim]
            assert got["rank"] == got["mesh_rank"] == group.index(job_rank), (dim, got)
            assert got["ranks"] == got["peers"] == group, (dim, got)
            assert got["same_world"], (dim, got)
            assert all(got[op] < 1e-5 for op in ("ag_gemm", "ag_gemm_ctx", "gemm_rs")), (dim, got)


@pytest.mark.slow
def test_a_group_given_after_joining_the_whole_job_or_from_outside_is_refused():
    reports = tilelink.spawn(worlds.init_errors, 4)
    for job_rank, report in enumerate(reports):
        mine = [0, 1] if job_rank < 2 else [2, 3]
        assert report["after_whole_job"].startswith("TileLinkError: tilelink is already initialised on the whole "
                                                    f"job (4 ranks), and init was called again for the group of "
                                                    f"ranks {mine}"), report
        assert "call tilelink.finalize() before joining another" in report["after_whole_job"]
        assert report["not_a_member"].startswith(f"TileLinkError: tilelink.init(group=...): this process (rank "
                                                 f"{job_rank} of the job) is not a member of the group"), report
        assert report["whole_job_again"] == "same"


@pytest.mark.slow
def test_ranks_that_pass_different_groups_are_told_which_member_went_elsewhere():
    reports = tilelink.spawn(worlds.group_errors, 4, groups=[[0, 1], [2, 3]])
    for job_rank, report in enumerate(reports):
        assert report["again_same"] == "same"
        joined, asked = [0, 1] if job_rank < 2 else [2, 3], [0, 2] if job_rank % 2 == 0 else [1, 3]
        assert report["another_group"].startswith(f"TileLinkError: tilelink is already initialised on the group of "
                                                  f"ranks {joined}, and init was called again for the group of ranks "
                                                  f"{asked}: a process belongs to one TileLink world at a time"), report
    # rank 0 passed {0, 1}, but 1 passed {1, 3}; rank 2 passed {0, 2}, but 0 passed {0, 1}
    assert reports[0]["mismatch"] == (
        "WorldMismatchError: rank 0 of the job joins TileLink with the group of ranks [0, 1], but rank 1, a member of "
        "it, joined another group (ranks [1, 3]): every rank of a group must pass that same group (the same mesh "
        "dimension) to tilelink.init"), reports[0]
    assert reports[2]["mismatch"].startswith("WorldMismatchError: rank 2 of the job joins TileLink with the group of "
                                             "ranks [0, 2], but rank 0, a member of it, joined another group (ranks "
                                             "[0, 1])"), reports[2]
    for job_rank in (1, 3):  # they agreed with each other
        assert reports[job_rank]["mismatch"] == "NO ERROR" and reports[job_rank]["mismatch_world"] == "[1, 3]"


@pytest.mark.slow
def test_a_failure_is_reported_to_its_own_group():
    """Rank 3 of the job fails while rank 2, its group's other rank, waits for it: rank 2 stops at once naming it
    (both by their ranks in the group and in the job); ranks 0 and 1, the other group, are not told."""
    with pytest.raises(ValueError, match="deliberate failure of rank 3 of the job") as info:
        tilelink.spawn(worlds.one_group_fails, 4, groups=[[0, 1], [2, 3]], timeout=150)
    exc = info.value
    assert isinstance(exc, runtime.RankFailedError) and exc.rank == 3, exc
    text = str(exc)
    assert ("later failures: rank 2: PeerFailedError: rank 0 (rank 2 of the job): rank 1 (rank 3 of the job) failed "
            "(ValueError: deliberate failure of rank 3 of the job)") in text, text
    later = text.split("later failures: ", 1)[1]
    assert "rank 0: " not in later and "rank 1: " not in later, text


@pytest.mark.slow
def test_moe_layer_gathers_its_routing_within_its_group():
    """TPMoE all-gathers the routing of its tokens with torch.distributed: on the interleaved groups, a gather over
    the job's default group would take the other group's tokens too."""
    from tests.ops.moe_worlds import layer_matches_torch

    for err in tilelink.spawn(layer_matches_torch, 4, 11, 16, 24, 4, 2, False, groups=[[0, 2], [1, 3]]):
        assert err < 1e-5
