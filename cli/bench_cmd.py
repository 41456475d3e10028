"""``tlxform bench``: the paper's benchmarks (``tilelink.benchmarks``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import click

_VARIANTS = ("auto", "pointer", "descriptor", "persistent", "persistent_ws")


def _benchmarks_module(name: str):
    """``tilelink.benchmarks.<name>``, imported when its command runs (the benchmarks load torch)."""
    return importlib.import_module(f"tilelink.benchmarks.{name}")


@click.group()
def bench() -> None:
    """Run the paper's benchmarks and write JSON records and PNG charts."""


@bench.command()
@click.option("--world", "-w", type=click.IntRange(min=1), default=8, show_default=True,
              help="Tensor-parallel world size: sets the per-rank shapes, and the ranks in dist mode.")
@click.option("--shapes", default="all", show_default=True,
              help="Table 4 MLP shapes: 'all' or a comma list such as 'MLP-1,MLP-3' or '1,3'.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
              show_default=True, help="Directory for the JSON record and the PNG chart.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32", "fp8"]), default="bf16", show_default=True,
              help="Operand dtype. fp8: e4m3 operands with row-wise and per-tensor scales and bf16 out, the operators' "
                   "FP8 kernels against torch._scaled_mm (compute mode only).")
@click.option("--mode", type=click.Choice(["auto", "compute", "dist"]), default="auto", show_default=True,
              help="compute: one GPU, per-rank GEMM vs torch.matmul; dist: --world GPUs, vs cuBLAS+NCCL and "
                   "async-TP; auto: dist when there are --world GPUs, else compute.")
@click.option("--variant", "variants", type=click.Choice(_VARIANTS), multiple=True, default=("auto",),
              show_default=True, help="compute mode: TileLink GEMM variant(s) to measure (repeatable).")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed repetitions per method (each a do_bench median); methods alternate order.")
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True,
              help="Divide S, H and I by this (smoke tests on small machines).")
def mlp(world: int, shapes: str, out: Path, dtype: str, mode: str, variants: tuple[str, ...], rounds: int,
        scale: int) -> None:
    """Tensor-parallel MLP (paper Table 4, Figure 8): AG+GEMM and GEMM+RS per shape."""
    record = _benchmarks_module("mlp").run(world=world, shapes=shapes, out=out, dtype=dtype, mode=mode,
                                           variants=variants, rounds=rounds, scale=scale)
    _fail_if_nothing_ran(record)


def _fail_if_nothing_ran(record) -> None:
    """Exit non-zero, saying why, when no TileLink measurement of the benchmark succeeded (every shape's
    every method failed): a record of errors alone is not a result."""
    if not isinstance(record, dict) or not record.get("results"):
        return
    ours = ("TileLink",) if record.get("mode") == "dist" else tuple(record.get("variants") or ())
    if any(name in row.get("median_ms", {}) for row in record["results"] for name in ours):
        return
    errors = [e for row in record["results"] for e in row.get("errors", {}).values()]
    why = f"; the first error: {errors[0]}" if errors else ""
    import torch

    hint = ("; there is no GPU here (torch.cuda.is_available() is False) and the benchmarks measure GPU kernels"
            if not torch.cuda.is_available() else "")
    raise click.ClickException(f"nothing ran: every TileLink measurement of {len(record['results'])} shape/part(s) "
                               f"failed{why}{hint}")


# further benchmarks live in their own modules of this package (cli/bench_<name>.py), each defining a
# click command named `command`
for _name in ("moe", "attention", "e2e", "host", "model", "decode"):
    bench.add_command(importlib.import_module(f"tilelink.cli.bench_{_name}").command, name=_name)
