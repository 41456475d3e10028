"""Start a world of rank processes on this machine's GPU(s), the way torchrun would.

``run_world(fn, n)`` starts ``n`` processes (multiprocessing *spawn*), each with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` set; several ranks share one GPU
when there are fewer GPUs than ranks. ``mode="backend"`` brings up gloo and a bare
:class:`tilelink.runtime.nvshmem.NvshmemBackend` (no other runtime module involved) and calls
``fn(backend)``; ``mode="tilelink"`` calls ``tilelink.init(backend="nvshmem")`` and ``fn(world)``.
Results come back by rank; a rank's exception comes back as its traceback; a world that outlives
``timeout`` is killed and reported, so a hung test fails instead of hanging the run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback

NO_MULTICAST = {"NVSHMEM_DISABLE_NVLS": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def _child(fn, rank, world_size, port, mode, queue, args):
    os.environ.update(NO_MULTICAST)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "TILELINK_BACKEND": "nvshmem"})
    try:
        import torch.distributed as dist

        if mode == "backend":
            from tilelink.runtime.nvshmem import NvshmemBackend

            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            backend = NvshmemBackend()
            try:
                result = fn(backend, *args)
            finally:
                backend.finalize()
                dist.destroy_process_group()
        else:
            import tilelink

            world = tilelink.init(backend="nvshmem")
            try:
                result = fn(world, *args)
            finally:
                tilelink.finalize()
        queue.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        queue.put((rank, False, traceback.format_exc()))


class WorldFailed(AssertionError):
    """A rank raised, died or the world ran past its time."""


def run_world(fn, world_size: int, *args, mode: str = "backend", timeout: float = 180.0) -> list:
    """Run ``fn`` on every rank of a fresh world; returns the results by rank."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    from tilelink.runtime.launch import free_port

    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, port, mode, queue, args), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, object]] = {}
    deadline = time.monotonic() + timeout
    while len(results) < world_size and time.monotonic() < deadline:
        try:
            rank, ok, value = queue.get(timeout=0.5)
            results[rank] = (ok, value)
        except Exception:  # noqa: BLE001 - queue.Empty
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()) if len(results) == world_size else 1.0)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    failures = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(results.items()) if not ok]
    missing = [r for r in range(world_size) if r not in results]
    if missing:
        codes = {r: procs[r].exitcode for r in missing}
        failures.append(f"ranks {missing} returned nothing within {timeout:g} s (exit codes {codes})")
    if failures:
        raise WorldFailed(f"world of {world_size} failed:\n" + "\n".join(failures))
    return [results[r][1] for r in range(world_size)]
