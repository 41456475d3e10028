"""Rank functions of the process-group tests (``tests/runtime/test_groups.py``, ``tests/gpu/test_groups_gpu.py``):
a job of several TileLink worlds, one per ``torch.distributed`` group, each running its operators at the same
time as the others. Each group multiplies matrices of its own (seeded by its ranks), so rows that crossed from
another group would show in the error."""

from __future__ import annotations

import time

import torch

import tilelink
from tilelink import runtime


def _bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per)


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double().cpu() - ref).norm() / max(ref.norm().item(), 1e-30)).item() if ref.numel() else 0.0


def _ops_errors(M: int, N: int, K: int, dtype: torch.dtype, calls: int) -> dict[str, float]:
    """``ag_gemm`` and ``gemm_rs`` on this world, ``calls`` times with new data: the worst error of each against
    torch on the whole problem of this group."""
    from tilelink.ops import TPContext, ag_gemm, gemm_rs

    world = runtime.current_world()
    r, R = tilelink.rank(), tilelink.world_size()
    lo, hi = _bounds(M, r, R)
    klo, khi = _bounds(K, r, R)
    errors = {"ag_gemm": 0.0, "ag_gemm_ctx": 0.0, "gemm_rs": 0.0}
    for call in range(calls):
        gen = torch.Generator().manual_seed(1000 * (1 + min(world.ranks)) + call)
        a = torch.randn(M, K, generator=gen).to(dtype)
        b = torch.randn(K, N, generator=gen).to(dtype)
        ref = a.double() @ b.double()
        a_dev, b_dev = a.to(world.device), b.to(world.device)
        c = ag_gemm(a_dev[lo:hi].contiguous(), b_dev)
        errors["ag_gemm"] = max(errors["ag_gemm"], _rel(c, ref))
        c = ag_gemm(a_dev[lo:hi].contiguous(), b_dev, TPContext(M))
        errors["ag_gemm_ctx"] = max(errors["ag_gemm_ctx"], _rel(c, ref))
        y = gemm_rs(a_dev[:, klo:khi].contiguous(), b_dev[klo:khi].contiguous())
        assert y.shape == (hi - lo, N), y.shape
        errors["gemm_rs"] = max(errors["gemm_rs"], _rel(y, ref[lo:hi]))
    return errors


def _symmetric_peers() -> list[int]:
    """A symmetric buffer of this world: each rank writes its job rank into its copy; what every peer's copy
    holds, by rank of this world."""
    world = runtime.current_world()
    buffer = runtime.symmetric_zeros((4,), torch.int64)
    buffer.fill_(world.global_rank)
    world.barrier()
    seen = [int(runtime.peer_tensor(buffer, peer)[3].item()) for peer in range(world.world_size)]
    world.barrier()
    runtime.free(buffer)
    return seen


def group_ops(M: int, N: int, K: int, dtype_name: str = "float32", calls: int = 2) -> dict:
    """In a world of a group: who this rank is, what its symmetric buffer's peers hold, and the operators'
    errors."""
    world = runtime.current_world()
    report = {"rank": tilelink.rank(), "world_size": tilelink.world_size(), "global_rank": world.global_rank,
              "ranks": list(world.ranks), "peers": _symmetric_peers()}
    report.update(_ops_errors(M, N, K, getattr(torch, dtype_name), calls))
    return report


def mesh_dims_ops(M: int, N: int, K: int) -> dict:
    """A 2 x 2 DeviceMesh ("dp", "tp") of the job: join TileLink along "tp" (ranks {0, 1} and {2, 3}), run the
    operators, leave; then along "dp" (the interleaved {0, 2} and {1, 3}) the same way. The job starts joined to
    the groups ``spawn`` was given; it leaves them first."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    tilelink.finalize()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    report: dict = {"job_rank": dist.get_rank(), "no_dim": _message(lambda: tilelink.init(mesh=mesh)),
                    "unknown_dim": _message(lambda: tilelink.init(mesh=mesh, mesh_dim="pp"))}
    for dim in ("tp", "dp"):
        world = tilelink.init(mesh=mesh, mesh_dim=dim)
        same = tilelink.init(group=mesh[dim]) is world and tilelink.init() is world
        report[dim] = {"rank": tilelink.rank(), "mesh_rank": mesh.get_local_rank(dim), "ranks": list(world.ranks),
                       "same_world": same, "peers": _symmetric_peers(), **_ops_errors(M, N, K, torch.float32, 1)}
        tilelink.finalize()
    return report


def mesh_dim_ops(M: int, N: int, K: int, dtype_name: str, dim: str) -> dict:
    """A 2 x 2 DeviceMesh ("dp", "tp") of a job already joined to the groups of its dimension ``dim`` (``spawn``'s
    groups): ``init(mesh=mesh, mesh_dim=dim)`` is that world (nothing is started again); its operators run. The
    mesh's device type does not matter to TileLink, which takes the ranks of its groups."""
    from torch.distributed.device_mesh import init_device_mesh

    joined = runtime.current_world()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    world = tilelink.init(mesh=mesh, mesh_dim=dim)
    report = {"same_world": world is joined, "rank": tilelink.rank(), "mesh_rank": mesh.get_local_rank(dim),
              "ranks": list(world.ranks), "peers": _symmetric_peers()}
    report.update(_ops_errors(M, N, K, getattr(torch, dtype_name), 2))
    return report


def _message(call) -> str:
    try:
        call()
    except tilelink.TileLinkError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "NO ERROR"


def init_errors() -> dict[str, str]:
    """A job of 4 ranks joined as the whole job (``spawn`` without groups): a group given now, and a group this
    rank is not in. Returns the messages."""
    import torch.distributed as dist

    first, second = dist.new_group([0, 1]), dist.new_group([2, 3])  # collective: every rank makes both
    mine = first if dist.get_rank() < 2 else second
    other = second if dist.get_rank() < 2 else first
    return {"after_whole_job": _message(lambda: tilelink.init(group=mine)),
            "not_a_member": _message(lambda: tilelink.init(group=other)),
            "whole_job_again": "same" if tilelink.init() is runtime.current_world() else "another world"}


def group_errors() -> dict[str, str]:
    """A job of 4 ranks in groups {0, 1} and {2, 3}: another group asked for while in one; then, after leaving,
    ranks that pass mismatched groups (0 passes {0, 1}, 1 and 3 pass {1, 3}, 2 passes {0, 2}): 0 and 2 are told
    which member joined elsewhere, 1 and 3 make a world of their own. Returns the messages."""
    import torch.distributed as dist

    rank = dist.get_rank()
    made = {ranks: dist.new_group(list(ranks)) for ranks in ((0, 1), (1, 3), (0, 2), (2, 3))}
    report = {"again_same": "same" if tilelink.init(group=made[(0, 1) if rank < 2 else (2, 3)]) is
              runtime.current_world() else "another world",
              "another_group": _message(lambda: tilelink.init(group=made[(0, 2) if rank % 2 == 0 else (1, 3)]))}
    tilelink.finalize()
    chosen = {0: (0, 1), 1: (1, 3), 2: (0, 2), 3: (1, 3)}[rank]
    report["mismatch"] = _message(lambda: tilelink.init(group=made[chosen]))
    if tilelink.is_initialized():
        report["mismatch_world"] = str(list(runtime.current_world().ranks))
        tilelink.finalize()
    return report


def one_group_fails() -> str:
    """Groups {0, 1} and {2, 3}: rank 3 of the job fails while rank 2 waits for it at a barrier; ranks 0 and 1
    go on with barriers of their own group meanwhile (they never hear of it)."""
    world = runtime.current_world()
    if world.global_rank == 3:
        time.sleep(0.3)
        raise ValueError("deliberate failure of rank 3 of the job")
    for _ in range(5 if world.global_rank < 2 else 1):
        world.barrier()
        time.sleep(0.2)
    return "done"
