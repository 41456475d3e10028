"""The cost model: what an operator costs overlapped, and what cuBLAS (or SDPA) + an NCCL collective costs.

For an operator, a shape, a world size and a link, :func:`predict` gives three times (ms):

- ``plain``: the non-overlapped path, the vendor compute (cuBLAS GEMM, SDPA attention; for MoE our own grouped
  GEMM, the fused path) then an NCCL collective of the same bytes, one after the other;
- ``overlap``: TileLink's overlapped kernels (copy-engine transfers pipelined with the tile GEMM);
- ``ideal``: ``max(compute, communication)`` of the plain path's parts, what perfect overlap would reach.

Each is built from parts measured on a GPU and kept in a calibration file (JSON, :class:`Calibration`): the
cuBLAS rate, each operator's tile kernel rate as a ratio to cuBLAS, the copy engine's and the SM pull's
bandwidth per peer, NCCL's bandwidth and latency per collective, a kernel launch, the host's time per call of
each path, the handshake's latency. The equations are in docs/ARCHITECTURE.md ("Cost model"); the GPU time
of a path is the larger of its device work and its host time per call (a call whose host work is longer than
its GPU work sets the pace itself).

:func:`choose` is the operators' ``path="auto"``: the overlapped kernels when the model predicts them faster,
else the plain path, from what every rank shares (shapes, world size, calibration) so every rank picks the same.

The shipped calibration (``cost_h200.json``, next to this module) was built from the records in docs/perf by
:func:`calibration_from_records`; ``tlxform bench model --calibrate`` measures the parts on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("tilelink.cost")

#: a calibration file to use in place of the shipped one (also makes ``path="auto"`` model the emulated world)
CALIBRATION_ENV = "TILELINK_CALIBRATION"
SHIPPED = Path(__file__).with_name("cost_h200.json")
PATHS = ("auto", "overlap", "plain")

#: every part a calibration holds, with its unit and meaning (``tlxform bench model`` prints them)
PARTS = {
    "gemm_tflops": "cuBLAS's dense GEMM rate, TFLOP/s (bf16), without its epilogue",
    "gemm_epilogue_gb_s": "cuBLAS's output cost: C bytes per second its epilogue adds to a GEMM",
    "hbm_gb_s": "device memory bandwidth, GB/s (a memory-bound GEMM, reductions, copies)",
    "attention_tflops": "SDPA's fastest backend, TFLOP/s (non-causal, head dim 128)",
    "tile_ratio.ag_gemm": "the overlapped AG+GEMM kernel's rate / cuBLAS (channels satisfied)",
    "tile_ratio.gemm_rs": "the overlapped GEMM+RS kernel's rate / cuBLAS (channels satisfied)",
    "tile_ratio.gemm_ar": "the overlapped GEMM+AR kernel's rate / cuBLAS (channels satisfied)",
    "tile_ratio.ag_moe": "ag_moe's grouped GEMM, rate per computed row / dense cuBLAS",
    "tile_ratio.moe_rs": "moe_rs's grouped GEMM, rate per computed row / dense cuBLAS",
    "tile_ratio.sp_attention": "sp_attention's kernel / SDPA's fastest backend",
    "copy_engine_gb_s": "copy-engine bandwidth to one peer, GB/s",
    "sm_pull_ag_gb_s": "SM pull (ag_pull_producer, 16 programs) from one peer, GB/s",
    "sm_pull_rs_gb_s": "SM pull (rs_pull_consumer, 16 programs) from one peer, GB/s",
    "nccl_all_gather_gb_s": "NCCL all-gather, the bytes of one peer's shard per second, GB/s",
    "nccl_all_gather_latency_us": "NCCL all-gather, a call's fixed time, us",
    "nccl_reduce_scatter_gb_s": "NCCL reduce-scatter, the bytes of one peer's block per second, GB/s",
    "nccl_reduce_scatter_latency_us": "NCCL reduce-scatter, a call's fixed time, us",
    "link_latency_us": "one flag over the link, us (the link the NCCL and copy numbers were measured on)",
    "handshake_us": "an operator's per-call handshake (a word to every peer, a stream wait), us",
    "kernel_launch_us": "one kernel launch on the device, us",
    "host_ms.ag_gemm": "host time per ag_gemm call, ms",
    "host_ms.gemm_rs": "host time per gemm_rs call, ms",
    "host_ms.gemm_ar": "host time per gemm_ar call, ms",
    "host_ms.ag_moe": "host time per ag_moe call (routing once), ms",
    "host_ms.moe_rs": "host time per moe_rs call (routing once), ms",
    "host_ms.sp_attention": "host time per sp_attention call, ms",
    "host_ms.plain": "host time per plain call (a torch.distributed collective + a cuBLAS GEMM), ms",
    "host_ms.plain_moe": "host time per plain MoE call (the grouped GEMM + a torch.distributed collective), ms",
    "host_peer_ms.ag_gemm": "host time each rank past two adds to an ag_gemm call (its copies and flags), ms",
    "host_peer_ms.gemm_rs": "host time each rank past two adds to a gemm_rs call (its waits, copies, flags), ms",
    "host_peer_ms.gemm_ar": "host time each rank past two adds to a gemm_ar call, ms",
    "host_peer_ms.ag_moe": "host time each rank past two adds to an ag_moe call, ms",
    "host_peer_ms.moe_rs": "host time each rank past two adds to a moe_rs call, ms",
    "host_peer_ms.sp_attention": "host time each rank past two adds to an sp_attention call, ms",
    "choice_margin": "auto takes the overlapped path only when it is predicted this fraction faster",
}


#: parts a calibration file may leave out, and the value they then take: the host's time per peer came later
#: than the files of some machines (0: the host time of two ranks at every world size)
OPTIONAL_PARTS = {name: 0.0 for name in PARTS if name.startswith("host_peer_ms.")}


@dataclasses.dataclass
class Calibration:
    """The measured parts (:data:`PARTS`), where each came from, and the machine they were measured on."""

    machine: dict
    parts: dict[str, float]
    sources: dict[str, str] = dataclasses.field(default_factory=dict)

    def __getitem__(self, name: str) -> float:
        try:
            return float(self.parts[name])
        except KeyError:
            raise KeyError(f"the calibration of {self.machine.get('device', '?')} has no part {name!r}; "
                           f"recalibrate (tlxform bench model --calibrate) or add it to the file") from None

    def to_json(self) -> dict:
        return {"machine": self.machine, "parts": self.parts, "sources": self.sources}

    @classmethod
    def from_json(cls, data: dict, where: str = "the calibration") -> Calibration:
        if not isinstance(data, dict) or not isinstance(data.get("parts"), dict):
            raise ValueError(f"{where}: not a TileLink calibration (a JSON object with 'machine' and 'parts')")
        missing = sorted(set(PARTS) - set(data["parts"]) - set(OPTIONAL_PARTS))
        if missing:
            raise ValueError(f"{where}: missing parts {', '.join(missing)}; recalibrate with tlxform bench model "
                             f"--calibrate")
        parts = {**OPTIONAL_PARTS, **{k: float(v) for k, v in data["parts"].items()}}
        sources = dict(data.get("sources", {}))
        for name in set(OPTIONAL_PARTS) - set(data["parts"]):
            sources[name] = f"not in this file: {OPTIONAL_PARTS[name]:g}"
        return cls(dict(data.get("machine", {})), parts, sources)


def load(path: str | os.PathLike | None = None) -> Calibration:
    """The calibration at ``path``, else at ``$TILELINK_CALIBRATION``, else the shipped one (H200)."""
    chosen = Path(path or os.environ.get(CALIBRATION_ENV) or SHIPPED)
    try:
        data = json.loads(chosen.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read the calibration {chosen}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{chosen}:{exc.lineno}: not JSON ({exc.msg})") from None
    return Calibration.from_json(data, str(chosen))


def save(cal: Calibration, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal.to_json(), indent=2) + "\n")
    return path


@dataclasses.dataclass(frozen=True)
class Link:
    """The link between two ranks: bandwidth per direction to one peer (GB/s) and one message's latency (us).
    ``None`` keeps the calibration's (the link it was measured on)."""

    gb_s: float | None = None
    latency_us: float | None = None


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Predicted times (ms) of one operator call, and the parts they came from."""

    op: str
    shape: dict
    world: int
    plain: float
    overlap: float
    ideal: float
    compute: float  # the plain path's compute (cuBLAS / SDPA / our grouped GEMM)
    comm: float  # the plain path's collective
    overlap_gpu: float  # the overlapped path's device time, before its host time is considered
    plain_gpu: float
    host_overlap: float
    host_plain: float

    @property
    def speedup(self) -> float:
        """plain / overlap: above 1 the overlapped kernels are predicted faster."""
        return self.plain / self.overlap if self.overlap else math.inf


# ----------------------------------------------------------------------------------------------
# the parts' equations


class _Parts:
    """The calibration's parts at one link: the few equations every operator's model shares."""

    def __init__(self, cal: Calibration, link: Link | None):
        self.cal = cal
        link = link or Link()
        base = cal["copy_engine_gb_s"]
        self.scale = (link.gb_s / base) if link.gb_s else 1.0  # every link-bound bandwidth moves with the link
        self.extra_latency_us = (link.latency_us - cal["link_latency_us"]) if link.latency_us is not None else 0.0

    def gemm(self, M: int, N: int, K: int, e: int) -> float:
        """cuBLAS: ``launch + max(2MNK / rate + C bytes / epilogue, bytes moved / HBM)``."""
        if not (M and N and K):
            return self.cal["kernel_launch_us"] * 1e-3
        compute = 2 * M * N * K / (self.cal["gemm_tflops"] * 1e9) + M * N * e / (self.cal["gemm_epilogue_gb_s"] * 1e6)
        memory = (M * K + K * N + M * N) * e / (self.cal["hbm_gb_s"] * 1e6)
        return self.cal["kernel_launch_us"] * 1e-3 + max(compute, memory)

    def memory(self, nbytes: float) -> float:
        return nbytes / (self.cal["hbm_gb_s"] * 1e6)

    def nccl(self, kind: str, per_peer_bytes: float, R: int) -> float:
        """A collective of ``R`` ranks: ``latency + (R - 1) * per-peer bytes / bandwidth`` (a ring moves every
        peer's shard through each rank's link; the latency, a call's launch and synchronisation, is measured at
        two ranks only, so it is kept fixed)."""
        if R == 1:
            return 0.0
        bw = self.cal[f"nccl_{kind}_gb_s"] * self.scale
        latency = (self.cal[f"nccl_{kind}_latency_us"] + self.extra_latency_us) * 1e-3
        return latency + (R - 1) * per_peer_bytes / (bw * 1e6)

    def copy(self, nbytes: float, via: str = "copy_engine", kind: str = "ag") -> float:
        bw = self.cal["copy_engine_gb_s"] if via == "copy_engine" else self.cal[f"sm_pull_{kind}_gb_s"]
        return nbytes / (bw * self.scale * 1e6) + max(0.0, self.extra_latency_us) * 1e-3

    def handshake(self, R: int) -> float:
        return 0.0 if R == 1 else (self.cal["handshake_us"] + self.extra_latency_us) * 1e-3

    def launch(self, n: int = 1) -> float:
        return n * self.cal["kernel_launch_us"] * 1e-3


def gather_pipeline(R: int, c: float, s: float) -> float:
    """An all-gather overlapped with compute: this rank's shard is computed first (``c`` per shard), each
    peer's shard arrives ``s`` after the one before it (the copies run one after another), and a shard is
    computed once it is here: ``max_j (j*s + (R - j) * c) = max(R*c, (R-1)*s + c)``."""
    return max(j * s + (R - j) * c for j in range(R)) if R > 1 else c


def scatter_pipeline(R: int, c: float, s: float) -> float:
    """A reduce-scatter overlapped with compute: the peers' blocks are computed first (``c`` each, this rank's
    own last), each copied to its owner after it is done and after the copy before it (``s``); done when the
    own block is computed and the last peer block has arrived."""
    if R == 1:
        return c
    sent = 0.0
    for j in range(1, R):
        sent = max(j * c, sent) + s
    return max(R * c, sent)


def _shard(n: int, R: int) -> int:
    return -(-n // R)


def _bytes(dtype) -> int:
    if isinstance(dtype, int):
        return dtype
    name = str(dtype).removeprefix("torch.")
    return {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float8_e4m3fn": 1,
            "fp8": 1}[name]


def _finish(op: str, shape: dict, R: int, p: _Parts, compute: float, comm: float, overlap_gpu: float,
            host_op: str, host_plain: str, plain_extra: float = 0.0) -> Prediction:
    plain_gpu = compute + comm + plain_extra
    cal = p.cal
    # the host's time of a call with peers: that of two ranks, plus what each further peer's copies, flags and
    # waits add (the plain path's collective is one call whatever the world)
    h_over = cal[f"host_ms.{host_op}"] + cal[f"host_peer_ms.{host_op}"] * (R - 2) if R > 1 else 0.0
    h_plain = cal[f"host_ms.{host_plain}"] if R > 1 else 0.0
    return Prediction(op=op, shape=dict(shape), world=R, plain=max(plain_gpu, h_plain),
                      overlap=max(overlap_gpu, h_over), ideal=max(compute + plain_extra, comm), compute=compute,
                      comm=comm, overlap_gpu=overlap_gpu, plain_gpu=plain_gpu, host_overlap=h_over,
                      host_plain=h_plain)


#: a GEMM of at most this many rows is a decode step's: the tile kernels' rate there is the decode records' (the
#: GEMM+AR ratio, 0.36-1.01 of cuBLAS at 1-256 tokens), not the large shapes' (0.98-0.99)
DECODE_ROWS = 256


def _tile_ratio(p: _Parts, op: str, M: int) -> float:
    return p.cal["tile_ratio.gemm_ar"] if M <= DECODE_ROWS else p.cal[f"tile_ratio.{op}"]


def _ag_gemm(p: _Parts, R: int, M: int, N: int, K: int, e: int, via: str = "copy_engine") -> Prediction:
    """AllGather(A) @ B: per rank (M, K) @ (K, N), each rank holding ceil(M/R) rows of A."""
    shard = _shard(M, R) * K * e
    compute = p.gemm(M, N, K, e)
    comm = p.nccl("all_gather", shard, R)
    tile = p.launch() + (compute - p.launch()) / _tile_ratio(p, "ag_gemm", M)
    if via == "sm":  # the pull partner keeps 16 SMs: the GEMM runs on the rest
        tile *= p.cal.machine.get("sms", 132) / (p.cal.machine.get("sms", 132) - 16)
    own_copy = p.memory(2 * shard) if R > 1 else 0.0  # the shard into this rank's symmetric set
    overlap = p.handshake(R) + own_copy + gather_pipeline(R, tile / R, p.copy(shard, via, "ag"))
    return _finish("ag_gemm", dict(M=M, N=N, K=K), R, p, compute, comm, overlap, "ag_gemm", "plain")


def _gemm_rs(p: _Parts, R: int, M: int, N: int, K: int, e: int, via: str = "copy_engine") -> Prediction:
    """(A_r @ B_r) summed over ranks and scattered by rows: per rank (M, K) @ (K, N)."""
    block = _shard(M, R) * N * e
    compute = p.gemm(M, N, K, e)
    comm = p.nccl("reduce_scatter", block, R)
    tile = p.launch() + (compute - p.launch()) / _tile_ratio(p, "gemm_rs", M)
    if R == 1:
        return _finish("gemm_rs", dict(M=M, N=N, K=K), R, p, compute, comm, tile, "gemm_rs", "plain")
    reduce = p.launch() + p.memory((R + 1) * block)  # every rank's block read, the sum written
    overlap = p.handshake(R) + scatter_pipeline(R, tile / R, p.copy(block, via, "rs")) + reduce
    return _finish("gemm_rs", dict(M=M, N=N, K=K), R, p, compute, comm, overlap, "gemm_rs", "plain")


def _gemm_ar(p: _Parts, R: int, M: int, N: int, K: int, e: int, via: str = "copy_engine") -> Prediction:
    """(A_r @ B_r) summed over ranks, the whole sum on every rank: the plain path is cuBLAS + NCCL all-reduce
    (a reduce-scatter and an all-gather of the same blocks); the overlapped one is modelled as GEMM+RS's
    pipeline followed by the copy engine's gather of the summed blocks. Its tile ratio and host time are parts
    of their own, so a measurement of the operator replaces GEMM+RS's numbers."""
    block = _shard(M, R) * N * e
    compute = p.gemm(M, N, K, e)
    comm = p.nccl("reduce_scatter", block, R) + p.nccl("all_gather", block, R)
    tile = p.launch() + (compute - p.launch()) / p.cal["tile_ratio.gemm_ar"]
    if R == 1:
        return _finish("gemm_ar", dict(M=M, N=N, K=K), R, p, compute, comm, tile, "gemm_ar", "plain")
    reduce = p.launch() + p.memory((R + 1) * block)
    gather = (R - 1) * p.copy(block, via, "ag")
    overlap = p.handshake(R) + scatter_pipeline(R, tile / R, p.copy(block, via, "rs")) + reduce + gather
    return _finish("gemm_ar", dict(M=M, N=N, K=K), R, p, compute, comm, overlap, "gemm_ar", "plain")


#: the rows a grouped GEMM pads per expert under random routing: half a tile of 128 rows on average
MOE_BLOCK_M = 128


def _grouped(p: _Parts, op: str, slots: int, N: int, K: int, E: int, e: int) -> float:
    """Our grouped GEMM: dense cuBLAS on the computed rows (slots + each expert's padding) / its row rate."""
    rows = slots + E * MOE_BLOCK_M // 2 if slots else 0
    return p.launch() + (p.gemm(rows, N, K, e) - p.launch()) / p.cal[f"tile_ratio.{op}"]


def _ag_moe(p: _Parts, R: int, S: int, H: int, N: int, E: int, topk: int, e: int) -> Prediction:
    """AllGather(tokens) + gather + grouped GEMM: S tokens of H, ``N`` = this rank's 2I/R columns. Every
    expert-sorted tile gathers tokens of every rank, so the GEMM waits for the whole gather."""
    shard = _shard(S, R) * H * e
    compute = _grouped(p, "ag_moe", S * topk, N, H, E, e)
    comm = p.nccl("all_gather", shard, R)
    overlap = p.handshake(R) + (p.memory(2 * shard) if R > 1 else 0.0) + (R - 1) * p.copy(shard) + compute
    return _finish("ag_moe", dict(S=S, H=H, N=N, E=E, topk=topk), R, p, compute, comm, overlap, "ag_moe",
                   "plain_moe")


def _moe_rs(p: _Parts, R: int, S: int, H: int, K: int, E: int, topk: int, e: int) -> Prediction:
    """Grouped GEMM + scatter + top-k reduce + ReduceScatter: S*topk slots of ``K`` = I/R to H columns. The
    top-k reduce runs after the GEMM (no channel completes before its last tiles) and feeds the copy engine
    channel by channel; the peers' summed rows are then reduced on the SMs."""
    slots = S * topk
    block = _shard(S, R) * H * e
    compute = _grouped(p, "moe_rs", slots, H, K, E, e)
    topk_sum = p.launch() + p.memory((slots + S) * H * e)
    comm = p.nccl("reduce_scatter", block, R)
    # the plain path: the top-k sum in torch and the rows padded to the ranks' equal blocks before NCCL
    plain_extra = topk_sum + (p.memory(3 * S * H * e) if R > 1 else 0.0)
    if R == 1:
        overlap = compute + topk_sum
    else:
        copies = scatter_pipeline(R, topk_sum / R, p.copy(block))
        overlap = p.handshake(R) + compute + copies + p.launch() + p.memory((R + 1) * block)
    return _finish("moe_rs", dict(S=S, H=H, K=K, E=E, topk=topk), R, p, compute, comm, overlap, "moe_rs",
                   "plain_moe", plain_extra)


def _sp_attention(p: _Parts, R: int, S: int, heads: int, kv_heads: int, head_dim: int, e: int,
                  causal: bool = False, batch: int = 1) -> Prediction:
    """Sequence-parallel attention: S/R query rows per rank against all S keys; K and V all-gathered."""
    rows = _shard(S, R)
    flops = 4 * batch * rows * S * heads * head_dim * (0.5 if causal else 1.0)
    compute = p.launch() + flops / (p.cal["attention_tflops"] * 1e9)
    shard = 2 * batch * rows * kv_heads * head_dim * e
    comm = p.nccl("all_gather", shard, R)
    tile = p.launch() + (compute - p.launch()) / p.cal["tile_ratio.sp_attention"]
    overlap = p.handshake(R) + (p.memory(2 * shard) if R > 1 else 0.0) + gather_pipeline(R, tile / R, p.copy(shard))
    return _finish("sp_attention", dict(S=S, heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=causal,
                                        batch=batch), R, p, compute, comm, overlap, "sp_attention", "plain")


#: each operator's model: the shape's names (in order) and the function of (parts, R, *shape, dtype bytes)
OPERATORS: dict[str, tuple[tuple[str, ...], Callable]] = {
    "ag_gemm": (("M", "N", "K"), _ag_gemm),
    "gemm_rs": (("M", "N", "K"), _gemm_rs),
    "gemm_ar": (("M", "N", "K"), _gemm_ar),
    "ag_moe": (("S", "H", "N", "E", "topk"), _ag_moe),
    "moe_rs": (("S", "H", "K", "E", "topk"), _moe_rs),
    "sp_attention": (("S", "heads", "kv_heads", "head_dim"), _sp_attention),
}


def predict(op: str, shape: dict, world: int, *, dtype="bf16", link: Link | None = None,
            calibration: Calibration | None = None, **options) -> Prediction:
    """Predicted times of ``op`` (a key of :data:`OPERATORS`) on ``shape`` (its names, per-rank sizes as the
    operator takes them) over ``world`` ranks. ``options``: ``via="sm"`` for the GEMMs' SM pull,
    ``causal``/``batch`` for attention."""
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op!r}: the cost model knows {', '.join(OPERATORS)}")
    names, fn = OPERATORS[op]
    missing = [n for n in names if n not in shape]
    if missing:
        raise ValueError(f"{op}: shape lacks {', '.join(missing)} (it takes {', '.join(names)})")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive int, got {world!r}")
    parts = _Parts(calibration or shipped(), link)
    if op == "sp_attention":  # its options may come with the shape (the operator's shared arguments)
        options = {k: shape[k] for k in ("causal", "batch") if k in shape} | options
    return fn(parts, world, *(int(shape[n]) for n in names), _bytes(dtype), **options)


_shipped: tuple[str, Calibration] | None = None  # ($TILELINK_CALIBRATION when read, what it gave)


def shipped() -> Calibration:
    """The calibration the operators use: ``$TILELINK_CALIBRATION`` or the shipped one, read again only when the
    variable changes."""
    global _shipped
    chosen = os.environ.get(CALIBRATION_ENV, "")
    if _shipped is None or _shipped[0] != chosen:
        _shipped = (chosen, load())
    return _shipped[1]


def reset() -> None:
    """Forget the calibration read (after the file at ``$TILELINK_CALIBRATION`` changes)."""
    global _shipped
    _shipped = None


# ----------------------------------------------------------------------------------------------
# the choice


@dataclasses.dataclass(frozen=True)
class Choice:
    path: str  # "overlap" or "plain"
    why: str
    prediction: Prediction | None = None


def decide(op: str, shape: dict, world: int, *, dtype="bf16", calibration: Calibration | None = None,
           **options) -> Choice:
    """The model's choice for ``op`` on ``shape``: the overlapped kernels when they are predicted faster than the
    plain path by more than the calibration's ``choice_margin``, else the plain path."""
    cal = calibration or shipped()
    if world == 1:
        return Choice("overlap", "one rank: nothing to communicate, the kernel runs with satisfied channels")
    pred = predict(op, shape, world, dtype=dtype, calibration=cal, **options)
    margin = cal["choice_margin"]
    path = "overlap" if pred.overlap < pred.plain * (1 - margin) else "plain"
    why = (f"predicted overlap {pred.overlap:.4f} ms (device {pred.overlap_gpu:.4f}, host {pred.host_overlap:.4f}) "
           f"vs plain {pred.plain:.4f} ms (device {pred.plain_gpu:.4f}, host {pred.host_plain:.4f}), margin "
           f"{margin:.0%}, calibration {cal.machine.get('device', '?')}")
    return Choice(path, why, pred)
