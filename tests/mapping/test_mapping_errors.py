"""Bad input to the mapping and to ``tlxform mapping`` gives a clear error: what is wrong, what to pass."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tilelink.cli.mapping_cmd import mapping
from tilelink.mapping import RowSharding, remap_tile, remap_tile_rows


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 4, 1), r"size must be >= 1, got 0; pass the number of rows"),
        ((-3, 4, 1), r"size must be >= 1, got -3"),
        ((100, 0, 1), r"world must be >= 1, got 0; pass the number of ranks"),
        ((100, 4, 0), r"channels_per_rank must be >= 1, got 0"),
        ((100, 4, 26), r"channels_per_rank=26 exceeds rows_per_rank=25 .*pass channels_per_rank <= 25"),
        ((3, 8, 2), r"channels_per_rank=2 exceeds rows_per_rank=1"),
        ((10.0, 4, 1), r"size must be an integer, got 10.0"),
        ((True, 4, 1), r"size must be an integer"),
    ],
)
def test_bad_sharding(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        RowSharding(*args)


def test_bad_indices_and_tiles() -> None:
    s = RowSharding(100, 4, 2)
    with pytest.raises(ValueError, match=r"tile must be >= 1, got 0; pass the tile size"):
        s.consumer_channels(0, 0)
    with pytest.raises(ValueError, match=r"channel=8 is out of range: the sharding has 8, pass 0 <= channel"):
        s.channel_range(8)
    with pytest.raises(ValueError, match=r"t=4 is out of range"):
        s.producer_notifies(4, 32)
    with pytest.raises(ValueError, match=r"row=100 is out of range"):
        s.channel_of_row(100)
    with pytest.raises(ValueError, match=r"rank=4 is out of range"):
        s.rank_range(4)
    with pytest.raises(ValueError, match=r"comm_block must be >= 1"):
        RowSharding.from_comm_block(100, 4, 0)


def test_bad_tile_orders() -> None:
    with pytest.raises(ValueError, match=r"unknown tile order 'spiral'; pass one of: mesh, ring, local"):
        remap_tile(0, 4, 0, 2, "spiral")
    with pytest.raises(ValueError, match=r"num_tiles must be >= 1"):
        remap_tile(0, 0, 0, 2, "ring")
    with pytest.raises(ValueError, match=r"rank=2 is out of range"):
        remap_tile(0, 4, 2, 2, "ring")
    with pytest.raises(ValueError, match=r"t=4 is out of range"):
        remap_tile_rows(4, 4, 0, 10, 16)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-M", "0", "-R", "2", "-T", "16"], "size must be >= 1"),
        (["-M", "10", "-R", "4", "-C", "4", "-T", "16"], "channels_per_rank=4 exceeds rows_per_rank=3"),
        (["-M", "10", "-R", "2", "-T", "0"], "--tile must be >= 1"),
        (["-M", "10", "-R", "2", "-T", "4", "-P", "-1"], "--producer-tile must be >= 1"),
        (["-M", "10", "-R", "2", "-T", "4", "--rank", "2"], "--rank 2 is out of range"),
        (["-M", "10", "-R", "2", "-T", "4", "--order", "spiral"], "'spiral' is not one of"),
    ],
)
def test_cli_bad_usage(argv, message) -> None:
    result = CliRunner().invoke(mapping, argv)
    assert result.exit_code == 2
    assert message in result.output


def test_numpy_integers_are_accepted_as_ints() -> None:
    import numpy as np

    s = RowSharding(np.int64(100), np.int32(4), np.int64(2))
    assert type(s.size) is int and s == RowSharding(100, 4, 2)
    assert s.channel_of_row(np.int64(99)) == 7 and s.tile_range(np.int64(3), 32) == (96, 100)
