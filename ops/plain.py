"""The plain path of the operators (``path="plain"``): cuBLAS (``torch.matmul``) and a ``torch.distributed``
collective of the same bytes, nothing overlapped.

The collectives run on the world's process group: on a GPU an NCCL group of the world's ranks, created once per
world on the first plain call (every rank makes that call, in the same order, since the path is chosen alike on
every rank); in the emulated world, and for ranks sharing one GPU (which NCCL refuses), the world's gloo group.
Rows are split as the overlapped operators split them (:func:`tilelink.mapping.shard_range`): the last rank's
shorter shard is padded to the ranks' equal blocks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tilelink.errors import LaunchError
from tilelink.mapping import shard_range

_nccl_groups: dict[tuple, object] = {}


def group(world) -> tuple[object, bool]:
    """The process group of the plain path's collectives (see the module docstring), and whether tensors go
    through host memory for it: ranks sharing a GPU (more ranks than GPUs on a host) cannot form an NCCL group,
    so they run the world's gloo group on host copies."""
    base = world.group if world.group is not None else dist.group.WORLD
    if world.device.type != "cuda" or dist.get_backend(base) == "nccl":
        return base, False
    # the control's prefix names this world alone (its init): an id could be a finalized world's, whose group
    # went with its process group
    key = (world.session, world.control.prefix)
    if key not in _nccl_groups:
        import socket

        # every rank makes this call (the path is chosen alike on every rank): one exchange, the same answer
        device = str(getattr(torch.cuda.get_device_properties(world.device), "uuid", world.device.index))
        places = world.control.exchange((socket.gethostname(), device), "plain path group")
        if len(set(places)) < len(places):
            _nccl_groups[key] = None
        else:
            ranks = list(world.ranks) if world.ranks else list(range(world.world_size))
            # only this world's ranks call it (a data x tensor parallel job's other groups do not)
            _nccl_groups[key] = dist.new_group(ranks=ranks, backend="nccl", use_local_synchronization=True)
    nccl = _nccl_groups[key]
    if nccl is None and torch.cuda.is_current_stream_capturing():
        raise LaunchError("the plain path (cuBLAS + a torch.distributed collective) cannot be captured in a CUDA "
                          "graph here: ranks that share a GPU cannot form an NCCL group, and its gloo collective "
                          "goes through host copies; pass path=\"overlap\" to the operator (or set "
                          "TILELINK_PATH=overlap) for the captured calls, or give each rank its own GPU")
    return (base, True) if nccl is None else (nccl, False)


def all_gather_rows(shard: torch.Tensor, M: int, world) -> torch.Tensor:
    """The (M, ...) tensor whose rows ``shard_range(M, r, R)`` rank ``r`` holds."""
    R = world.world_size
    if R == 1:
        return shard
    per = -(-M // R)
    pg, staged = group(world)
    padded = shard
    if staged or shard.shape[0] != per or not shard.is_contiguous():
        padded = shard.new_zeros((per, *shard.shape[1:]), device="cpu" if staged else shard.device)
        padded[:shard.shape[0]] = shard
    full = padded.new_empty((R * per, *shard.shape[1:]))
    dist.all_gather_into_tensor(full, padded, group=pg)
    return full[:M].to(shard.device)


def reduce_scatter_rows(partial: torch.Tensor, world) -> torch.Tensor:
    """This rank's rows (``shard_range``) of the sum over ranks of ``partial`` (M, ...)."""
    R, M = world.world_size, partial.shape[0]
    if R == 1:
        return partial
    per = -(-M // R)
    pg, staged = group(world)
    padded = partial
    if staged or M != R * per or not partial.is_contiguous():
        padded = partial.new_zeros((R * per, *partial.shape[1:]), device="cpu" if staged else partial.device)
        padded[:M] = partial
    out = padded.new_empty((per, *partial.shape[1:]))
    dist.reduce_scatter_tensor(out, padded, group=pg)
    lo, hi = shard_range(M, world.rank, R)
    return out[:hi - lo].to(partial.device)


def all_reduce(partial: torch.Tensor, world) -> torch.Tensor:
    """The sum over ranks of ``partial``, on every rank."""
    if world.world_size == 1:
        return partial
    pg, staged = group(world)
    buf = partial.to("cpu", copy=True) if staged else partial.contiguous()
    dist.all_reduce(buf, group=pg)
    return buf.to(partial.device)


def gemm_ar(a: torch.Tensor, b_shard_rows: torch.Tensor, world) -> torch.Tensor:
    """The sum over ranks of A_r @ B_r, on every rank (GEMM + all-reduce's plain path)."""
    return all_reduce(torch.matmul(a, b_shard_rows), world)


def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, M: int, world) -> torch.Tensor:
    """AllGather(A) @ B: the gathered (M, K) A times this rank's (K, N) B."""
    return torch.matmul(all_gather_rows(a_shard, M, world), b)


def gemm_rs(a: torch.Tensor, b_shard: torch.Tensor, world) -> torch.Tensor:
    """This rank's rows of the sum over ranks of A_r @ B_r."""
    return reduce_scatter_rows(torch.matmul(a, b_shard), world).contiguous()


def sp_attention(q_shard: torch.Tensor, k_shard: torch.Tensor, v_shard: torch.Tensor, S: int, causal: bool,
                 world) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence: K and V gathered (sequence-major, one block of rows
    a rank), then SDPA; causal by global position."""
    B, H, rows, D = q_shard.shape
    lo, _ = shard_range(S, world.rank, world.world_size)
    k, v = (all_gather_rows(t.permute(2, 0, 1, 3).contiguous(), S, world).permute(1, 2, 0, 3)
            for t in (k_shard, v_shard))
    if rows == 0:
        return torch.empty(q_shard.shape, dtype=q_shard.dtype, device=q_shard.device)
    group = H // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = None
    if causal:  # this rank's query at global position lo + i sees the keys up to it
        pos = torch.arange(lo, lo + rows, device=q_shard.device)
        mask = torch.arange(S, device=q_shard.device)[None, :] <= pos[:, None]
    return torch.nn.functional.scaled_dot_product_attention(q_shard, k, v, attn_mask=mask)
