"""``tlxform bench attention``: sequence-parallel self-attention (paper Table 4 Attn-1/2, Figure 10)."""

from __future__ import annotations

from pathlib import Path

import click

from tilelink.cli.bench_cmd import _benchmarks_module


@click.command()
@click.option("--world", "-w", type=click.IntRange(min=1), default=8, show_default=True,
              help="Sequence-parallel world size: sets the per-rank shapes, and the ranks in dist mode.")
@click.option("--shapes", default="all", show_default=True, help="'all' or a comma list such as 'Attn-1' or '1,2'.")
@click.option("--seqs", default="all", show_default=True, help="Sequence lengths: 'all' (16k..128k) or e.g. '16k,64k'.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
              show_default=True, help="Directory for the JSON record.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--mode", type=click.Choice(["auto", "compute", "dist"]), default="auto", show_default=True,
              help="compute: one GPU, our flash attention vs SDPA (flash backend) on the per-rank shapes; dist: "
                   "under torchrun on --world GPUs, vs torch all-gather + SDPA and ring attention.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed repetitions per method (each a do_bench median); methods alternate order.")
@click.option("--configs/--no-configs", default=False, show_default=True,
              help="compute mode: also time candidate tile configs on the first shape.")
@click.option("--rewritten/--no-rewritten", default=True, show_default=True,
              help="compute mode: also time the rewritten kernel with every channel satisfied.")
def command(world: int, shapes: str, seqs: str, out: Path, dtype: str, mode: str, rounds: int, configs: bool,
            rewritten: bool) -> None:
    """Sequence-parallel attention: AllGather K/V on the copy engine + flash attention."""
    _benchmarks_module("attention").run(world=world, shapes=shapes, seqs=seqs, out=out, dtype=dtype, mode=mode,
                                        rounds=rounds, configs=configs, rewritten=rewritten)
