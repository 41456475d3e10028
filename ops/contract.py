"""The launch contract of the overlapped operators, in one place.

What every operator of :mod:`tilelink.ops` does the same way before a kernel runs: check each
argument (type, rank, dtype, device, layout) and the rows a rank holds
(:func:`tilelink.mapping.shard_range`), learn a full size the shards alone do not tell, and hand
Triton's interpreter inputs it computes correctly.
"""

from __future__ import annotations

import torch

from tilelink.errors import LaunchError
from tilelink.mapping import shard_range
from tilelink.runtime.world import current_world, interpreting

DTYPES = (torch.float16, torch.bfloat16, torch.float32)

__all__ = ["DTYPES", "CallPlans", "check_rows", "check_tensor", "full_size", "interpreter_dtype", "interpreter_inputs",
           "interpreting", "operand_key", "persistent_grid", "tail_split"]


def interpreter_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel gets for operands of ``dtype``. Triton 3.9's interpreter computes ``tl.dot`` of bf16
    operands wrongly (numpy has no bf16); bf16 products are exact in fp32, so under the interpreter bf16 inputs
    go in as fp32 and the caller casts the result back."""
    return torch.float32 if dtype == torch.bfloat16 and interpreting() else dtype


def interpreter_inputs(*ts: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """The tensors a kernel should get: ``ts`` as :func:`interpreter_dtype` of the first one's dtype. ``dtype``:
    that dtype, where the caller kept it from an earlier call of the same form (no test of the interpreter)."""
    to = interpreter_dtype(ts[0].dtype) if dtype is None else dtype
    return ts if to == ts[0].dtype else tuple(t.to(to) for t in ts)


class CallPlans:
    """What an operator's checks and choices computed for one form of call, found again by a key the operator
    reads without a check (its operands' types, shapes, strides, dtypes and devices and its other arguments): a call
    of a form seen before skips them, and only allocates its result and launches. A call of a new form, or with an
    argument the key does not cover, is checked in full, and refused with the same message as ever.

    Kept for one world at a time (a new world, of another device, rank or size, starts empty), and for
    :data:`LIMIT` forms (then started again: a workload of ever-new shapes keeps its memory bounded)."""

    LIMIT = 1024

    __slots__ = ("plans", "world")

    def __init__(self) -> None:
        self.world = None
        self.plans: dict[tuple, object] = {}

    def find(self, key: tuple | None) -> object | None:
        """The plan kept for ``key`` in the current world (which is then :attr:`world`), or ``None``."""
        plan = self.plans.get(key) if key is not None else None
        if plan is not None and current_world() is not self.world:
            return None
        return plan

    def put(self, key: tuple | None, world, plan) -> None:
        """Keep ``plan`` for the calls of ``key`` in ``world`` (nothing for ``key=None``)."""
        if key is None:
            return
        if world is not self.world or len(self.plans) >= self.LIMIT:
            self.plans.clear()
            self.world = world  # held: a new world cannot take the identity of this one
        self.plans[key] = plan


def operand_key(t: object) -> tuple | None:
    """What :func:`check_tensor` reads of ``t``, as a key: its type, shape, strides, dtype and device; ``None``
    for anything but a tensor (checked in full at every call)."""
    if not isinstance(t, torch.Tensor):
        return None
    return type(t), t.shape, t.stride(), t.dtype, t.device


def check_tensor(op: str, what: str, t: object, dims: int, device: torch.device, *, layout: str = "",
                 dtypes: tuple[torch.dtype, ...] = DTYPES, contiguous: bool = True) -> None:
    """Raise :class:`tilelink.LaunchError` unless ``t`` is a ``dims``-D tensor of ``dtypes`` on
    ``device`` (and contiguous when asked); ``layout`` names its dims in the message."""
    if not isinstance(t, torch.Tensor) or t.dim() != dims:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise LaunchError(f"{op}: {what} must be a {dims}-D torch.Tensor{layout}, got {got}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise LaunchError(f"{op}: dtype {t.dtype} of {what} is not supported ({names})")
    on = t.device
    if on != device and (on.type != device.type or (on.index or 0) != (device.index or 0)):
        raise LaunchError(f"{op}: {what} is on {on}, this rank computes on {device}")
    if contiguous and not t.is_contiguous():
        raise LaunchError(f"{op}: {what} must be contiguous (call .contiguous())")


def check_rows(op: str, what: str, got: int, size: int, world) -> tuple[int, int]:
    """This rank's rows ``[lo, hi)`` of a dimension of ``size``; raises unless it holds ``got`` of them."""
    lo, hi = shard_range(size, world.rank, world.world_size)
    if got != hi - lo:
        raise LaunchError(f"{op}: rank {world.rank} must hold rows [{lo}, {hi}) of {what} ({hi - lo} rows for "
                          f"{size} over {world.world_size} ranks), got {got}")
    return lo, hi


def full_size(shard: torch.Tensor, dim: int, known: int | None, world, op: str = "an operator") -> int:
    """The full size along ``dim`` of a tensor sharded over the ranks: ``known`` when the caller's
    context gives it, else the sum of every rank's shard (one exchange through the world's store, bounded
    like a call's handshake, naming a rank that does not come to call ``op``)."""
    if known is not None:
        return known
    if world.world_size == 1:
        return shard.shape[dim]
    return sum(world.control.exchange(int(shard.shape[dim]), op))


def persistent_wanted(device: torch.device, persistent: bool | None = None) -> bool:
    """Whether the operators take their persistent tensor-descriptor kernels on ``device``: as the caller's
    ``persistent`` says (``True`` forces them, in the interpreter too; ``False`` forbids them), else on a GPU.
    Decided from what the ranks share (the device type, the argument every rank passes alike), never from a
    rank's own slice (see :func:`aligned`)."""
    return device.type == "cuda" if persistent is None else persistent


def descriptor_size(size: int, itemsize: int) -> int:
    """``size`` elements of ``itemsize`` bytes rounded up to a 16-byte multiple (at least one element's worth): the
    size :func:`aligned` pads a dimension to."""
    per = 16 // itemsize
    return -(-max(size, 1) // per) * per


def descriptor_ready(t: torch.Tensor) -> bool:
    """Whether a tensor descriptor over ``t``'s last two dims reads ``t`` in place: a unit last stride, a 16-byte
    aligned base and row stride (a descriptor's stride, checked whatever the row count), and each leading dim's
    stride a 16-byte multiple where that dim has more than one index (it moves the descriptor's base; the stride of a
    dim of size 1 is never stepped)."""
    size = t.element_size()
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    if t.dim() >= 2 and (t.stride(-2) * size) % 16:
        return False
    if t.dim() <= 2:  # no leading dims (the operators' operands: this runs at every call)
        return True
    return all((s * size) % 16 == 0 for s, n in zip(t.stride()[:-2], t.shape[:-2], strict=True) if n > 1)


def aligned(t: torch.Tensor, dim: int = -1, size: int | None = None) -> torch.Tensor:
    """``t`` with dimension ``dim`` (the last or the first) holding a 16-byte multiple of elements (at
    least ``size`` and at least one), contiguous and 16-byte aligned: what a tensor descriptor needs.
    ``t`` itself when it already is; otherwise a zero-padded copy.

    The operators pick their kernel (persistent with tensor descriptors, or pointer loads) from what
    every rank shares, never from the sizes of this rank's own shard: ranks that picked differently
    would run different communication protocols and wait for each other forever. A shard whose size
    does not suit a descriptor is padded instead (zero columns add nothing to a product)."""
    dim = dim % t.dim()
    want = descriptor_size(t.shape[dim] if size is None else size, t.element_size())
    if want == t.shape[dim] and t.is_contiguous() and descriptor_ready(t):
        return t
    shape = list(t.shape)
    shape[dim] = want
    out = t.new_zeros(shape)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


def tail_split(tiles: int, programs: int, block_n: int, most: int = 4, narrowest: int | None = None) -> int:
    """Column pieces to cut each tile of a persistent kernel's last, partial wave into (1, 2 or 4, at
    most ``most``): the largest whose pieces (``tiles % programs`` times it) still run at once on the
    ``programs``, with pieces at least ``narrowest`` columns wide (default 64 on a GPU, 8 in the
    interpreter). A last wave of a few tiles then takes a fraction of a tile's time instead of a whole
    one, with most SMs idle (on an H200: AG+GEMM MLP-1, 704 tiles on 132 SMs, 0.97 -> 1.01 of cuBLAS)."""
    tail = tiles % programs
    if narrowest is None:
        narrowest = 8 if interpreting() else 64
    split = 1
    while tail and split * 2 <= most and block_n // (split * 2) >= narrowest and tail * split * 2 <= programs:
        split *= 2
    return split


def persistent_grid(tiles: int, programs: int, meta: dict, tail: bool = True) -> tuple[tuple[int], dict]:
    """The grid and launch meta of a persistent kernel over ``tiles`` tiles on ``programs`` programs
    (``NUM_SMS``); with ``tail``, the kernel takes ``TAIL_SPLIT`` (:func:`tail_split`) and the grid covers
    its last wave's pieces too."""
    if not tail:
        return (min(programs, tiles),), {**meta, "NUM_SMS": programs}
    split = tail_split(tiles, programs, meta["BLOCK_N"])
    return (min(programs, tiles * split),), {**meta, "NUM_SMS": programs, "TAIL_SPLIT": split}
