"""``tlxform bench moe``: tensor-parallel MoE (paper Table 4 MoE-1..6, Figure 9), ``benchmarks/moe.py``."""

from __future__ import annotations

from pathlib import Path

import click

from tilelink.cli.bench_cmd import _benchmarks_module


@click.command()
@click.option("--world", "-w", type=click.IntRange(min=1), default=8, show_default=True,
              help="Tensor-parallel world size: sets the per-rank shapes, and the ranks in dist mode.")
@click.option("--shapes", default="all", show_default=True, help="'all' or a comma list such as 'MoE-4' or '4,5,6'.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
              show_default=True, help="Directory for the JSON record.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--mode", type=click.Choice(["auto", "compute", "dist"]), default="auto", show_default=True,
              help="compute: one GPU, the grouped GEMMs vs dense cuBLAS on equal FLOPs and a torch loop over "
                   "experts; dist: --world ranks (started here, one per GPU or emulated without GPUs enough; "
                   "or under torchrun), ag_moe / moe_rs vs torch and vs our non-overlapped fused path, with "
                   "the host's time per call.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed repetitions per method (each a do_bench median); methods alternate order.")
@click.option("--configs/--no-configs", default=False, show_default=True,
              help="compute mode: also time candidate tile configs.")
@click.option("--rewritten/--no-rewritten", default=True, show_default=True,
              help="compute mode: also time the rewritten kernels with every channel satisfied.")
@click.option("--profile/--no-profile", default=False, show_default=True,
              help="dist mode: also profile 5 calls of each overlapped operator and of the fused path (Chrome "
                   "traces in OUT/profile, the last call's device timeline in the JSON).")
@click.option("--routing", type=click.Choice(["per-call", "once"]), default="per-call", show_default=True,
              help="dist mode: every call routes topk_ids itself (one copy to the host, which waits for the "
                   "GPU), or the routing is made once before the timed calls and passed in (as TPMoE does for "
                   "both parts of a layer).")
@click.option("--expert-routing", type=click.Choice(["random", "balanced", "equal"]), default="random",
              show_default=True,
              help="compute mode: which experts the tokens pick: at random, or every expert the same number of "
                   "slots (balanced: a token's experts neighbours; equal: dealt in a random order), to see what "
                   "uneven experts cost.")
def command(world: int, shapes: str, out: Path, dtype: str, mode: str, rounds: int, configs: bool,
            rewritten: bool, profile: bool, routing: str, expert_routing: str) -> None:
    """Tensor-parallel MoE: AG + gather + GroupGEMM and GroupGEMM + scatter + top-k reduce + RS."""
    _benchmarks_module("moe").run(world=world, shapes=shapes, out=out, dtype=dtype, mode=mode, rounds=rounds,
                                  configs=configs, rewritten=rewritten, profile=profile, routing=routing,
                                  expert_routing_kind=expert_routing)
