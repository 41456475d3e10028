"""``path=``: which way an operator runs a call, the overlapped kernels or the plain path.

``"overlap"``: TileLink's overlapped kernels. ``"plain"``: the vendor compute and a ``torch.distributed``
collective of the same bytes (:mod:`tilelink.ops.plain`). ``"auto"`` (the default): the cost model
(:mod:`tilelink.cost`) decides from what every rank shares, so every rank takes the same path:

- the shared sizes and the dtype (the same on every rank by the operators' contract);
- a rank's own sizes (``ag_gemm``'s N, ``gemm_rs``'s K) are exchanged once per new shared shape and the
  largest taken; the decision is then kept for that shared shape, on every rank alike;
- the world size and the calibration (``$TILELINK_CALIBRATION`` or the shipped one).

In the emulated world (Triton's interpreter, no GPU to model) ``auto`` runs the overlapped kernels, unless
``$TILELINK_CALIBRATION`` names a calibration: the emulated world exists to run the kernels.
``$TILELINK_PATH`` (``overlap`` or ``plain``) replaces ``auto`` for every call that does not name a path (the
kernels' own tests and benchmarks take the overlapped kernels whatever the model says). Each decision is
logged under the ``tilelink`` logger at debug level (``TILELINK_LOG=debug`` turns it on), with its
predicted times.
"""

from __future__ import annotations

import logging
import os

from tilelink.errors import LaunchError

log = logging.getLogger("tilelink.path")

_choices: dict[tuple, str] = {}


def _configure_logging() -> None:
    level = os.environ.get("TILELINK_LOG", "").strip().upper()
    if not level:
        return
    root = logging.getLogger("tilelink")
    root.setLevel(getattr(logging, level, logging.DEBUG))
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(handler)


_configure_logging()


def check(op: str, path: object) -> None:
    """Raise :class:`tilelink.LaunchError` unless ``path`` is one of ``auto``, ``overlap``, ``plain``."""
    from tilelink.cost import PATHS

    if path not in PATHS:
        raise LaunchError(f"{op}: path={path!r} is not one of {', '.join(map(repr, PATHS))} (auto: the cost model "
                          f"picks the overlapped kernels or cuBLAS + a torch.distributed collective)")


def _modelled(world) -> bool:
    return world.device.type == "cuda" or bool(os.environ.get("TILELINK_CALIBRATION"))


def select(op: str, path: str, world, shared: dict, own: dict, dtype) -> str:
    """The path this call takes: ``"overlap"`` or ``"plain"``. Collective when ``path="auto"`` meets a shared
    shape for the first time in a world of several ranks (one exchange of ``own``)."""
    check(op, path)
    if path == "auto" and os.environ.get("TILELINK_PATH"):
        path = os.environ["TILELINK_PATH"].strip().lower()
        if path not in ("auto", "overlap", "plain"):
            raise LaunchError(f"{op}: TILELINK_PATH={os.environ['TILELINK_PATH']!r} is not one of auto, overlap, plain "
                              f"(the path of every call that does not pass path=); unset it for auto")
    if path != "auto":
        log.debug("%s %s over %d ranks: %s (forced)", op, shared | own, world.world_size, path)
        return path
    if world.world_size == 1 or not _modelled(world):
        return "overlap"
    from tilelink import cost

    key = (world.session, id(world.control), world.world_size, op, tuple(sorted(shared.items())), str(dtype),
           os.environ.get("TILELINK_CALIBRATION", ""))
    chosen = _choices.get(key)
    if chosen is not None:
        return chosen
    widest = {}
    if own:  # a rank's own sizes: every rank decides from the widest
        sizes = world.control.exchange(tuple(own.values()), f"{op} path")
        widest = dict(zip(own, (max(s[i] for s in sizes) for i in range(len(own))), strict=True))
    choice = cost.decide(op, {**shared, **widest}, world.world_size, dtype=dtype)
    _choices[key] = choice.path
    log.debug("%s %s over %d ranks: %s; %s", op, shared | widest, world.world_size, choice.path, choice.why)
    return choice.path


def forget() -> None:
    """Forget every decision kept (a new calibration then decides again)."""
    _choices.clear()
