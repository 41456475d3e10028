"""``tlxform bench decode``: the row-parallel linears of the paper's models at decode batch sizes, GEMM +
AllReduce against cuBLAS + NCCL (``benchmarks/decode.py``)."""

from __future__ import annotations

from pathlib import Path

import click

from tilelink.cli.bench_cmd import _benchmarks_module

# the dense models of tilelink.ops.models.MODELS, spelled out so that `tlxform --help` need not import torch
MODEL_NAMES = ("llama-2-7b", "llama-3.1-8b", "gemma-2-9b", "gemma-2-27b", "llama-3.1-70b", "qwen-2-72b", "tiny",
               "small")


def _tokens(ctx, param, value: str) -> tuple[int, ...]:
    try:
        tokens = tuple(int(t) for t in value.split(",") if t.strip())
    except ValueError:
        raise click.BadParameter(f"expected a comma list of token counts such as 1,16,256, got {value!r}") from None
    if not tokens or min(tokens) < 1:
        raise click.BadParameter(f"token counts must be positive, got {value!r}")
    return tokens


@click.command()
@click.option("--model", "models", multiple=True, type=click.Choice(MODEL_NAMES, case_sensitive=False),
              default=("llama-2-7b", "llama-3.1-8b", "gemma-2-9b", "gemma-2-27b", "llama-3.1-70b", "qwen-2-72b"),
              show_default=True, help="Model whose o_proj and down_proj are measured (repeatable).")
@click.option("--tokens", default="1,4,16,64,256", show_default=True, callback=_tokens,
              help="Decode batch sizes (rows of the GEMM), a comma list.")
@click.option("--world", "-w", type=click.IntRange(min=1), default=8, show_default=True,
              help="Tensor-parallel world size: the K slice of each rank, and the ranks in dist mode.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--mode", type=click.Choice(["auto", "compute", "dist"]), default="auto", show_default=True,
              help="compute: one GPU, the per-rank GEMM vs torch.matmul; dist: --world ranks (one per GPU, or "
                   "emulated without GPUs enough), gemm_ar vs cuBLAS + NCCL all_reduce; auto: dist when there are "
                   "--world GPUs, else compute.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed repetitions per method (each a median of many calls); methods alternate order.")
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True,
              help="Divide N and K by this (smoke runs on small machines).")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
              show_default=True, help="Directory for the JSON record and the markdown table.")
def command(models: tuple[str, ...], tokens: tuple[int, ...], world: int, dtype: str, mode: str, rounds: int,
            scale: int, out: Path) -> None:
    """Decode: GEMM + AllReduce of the row-parallel linears, TileLink vs cuBLAS + NCCL."""
    _benchmarks_module("decode").run(models=models, tokens=tokens, world=world, dtype=dtype, mode=mode,
                                     rounds=rounds, scale=scale, out=out)
