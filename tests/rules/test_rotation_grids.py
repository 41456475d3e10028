"""The tile-order rotation (``tl_remap_tile``) and grids that do not launch one program per tile. A grid one
program short of the tiles leaves the last tile uncomputed in the kernel as written; rotated over all the tiles, the
short grid computed another set (a rank's own first), so a tile the kernel computes was left unwritten. A grid with
idle programs past the tiles (masked in the kernel as written) sent them onto real tiles, which two programs then
stored: in a reduce-scatter each store counts its rows toward the channel, so a channel completed before its other
tiles were stored. The rotation is among the launched programs, and an idle program stays idle."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
from tilelink.runtime import current_world

FORM = Path(__file__).parent / "forms" / "row_tile_copy.py"
M, D, BLOCK_M = 16, 4, 4


def _module(path: str):
    spec = importlib.util.spec_from_file_location(f"row_tile_copy_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gathered(path: str, programs: int) -> float:
    """The gathered copy by ``programs`` programs against the rows the kernel as written computes."""
    module = _module(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(M, D, generator=torch.Generator().manual_seed(7))
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.zeros(M, D, device=device)
    module.row_tile_copy[(programs,)](x[lo:hi].contiguous().to(device), y, M, D, D, BLOCK_M=BLOCK_M, BLOCK_D=D)
    want = torch.zeros(M, D)
    done = min(M, programs * BLOCK_M)
    want[:done] = x[:done]
    got = y.cpu()
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


def _reduced(path: str, programs: int) -> float:
    """The reduce-scatter of ``2 * x_r`` by ``programs`` programs (at least one per tile) against torch."""
    module = _module(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    xs = [torch.randn(M, D, generator=torch.Generator().manual_seed(11 + r)) for r in range(world)]
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.zeros(hi - lo, D, device=device)
    module.row_tile_scale[(programs,)](xs[rank].to(device), y, M, D, D, BLOCK_M=BLOCK_M, BLOCK_D=D)
    want = 2.0 * sum(xs)[lo:hi]
    got = y.cpu()
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


def test_a_program_past_the_tiles_is_not_rotated_onto_one() -> None:
    from tilelink.mapping import rotate_tile

    tiles, shift = 4, 3
    assert sorted(rotate_tile(t, tiles, shift) for t in range(tiles)) == list(range(tiles))
    # the idle programs of a grid of 6 stay past the tiles, where the kernel's masks keep them idle
    assert [rotate_tile(t, tiles, shift) for t in range(tiles, 6)] == [4, 5]


def test_the_program_id_itself_is_rotated_among_the_launched_programs() -> None:
    from tilelink.annotations import requests_in
    from tilelink.codegen import generate

    source = FORM.read_text()
    gen = generate(source, "row_tile_copy.py", requests_in(source, "row_tile_copy.py"))
    assert "tl.minimum(tl.cdiv(M, BLOCK_M), tl.num_programs(0))" in gen.text, gen.text


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_grids_short_of_and_past_the_tiles_on_the_race_exposing_schedule(world: int, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "row_tile_copy.py"
    path.write_text(FORM.read_text())
    tiles = M // BLOCK_M
    for programs in (tiles - 1, tiles, tiles + 2):
        assert all(e < 1e-6 for e in tilelink.spawn(_gathered, world, str(path), programs)), programs
    for programs in (tiles, tiles + 2):
        assert all(e < 1e-5 for e in tilelink.spawn(_reduced, world, str(path), programs)), programs


def _reduced_refusal(path: str, programs: int) -> str:
    try:
        _reduced(path, programs)
    except tilelink.LaunchError as refused:
        return str(refused)
    return "ran"


def test_a_reduction_on_a_grid_short_of_the_tiles_is_refused_before_it_waits(tmp_path) -> None:
    # the last tile is stored by no program: its channel would never complete, and the owner's wait would time out
    path = tmp_path / "row_tile_copy.py"
    path.write_text(FORM.read_text())
    said = tilelink.spawn(_reduced_refusal, 2, str(path), M // BLOCK_M - 1)
    assert all(f"no program stores rows [{M - BLOCK_M}, {M}) of 'y_ptr'" in s for s in said), said
