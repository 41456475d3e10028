"""The tile order rotates the tile index a kernel computes from its program id (`pid_m = pid // num_pid_n`) among
the `tl.cdiv(M, BLOCK_M)` row tiles, so that each rank starts on its own rows. The programs then compute the kernel's
own tiles only where the grid gives that index every tile: a shorter grid (a kernel launched for the first rows only)
would compute others once rotated. Each call with peers checks the grid, and refuses one that leaves a tile out;
`order="mesh"` keeps the kernel's own order."""

from __future__ import annotations

import re

import pytest
import torch

import tilelink
from tests.rules.cases import module_at, rows_of
from tilelink.errors import AnnotationError, LaunchError

KERNEL = '''import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.all_gather("a_ptr"){options})
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


def _multiplied(path: str, grid: tuple, M: int = 64, N: int = 32, **meta) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel of ``path`` on ``grid`` (C at NaN where no program stores) and torch's product, on M x N x 40."""
    rank, world = tilelink.rank(), tilelink.world_size()
    K = 40
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    lo, hi = rows_of(rank, world, M)
    c = torch.full((M, N), float("nan"))
    module_at(path).matmul[grid](a[lo:hi].contiguous(), b, c, M, N, K, K, 1, N, 1, N, 1, BLOCK_M=16, BLOCK_N=16,
                                 BLOCK_K=16, **meta)
    return c, a @ b


def _first_rows(path: str, tiles: int) -> float:
    """The kernel on a grid of the first ``tiles`` row tiles (every column tile of each), against torch on those
    rows."""
    c, want = _multiplied(path, (tiles * 2,))
    return (c[:tiles * 16] - want[:tiles * 16]).abs().max().item()


def test_a_grid_that_covers_every_tile_equals_torch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "rotated.py"
    path.write_text(KERNEL.format(options=""))
    errors = tilelink.spawn(_first_rows, 2, str(path), 4)
    assert all(e < 1e-4 for e in errors), errors


def test_a_grid_shorter_than_the_tiles_is_refused_before_the_launch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "short.py"
    path.write_text(KERNEL.format(options=""))
    with pytest.raises(LaunchError, match=r"rotates the tile index bound at .*short.py:12 .* among its 4 tiles, but "
                                          r"the grid \(4, 1, 1\) gives it 2 of them where `\(tl.program_id\(0\)\) % "
                                          r"\(tl.cdiv\(N, BLOCK_N\)\)` = 0 \(not tile 2\)"):
        tilelink.spawn(_first_rows, 2, str(path), 2)


def test_a_grid_short_by_part_of_a_row_of_tiles_is_refused(tmp_path, monkeypatch) -> None:
    """Every row tile is there, but not at every column tile: rotated, tile (1, 1) would be computed in place of
    tile (3, 1)."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "part_row.py"
    path.write_text(KERNEL.format(options=""))
    with pytest.raises(LaunchError, match=r"the grid \(7, 1, 1\) gives it 3 of them where `\(tl.program_id\(0\)\) % "
                                          r"\(tl.cdiv\(N, BLOCK_N\)\)` = 1 \(not tile 3\)"):
        tilelink.spawn(_programs, 2, str(path), 7)


def _programs(path: str, programs: int) -> float:
    _multiplied(path, (programs,))
    return 0.0


def test_a_rotation_under_a_side_the_launch_does_not_compile_is_not_checked(tmp_path, monkeypatch) -> None:
    """`if TWO_D:` takes the program id itself on a 2-D grid (rotated among the launched programs), `else:` a value
    made from it on a 1-D grid: a 2-D launch is checked by the side it compiles."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = KERNEL.format(options="").replace("BLOCK_K: tl.constexpr):",
                                               "BLOCK_K: tl.constexpr, TWO_D: tl.constexpr):")
    source = source.replace(
        "    pid = tl.program_id(0)\n    num_pid_n = tl.cdiv(N, BLOCK_N)\n    pid_m = pid // num_pid_n\n"
        "    pid_n = pid % num_pid_n\n",
        "    num_pid_n = tl.cdiv(N, BLOCK_N)\n    if TWO_D:\n        pid_m = tl.program_id(0)\n"
        "        pid_n = tl.program_id(1)\n    else:\n        pid_m = tl.program_id(0) // num_pid_n\n"
        "        pid_n = tl.program_id(0) % num_pid_n\n")
    assert "if TWO_D:" in source
    path = tmp_path / "two_d.py"
    path.write_text(source)
    errors = tilelink.spawn(_two_d, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


def _two_d(path: str) -> float:
    c, want = _multiplied(path, (4, 2), TWO_D=True)
    return (c - want).abs().max().item()


def test_the_kernel_s_own_order_runs_a_shorter_grid(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mesh.py"
    path.write_text(KERNEL.format(options=', order="mesh"'))
    errors = tilelink.spawn(_first_rows, 2, str(path), 2)
    assert all(e < 1e-4 for e in errors), errors


def test_the_other_coordinate_written_only_into_addresses_still_groups_the_check(tmp_path, monkeypatch) -> None:
    """`pid_n` never named: `(pid % num_pid_n) * BLOCK_N + tl.arange(...)` written into the addresses. The other of
    the index's `//` is its other coordinate, and a grid short by part of a row of tiles is refused."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = KERNEL.format(options="").replace("    pid_n = pid % num_pid_n\n", "").replace(
        "    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n",
        "    rn = ((pid % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)) * 1\n")
    assert not re.search(r"\bpid_n\b", source)
    path = tmp_path / "inline_n.py"
    path.write_text(source)
    with pytest.raises(LaunchError, match=r"the grid \(7, 1, 1\) gives it 3 of them"):
        tilelink.spawn(_programs, 2, str(path), 7)


@pytest.mark.parametrize("alias, says", [
    ("    pf = tl.program_id\n    pid = pf(0)\n", r"`tl.program_id` at line \d+ is used without being called"),
    ("    pid = pf(0)\n", r"`from triton.language import program_id as pf` names `program_id` otherwise"),
])
def test_the_position_read_through_another_name_is_refused(tmp_path, alias: str, says: str) -> None:
    """The rotation and split-K read the position where `tl.program_id(...)` is called: through another name they
    would miss it, so the kernel is refused and told to call it."""
    source = KERNEL.format(options="").replace("    pid = tl.program_id(0)\n", alias)
    if "pf = " not in alias:
        source = source.replace("import tilelink\n", "import tilelink\nfrom triton.language import program_id as pf\n")
    path = tmp_path / "alias.py"
    path.write_text(source)
    with pytest.raises(AnnotationError, match=says):
        module_at(str(path))


#: triton.ops' grouped ordering: the row takes `pid % group_size`, the column `(pid % width) // group_size`, not the
#: exact other half of the row's `%`; in a last group of 2 rows after a group of 3 on 3 column tiles (width 9), `pid %
#: 2` is not `(pid % width) % 2`, and each column still gets every row tile once
OPS_GROUPED = KERNEL.format(options="").replace(
    "BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):").replace(
    "    num_pid_n = tl.cdiv(N, BLOCK_N)\n    pid_m = pid // num_pid_n\n    pid_n = pid % num_pid_n\n",
    "    grid_m = tl.cdiv(M, BLOCK_M)\n    grid_n = tl.cdiv(N, BLOCK_N)\n    width = GROUP_M * grid_n\n"
    "    group_id = pid // width\n    group_size = min(grid_m - group_id * GROUP_M, GROUP_M)\n"
    "    pid_m = group_id * GROUP_M + (pid % group_size)\n    pid_n = (pid % width) // (group_size)\n")


def _ops_grouped(path: str, programs: int) -> float:
    c, want = _multiplied(path, (programs,), M=80, N=48, GROUP_M=3)
    return (c - want).abs().max().item()


def test_a_grouped_ordering_whose_column_is_not_the_rows_exact_pair_is_rotated_and_checked(tmp_path,
                                                                                           monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert "pid_m = group_id * GROUP_M + (pid % group_size)" in OPS_GROUPED
    path = tmp_path / "ops_grouped.py"
    path.write_text(OPS_GROUPED)
    (entry,) = [str(e) for e in module_at(str(path)).matmul.report.entries if "order" in e.message]
    assert entry.startswith("[applied]") and "pid_m rotated" in entry, entry
    for world in (2, 3):
        errors = tilelink.spawn(_ops_grouped, world, str(path), 15)
        assert all(e < 1e-4 for e in errors), (world, errors)
    # the first group only (3 row tiles of 5, every column): the check groups the grid by the column
    with pytest.raises(LaunchError, match=r"gives it 3 of them where `.*` = 0 \(not tile 3\)"):
        tilelink.spawn(_ops_grouped, 2, str(path), 9)


def _report_entry(path: str) -> str:
    (entry,) = [str(e) for e in module_at(path).matmul.report.entries if "order" in e.message]
    return entry


def _parity_source(parity: str) -> str:
    source = KERNEL.format(options="").replace("    rm = pid_m", parity + "    rm = pid_m").replace(
        "    tl.store(", "    acc = acc * (1 + par)\n    tl.store(")
    assert "par = " in source and "acc = acc * (1 + par)" in source
    return source


def test_a_position_the_check_cannot_evaluate_keeps_the_order(tmp_path) -> None:
    """The row tile's parity scaling the sums: only a check grouping the grid by it could tell that the rotation
    keeps each program's parity; it cannot evaluate `& 1`, so the kernel keeps its order (rotated, world 3 moved
    rows to a tile of the other parity)."""
    path = tmp_path / "parity.py"
    path.write_text(_parity_source("    par = ((pid % (2 * num_pid_n)) // num_pid_n) & 1\n"))
    entry = _report_entry(str(path))
    assert entry.startswith("[not applied]") and "reads the program id" in entry, entry


def test_a_tensor_made_from_a_coordinate_does_not_switch_the_check_off(tmp_path, monkeypatch) -> None:
    """The same parity written so that the check evaluates it: `acc = acc * (1 + par)`, a tensor the check cannot
    evaluate, is no coordinate of it, and the parity groups the grid, at each of whose values the rotated index
    gets 2 of its 4 tiles: refused (it used to switch the whole check off, and world 3 was wrong)."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "parity.py"
    path.write_text(_parity_source("    par = (pid % (2 * num_pid_n)) // num_pid_n\n"))
    assert _report_entry(str(path)).startswith("[applied]")
    with pytest.raises(LaunchError, match=r"among its 4 tiles, but the grid \(8, 1, 1\) gives it 2 of them"):
        tilelink.spawn(_programs, 3, str(path), 8)


def test_a_mask_made_from_the_column_does_not_switch_the_check_off(tmp_path, monkeypatch) -> None:
    """`n_lim = tl.where(pid_n < grid_n, N, 0)`, a value the check cannot evaluate, is no coordinate of it: the
    column still groups the grid, and the first group's grid is refused."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = OPS_GROUPED.replace("    pid_n = (pid % width) // (group_size)\n",
                                 "    pid_n = (pid % width) // (group_size)\n"
                                 "    n_lim = tl.where(pid_n < grid_n, N, 0)\n").replace(
        "(rn[None, :] < N))\n", "(rn[None, :] < n_lim))\n")
    assert "< n_lim))" in source
    path = tmp_path / "n_lim.py"
    path.write_text(source)
    assert _report_entry(str(path)).startswith("[applied]")
    with pytest.raises(LaunchError, match=r"gives it 3 of them"):
        tilelink.spawn(_ops_grouped, 2, str(path), 9)
    errors = tilelink.spawn(_ops_grouped, 3, str(path), 15)
    assert all(e < 1e-4 for e in errors), errors


def test_a_rotation_that_stands_on_the_check_refuses_a_grid_it_cannot_read(tmp_path, monkeypatch) -> None:
    """`pid_n = (pid - 1) % num_pid_n` is no exact pair of `pid // num_pid_n`: the rotation stands on the check, which
    cannot evaluate a `%` of the negative `pid - 1` of the first program, so the call is refused rather than passed
    unchecked."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = KERNEL.format(options="").replace("    pid_n = pid % num_pid_n\n", "    pid_n = (pid - 1) % num_pid_n\n")
    path = tmp_path / "shifted_column.py"
    path.write_text(source)
    assert _report_entry(str(path)).startswith("[applied]")
    with pytest.raises(LaunchError, match=r"which it takes for the mapping's only where each call's grid gives the "
                                          r"index every tile at each of them, but TileLink cannot evaluate them"):
        tilelink.spawn(_programs, 2, str(path), 8)


def test_a_pairs_other_the_kernel_never_computes_is_no_coordinate(tmp_path, monkeypatch) -> None:
    """`pid_m = (tl.program_id(0) + 1) % tiles` holds a `%` whose other, `(tl.program_id(0) + 1) // tiles`, the kernel
    never computes: the grid is not grouped by it (it was, and the full grid was refused as short)."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = KERNEL.format(options="").replace(
        "    pid = tl.program_id(0)\n    num_pid_n = tl.cdiv(N, BLOCK_N)\n    pid_m = pid // num_pid_n\n"
        "    pid_n = pid % num_pid_n\n",
        "    pid_m = (tl.program_id(0) + 1) % tl.cdiv(M, BLOCK_M)\n    pid_n = tl.program_id(1)\n")
    assert "(tl.program_id(0) + 1) %" in source
    path = tmp_path / "shifted_rows.py"
    path.write_text(source)
    assert _report_entry(str(path)).startswith("[applied]")
    errors = tilelink.spawn(_two_d_grid, 3, str(path))
    assert all(e < 1e-4 for e in errors), errors


def _two_d_grid(path: str) -> float:
    c, want = _multiplied(path, (4, 2))
    return (c - want).abs().max().item()
