"""``tilelink.runtime``: world bootstrap, symmetric heap, channels, host primitives, launcher.

The device-side primitives are :mod:`tilelink.language` (``tilelink.runtime.language``); they are
not imported here so that host code does not pull in Triton's interpreter choice early.
"""

from tilelink.runtime.channel import Channel
from tilelink.runtime.diagnostics import Diagnostics, check_diagnostics, wait_timeout_s
from tilelink.runtime.heap import (
    free,
    is_symmetric,
    peer_table,
    peer_tensor,
    symmetric_empty,
    symmetric_zeros,
)
from tilelink.runtime.host import rank_copy_data, rank_notify, rank_wait
from tilelink.runtime.launch import RankFailedError, SpawnTimeout, spawn
from tilelink.runtime.preload import preload
from tilelink.runtime.world import (
    World,
    current_world,
    finalize,
    init,
    is_initialized,
    local_rank,
    rank,
    world_size,
)

__all__ = [
    "Channel",
    "Diagnostics",
    "RankFailedError",
    "SpawnTimeout",
    "World",
    "check_diagnostics",
    "current_world",
    "finalize",
    "free",
    "init",
    "is_initialized",
    "is_symmetric",
    "local_rank",
    "peer_table",
    "peer_tensor",
    "preload",
    "rank",
    "rank_copy_data",
    "rank_notify",
    "rank_wait",
    "spawn",
    "symmetric_empty",
    "symmetric_zeros",
    "wait_timeout_s",
    "world_size",
]
