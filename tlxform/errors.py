"""Every error TileLink raises. Each names what went wrong and what to do about it."""

from __future__ import annotations


class TileLinkError(Exception):
    """Base class of all TileLink errors."""


class NotInitializedError(TileLinkError):
    """A runtime call was made before ``tilelink.init()`` (or after ``finalize()``)."""


class SymmetricHeapError(TileLinkError):
    """A tensor that must live on the symmetric heap does not, or was already freed."""


class WorldMismatchError(TileLinkError):
    """Ranks disagree (world size, shapes, dtypes) or a context belongs to another world."""


class LaunchError(TileLinkError):
    """Arguments of an overlapped launch are invalid (shape, dtype, device, layout)."""


class PlanError(TileLinkError):
    """A rewrite's launch plan is incomplete or inconsistent: a field missing, unknown, or of the wrong kind."""


class AnnotationError(TileLinkError):
    """The ``@tilelink.overlap`` annotation cannot be applied to a kernel.

    The message names the user's file, line and column and says what to write instead.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 column: int | None = None, hint: str | None = None) -> None:
        self.file, self.line, self.column, self.hint = file, line, column, hint
        self.reason = message
        where = ""
        if file is not None:
            where = f"{file}:{line if line is not None else '?'}"
            if column is not None:
                where += f":{column}"
            where += ": "
        text = f"{where}{message}"
        if hint:
            text += f"\n  what to do: {hint}"
        super().__init__(text)


class WaitTimeout(TileLinkError):
    """A device-side wait spun past its budget: a notify it depends on never came.

    Attributes name the rank that waited, the primitive, the channel or tile index,
    the value it waited for and the last value it saw.
    """

    def __init__(self, *, rank: int, primitive: str, index: int, expected: int, seen: int,
                 budget_s: float, kernel: str | None = None) -> None:
        self.rank, self.primitive, self.index = rank, primitive, index
        self.expected, self.seen, self.budget_s, self.kernel = expected, seen, budget_s, kernel
        where = f" in kernel {kernel}" if kernel else ""
        # part of the count came: the producers ran, and stored fewer elements than the channel's rows hold
        short = (" It saw part of the count: if every rank launched, their stores cover less than the channel's "
                 "rows. Under reduce_scatter or all_reduce a channel completes when every element of its rows is "
                 "stored on every rank, so an output wider than the columns the kernel stores (a padded row), a "
                 "store mask narrower than the row, a `return` before the store or a grid short of the tiles "
                 "never completes it: store every element of the output's rows (zeros where need be), or pass an "
                 "output exactly as wide as what is stored." if 0 < seen < expected else "")
        super().__init__(
            f"rank {rank}: {primitive} on channel/tile {index}{where} waited {budget_s:g} s for value "
            f">= {expected} but saw {seen}. A producer never notified it: check that every rank "
            f"launched the same operator with the same shapes, and that no rank failed earlier.{short} "
            f"Raise the budget with TILELINK_WAIT_TIMEOUT=<seconds> if the producer is just slow."
        )
        self.spoiled_calls = 0

    def spoiled(self, calls: int, replays: bool = False) -> None:
        """Say that the ``calls`` last calls on this rank returned results computed past this wait: a GPU's record
        is read behind the kernels, a few calls after the one that timed out. ``replays``: the wait ran in a
        replay of a captured call, and which replays came after it is not known (``spoiled_calls`` is None)."""
        if replays:
            self.spoiled_calls = None
            self.args = (f"{self.args[0]} The wait ran in a replay of a captured call: the replays since the last "
                         f"uncaptured check on rank {self.rank} may have computed past it; discard their results.",)
            return
        self.spoiled_calls = calls
        if calls <= 0:
            return
        what = f"the last {calls} calls" if calls > 1 else "the last call"
        self.args = (f"{self.args[0]} The wait is read a few calls after it happens: {what} of this operator on "
                     f"rank {self.rank} returned results that may be computed past it; discard them. "
                     f"TILELINK_CHECK_WAITS=each reads the waits at every call before it returns (a device "
                     f"synchronisation per call).",)
