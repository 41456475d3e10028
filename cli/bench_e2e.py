"""``tlxform bench e2e``: end-to-end decoder forward, TileLink TP vs PyTorch TP (``benchmarks/e2e.py``).

The options live here (``python -m tilelink.benchmarks.e2e`` takes the same ones); the benchmark module is
imported when the command runs (it loads torch).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

# the names of tilelink.ops.models.MODELS, spelled out so that `tlxform --help` need not import torch
# (tests/ops/test_models.py keeps the two lists equal)
MODEL_NAMES = ("llama-2-7b", "llama-3.1-8b", "gemma-2-9b", "gemma-2-27b", "llama-3.1-70b", "qwen-2-72b", "tiny",
               "small", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "tiny-moe", "tiny-qwen-moe")


def options(fn):
    """The command-line options, shared by ``python -m tilelink.benchmarks.e2e`` and ``tlxform bench e2e``."""
    decorators = [
        click.option("--model", "models", multiple=True, default=("llama-2-7b",), show_default=True,
                     type=click.Choice(MODEL_NAMES, case_sensitive=False),
                     help="Model (repeatable)."),
        click.option("--world", "-w", type=click.IntRange(min=1), default=1, show_default=True,
                     help="TP ranks, one GPU each (world 1 on one GPU: the single-rank model)."),
        click.option("--batch", type=click.IntRange(min=1), default=4, show_default=True),
        click.option("--seq", type=click.IntRange(min=1), default=8192, show_default=True),
        click.option("--layers", type=click.IntRange(min=1), default=None,
                     help="Run this many layers instead of the model's (models whose weights do not fit)."),
        click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True),
        click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True,
                     help="Timed forwards per method per round."),
        click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True,
                     help="Rounds; each alternates which method goes first."),
        click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
                     show_default=True, help="Directory for the JSON record and the PNG chart."),
        click.option("--record", is_flag=True,
                     help="Also write the markdown table, with its command, date and device, into --out."),
    ]
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


@click.command(name="e2e")
@options
def command(models, world, batch, seq, layers, dtype, iters, rounds, warmup, out, record) -> None:
    """Decoder forward on the paper's models: TileLink TP layers vs PyTorch TP (paper §7.3, Figure 11).

    Batch 4 x seq 8192 by default. With --world 1 on one GPU it measures the single-rank model
    (compute only, no overlap): the only thing one GPU can tell.
    """
    from tilelink.cli.bench_cmd import _benchmarks_module

    args = sys.argv[sys.argv.index("e2e") + 1:] if "e2e" in sys.argv else []
    _benchmarks_module("e2e").run(models, world, batch, seq, layers, dtype, iters, rounds, warmup, out, record,
                                  command=shlex.join(["tlxform", "bench", "e2e", *args]))
