"""``tlxform bench model``: the cost model's predictions, its validation against the records, and the
calibration of this machine (``benchmarks/model.py``, ``tilelink.cost``)."""

from __future__ import annotations

from pathlib import Path

import click


def _shape(text: str) -> dict:
    shape = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise click.BadParameter(f"{item!r}: give the shape as NAME=INT pairs, such as M=8192,N=11008,K=4096")
        shape[name.strip()] = int(value)
    return shape


@click.command()
@click.option("--op", type=click.Choice(["ag_gemm", "gemm_rs", "gemm_ar", "ag_moe", "moe_rs", "sp_attention"]),
              default=None, help="Predict one operator on --shape (default: every paper shape at --world).")
@click.option("--shape", "shape_text", default="",
              help="The operator's per-rank shape: M=,N=,K= (GEMMs); S=,H=,N=|K=,E=,topk= (MoE); "
                   "S=,heads=,kv_heads=,head_dim= (attention).")
@click.option("--world", "-w", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--link-gb-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Link bandwidth to one peer, GB/s (default: the calibration's link).")
@click.option("--link-latency-us", type=click.FloatRange(min=0), default=None,
              help="Link latency, us (default: the calibration's link).")
@click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Calibration file (default: $TILELINK_CALIBRATION, else the shipped H200 one).")
@click.option("--validate", is_flag=True, help="The model against every measured multi-GPU run in --records.")
@click.option("--records", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The records' folder (default: docs/perf of this checkout).")
@click.option("--calibrate", is_flag=True,
              help="Measure the parts on this machine's GPU(s) and write --out (parts not measurable here keep "
                   "the calibration's).")
@click.option("--from-records", is_flag=True, help="Build the calibration from --records and write --out.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("calibration.json"),
              show_default=True, help="Where --calibrate / --from-records write the calibration.")
def command(op, shape_text, world, dtype, link_gb_s, link_latency_us, calibration, validate, records, calibrate,
            from_records, out) -> None:
    """The cost model: overlapped vs cuBLAS/SDPA + NCCL, predicted from measured parts."""
    from tilelink import cost
    from tilelink.benchmarks import model

    folder = records or model.RECORDS
    if from_records:  # needs no calibration to start from
        click.echo(f"wrote {cost.save(model.calibration_from_records(folder), out)} (from {folder})")
        return
    try:
        cal = cost.load(calibration)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if calibrate:
        cal = model.calibrate(cal, echo=lambda line: click.echo(line, err=True))
        click.echo(f"wrote {cost.save(cal, out)}; use it with TILELINK_CALIBRATION={out}")
        return
    link = cost.Link(link_gb_s, link_latency_us)
    if validate:
        rows = model.validation_rows(cal, folder)
        if not rows:
            raise click.ClickException(f"no multi-GPU record in {folder}")
        click.echo(model.validation_table(rows))
        click.echo(model.summary(rows))
        return
    if op is not None:
        try:
            p = cost.predict(op, _shape(shape_text), world, dtype=dtype, link=link, calibration=cal)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        choice = cost.decide(op, p.shape, world, dtype=dtype, calibration=cal)
        click.echo(f"{op} {p.shape} over {world} ranks ({cal.machine.get('device', '?')}):")
        for name in ("plain", "overlap", "ideal", "compute", "comm", "plain_gpu", "overlap_gpu", "host_plain",
                     "host_overlap"):
            click.echo(f"  {name:13} {getattr(p, name):9.4f} ms")
        click.echo(f"  speedup       {p.speedup:9.3f}\n  auto picks    {choice.path}")
        return
    click.echo(f"calibration: {cal.machine.get('device', '?')} ({', '.join(cal.machine.get('records', [])[:3])}"
               f"{', ...' if len(cal.machine.get('records', [])) > 3 else ''})")
    for name, value in cal.parts.items():
        click.echo(f"  {name:30} {value:12.4f}  {cost.PARTS.get(name, '')}")
    click.echo(f"\npredictions at world {world}:")
    click.echo(model.prediction_table(model.prediction_rows(cal, world, link)))
