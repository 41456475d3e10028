"""``tilelink.mapping``: the tile-centric mapping (paper §4.1).

A tile id is mapped to a shape range (``f_S``), a rank (``f_R``) and a channel (``f_C``, one barrier
word). Two kinds:

* **Static mapping** (affine): a dimension of ``M`` rows is row-sharded over ``R`` ranks with ``C``
  channels per rank. :class:`RowSharding` is the Python model; the same integer arithmetic exists as
  ``@triton.jit`` functions (``tl_channel_of_row`` …) for device code.
* **Dynamic mapping** (lookup tables filled at run time, MoE routing): :class:`LookupTables`, built
  with torch ops from a gather index, read on the device with ``tl_table_*``.

The static model
----------------
``rpr = ceil(M / R)`` rows per rank; rank ``r`` holds rows ``[r*rpr, min(M, (r+1)*rpr))`` (the last
ranks may hold fewer rows or none: ``M < R`` is allowed). ``rpc = ceil(rpr / C)`` rows per channel;
channel ``ch = r*C + j`` holds ``[r*rpr + j*rpc, min(rank_hi(r), r*rpr + (j+1)*rpc))``, which may be
empty. Hence ``channel_of_row(row) = (row // rpr) * C + (row % rpr) // rpc`` — monotone in ``row``.

Empty channels. When ``ceil(rpr / rpc) < C`` (e.g. ``rpr = 9, C = 4 -> rpc = 3``) the last channels
of every rank are empty, and they lie *between* the last channel of rank ``r`` and the first of rank
``r + 1`` in channel order. A consumer tile's wait range ``channels_of_rows(lo, hi) -> (first, count)``
is the contiguous channel range ``[channel_of_row(lo), channel_of_row(hi - 1)]`` and so may include
such empty channels. Its first and last channels are never empty, and its non-empty channels are
exactly the channels whose rows the tile reads. A wait on an empty channel must cost nothing:

* counter protocol (reduce-scatter): the target is ``epoch * rows(ch) * N = 0`` — satisfied at once;
* one-notify protocol (all-gather, ``k = 1``): the producer of channel ``ch`` notifies it once per
  call *even when it holds no rows* (it copies nothing, then notifies), so a single target
  ``epoch`` is valid for the whole range; or a waiter uses ``epoch * min(rows(ch), 1)``.

Producer notifications (:meth:`RowSharding.producer_notifies`) never name an empty channel.

Bad input. ``size``, ``world``, ``channels_per_rank``, tile sizes must be >= 1, and
``channels_per_rank <= rows_per_rank`` (every channel of a full rank must be able to hold a row;
``rows_per_rank >= 1`` always since ``size >= 1``). Otherwise :class:`ValueError` says what is wrong
and what to pass instead. :meth:`RowSharding.from_comm_block` picks ``C`` from a row budget.

One definition, two forms
-------------------------
The integer arithmetic is written once, below, as plain Python functions restricted to ``+ - * // %``,
``_min``/``_max``, calls of each other, assignments, tuples and ``return`` (all divisions on
non-negative integers, where Python's floor and Triton's truncation agree). They work on Python ints,
numpy arrays and torch tensors (the Python model). The Triton form is *generated from their source*:
each ``name`` becomes ``tl_<name>`` (``rotate_tile`` becomes ``tl_remap_tile``), ``_min``/``_max``
become ``tl.minimum``/``tl.maximum``, annotations are dropped and ``@triton.jit`` is added.
:func:`emit_source` returns that text for pasting into generated modules; ``tilelink.mapping.tl_*``
are the same functions compiled from it (built on first access, so ``TRITON_INTERPRET`` is honoured
if set before that). :data:`PYTHON_FORMS` maps each ``tl_`` name to its Python form. All arguments
are runtime integers (no ``tl.constexpr``).

Tile orders
-----------
``tl_remap_tile(t, num_tiles, shift) = (t + shift) % num_tiles`` — a rotation, so a bijection on
``[0, num_tiles)`` for any ``shift >= 0``; a ``t`` past the tiles (an idle program of a larger grid) is left as it
is. ``order="mesh"`` is ``shift = 0``; ``"ring"`` and
``"local_first"`` (same thing) rotate so that the tiles holding this rank's rows come first, then the
next rank's, and so on: with row sizes known (:func:`remap_tile_rows`) ``shift = (rank * rpr) // tile``
(``tl_tile_shift``, the tile holding the rank's first row), otherwise (:func:`remap_tile`)
``shift = (rank * num_tiles) // world``.
"""

# The tl_ names in __all__ are built on first access (module __getattr__), invisible to ruff:
# ruff: noqa: F822

from __future__ import annotations

import inspect
import linecache
import operator
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported lazily: the CLI and the static model do not need it
    import torch

__all__ = [
    "ORDERS",
    "PYTHON_FORMS",
    "TRITON_NAMES",
    "LookupTables",
    "RowSharding",
    "channel_of_row",
    "channel_overlap",
    "channel_range",
    "channel_rank",
    "channel_rows",
    "channels_of_rows",
    "emit_module_source",
    "emit_source",
    "rank_range",
    "remap_tile",
    "remap_tile_rows",
    "rotate_tile",
    "shard_range",
    "tile_range",
    "tile_shift",
    # Triton forms (built on first access)
    "tl_channel_of_row",
    "tl_channel_overlap",
    "tl_channel_range",
    "tl_channel_rank",
    "tl_channel_rows",
    "tl_channels_of_rows",
    "tl_rank_range",
    "tl_remap_tile",
    "tl_table_rows",
    "tl_table_wait_channel",
    "tl_table_wait_range",
    "tl_tile_range",
    "tl_tile_shift",
]

ORDERS = ("mesh", "ring", "local_first")
"""Tile orders understood by :func:`remap_tile`: ``mesh`` = identity; ``ring`` = ``local_first``."""


# ---------------------------------------------------------------------------------------------------
# The one definition. Restricted subset: see the module docstring; tests/mapping checks the subset.
# Argument names: M rows in all, rpr rows per rank, rpc rows per channel, C channels per rank.
# ---------------------------------------------------------------------------------------------------


def _elementwise(op: str, a: Any, b: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        return getattr(torch, op)(torch.as_tensor(a), torch.as_tensor(b))
    import numpy

    return getattr(numpy, op)(a, b)


def _min(a: Any, b: Any) -> Any:
    """``tl.minimum`` on the device; ints, numpy arrays or torch tensors here."""
    if isinstance(a, int) and isinstance(b, int):
        return a if a <= b else b
    return _elementwise("minimum", a, b)


def _max(a: Any, b: Any) -> Any:
    """``tl.maximum`` on the device; ints, numpy arrays or torch tensors here."""
    if isinstance(a, int) and isinstance(b, int):
        return a if a >= b else b
    return _elementwise("maximum", a, b)


def channel_of_row(row, rpr, rpc, C):
    """Channel (barrier index) holding ``row`` (``0 <= row < M``): ``f_C`` of a row."""
    return (row // rpr) * C + (row % rpr) // rpc


def channel_rank(ch, C):
    """Rank owning channel ``ch``: ``f_R`` of a channel."""
    return ch // C


def rank_range(r, M, rpr):
    """Rows ``[lo, hi)`` held by rank ``r``; ``lo == hi`` for a rank holding none."""
    hi = _min((r + 1) * rpr, M)
    lo = _min(r * rpr, hi)
    return lo, hi


def channel_range(ch, M, rpr, rpc, C):
    """Rows ``[lo, hi)`` of channel ``ch``: ``f_S`` of a channel; ``lo == hi`` when it is empty."""
    r = ch // C
    j = ch % C
    rank_hi = _min((r + 1) * rpr, M)
    lo = _min(r * rpr + j * rpc, rank_hi)
    hi = _min(r * rpr + (j + 1) * rpc, rank_hi)
    return lo, hi


def channel_rows(ch, M, rpr, rpc, C):
    """Number of rows of channel ``ch`` (0 for an empty channel)."""
    lo, hi = channel_range(ch, M, rpr, rpc, C)
    return hi - lo


def channels_of_rows(lo, hi, M, rpr, rpc, C):
    """Channels ``first .. first + count - 1`` spanning rows ``[lo, hi) ∩ [0, M)``; ``(0, 0)`` if empty.

    The span is tight (its first and last channels hold rows of the range) and its non-empty
    channels are exactly those overlapping the rows; empty channels between ranks may lie inside.
    """
    a = _max(lo, 0)
    b = _min(hi, M)
    nonempty = _min(_max(b - a, 0), 1)
    a = _min(a, M - 1)
    last_row = _max(b - 1, a)
    first = channel_of_row(a, rpr, rpc, C)
    count = (channel_of_row(last_row, rpr, rpc, C) - first + 1) * nonempty
    return first * nonempty, count


def channel_overlap(ch, lo, hi, M, rpr, rpc, C):
    """Number of rows of channel ``ch`` inside ``[lo, hi)``: what a producer tile adds to ``ch``."""
    c_lo, c_hi = channel_range(ch, M, rpr, rpc, C)
    return _max(_min(hi, c_hi) - _max(lo, c_lo), 0)


def tile_range(t, tile, M):
    """Rows ``[lo, hi)`` of tile ``t`` of ``tile`` rows: ``f_S`` of a tile (clipped to ``M``)."""
    hi = _min((t + 1) * tile, M)
    lo = _min(t * tile, hi)
    return lo, hi


def tile_shift(rank, rpr, tile):
    """Rotation that makes ``rank``'s first row's tile come first (``ring`` / ``local_first``)."""
    return (rank * rpr) // tile


def rotate_tile(t, num_tiles, shift):
    """The tile processed at step ``t``: ``(t + shift) % num_tiles`` (a bijection on ``[0, num_tiles)`` for ``shift >=
    0``); a step outside the tiles (``t >= num_tiles`` or ``t < 0``: a program of a grid larger than the tiles, or one
    the kernel places before the first, which its masks leave idle) stays as it is, so that it is not sent onto a tile
    another program also computes. No division reads ``t`` itself, which may be negative."""
    before = _min(_max(0 - t, 0), 1)
    past = _min(_max(t - num_tiles + 1, 0), 1)
    inside = _max(_min(t, num_tiles - 1), 0)
    return (1 - before - past) * ((inside + shift) % num_tiles) + (before + past) * t


# tl_ name -> Python form. Order = dependency order (a function only calls ones above it).
PYTHON_FORMS: dict[str, Callable[..., Any]] = {
    "tl_channel_of_row": channel_of_row,
    "tl_channel_rank": channel_rank,
    "tl_rank_range": rank_range,
    "tl_channel_range": channel_range,
    "tl_channel_rows": channel_rows,
    "tl_channels_of_rows": channels_of_rows,
    "tl_channel_overlap": channel_overlap,
    "tl_tile_range": tile_range,
    "tl_tile_shift": tile_shift,
    "tl_remap_tile": rotate_tile,
}
"""Each static ``tl_`` function's Python form (same arguments, same results)."""

# Dynamic-table readers: they load memory, so they have no arithmetic Python form; their Python
# model is the matching :class:`LookupTables` method (named in the docstring).
_TABLE_SOURCE = {
    "tl_table_wait_range": '''
@triton.jit
def tl_table_wait_range(wait_ptr, t):
    """Consumer tile t waits on wait_channels[start:end] (model: LookupTables.wait_range)."""
    start = tl.load(wait_ptr + t)
    end = tl.load(wait_ptr + t + 1)
    return start, end
''',
    "tl_table_wait_channel": '''
@triton.jit
def tl_table_wait_channel(wait_channels_ptr, i):
    """The i-th entry of the CSR wait list (model: LookupTables.wait_channels[i])."""
    return tl.load(wait_channels_ptr + i)
''',
    "tl_table_rows": '''
@triton.jit
def tl_table_rows(low_ptr, high_ptr, t):
    """Source rows [low, high) that consumer tile t reads (model: LookupTables.rows)."""
    low = tl.load(low_ptr + t)
    high = tl.load(high_ptr + t)
    return low, high
''',
}

TRITON_NAMES: tuple[str, ...] = (*PYTHON_FORMS, *_TABLE_SOURCE)
"""Every ``tl_`` function this module provides, static ones first, in dependency order."""

_DEVICE_NAMES = {"_min": "tl.minimum", "_max": "tl.maximum"}


def _triton_text(tl_name: str) -> str:
    """Generate the Triton source of a static function from its Python form's source."""
    import libcst as cst

    renames = {fn.__name__: name for name, fn in PYTHON_FORMS.items()}

    class ToTriton(cst.CSTTransformer):
        def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
            return updated_node.with_changes(annotation=None)

        def leave_FunctionDef(self, original_node, updated_node):
            return updated_node.with_changes(
                name=cst.Name(renames[original_node.name.value]),
                returns=None,
                decorators=[cst.Decorator(cst.parse_expression("triton.jit"))],
            )

        def leave_Call(self, original_node, updated_node):
            func = original_node.func
            if isinstance(func, cst.Name):
                if func.value in _DEVICE_NAMES:
                    return updated_node.with_changes(func=cst.parse_expression(_DEVICE_NAMES[func.value]))
                if func.value in renames:
                    return updated_node.with_changes(func=cst.Name(renames[func.value]))
            return updated_node

    source = textwrap.dedent(inspect.getsource(PYTHON_FORMS[tl_name]))
    return "\n" + cst.parse_module(source).visit(ToTriton()).code


def _calls(tl_name: str) -> list[str]:
    """The ``tl_`` functions that ``tl_name``'s source calls directly."""
    text = emit_source(tl_name)
    return [n for n in TRITON_NAMES if n != tl_name and re.search(rf"\b{n}\(", text)]


def emit_source(name: str) -> str:
    """Triton source text of one ``tl_`` function (``@triton.jit`` included, no imports).

    The text assumes ``triton`` and ``triton.language as tl`` are imported and that the ``tl_``
    functions it calls are defined beside it; :func:`emit_module_source` adds those.
    """
    if name in PYTHON_FORMS:
        return _triton_text(name)
    if name in _TABLE_SOURCE:
        return _TABLE_SOURCE[name]
    raise ValueError(f"no mapping function named {name!r}; pass one of: {', '.join(TRITON_NAMES)}")


def emit_module_source(names: tuple[str, ...] | list[str] = TRITON_NAMES, *, imports: bool = True) -> str:
    """Source text defining ``names`` and every ``tl_`` function they call, each once, callees first.

    With ``imports`` the text starts with the ``triton`` imports, so it is a complete module.
    """
    wanted: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name not in wanted:
            emit_source(name)  # validates the name
            wanted.add(name)
            pending.extend(_calls(name))
    header = (
        "# Tile-centric mapping, generated by tilelink.mapping (paper §4.1). Do not edit: the\n"
        "# definition is the Python model in tilelink/mapping.py.\n"
    )
    if imports:
        header += "import triton\nimport triton.language as tl\n\n"
    body = "\n".join(emit_source(n) for n in TRITON_NAMES if n in wanted)
    return header + body


_TRITON_FORMS: dict[str, Any] = {}
_GENERATED_FILE = "<tilelink.mapping: generated Triton forms>"


def _build_triton_forms() -> dict[str, Any]:
    """Compile :func:`emit_module_source` once; Triton reads the source back through linecache."""
    if not _TRITON_FORMS:
        text = emit_module_source()
        # mtime None: linecache.checkcache() keeps the entry (there is no file to compare with).
        linecache.cache[_GENERATED_FILE] = (len(text), None, text.splitlines(True), _GENERATED_FILE)
        namespace: dict[str, Any] = {"__name__": __name__}
        exec(compile(text, _GENERATED_FILE, "exec"), namespace)
        _TRITON_FORMS.update({name: namespace[name] for name in TRITON_NAMES})
    return _TRITON_FORMS


def __getattr__(name: str) -> Any:
    if name in TRITON_NAMES:
        value = _build_triton_forms()[name]
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------------
# Python model: validated API over the definition.
# ---------------------------------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shard_range(size: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a dimension of ``size`` that ``rank`` of ``world`` holds: rank ``r`` holds
    ``[r*ceil(size/world), min(size, (r+1)*ceil(size/world)))`` (the last ranks may hold fewer or
    none). The split of every launch contract, and of the weights the layers shard."""
    return rank_range(rank, size, _cdiv(size, world))


def _as_int(value: Any) -> int | None:
    """``value`` as a Python int if it is an integer (numpy and 0-d torch integers too), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _require_int(name: str, value: Any, minimum: int, hint: str) -> int:
    number = _as_int(value)
    if number is None:
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__}); {hint}")
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}; {hint}")
    return number


def _require_index(name: str, value: Any, count: int, what: str) -> int:
    number = _as_int(value)
    if number is None or not 0 <= number < count:
        raise ValueError(f"{name}={value!r} is out of range: {what} has {count}, pass 0 <= {name} < {count}")
    return number


@dataclass(frozen=True)
class RowSharding:
    """Static row sharding of ``size`` rows over ``world`` ranks, ``channels_per_rank`` channels each.

    See the module docstring for the formulas. Validated on construction (:class:`ValueError`).
    """

    size: int
    world: int
    channels_per_rank: int = 1

    def __post_init__(self) -> None:
        # stored as Python ints (numpy / torch integers are accepted and converted)
        object.__setattr__(self, "size", _require_int(
            "size", self.size, 1, "pass the number of rows of the sharded dimension (M >= 1)"))
        object.__setattr__(self, "world", _require_int(
            "world", self.world, 1, "pass the number of ranks (world >= 1)"))
        object.__setattr__(self, "channels_per_rank", _require_int(
            "channels_per_rank", self.channels_per_rank, 1,
            "pass the number of barriers per rank (>= 1), or use RowSharding.from_comm_block"))
        if self.channels_per_rank > self.rows_per_rank:
            raise ValueError(
                f"channels_per_rank={self.channels_per_rank} exceeds rows_per_rank={self.rows_per_rank} "
                f"(size {self.size} over world {self.world}): every channel needs at least one row; pass "
                f"channels_per_rank <= {self.rows_per_rank}, or use RowSharding.from_comm_block"
            )

    @classmethod
    def from_comm_block(cls, size: int, world: int, comm_block: int) -> RowSharding:
        """Sharding whose channels hold at most ``comm_block`` rows: ``C = ceil(rpr / comm_block)``."""
        _require_int("size", size, 1, "pass the number of rows of the sharded dimension (M >= 1)")
        _require_int("world", world, 1, "pass the number of ranks (world >= 1)")
        _require_int("comm_block", comm_block, 1, "pass the rows per communication block (>= 1)")
        return cls(size, world, _cdiv(_cdiv(size, world), comm_block))

    # -- sizes --------------------------------------------------------------------------------------
    @property
    def rows_per_rank(self) -> int:
        """``ceil(size / world)``."""
        return _cdiv(self.size, self.world)

    @property
    def rows_per_channel(self) -> int:
        """``ceil(rows_per_rank / channels_per_rank)``."""
        return _cdiv(self.rows_per_rank, self.channels_per_rank)

    @property
    def num_channels(self) -> int:
        """``world * channels_per_rank`` (barrier words per context), empty channels included."""
        return self.world * self.channels_per_rank

    @property
    def args(self) -> tuple[int, int, int, int]:
        """``(M, rpr, rpc, C)``: the trailing arguments of the ``tl_`` channel functions."""
        return self.size, self.rows_per_rank, self.rows_per_channel, self.channels_per_rank

    def num_tiles(self, tile: int) -> int:
        """Number of tiles of ``tile`` rows covering the dimension."""
        return _cdiv(self.size, self._tile(tile))

    # -- channels -----------------------------------------------------------------------------------
    def rank_range(self, r: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of rank ``r`` (``lo == hi`` for a rank holding none)."""
        return rank_range(_require_index("rank", r, self.world, "the world"), self.size, self.rows_per_rank)

    def channel_range(self, ch: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of channel ``ch`` (``lo == hi`` when empty)."""
        return channel_range(self._channel(ch), *self.args)

    def channel_rows(self, ch: int) -> int:
        """Rows of channel ``ch``: the per-call counter target unit (times ``N`` for elements)."""
        return channel_rows(self._channel(ch), *self.args)

    def channel_rank(self, ch: int) -> int:
        """Rank owning channel ``ch``."""
        return channel_rank(self._channel(ch), self.channels_per_rank)

    def channel_of_row(self, row: int) -> int:
        """Channel holding ``row``."""
        row = _require_index("row", row, self.size, "the sharded dimension")
        return channel_of_row(row, self.rows_per_rank, self.rows_per_channel, self.channels_per_rank)

    def rank_of_row(self, row: int) -> int:
        """Rank holding ``row``."""
        return _require_index("row", row, self.size, "the sharded dimension") // self.rows_per_rank

    def channels_of_rows(self, lo: int, hi: int) -> tuple[int, int]:
        """``(first, count)`` spanning the channels of rows ``[lo, hi) ∩ [0, M)``; ``(0, 0)`` if empty."""
        lo = _require_int("lo", lo, -(2**62), "pass a row index")
        hi = _require_int("hi", hi, -(2**62), "pass a row index")
        return channels_of_rows(lo, hi, *self.args)

    def channels_overlapping(self, lo: int, hi: int) -> list[int]:
        """The non-empty channels holding rows of ``[lo, hi)``, ascending (the exact wait set)."""
        first, count = self.channels_of_rows(lo, hi)
        return [ch for ch in range(first, first + count) if self.channel_rows(ch) > 0]

    # -- tiles --------------------------------------------------------------------------------------
    def tile_range(self, t: int, tile: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of tile ``t`` of ``tile`` rows."""
        t = _require_index("t", t, self.num_tiles(tile), f"the dimension in tiles of {tile} rows")
        return tile_range(t, self._tile(tile), self.size)

    def consumer_channels(self, t: int, tile: int) -> tuple[int, int]:
        """``(first, count)``: the channel span consumer tile ``t`` (``tile`` rows) waits on."""
        return self.channels_of_rows(*self.tile_range(t, tile))

    def producer_notifies(self, t: int, tile: int) -> list[tuple[int, int]]:
        """``[(channel, rows)]``: what producer tile ``t`` of ``tile`` rows adds to each channel it writes.

        Summed over all producer tiles, a channel receives exactly ``channel_rows(channel)``.
        """
        lo, hi = self.tile_range(t, tile)
        first, count = channels_of_rows(lo, hi, *self.args)
        notes = [(ch, channel_overlap(ch, lo, hi, *self.args)) for ch in range(first, first + count)]
        return [(ch, rows) for ch, rows in notes if rows > 0]

    def _channel(self, ch: int) -> int:
        return _require_index("channel", ch, self.num_channels, "the sharding")

    def _tile(self, tile: int) -> int:
        return _require_int("tile", tile, 1, "pass the tile size in rows (>= 1)")


def remap_tile(t: int, num_tiles: int, rank: int, world: int, order: str = "mesh") -> int:
    """Tile processed at step ``t`` by ``rank``: ``mesh`` = ``t``; ``ring``/``local_first`` rotate by
    ``(rank * num_tiles) // world`` (use :func:`remap_tile_rows` when the row sizes are known)."""
    _check_order(order)
    num_tiles = _require_int("num_tiles", num_tiles, 1, "pass the number of tiles (>= 1)")
    world = _require_int("world", world, 1, "pass the number of ranks (world >= 1)")
    rank = _require_index("rank", rank, world, "the world")
    t = _require_index("t", t, num_tiles, "the tile loop")
    shift = 0 if order == "mesh" else (rank * num_tiles) // world
    return rotate_tile(t, num_tiles, shift)


def remap_tile_rows(t: int, num_tiles: int, rank: int, rows_per_rank: int, tile: int,
                    order: str = "ring") -> int:
    """Like :func:`remap_tile` with ``shift = (rank * rows_per_rank) // tile`` (``tl_tile_shift``):
    the first tile processed is the one holding ``rank``'s first row."""
    _check_order(order)
    num_tiles = _require_int("num_tiles", num_tiles, 1, "pass the number of tiles (>= 1)")
    rank = _require_int("rank", rank, 0, "pass this process's rank (>= 0)")
    rows_per_rank = _require_int("rows_per_rank", rows_per_rank, 1, "pass ceil(M / world) (>= 1)")
    tile = _require_int("tile", tile, 1, "pass the tile size in rows (>= 1)")
    t = _require_index("t", t, num_tiles, "the tile loop")
    shift = 0 if order == "mesh" else tile_shift(rank, rows_per_rank, tile)
    return rotate_tile(t, num_tiles, shift)


def _check_order(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(f"unknown tile order {order!r}; pass one of: {', '.join(ORDERS)}")


# ---------------------------------------------------------------------------------------------------
# Dynamic mapping: lookup tables (MoE).
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LookupTables:
    """Dynamic mapping of consumer tiles of a gathered order onto source rows and channels.

    Built from a gather index: ``index[i]`` is the source row (of the row-sharded dimension) that
    gathered row ``i`` reads, ``-1`` for padding. Consumer tile ``t`` reads gathered rows
    ``[t*tile, min(L, (t+1)*tile))``, i.e. source rows ``index[t*tile : (t+1)*tile]`` (``L`` =
    ``len(index)``). Per tile (all tensors on ``index``'s device, ``int32``, ``int64`` past 2**31):

    * ``low[t]``, ``high[t]`` (``f_S``): ``[min, max + 1)`` of the valid source rows; ``0, 0`` for a
      tile of padding only. The tile may read only some rows of that range.
    * ``wait_ptr`` (``num_tiles + 1``) and ``wait_channels`` (CSR, ``f_C``): tile ``t`` waits on
      ``wait_channels[wait_ptr[t]:wait_ptr[t+1]]``, the distinct channels of its valid rows,
      ascending; never an empty channel. Its ranks (``f_R``) are ``channel // channels_per_rank``.
    """

    sharding: RowSharding
    tile: int
    low: torch.Tensor
    high: torch.Tensor
    wait_ptr: torch.Tensor
    wait_channels: torch.Tensor

    @classmethod
    def build(cls, index: torch.Tensor, sharding: RowSharding, tile: int, *,
              validate: bool = True) -> LookupTables:
        """Fill the tables with torch ops (no Python loop over rows; CPU or CUDA)."""
        import torch

        _require_int("tile", tile, 1, "pass the consumer tile size in rows (>= 1)")
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype.is_floating_point \
                or index.dtype == torch.bool:
            raise ValueError("index must be a 1-D integer tensor of source rows (-1 = padding), "
                             f"got {getattr(index, 'dtype', type(index).__name__)} "
                             f"of shape {tuple(getattr(index, 'shape', ()))}")
        M = sharding.size
        if validate and index.numel() and bool(((index < -1) | (index >= M)).any()):
            bad = index[(index < -1) | (index >= M)][0].item()
            raise ValueError(f"index holds source row {bad}, outside [0, {M}) and not -1 (padding); "
                             f"pass rows of the sharded dimension of size {M}, or -1 for padding")
        device = index.device
        dtype = torch.int32 if max(M, index.numel()) < 2**31 - 1 else torch.int64
        L = index.numel()
        num_tiles = _cdiv(L, tile) if L else 0
        src = index.to(torch.int64)
        valid = src >= 0
        tile_of = torch.arange(L, device=device, dtype=torch.int64) // tile
        rows = src[valid]
        tiles = tile_of[valid]

        low = torch.full((num_tiles,), M, dtype=torch.int64, device=device)
        high = torch.zeros(num_tiles, dtype=torch.int64, device=device)
        low.scatter_reduce_(0, tiles, rows, "amin")
        high.scatter_reduce_(0, tiles, rows + 1, "amax")
        low = torch.minimum(low, high)  # padding-only tiles: low = M, high = 0 -> 0, 0

        nc = sharding.num_channels
        channels = channel_of_row(rows, sharding.rows_per_rank, sharding.rows_per_channel,
                                  sharding.channels_per_rank)
        pairs = torch.unique(tiles * nc + channels)  # sorted: by tile, then channel
        counts = torch.bincount(pairs // nc, minlength=num_tiles)
        wait_ptr = torch.zeros(num_tiles + 1, dtype=torch.int64, device=device)
        wait_ptr[1:] = torch.cumsum(counts, 0)
        return cls(sharding, tile, low.to(dtype), high.to(dtype), wait_ptr.to(dtype),
                   (pairs % nc).to(dtype))

    @property
    def num_tiles(self) -> int:
        """Number of consumer tiles."""
        return self.wait_ptr.numel() - 1

    def wait_range(self, t: int) -> tuple[int, int]:
        """``(start, end)`` into :attr:`wait_channels` for tile ``t`` (model of ``tl_table_wait_range``)."""
        _require_index("t", t, self.num_tiles, "the consumer tiles")
        return int(self.wait_ptr[t]), int(self.wait_ptr[t + 1])

    def waits_of(self, t: int) -> list[int]:
        """The channels consumer tile ``t`` waits on, ascending."""
        start, end = self.wait_range(t)
        return [int(c) for c in self.wait_channels[start:end].tolist()]

    def rows(self, t: int) -> tuple[int, int]:
        """``(low, high)`` source rows of tile ``t`` (model of ``tl_table_rows``)."""
        _require_index("t", t, self.num_tiles, "the consumer tiles")
        return int(self.low[t]), int(self.high[t])
