"""End-to-end decoder forward (paper §7.3, Figure 11): TileLink TP layers vs plain PyTorch TP.

The model is :class:`tilelink.ops.models.TPDecoder` (AG+GEMM for QKV, local attention, GEMM+RS for W_o,
``tilelink.nn.TPMLP``, or ``tilelink.nn.TPMoE`` for the MoE models ``mixtral-8x7b`` and
``qwen1.5-moe-a2.7b``); the baseline :class:`tilelink.ops.models_reference.TorchTPDecoder` on the very
same weight tensors (``from_shards``): ``all_gather_into_tensor`` + ``matmul`` and ``matmul`` +
``reduce_scatter_tensor`` on an NCCL group. Default input: batch 4 × seq 8192 tokens of hidden states.

Ranks are started with :func:`tilelink.spawn` (``backend="nvshmem"`` on GPUs, rank r on GPU r; emulated
CPU ranks without a GPU, a smoke test only). Each method runs ``--iters`` timed forwards per round,
rounds alternating which method goes first; every forward is timed with CUDA events after a barrier, a
forward's time is the slowest rank's, and the result is the median over all forwards.

**One GPU, world 1** (the default world): the single-rank model, i.e. the TileLink kernels with no peer
against cuBLAS/SDPA; it says what the compute part costs, nothing about overlap — that needs one GPU
per rank. With more ranks than GPUs the baseline falls back to gloo through host memory, so such runs
are refused for timing.

``python -m tilelink.benchmarks.e2e --help`` or ``tlxform bench e2e``; writes ``e2e_w<R>_<dtype>.json`` and a
PNG chart into ``--out``, and with ``--record`` a markdown table (with its command, date and device) beside them,
ready to replace the end-to-end table of ``docs/PERFORMANCE.md``.
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
import sys
import time
from pathlib import Path

import click

from tilelink.benchmarks.common import bar_chart, environment, write_json

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def forward_flops(config, batch: int, seq: int) -> float:
    """Matmul FLOPs of one forward (causal attention counted as half of the S² products). MoE: the router,
    each token's top-k experts and the shared expert (the FLOPs actually needed, not the padded tiles)."""
    T, H, I, d = batch * seq, config.hidden, config.intermediate, config.head_dim  # noqa: E741
    mlp = 3 * 2 * T * H * I
    if getattr(config, "experts", 0):
        mlp = (2 * T * H * config.experts + config.top_k * 3 * 2 * T * H * I
               + 3 * 2 * T * H * config.shared_intermediate + (2 * T * H if config.shared_expert_gate else 0))
    per_layer = (2 * T * H * config.qkv_width + 2 * T * config.heads * d * H + mlp
                 + 2 * batch * config.heads * seq * seq * d)  # QK^T and PV, each half of S² by causality
    return float(per_layer * config.layers)


def _forward_times(fn, iters: int, device, barrier) -> list[float]:
    import torch

    samples = []
    for _ in range(iters):
        barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def measure_rank(config_fields: dict, batch: int, seq: int, dtype_name: str, iters: int, rounds: int,
                 warmup: int, seed: int = 0) -> dict:
    """Body of one rank: build both models on shared weights, check them, time them."""
    import torch
    import torch.distributed as dist

    from tilelink.ops.models import DecoderConfig, TPDecoder, row_bounds
    from tilelink.ops.models_reference import TorchTPDecoder
    from tilelink.runtime import current_world

    config = DecoderConfig(**config_fields)
    dtype = getattr(torch, dtype_name)
    world = current_world()
    R, device = world.world_size, world.device
    group, baseline_comm = None, "none (world 1)"
    if R > 1:
        if device.type == "cuda" and torch.cuda.device_count() >= R:
            group, baseline_comm = dist.new_group(backend="nccl"), "nccl"
        else:
            baseline_comm = "gloo (host memory)"
    torch.manual_seed(seed)
    tl_model = TPDecoder(config, seed=seed, dtype=dtype)
    torch_model = TorchTPDecoder.from_shards(config, tl_model.shards(), group=group)
    lo, hi = row_bounds(batch * seq, world.rank, R)
    x = torch.randn(hi - lo, config.hidden, device=device, dtype=torch.float32).to(dtype)
    fns = {"pytorch": lambda: torch_model(x, batch, seq), "tilelink": lambda: tl_model(x, batch, seq)}

    def barrier() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()
        if R > 1:
            dist.barrier()

    with torch.no_grad():
        y_tl, y_torch = fns["tilelink"](), fns["pytorch"]()
        rel_err = float((y_tl.float() - y_torch.float()).norm() / max(y_torch.float().norm().item(), 1e-30))
        del y_tl, y_torch
        for name in fns:
            _forward_times(fns[name], warmup, device, barrier)
        times: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        for r in range(rounds):
            for name in names[r % 2:] + names[:r % 2]:
                times[name] += _forward_times(fns[name], iters, device, barrier)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {"rank": world.rank, "times_ms": times, "rel_err": rel_err, "peak_gib": peak,
            "baseline_comm": baseline_comm}


def run_model(name: str, *, world: int, batch: int, seq: int, layers: int | None, dtype: str, iters: int,
              rounds: int, warmup: int) -> dict:
    """Measure one model; returns its row of the record."""
    import torch

    import tilelink
    from tilelink.ops.models import check_config, get_config

    config = get_config(name)
    if layers:
        config = config.with_layers(layers)
    check_config(config, world)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and gpus < world:
        raise click.ClickException(f"world {world} needs {world} GPUs for a timing (this machine has {gpus}): "
                                   f"ranks sharing a GPU measure nothing useful; the GPU tests cover correctness")
    backend = "nvshmem" if gpus else "emulated"
    per_rank = tilelink.spawn(measure_rank, world, dataclasses.asdict(config), batch, seq, DTYPES[dtype], iters,
                              rounds, warmup, backend=backend, timeout=3600)
    slowest = {m: [max(r["times_ms"][m][i] for r in per_rank) for i in range(len(per_rank[0]["times_ms"][m]))]
               for m in per_rank[0]["times_ms"]}
    median = {m: statistics.median(v) for m, v in slowest.items()}
    flops = forward_flops(config, batch, seq) / world
    return {"model": config.name, "source": config.source, "layers": config.layers, "hidden": config.hidden,
            "intermediate": config.intermediate, "heads": config.heads, "kv_heads": config.kv_heads,
            "head_dim": config.head_dim, "experts": config.experts, "top_k": config.top_k,
            "shared_intermediate": config.shared_intermediate, "backend": backend,
            "baseline_comm": per_rank[0]["baseline_comm"],
            "forward_ms": slowest, "median_ms": median, "speedup": median["pytorch"] / median["tilelink"],
            "tflops_per_rank": {m: flops / (t * 1e-3) / 1e12 for m, t in median.items()},
            "rel_err": max(r["rel_err"] for r in per_rank),
            "peak_gib": max((r["peak_gib"] or 0.0) for r in per_rank) or None}


def markdown_table(record: dict) -> str:
    lines = ["| model | layers | tokens | PyTorch TP ms | TileLink ms | speedup | TFLOP/s per rank (torch / tilelink) "
             "| rel. err |", "|---|---|---|---|---|---|---|---|"]
    tokens = f"{record['batch']}×{record['seq']}"
    for r in record["results"]:
        if "error" in r:
            lines.append(f"| {r['model']} | - | {tokens} | error: {r['error'][:80]} | | | | |")
            continue
        t = r["tflops_per_rank"]
        lines.append(f"| {r['model']} | {r['layers']} | {tokens} | {r['median_ms']['pytorch']:.2f} | "
                     f"{r['median_ms']['tilelink']:.2f} | {r['speedup']:.3f} | {t['pytorch']:.0f} / "
                     f"{t['tilelink']:.0f} | {r['rel_err']:.1e} |")
    return "\n".join(lines)


def record_markdown(record: dict, path: Path) -> Path:
    """Write this run's table, with its command, date and device, to ``path`` (markdown)."""
    block = [
        "", f"### End-to-end decoder forward, world {record['world']}, {record['dtype']} — {record['date']}", "",
        f"Device: {record['device']}; torch {record['torch']}, triton {record['triton']}. Command:", "",
        "```", record["command"], "```", "",
        f"{record['iters'] * record['rounds']} timed forwards per method (CUDA events, slowest rank), median. "
        + ("World 1: the single-rank model, no communication — the compute of the TileLink kernels "
           "against cuBLAS/SDPA, not overlap." if record["world"] == 1 else ""), "",
        markdown_table(record), ""]
    path.write_text("\n".join(block).lstrip("\n"))
    return path


def chart(record: dict, path: Path) -> Path | None:
    ok = [r for r in record["results"] if "error" not in r]
    groups = [f"{r['model']}\n{r['layers']} layers" for r in ok]
    series = {"PyTorch TP": [1.0] * len(ok), "TileLink": [r["speedup"] for r in ok]}
    title = (f"Decoder forward, batch {record['batch']} x seq {record['seq']}, world {record['world']}, "
             f"{record['dtype']}, {record['device']}")
    return bar_chart(path, title, groups, series, "speedup over PyTorch TP")


def run(models: tuple[str, ...], world: int, batch: int, seq: int, layers: int | None, dtype: str, iters: int,
        rounds: int, warmup: int, out: Path, record: bool, command: str | None = None) -> dict:
    results = []
    for name in models:
        click.echo(f"{name}: world {world}, batch {batch} x seq {seq}, {dtype} ...", err=True)
        try:
            row = run_model(name, world=world, batch=batch, seq=seq, layers=layers, dtype=dtype, iters=iters,
                            rounds=rounds, warmup=warmup)
        except click.ClickException:
            raise
        except Exception as exc:  # one model that does not fit must not lose the others' numbers
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            click.echo(f"  {row['error'][:300]}", err=True)
        else:
            click.echo(f"  torch {row['median_ms']['pytorch']:.3f} ms, tilelink {row['median_ms']['tilelink']:.3f} ms,"
                       f" speedup {row['speedup']:.3f}, rel err {row['rel_err']:.2e}", err=True)
        results.append(row)
    rec = {"benchmark": "e2e", "world": world, "batch": batch, "seq": seq, "dtype": dtype, "iters": iters,
           "rounds": rounds, "warmup": warmup,
           "command": command or shlex.join(["python", "-m", "tilelink.benchmarks.e2e", *sys.argv[1:]]),
           **environment(), "results": results}
    stem = f"e2e_w{world}_{dtype}"
    click.echo(f"wrote {write_json(out / f'{stem}.json', rec)}", err=True)
    png = chart(rec, out / f"{stem}.png")
    if png:
        click.echo(f"wrote {png}", err=True)
    click.echo(markdown_table(rec))
    if record:
        click.echo(f"wrote {record_markdown(rec, out / f'{stem}.md')}", err=True)
    return rec


def _options(fn):
    from tilelink.cli.bench_e2e import options

    return options(fn)


@click.command()
@_options
def main(models, world, batch, seq, layers, dtype, iters, rounds, warmup, out, record) -> None:
    """Decoder forward: TileLink TP layers vs PyTorch TP (paper §7.3)."""
    run(models, world, batch, seq, layers, dtype, iters, rounds, warmup, out, record)


if __name__ == "__main__":
    main()

