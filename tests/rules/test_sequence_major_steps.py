"""A gathered buffer whose dims before the rows are all of size 1 holds the dims a kernel steps packed into its row,
sequence-major (sp_attention's (1, 1, S, B * H * D)): a step `b * stride_xb` of a batch there is a block of columns
of the row, which stays in the row only while the batch the kernel computes stays below the row's block count. The
launch bounds that value from the grid (`b = tl.program_id(0)` below the grid's programs): a grid of one program more
than the row holds blocks read the next chunk's rows, which no wait covered (NaN on the race-exposing schedule), and
is refused at the call; the grid of one program per batch equals torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

FORM = Path(__file__).parent / "forms" / "chunked_rows_descriptor.py"
B, S, D = 2, 8, 4


def _column_sums(path: str, programs: int) -> float:
    spec = importlib.util.spec_from_file_location(f"chunked_rows_descriptor_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(5))
    lo, hi = rows_of(rank, world, S)
    device = current_world().device
    # sequence-major: (1, S, B * D), each batch a block of D columns of a row
    shard = x.permute(1, 0, 2).reshape(1, S, B * D)[:, lo:hi].contiguous().to(device)
    y = torch.full((programs, D), float("nan"), device=device)
    module.chunked_col_sum_desc[(programs,)](shard, y, S, D, -(-S // world), D, B * D, BLOCK_S=4, BLOCK_D=D)
    got = y.cpu()
    # a program past the batches reads a block of the next row: NaN where no wait covered it
    return float("inf") if got.isnan().any() else (got[:B] - x.sum(1)).abs().max().item()


@pytest.mark.slow
def test_the_batch_is_bounded_by_the_grid_at_two_ranks_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "chunked_rows_descriptor.py"
    path.write_text(FORM.read_text())
    assert all(e < 1e-5 for e in tilelink.spawn(_column_sums, 2, str(path), B))
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_column_sums, 2, str(path), B + 1)
    said = str(info.value)
    assert "on the grid (3, 1, 1): `(tl.program_id(0))` in [0, 2] times stride_xb=4, so it reaches element 11 of a " \
           "row" in said and "has rows of 8 elements" in said, said
    assert "launch no more programs than the row holds blocks" in said, said
