"""What a user asks for: the overlap specs of ``@tilelink.overlap`` and their options.

A spec says which kernel parameter is communicated and how (gathered before use, or reduced and
scattered after the stores); options choose the decoupled design space of the paper (§3.1): the
resource the communication runs on, its direction, its tile order and its tile size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

VIA = ("copy_engine", "sm")
MODES = ("pull", "push")
ORDERS = ("local_first", "ring", "mesh")


@dataclass(frozen=True)
class AllGatherSpec:
    """``tensor`` is sharded along ``dim`` across ranks and gathered before the kernel reads it."""

    tensors: tuple[str, ...]
    dim: int = 0
    tile: tuple[str, str] | None = None
    index: str | None = None
    size: str | None = None
    kind: str = field(default="all_gather", init=False)

    def describe(self) -> str:
        names = ", ".join(repr(t) for t in self.tensors)
        extra = "".join(f", {k}={v!r}" for k, v in (("tile", self.tile), ("index", self.index),
                                                      ("size", self.size)) if v is not None)
        return f"all_gather({names}, dim={self.dim}{extra})"


@dataclass(frozen=True)
class ReduceScatterSpec:
    """The kernel's stores to ``tensor`` are partial sums, reduced and scattered along ``dim``."""

    tensors: tuple[str, ...]
    dim: int = 0
    tile: tuple[str, str] | None = None
    index: str | None = None
    topk: str | None = None
    size: str | None = None
    linear_epilogue: bool = False  # the user vouches that what is stored is linear in the partial sums
    kind: str = field(default="reduce_scatter", init=False)

    def describe(self) -> str:
        names = ", ".join(repr(t) for t in self.tensors)
        extra = "".join(f", {k}={v!r}" for k, v in (("tile", self.tile), ("index", self.index),
                                                      ("topk", self.topk), ("size", self.size),
                                                      ("linear_epilogue", self.linear_epilogue or None))
                        if v is not None)
        return f"reduce_scatter({names}, dim={self.dim}{extra})"


@dataclass(frozen=True)
class AllReduceSpec:
    """The kernel's stores to ``tensor`` are partial sums, reduced across ranks onto every rank.

    Like :class:`ReduceScatterSpec`, but every rank gets the whole reduced tensor. ``mode`` picks the algorithm:
    ``"one_shot"`` (each rank pulls every peer's partial rows and sums them: the fewest steps, for small
    messages), ``"two_shot"`` (a reduce-scatter, then an all-gather of the reduced rows: each rank reads a
    fraction of the bytes, for large ones) or ``None``, chosen from the message's size."""

    tensors: tuple[str, ...]
    dim: int = 0
    tile: tuple[str, str] | None = None
    size: str | None = None
    linear_epilogue: bool = False
    mode: str | None = None
    index: None = field(default=None, init=False)  # no dynamic (MoE) mapping
    topk: None = field(default=None, init=False)
    kind: str = field(default="all_reduce", init=False)

    def describe(self) -> str:
        names = ", ".join(repr(t) for t in self.tensors)
        extra = "".join(f", {k}={v!r}" for k, v in (("tile", self.tile), ("size", self.size),
                                                      ("linear_epilogue", self.linear_epilogue or None),
                                                      ("mode", self.mode)) if v is not None)
        return f"all_reduce({names}, dim={self.dim}{extra})"


Spec = AllGatherSpec | ReduceScatterSpec | AllReduceSpec

#: the all-reduce algorithms (``all_reduce(..., mode=...)``)
ALL_REDUCE_MODES = ("one_shot", "two_shot")


@dataclass(frozen=True)
class Options:
    """The decoupled design-space choices (paper §3.1). ``None`` means: the rule's default."""

    via: str | None = None
    mode: str | None = None
    order: str | None = None
    comm_block: int | None = None
    comm_sms: int | None = None
    channels_per_rank: int | None = None

    def resolved(self, **defaults: object) -> Options:
        """These options with every ``None`` replaced by the given default."""
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


def _tensors(tensor: str | tuple[str, ...] | list[str], what: str) -> tuple[str, ...]:
    names = (tensor,) if isinstance(tensor, str) else tuple(tensor)
    if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ValueError(f"{what}: expected a kernel parameter name or a tuple of names, got {tensor!r}; "
                         f"write e.g. {what}(\"a_ptr\", dim=0)")
    return names


def _one_output(names: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A reduction's partial sums are one tensor: its channels, buffers and launch checks are that tensor's."""
    if len(names) != 1:
        raise ValueError(f"{what}: one output tensor per kernel, got {names!r}: the channels, the symmetric buffer of "
                         f"the partial sums and the launch's checks are those of one tensor; reduce each output in a "
                         f"kernel of its own, {what}({names[0]!r})")
    return names


def _tile(tile: object, what: str) -> tuple[str, str] | None:
    if tile is None:
        return None
    if (not isinstance(tile, (tuple, list)) or len(tile) != 2
            or not all(isinstance(t, str) and t.strip() for t in tile)):
        raise ValueError(f"{what}: tile= takes two source expressions (start, size), e.g. "
                         f"tile=(\"pid_m * BLOCK_M\", \"BLOCK_M\"); got {tile!r}")
    return (tile[0].strip(), tile[1].strip())


def _parameter(value: object, what: str, key: str, example: str, alone: str) -> str | None:
    """A keyword that names a kernel parameter (``index=``, ``topk=``): ``None`` or an identifier."""
    if value is None or (isinstance(value, str) and value.isidentifier()):
        return value
    raise ValueError(f"{what}: {key}= names a parameter of the kernel, e.g. {key}=\"{example}\", got {value!r}; "
                     f"{alone}")


def _dim(dim: object, what: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
        raise ValueError(f"{what}: dim must be a non-negative int, got {dim!r}")
    return dim


def all_gather(tensor: str | tuple[str, ...], dim: int = 0, *, tile: tuple[str, str] | None = None,
               index: str | None = None, size: str | None = None) -> AllGatherSpec:
    """Gather ``tensor`` (a pointer parameter, or a tuple gathered together) along ``dim``.

    Args:
        tensor: name of the pointer parameter the kernel reads; each rank passes its shard.
        dim: the sharded dimension.
        tile: ``(start, size)`` source expressions of a tile along ``dim``; inferred when omitted.
        index: name of a gather-index parameter (dynamic mapping, MoE).
        size: name of the parameter holding the full size along ``dim``; inferred when omitted.
    """
    return AllGatherSpec(_tensors(tensor, "all_gather"), _dim(dim, "all_gather"),
                         _tile(tile, "all_gather"), _parameter(index, "all_gather", "index", "sorted_token_ids_ptr",
                                                               "leave it out where the rows are not read through an "
                                                               "index"), size)


def reduce_scatter(tensor: str | tuple[str, ...], dim: int = 0, *, tile: tuple[str, str] | None = None,
                   index: str | None = None, topk: str | None = None,
                   size: str | None = None, linear_epilogue: bool = False) -> ReduceScatterSpec:
    """Reduce the partial sums the kernel stores to ``tensor`` and scatter them along ``dim``.

    Args:
        tensor: name of the pointer parameter the kernel stores to (one); each rank passes its output shard.
        dim: the scattered dimension.
        tile: ``(start, size)`` source expressions of a tile along ``dim``; inferred when omitted.
        index: scatter-index parameter (MoE); topk: top-k parameter for the MoE reduction.
        size: name of the parameter holding the full size along ``dim``; inferred when omitted.
        linear_epilogue: the sum over ranks of what each rank stores must be what the full problem stores, so a
            non-linear function of the partial sums before the store (an activation, ``exp``, a ``@triton.jit``
            helper) is refused; ``True`` says the epilogue is linear all the same (a helper that only scales).
    """
    if not isinstance(linear_epilogue, bool):
        raise ValueError(f"reduce_scatter: linear_epilogue= takes True or False, got {linear_epilogue!r}")
    return ReduceScatterSpec(_one_output(_tensors(tensor, "reduce_scatter"), "reduce_scatter"),
                             _dim(dim, "reduce_scatter"),
                             _tile(tile, "reduce_scatter"),
                             _parameter(index, "reduce_scatter", "index", "sorted_token_ids_ptr",
                                        "leave it out where the rows are not written through an index"),
                             _parameter(topk, "reduce_scatter", "topk", "top_k",
                                        "leave it out where each token has one row (one slot)"), size, linear_epilogue)


def all_reduce(tensor: str | tuple[str, ...], dim: int = 0, *, tile: tuple[str, str] | None = None,
               size: str | None = None, linear_epilogue: bool = False, mode: str | None = None) -> AllReduceSpec:
    """Sum the partial sums the kernel stores to ``tensor`` over the ranks, onto every rank.

    Args:
        tensor: name of the pointer parameter the kernel stores to (one); each rank passes the whole output.
        dim: the dimension the channels cut (rows); only 0.
        tile: ``(start, size)`` source expressions of a tile along ``dim``; inferred when omitted.
        size: name of the parameter holding the full size along ``dim``; inferred when omitted.
        linear_epilogue: as for :func:`reduce_scatter`: what is stored must be linear in the partial sums.
        mode: ``"one_shot"``, ``"two_shot"``, or ``None`` to choose by the message's size (per shape).
    """
    if not isinstance(linear_epilogue, bool):
        raise ValueError(f"all_reduce: linear_epilogue= takes True or False, got {linear_epilogue!r}")
    if mode is not None and mode not in ALL_REDUCE_MODES:
        raise ValueError(f"all_reduce: mode={mode!r} is not one of {', '.join(map(repr, ALL_REDUCE_MODES))} "
                         f"(or None: chosen by size)")
    return AllReduceSpec(_one_output(_tensors(tensor, "all_reduce"), "all_reduce"), _dim(dim, "all_reduce"),
                         _tile(tile, "all_reduce"), size,
                         linear_epilogue, mode)


def make_options(via: str | None = None, mode: str | None = None, order: str | None = None,
                 comm_block: int | None = None, comm_sms: int | None = None,
                 channels_per_rank: int | None = None) -> Options:
    """Validate the keyword options of ``@tilelink.overlap``."""
    for name, value, allowed in (("via", via, VIA), ("mode", mode, MODES), ("order", order, ORDERS)):
        if value is not None and value not in allowed:
            raise ValueError(f"overlap: {name}={value!r} is not one of {', '.join(map(repr, allowed))}")
    for name, value in (("comm_block", comm_block), ("comm_sms", comm_sms),
                        ("channels_per_rank", channels_per_rank)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"overlap: {name} must be a positive int, got {value!r}")
    return Options(via, mode, order, comm_block, comm_sms, channels_per_rank)
