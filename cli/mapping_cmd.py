"""``tlxform mapping``: print the tile-centric mapping of a row sharding for a person to check.

Three tables: every channel with its rank and rows; every consumer tile (in the processing order of
``--rank`` under ``--order``) with the channels it waits on; every producer tile with the channels it
notifies and how many rows it adds to each.
"""

from __future__ import annotations

import click

from tilelink.mapping import ORDERS, RowSharding, remap_tile_rows


def _rows(lo: int, hi: int, width: int) -> str:
    return f"[{lo:>{width}}, {hi:>{width}})"


def _table(header: list[str], rows: list[list[str]], limit: int) -> list[str]:
    """Aligned text table; numbers right-aligned, the last column left-aligned."""
    shown = rows[:limit] if limit > 0 else rows
    widths = [max(len(header[i]), *(len(r[i]) for r in shown)) if shown else len(header[i])
              for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) for c, w in zip(cells[:-1], widths[:-1], strict=True)]
        return "  " + "  ".join([*parts, cells[-1]]).rstrip()

    out = [line(header)] + [line(r) for r in shown]
    if len(shown) < len(rows):
        out.append(f"  ... {len(rows) - len(shown)} more (raise --limit to see them)")
    return out


@click.command("mapping")
@click.option("--size", "-M", type=int, required=True, help="Rows of the sharded dimension (M).")
@click.option("--world", "-R", type=int, required=True, help="Number of ranks (R).")
@click.option("--channels-per-rank", "-C", type=int, default=1, show_default=True,
              help="Barrier channels per rank (C).")
@click.option("--tile", "-T", type=int, required=True, help="Consumer tile size in rows.")
@click.option("--producer-tile", "-P", type=int, default=None,
              help="Producer tile size in rows [default: one producer tile per channel].")
@click.option("--order", type=click.Choice(ORDERS), default="mesh", show_default=True,
              help="Consumer tile order.")
@click.option("--rank", "-r", type=int, default=0, show_default=True,
              help="Rank whose tile order is shown.")
@click.option("--limit", type=int, default=64, show_default=True,
              help="At most this many lines per table (0 = all).")
def mapping(size: int, world: int, channels_per_rank: int, tile: int, producer_tile: int | None,
            order: str, rank: int, limit: int) -> None:
    """Show which rows each channel holds and which channels each tile waits on or notifies."""
    try:
        sharding = RowSharding(size, world, channels_per_rank)
        for name, value in (("--tile", tile), ("--producer-tile", producer_tile)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 rows, got {value}; pass a positive tile size")
        if not 0 <= rank < world:
            raise ValueError(f"--rank {rank} is out of range: pass 0 <= rank < {world}")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc

    w = len(str(size))
    ch_w = len(str(sharding.num_channels - 1))
    echo = click.echo
    echo(f"Row sharding: M={size} rows over R={world} ranks, C={channels_per_rank} channels per rank")
    echo(f"  rows_per_rank={sharding.rows_per_rank}  rows_per_channel={sharding.rows_per_channel}  "
         f"channels={sharding.num_channels}")

    def channel_label(ch: int) -> str:
        return f"{ch:>{ch_w}} (r{sharding.channel_rank(ch)})"

    echo("")
    echo("Channels")
    rows = []
    for ch in range(sharding.num_channels):
        lo, hi = sharding.channel_range(ch)
        rows.append([str(ch), str(sharding.channel_rank(ch)), _rows(lo, hi, w), str(hi - lo),
                     "" if hi > lo else "empty"])
    for line in _table(["channel", "rank", "rows", "count", ""], rows, limit):
        echo(line)

    echo("")
    num_tiles = sharding.num_tiles(tile)
    echo(f"Consumer tiles: {num_tiles} of {tile} rows, order {order} as seen by rank {rank} "
         f"(waits: channel (rank); empty channels in the span are not listed)")
    rows = []
    for step in range(num_tiles):
        t = remap_tile_rows(step, num_tiles, rank, sharding.rows_per_rank, tile, order)
        lo, hi = sharding.tile_range(t, tile)
        first, count = sharding.consumer_channels(t, tile)
        waits = ", ".join(channel_label(ch) for ch in sharding.channels_overlapping(lo, hi))
        rows.append([str(step), str(t), _rows(lo, hi, w), f"{first}+{count}", waits])
    for line in _table(["step", "tile", "rows", "span", "waits on"], rows, limit):
        echo(line)

    echo("")
    if producer_tile is None:
        echo("Producer tiles: one per channel (all-gather copy), each notifies its channel once")
        return
    echo(f"Producer tiles: {sharding.num_tiles(producer_tile)} of {producer_tile} rows "
         f"(notifies: channel (rank): rows added)")
    rows = []
    for t in range(sharding.num_tiles(producer_tile)):
        lo, hi = sharding.tile_range(t, producer_tile)
        notes = ", ".join(f"{channel_label(ch)}: {n}"
                          for ch, n in sharding.producer_notifies(t, producer_tile))
        rows.append([str(t), _rows(lo, hi, w), notes])
    for line in _table(["tile", "rows", "notifies"], rows, limit):
        echo(line)
