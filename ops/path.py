"""``path=``: which way an operator runs a call, the overlapped kernels or the plain path.

``"overlap"``: TileLink's overlapped kernels. ``"plain"``: the vendor compute and a ``torch.distributed``
collective of the same bytes (:mod:`tilelink.ops.plain`). ``"auto"`` (the default): the cost model
(:mod:`tilelink.cost`) decides from what every rank shares, so every rank takes the same path:

- the shared sizes and the dtype (the same on every rank by the operators' contract);
- a rank's own sizes (``ag_gemm``'s N, ``gemm_rs``'s K) are exchanged once per new shared shape and the
  largest taken; the decision is then kept for that shared shape, on every rank alike;
- the world size and the calibration (``$TILELINK_CALIBRATION`` or the shipped one);
- ``$TILELINK_PATH`` and ``$TILELINK_CALIBRATION`` are read on each rank: the same exchange carries them (also
  when ``$TILELINK_PATH`` forces a path), and ranks whose settings differ raise instead of parting ways.

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

from tilelink.cost import PATHS
from tilelink.errors import LaunchError
from tilelink.runtime.settings import setting

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
    if path not in PATHS:
        raise LaunchError(f"{op}: path={path!r} is not one of {', '.join(map(repr, PATHS))} (auto: the cost model "
                          f"picks the overlapped kernels or cuBLAS + a torch.distributed collective)")


def _modelled(world) -> bool:
    return world.device.type == "cuda" or bool(setting("TILELINK_CALIBRATION"))


def _settings() -> tuple[str, str]:
    """What of this rank's environment feeds an automatic choice: ``$TILELINK_PATH`` and ``$TILELINK_CALIBRATION``,
    read at each call (a change takes effect at the next)."""
    return setting("TILELINK_PATH").strip().lower(), setting("TILELINK_CALIBRATION")


def select(op: str, path: str, world, shared: dict, own: dict, dtype) -> str:
    """The path this call takes: ``"overlap"`` or ``"plain"``. Collective when ``path="auto"`` meets a shared
    shape for the first time in a world of several ranks: one exchange of ``own`` and of the settings read from
    the environment, which must be alike on every rank (a rank taking the plain path's collective while its peers
    wait in the overlapped kernels would hang them)."""
    check(op, path)
    if path != "auto":  # the environment does not count
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s over %d ranks: %s (forced)", op, shared | own, world.world_size, path)
        return path
    forced, calibration = _settings()
    if forced not in ("", "auto", "overlap", "plain"):
        raise LaunchError(f"{op}: TILELINK_PATH={os.environ['TILELINK_PATH']!r} is not one of auto, overlap, plain "
                          f"(the path of every call that does not pass path=); unset it for auto")
    if world.world_size == 1:
        return forced if forced in ("overlap", "plain") else "overlap"
    # the control's prefix names this world alone (its init); an id could be a finalized world's, and a rank whose
    # new control took it would skip the exchange its peers make
    key = (world.session, world.control.prefix, world.world_size, op, tuple(sorted(shared.items())), str(dtype),
           forced, calibration)
    chosen = _choices.get(key)
    if chosen is not None:
        return chosen
    # every rank exchanges, forced or not: a setting of one rank alone must not send it down another path
    values = world.control.exchange((*own.values(), forced, calibration), f"{op} path")
    settings = [tuple(v[len(own):]) for v in values]
    if any(s != settings[0] for s in settings):
        listing = "; ".join(f"rank {r}: TILELINK_PATH={s[0]!r}, TILELINK_CALIBRATION={s[1]!r}"
                            for r, s in enumerate(settings))
        raise LaunchError(f"{op}: the ranks would choose the path from different settings ({listing}): set "
                          f"TILELINK_PATH and TILELINK_CALIBRATION alike on every rank, or pass path= to the call")
    if forced in ("overlap", "plain"):
        log.debug("%s %s over %d ranks: %s (forced)", op, shared | own, world.world_size, forced)
        _choices[key] = forced
        return forced
    if not _modelled(world):
        _choices[key] = "overlap"
        return "overlap"
    from tilelink import cost

    # a rank's own sizes: every rank decides from the widest
    widest = {name: max(v[i] for v in values) for i, name in enumerate(own)}
    choice = cost.decide(op, {**shared, **widest}, world.world_size, dtype=dtype)
    _choices[key] = choice.path
    log.debug("%s %s over %d ranks: %s; %s", op, shared | widest, world.world_size, choice.path, choice.why)
    return choice.path


def forget() -> None:
    """Forget every decision kept (a new calibration then decides again)."""
    _choices.clear()
