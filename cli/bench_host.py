"""``tlxform bench host``: the host time of one call of ``ag_gemm`` and ``gemm_rs`` (``benchmarks/host.py``)."""

from __future__ import annotations

from pathlib import Path

import click

from tilelink.cli.bench_cmd import _benchmarks_module


def _worlds(ctx, param, value: str) -> tuple[int, ...]:
    try:
        worlds = tuple(int(w) for w in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: write world sizes separated by commas, e.g. 1,2") from None
    if not worlds or min(worlds) < 1:
        raise click.BadParameter(f"{value!r}: every world size must be at least 1")
    return worlds


@click.command()
@click.option("--worlds", default="1,2", show_default=True, callback=_worlds,
              help="World sizes to measure, one world of ranks started after the other (ranks beyond the GPUs "
                   "share GPU 0).")
@click.option("--shape", default="MLP-1", show_default=True, help="The Table 4 MLP shape (per-rank GEMMs).")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
              show_default=True, help="Directory for the JSON record.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--calls", type=click.IntRange(min=1), default=20, show_default=True,
              help="Back-to-back calls per round (and calls profiled).")
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True,
              help="Rounds per method, a synchronisation between them; the median round is reported.")
@click.option("--kernel", type=click.Choice(["auto", "persistent", "pointer"]), default="auto", show_default=True,
              help="The operators' kernels: persistent (copy engine) or pointer (SM pull); auto: persistent on a "
                   "GPU.")
@click.option("--part", "parts", type=click.Choice(["ag_gemm", "gemm_rs"]), multiple=True,
              default=("ag_gemm", "gemm_rs"), show_default=True, help="Operators to measure (repeatable).")
@click.option("--profile/--no-profile", default=True, show_default=True,
              help="Also profile the operators' calls with cProfile (rank 0's top 20 in the record).")
@click.option("--scale", type=click.IntRange(min=1), default=1, show_default=True,
              help="Divide S, H and I by this (smoke tests on small machines).")
def command(worlds: tuple[int, ...], shape: str, out: Path, dtype: str, calls: int, rounds: int, kernel: str,
            parts: tuple[str, ...], profile: bool, scale: int) -> None:
    """Host time per call of ag_gemm and gemm_rs against torch.matmul (and a collective), with a profile."""
    _benchmarks_module("host").run(worlds=worlds, shape=shape, out=out, dtype=dtype, calls=calls, rounds=rounds,
                                   kernel=kernel, parts=parts, profile=profile, scale=scale)
