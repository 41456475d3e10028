"""All-gather consumer: the kernel reads a tensor that is sharded across ranks (paper Fig. 2, §4.1).

Spec: ``tilelink.all_gather("a_ptr", dim=0)``. Rank ``r`` passes its shard (rows
``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))``); every other argument is the full problem's.

Rewrite of the user's kernel (the consumer):
- before the first statement that reads the tensor, in the block where the tile is known, wait for
  the channels holding the tile's rows (``consumer_tile_wait``) and offset the tensor's pointers by
  the wait's token, so software pipelining cannot hoist the loads above the wait (paper §4.2);
- rotate the tile index so that the local shard's tiles come first (``order="local_first"``);
- add the channel parameters (``tlk_*``).

Partner kernels (the producer), chosen by ``via``/``mode``:
- ``sm`` + ``pull``: :func:`ag_pull_producer` copies every peer's channels into the local buffer on
  ``comm_sms`` programs, in ring order, notifying each channel when its rows have landed;
- ``sm`` + ``push``: :func:`ag_push_producer` writes this rank's channels into every peer and
  notifies the peer's barrier (p2p);
- ``copy_engine``: no kernel; the host copies each peer's channels on a side stream and sets the
  barrier word after each copy (``rank_copy_data`` + ``rank_notify``).
"""

from tilelink.rules.all_gather.rewrite import DEFAULTS, RULE, rewrite

__all__ = ["DEFAULTS", "RULE", "rewrite"]
