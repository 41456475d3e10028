"""Reduce-scatter producer: the kernel's stores are partial sums reduced across ranks (paper Fig. 4).

Spec: ``tilelink.reduce_scatter("c_ptr", dim=0)``. Rank ``r`` passes its output shard (rows
``[r*ceil(M/R), min(M, (r+1)*ceil(M/R)))`` of the summed result); every other argument is the full
problem's. The kernel itself writes the full partial result into a symmetric buffer.

Rewrite of the user's kernel (the producer):
- after each store to the tensor, count the elements the tile stored in each channel it overlaps
  and notify those channels (``producer_tile_notify``, release). A channel is complete when its
  count reaches ``rows(channel) * row_elems`` per call, whatever the producer's tile sizes, so
  autotuning the kernel never changes the consumer;
- rotate the tile index so that each rank starts with the rows the next rank reduces first
  (``order="ring"``), spreading the consumers' first waits over different producers;
- add the channel parameters (``tlk_*``).

Partner kernels (the consumer), chosen by ``via``:
- ``sm`` (``mode="pull"``, the default): :func:`rs_pull_consumer` on ``comm_sms`` programs pulls, for
  each of this rank's channels, every rank's partial rows once they are notified (full-mesh pull, ring
  start), sums them (and each token's top-k expert slots for MoE) in fp32 and writes this rank's
  output shard;
- ``sm`` with ``mode="push"``: :func:`rs_ring_consumer`, the ring of the paper's Figure 4 (partial sums
  travel rank to rank, each adding its own, with peer_tile_wait / peer_tile_notify between them);
- ``copy_engine`` (the paper's hybrid): the host copies each finished channel into the receive slot
  of the rank that owns it and flags it; :func:`rs_reduce_received` sums what arrived and this rank's
  own rows (read where the GEMM wrote them, not copied), on every SM (``REDUCE_PROGRAMS_PER_SM``
  programs each: it starts after the GEMM's last tile). With ``topk=`` (MoE) a third kernel comes first,
  :func:`rs_topk_reduce`, behind the GEMM on every SM: it sums each token's top-k expert slots channel by
  channel (the copy engine's order) and flags each channel, so the copy engine moves a token's one summed row
  instead of its top-k slot rows (``1 / topk`` of the bytes) while the next channel is summed.
"""

from tilelink.rules.reduce_scatter.rewrite import DEFAULTS, RULE, rewrite

__all__ = ["DEFAULTS", "RULE", "rewrite"]
