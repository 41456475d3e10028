"""Probe nvshmemx_putmem_signal_block's illegal addresses with several PEs on one GPU.

Runs the ring of tests/gpu/putmem_kernels.py (which passes as test_put_signal_ring: symmetric dest
and signal addresses, sig_op SET=9 / ADD=10, every module initialised) in fresh 4-rank worlds,
changing one thing each:

* ``no_hook``: module init done by hand on a pe=2 compile only; rank 0's pe == 1 launch runs a
  module Triton specialised separately and nobody initialised;
* ``sig_op_0``: sig_op 0 (not SET=9 nor ADD=10 in this NVSHMEM);
* ``peer_pointer``: the peer's mapped address (peer_table's) as dest instead of the symmetric one.

Usage: python tests/gpu/probe_putmem_signal.py [world_size] > probe.log
"""

from __future__ import annotations

import functools
import sys
import time

from putmem_kernels import ring_put_signal
from ranks import WorldFailed, run_world

CASES = {
    "no_hook": {"hook": False},
    "sig_op_0": {"rounds": ((0, 3),)},
    "peer_pointer": {"dest_mode": "peer_pointer"},
}


def _summary(text: str) -> str:
    keep = [line for line in str(text).splitlines()
            if any(w in line for w in ("rank ", "Error", "error", "illegal", "returned nothing", "Timeout"))]
    return "\n    ".join(keep[:24])


def main() -> None:
    world_size = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    for name, kwargs in CASES.items():
        start = time.monotonic()
        try:
            results = run_world(functools.partial(ring_put_signal, wait_s=8.0, **kwargs), world_size, timeout=45)
            verdict = "completed: " + "; ".join(
                f"r{o['rank']} pe={o['pe']} sig={o['signal_from_prev']} data_ok={o['data_ok']} "
                f"modules={o['modules_after']}" for o in results)
        except WorldFailed as exc:
            verdict = "FAILED:\n    " + _summary(exc)
        print(f"[probe {name}] ({time.monotonic() - start:.1f} s) {verdict}", flush=True)


if __name__ == "__main__":
    main()
