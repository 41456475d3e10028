"""What every TileLink benchmark shares: the paper's shapes, per-rank shapes, timing, JSON and charts.

Per-rank shapes of the tensor-parallel MLP (paper §2.4, §7.2, Table 4) at world size W, with S the
tokens, H the hidden size and I the intermediate size:

- AG+GEMM (gate and up projections fused into one GEMM): each rank holds S/W rows of the input;
  after the all-gather it computes ``(S, H) @ (H, 2*I/W)``: **M = S, N = 2*I/W, K = H**.
- GEMM+RS (down projection): each rank computes the partial sum ``(S, I/W) @ (I/W, H)``, then the
  reduce-scatter leaves it S/W rows: **M = S, N = H, K = I/W**.

Speed is reported as a ratio ``baseline time / our time`` measured in the same process, side by side
(rounds alternate which of the two runs first); above 1 means faster than the baseline.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import click


@dataclasses.dataclass(frozen=True)
class MLPShape:
    """One row of the paper's Table 4 (MLP part)."""

    name: str
    S: int
    H: int
    I: int  # noqa: E741 - the paper's name for the intermediate size
    source: str


@dataclasses.dataclass(frozen=True)
class GemmShape:
    """One GEMM, C (M x N) = A (M x K) @ B (K x N)."""

    M: int
    N: int
    K: int

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K


MLP_SHAPES: dict[str, MLPShape] = {s.name: s for s in (
    MLPShape("MLP-1", 8192, 4096, 11008, "LLaMA-7B"),
    MLPShape("MLP-2", 8192, 4096, 14336, "LLaMA-3.1-8B"),
    MLPShape("MLP-3", 8192, 3584, 14336, "Gemma-2-9B"),
    MLPShape("MLP-4", 8192, 4608, 36864, "Gemma-2-27B"),
    MLPShape("MLP-5", 8192, 8192, 28672, "LLaMA-3.1-70B"),
    MLPShape("MLP-6", 8192, 8192, 29568, "Qwen-2-72B"),
)}

PARTS = ("ag_gemm", "gemm_rs")


def scaled(shape: MLPShape, scale: int, world: int = 1) -> MLPShape:
    """``shape`` with S, H and I divided by ``scale`` (smoke tests on small machines); S and I stay
    multiples of ``world``."""
    if scale == 1:
        return shape
    shrink = lambda v, m: max(m, v // scale // m * m)
    return dataclasses.replace(shape, S=shrink(shape.S, world), H=shrink(shape.H, 1),
                               I=shrink(shape.I, world))


def per_rank_gemm(shape: MLPShape, part: str, world: int) -> GemmShape:
    """The GEMM one rank computes for ``part`` ("ag_gemm" or "gemm_rs") at world size ``world``."""
    if shape.I % world or shape.S % world:
        raise click.BadParameter(f"{shape.name}: S={shape.S} and I={shape.I} must be multiples of the "
                                 f"world size {world}")
    if part == "ag_gemm":
        return GemmShape(M=shape.S, N=2 * shape.I // world, K=shape.H)
    if part == "gemm_rs":
        return GemmShape(M=shape.S, N=shape.H, K=shape.I // world)
    raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")


def select_named(table: dict, prefix: str, names: str) -> list:
    """Parse ``--shapes``: "all" or comma-separated names or numbers ("MLP-1,MLP-3" or "1,3") of
    ``table``, whose keys are ``<prefix>-<n>``."""
    if names.strip().lower() == "all":
        return list(table.values())
    by_key = {key.upper(): value for key, value in table.items()}
    chosen = []
    for item in names.split(","):
        item = item.strip()
        key = (f"{prefix}-{item}" if item.isdigit() else item).upper()
        if key not in by_key:
            raise click.BadParameter(f"unknown shape {item!r}; choose from {', '.join(table)} or 'all'")
        chosen.append(by_key[key])
    return chosen


def select_shapes(names: str) -> list[MLPShape]:
    """The MLP shapes of ``--shapes`` (see :func:`select_named`)."""
    return select_named(MLP_SHAPES, "MLP", names)


def spawn_backend(world: int) -> str:
    """The backend for ``world`` ranks started by a benchmark: NVSHMEM with a GPU for each rank, else
    emulated ranks (CPU processes)."""
    import torch

    return "nvshmem" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "emulated"


def time_ms(fn: Callable[[], object], device_type: str, group=None, host: list | None = None) -> float:
    """Median time of ``fn`` in milliseconds: CUDA events through ``triton.testing.do_bench`` on a
    GPU (L2 flushed between calls), a host clock over a few calls on the CPU.

    ``group``: ``fn`` takes part in collectives of this torch.distributed group, so every rank must call
    it the same number of times. ``do_bench`` picks its repetitions from this rank's own estimate; two
    ranks with different estimates then issue different numbers of collectives and wait for each other
    forever (the first two-GPU run of the dist mode hung so). With a group the counts come from the
    largest estimate of any rank (:func:`time_ms_agreed`), which also appends the host's time per call to
    ``host``."""
    if group is not None:
        return time_ms_agreed(fn, device_type, group, host=host)
    if device_type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def time_ms_agreed(fn: Callable[[], object], device_type: str, group, warmup_ms: float = 25,
                   rep_ms: float = 100, host: list | None = None) -> float:
    """:func:`time_ms` for a ``fn`` that calls collectives of ``group``: every rank estimates ``fn``'s time
    from a few calls, the ranks agree on the largest estimate, and all run the same number of warm-up
    and timed calls (at least 3 timed), each between its own CUDA events with L2 flushed first, enqueued
    back to back as ``do_bench`` does (the host runs ahead of the GPU: an operator's host work is hidden
    unless it is longer than its GPU work; a synchronisation after each call exposed every call's
    launch latency). Returns the median. ``host``: the host's time per call is appended to it, the
    enqueueing of the timed calls over their number (on the CPU the calls' own time): when it is as long
    as the median, the host, not the GPU, sets the pace."""
    import torch
    import torch.distributed as dist

    cuda = device_type == "cuda"
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda") if cuda else None

    def call_ms() -> float:
        if cuda:
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    fn()
    estimate = torch.tensor([statistics.median(call_ms() for _ in range(3))], dtype=torch.float64,
                            device="cuda" if cuda else "cpu")
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX, group=group)
    per_call = max(float(estimate), 1e-3)
    for _ in range(max(1, int(warmup_ms / per_call))):
        fn()
    calls = max(3, int(rep_ms / per_call))
    if not cuda:
        median = statistics.median(call_ms() for _ in range(calls))
        if host is not None:
            host.append(median)
        return median
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    enqueue = time.perf_counter()
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    if host is not None:
        host.append((time.perf_counter() - enqueue) * 1e3 / calls)
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def side_by_side(fns: dict[str, Callable[[], object]], rounds: int,
                 device_type: str, group=None, host: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Time every function of ``fns`` ``rounds`` times, rotating which runs first in each round; with
    ``group``, functions calling collectives of that group (see :func:`time_ms`), and the host's time per
    call of each in ``host``."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            times[n].append(time_ms(fns[n], device_type, group,
                                    host=host.setdefault(n, []) if host is not None else None))
    return times


def progress(items: Iterable, label: str, length: int | None = None):
    """A progress bar on stderr (click's), labelled with what is being measured."""
    return click.progressbar(items, label=label, length=length, file=click.get_text_stream("stderr"),
                             item_show_func=lambda item: None if item is None else str(item))


def environment() -> dict:
    """Device, library versions and date of a measurement, for the JSON record."""
    import torch
    import triton

    device = "cpu"
    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name()} x{torch.cuda.device_count()}"
    return {"date": datetime.date.today().isoformat(), "device": device, "torch": torch.__version__,
            "triton": triton.__version__}


def write_json(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path


def bar_chart(path: Path, title: str, groups: list[str], series: dict[str, list[float]], ylabel: str,
              reference: float | None = 1.0) -> Path | None:
    """Grouped bar chart like the paper's Figure 8: one group per shape, one bar per method.

    Returns the path written, or None (with a message) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        click.echo(f"matplotlib is not installed: skipped the chart {path.name}", err=True)
        return None
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(min(20.0, max(6.0, len(groups) * (0.5 + 0.25 * len(series)))), 4.0))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, [0 if math.isnan(v) else v for v in values], width, label=label)
        for bar, v in zip(bars, values, strict=True):
            if not math.isnan(v):
                ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    if reference is not None:
        ax.axhline(reference, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
