"""The plain path of the operators (``path="plain"``): cuBLAS (``torch.matmul``) and a ``torch.distributed``
collective of the same bytes, nothing overlapped.

The collectives run on the world's process group: on a GPU an NCCL group of the world's ranks, created once per
world on the first plain call (every rank makes that call, in the same order, since the path is chosen alike on
every rank); in the emulated world the world's gloo group. Rows are split as the overlapped operators split them
(:func:`tilelink.mapping.shard_range`): the last rank's shorter shard is padded to the ranks' equal blocks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tilelink.mapping import shard_range

_nccl_groups: dict[tuple, object] = {}


def group(world):
    """The process group of the plain path's collectives (see the module docstring)."""
    base = world.group if world.group is not None else dist.group.WORLD
    if world.device.type != "cuda" or dist.get_backend(base) == "nccl":
        return base
    key = (world.session, id(world.control))
    if key not in _nccl_groups:
        ranks = list(world.ranks) if world.ranks else list(range(world.world_size))
        # only this world's ranks call it (a data x tensor parallel job's other groups do not)
        _nccl_groups[key] = dist.new_group(ranks=ranks, backend="nccl", use_local_synchronization=True)
    return _nccl_groups[key]


def all_gather_rows(shard: torch.Tensor, M: int, world) -> torch.Tensor:
    """The (M, ...) tensor whose rows ``shard_range(M, r, R)`` rank ``r`` holds."""
    R = world.world_size
    if R == 1:
        return shard
    per = -(-M // R)
    padded = shard
    if shard.shape[0] != per or not shard.is_contiguous():
        padded = shard.new_zeros((per, *shard.shape[1:]))
        padded[:shard.shape[0]] = shard
    full = shard.new_empty((R * per, *shard.shape[1:]))
    dist.all_gather_into_tensor(full, padded, group=group(world))
    return full[:M]


def reduce_scatter_rows(partial: torch.Tensor, world) -> torch.Tensor:
    """This rank's rows (``shard_range``) of the sum over ranks of ``partial`` (M, ...)."""
    R, M = world.world_size, partial.shape[0]
    if R == 1:
        return partial
    per = -(-M // R)
    padded = partial.contiguous()
    if M != R * per:
        padded = partial.new_zeros((R * per, *partial.shape[1:]))
        padded[:M] = partial
    out = partial.new_empty((per, *partial.shape[1:]))
    dist.reduce_scatter_tensor(out, padded, group=group(world))
    lo, hi = shard_range(M, world.rank, R)
    return out[:hi - lo]


def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, M: int, world) -> torch.Tensor:
    """AllGather(A) @ B: the gathered (M, K) A times this rank's (K, N) B."""
    return torch.matmul(all_gather_rows(a_shard, M, world), b)


def gemm_rs(a: torch.Tensor, b_shard: torch.Tensor, world) -> torch.Tensor:
    """This rank's rows of the sum over ranks of A_r @ B_r."""
    return reduce_scatter_rows(torch.matmul(a, b_shard), world).contiguous()
