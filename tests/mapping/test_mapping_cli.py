"""``tlxform mapping`` prints the mapping a person can check (golden text for one small case)."""

# The golden output has long lines.
# ruff: noqa: E501
from __future__ import annotations

from click.testing import CliRunner

from tilelink.cli.main import main

EXPECTED = """\
Row sharding: M=36 rows over R=4 ranks, C=4 channels per rank
  rows_per_rank=9  rows_per_channel=3  channels=16

Channels
  channel  rank      rows  count
        0     0  [ 0,  3)      3
        1     0  [ 3,  6)      3
        2     0  [ 6,  9)      3
        3     0  [ 9,  9)      0  empty
        4     1  [ 9, 12)      3
        5     1  [12, 15)      3
        6     1  [15, 18)      3
        7     1  [18, 18)      0  empty
        8     2  [18, 21)      3
        9     2  [21, 24)      3
       10     2  [24, 27)      3
       11     2  [27, 27)      0  empty
       12     3  [27, 30)      3
       13     3  [30, 33)      3
       14     3  [33, 36)      3
       15     3  [36, 36)      0  empty

Consumer tiles: 3 of 16 rows, order ring as seen by rank 1 (waits: channel (rank); empty channels in the span are not listed)
  step  tile      rows  span  waits on
     0     0  [ 0, 16)   0+7   0 (r0),  1 (r0),  2 (r0),  4 (r1),  5 (r1),  6 (r1)
     1     1  [16, 32)   6+8   6 (r1),  8 (r2),  9 (r2), 10 (r2), 12 (r3), 13 (r3)
     2     2  [32, 36)  13+2  13 (r3), 14 (r3)

Producer tiles: 2 of 20 rows (notifies: channel (rank): rows added)
  tile      rows  notifies
     0  [ 0, 20)   0 (r0): 3,  1 (r0): 3,  2 (r0): 3,  4 (r1): 3,  5 (r1): 3,  6 (r1): 3,  8 (r2): 2
     1  [20, 36)   8 (r2): 1,  9 (r2): 3, 10 (r2): 3, 12 (r3): 3, 13 (r3): 3, 14 (r3): 3
"""


def test_mapping_table() -> None:
    argv = ["mapping", "--size", "36", "--world", "4", "--channels-per-rank", "4", "--tile", "16",
            "--producer-tile", "20", "--order", "ring", "--rank", "1"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    assert result.output == EXPECTED
