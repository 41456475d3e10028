"""All-reduce producer: the kernel's stores are partial sums, summed across ranks onto every rank.

Spec: ``tilelink.all_reduce("c_ptr", dim=0)``. Every rank passes the whole output and every other argument of
the full problem, and computes the whole (M, N) partial result from its slice of the reduced dimension (a
row-parallel linear layer's K slice). The kernel itself writes that partial result into a symmetric buffer.

Rewrite of the user's kernel (the producer): the reduce-scatter's (:mod:`tilelink.rules.reduce_scatter`) -- after
each store, the count of the elements it stored in each channel it overlaps, notified to those channels; the
tile order rotated (``order="ring"``); the channel parameters added.

Partner kernels (the reduction, on ``comm_sms`` programs, pulling the peers' rows), by ``all_reduce(...,
mode=...)``, or chosen by the message's size when it is left out (:func:`launcher.choose_mode`):
- ``one_shot``: :func:`ar_pull_reduce` over every channel: each rank pulls every peer's partial rows once they
  are notified and sums them (the fewest steps: small messages, decode);
- ``two_shot``: :func:`ar_pull_reduce` over this rank's channels (a reduce-scatter), writing the sums into a
  symmetric buffer too and flagging each channel, then :func:`ar_gather_rows` pulls the other ranks' summed
  channels as their flags complete (an all-gather): each rank reads ``2 (R - 1) / R`` of the message instead
  of ``R - 1`` times it.
Every rank sums the ranks in rank order: the result is the same to the bit on every rank.
"""

from tilelink.rules.all_reduce.rewrite import DEFAULTS, RULE, rewrite

__all__ = ["DEFAULTS", "RULE", "rewrite"]
