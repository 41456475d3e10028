"""The tile-order rotation leaves the tile mapping's other coordinate as it is (`col = pid % 2` beside `pid_m = pid //
2`): it names the part of the position the rotated variable does not hold, so each program still gets one tile. The
pair is compared by its nodes and the facts of the names in it, not by its text: a divisor bound again between the two
(`w = 1; ... // w; w = 2; ... % w`), a rotated variable that reads the position whole (`pid + (pid // 2) * 0`), or that
holds the other's part itself (`pid // 2 * 2 + pid % 2`, `pid // 1`), or a branch whose value holds it (`if C: pid_m =
pid` / `else: pid_m = pid // 2`, the pair holding for one value only), keeps the kernel's own order; rotated, each
program scaled its rotated tile by its own parity. A value bound again before the other is the only one it sees. A
helper of the kernel's file that returns the pair (`pid_m, col = tile_of(tl.program_id(0), ...)`) is read the same
way, from its one `return`, its last statement: `return p, p % W` keeps the order, and so does that pair returned
before the last statement's; `return p // W, p % W` and a grouped ordering keep the rotation. So is a helper the file
imports by name from a module TileLink finds (`from tile_helpers import tile_of`); one it cannot find keeps the order,
and the report names it."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

# y = x on odd tiles, 0 on even ones: the tile's parity is the mapping's other coordinate
PARITY = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def parity_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    MAPPING
    offs = pid_m * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, x * col, mask=offs < N)
'''

WRONG = {
    "rebound_divisor": "w = 1\n    pid_m = pid // w\n    w = 2\n    col = pid % w",
    "read_whole": "pid_m = pid + (pid // 2) * 0\n    col = pid % 2",
    "holds_the_other": "pid_m = pid // 2 * 2 + pid % 2\n    col = pid % 2",
    "finer_split": "pid_m = pid // 1 + pid // 2 * 0\n    col = pid % 2",
    # the branch taken holds the parity: the other branch's pair is not the mapping's on this launch
    "branch_holds_the_other": "if BLOCK > 4:\n        pid_m = pid\n    else:\n        pid_m = pid // 2\n"
                              "    col = pid % 2",
}

# the mapping's pairs as matmul kernels write them, in a grid of one column tile: each keeps the rotation
RIGHT = {
    "row_major": "pid_m = pid // 1\n    col = pid % 1 + 1",
    "grouped": "num_pid_in_group = 2\n    group_id = pid // num_pid_in_group\n    first_pid_m = group_id * 2\n"
               "    pid_m = first_pid_m + (pid % num_pid_in_group) % 2\n    col = (pid % num_pid_in_group) // 2 + 1",
    # bound again before the other: only the second value reaches it
    "bound_again_before": "pid_m = pid\n    pid_m = pid // 1\n    col = pid % 1 + 1",
    # triton.ops' grouped ordering: the place in the group taken from the position itself (`pid % group_size`, not
    # `(pid % num_pid_in_group) % group_size`), groups of 4 over 6 tiles (the last of 2)
    "group_place": "num_pid_in_group = 4\n    group_id = pid // num_pid_in_group\n"
                   "    group_size = min(6 - group_id * 4, 4)\n    pid_m = group_id * 4 + pid % group_size\n"
                   "    col = (pid % num_pid_in_group) // group_size + 1",
}


# y = x * (col + 1), the pair from a helper of the file
HELPER = '''
@triton.jit
def tile_of(p, W: tl.constexpr):
    BODY


@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def parity_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid_m, col = tile_of(tl.program_id(0), WIDTH)
    offs = pid_m * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, x * (col + 1), mask=offs < N)
'''

HELPERS = {
    # the first holds the parity too
    "helper_whole": ("return p, p % W", 2),
    # the same pair returned early, before the last statement's: the one a launch of width 2 takes
    "helper_early_return": ("if W == 2:\n        return p, p % W\n    return p // W, p % W", 2),
    "helper_pair": ("return p // W, p % W", 1),
    "helper_grouped": ("group_id = p // (2 * W)\n    first_pid_m = group_id * 2\n"
                       "    pid_m = first_pid_m + (p % (2 * W)) % 2\n    pid_n = (p % (2 * W)) // 2\n"
                       "    return pid_m, pid_n", 1),
    # Triton's persistent matmul tutorial's `_compute_pid`: the place in the group from the tile id itself
    "helper_group_place": ("group_id = p // (4 * W)\n    first_pid_m = group_id * 4\n"
                           "    group_size_m = min(6 - first_pid_m, 4)\n    pid_m = first_pid_m + (p % group_size_m)\n"
                           "    pid_n = (p % (4 * W)) // group_size_m\n    return pid_m, pid_n", 1),
}

#: the place in the group from the position, but a column that is no column of the group: `pid // 2`, the exact
#: other of `pid % 2`, steps through the groups' rows, not their columns
NOT_A_COLUMN = ("num_pid_in_group = 4\n    group_id = pid // num_pid_in_group\n    pid_m = group_id * 4 + pid % 2\n"
                "    col = pid // 2 + 1")


def _form(mapping: str) -> str:
    if mapping in HELPERS:
        body, width = HELPERS[mapping]
        return HEAD + textwrap.dedent(HELPER).replace("BODY", body).replace("WIDTH", str(width))
    return HEAD + textwrap.dedent(PARITY).replace("MAPPING", mapping)


def _order(source: str) -> str:
    report = generate(source, "user_kernels.py", requests_in(source, "user_kernels.py")).report
    (entry,) = [str(e) for e in report.entries if "order" in e.message]
    return entry


@pytest.mark.parametrize("form", sorted(WRONG))
def test_a_pair_that_prints_alike_but_is_not_the_mappings_keeps_the_order(form: str) -> None:
    entry = _order(_form(WRONG[form]))
    assert entry.startswith("[not applied]") and "reads the program id" in entry and "not through pid_m" in entry, entry


@pytest.mark.parametrize("form", sorted(RIGHT))
def test_the_mappings_pairs_keep_the_rotation(form: str) -> None:
    entry = _order(_form(RIGHT[form]))
    assert entry.startswith("[applied]") and "pid_m rotated" in entry, entry


def test_the_group_place_taken_from_the_position_pairs_with_the_groups_column(tmp_path, monkeypatch) -> None:
    entry = _order(_form("helper_group_place"))
    assert entry.startswith("[applied]") and "pid_m rotated" in entry, entry
    # `pid // 2` is no pair of it: rotated only as a coordinate the call checks, and the check refuses the grid, on
    # which each of its values gets 2 of the 6 row tiles
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "not_a_column.py"
    path.write_text(_form(NOT_A_COLUMN))
    with pytest.raises(LaunchError, match=r"gives it 2 of them where `\(tl.program_id\(0\)\) // 2 \+ 1` = 1 "
                                          r"\(not tile 2\)"):
        tilelink.spawn(_parity, 2, str(path), "not_a_column")


def test_a_helpers_pair_is_read_from_its_body() -> None:
    for form in ("helper_whole", "helper_early_return"):
        entry = _order(_form(form))
        assert entry.startswith("[not applied]") and "not through pid_m" in entry, (form, entry)
    for form in ("helper_pair", "helper_grouped"):
        entry = _order(_form(form))
        assert entry.startswith("[applied]") and "pid_m rotated" in entry, (form, entry)


def _imported(form: str, module: str = "tile_helpers") -> tuple[str, str]:
    """The kernel of a helper form importing its helper from ``module``, and that module's source."""
    source = _form(form)
    start, end = source.index("@triton.jit\ndef tile_of"), source.index("@tilelink.overlap")
    return source[:start] + f"from {module} import tile_of\n\n\n" + source[end:], HEAD + source[start:end]


def test_an_imported_helpers_pair_is_read_from_its_module(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    for form, applied in (("helper_whole", False), ("helper_early_return", False), ("helper_pair", True),
                          ("helper_grouped", True)):
        kernel, helpers = _imported(form, f"tile_helpers_{form}")
        (tmp_path / f"tile_helpers_{form}.py").write_text(helpers)
        entry = _order(kernel)
        assert entry.startswith("[applied]" if applied else "[not applied]"), (form, entry)
        assert "which TileLink cannot read" not in entry, (form, entry)


def test_a_helper_tilelink_cannot_find_keeps_the_order_and_is_named() -> None:
    kernel, _ = _imported("helper_pair", "tile_helpers_nowhere")
    entry = _order(kernel)
    assert entry.startswith("[not applied]") and "not through pid_m" in entry, entry
    assert "pid_m is unpacked from `tile_of`, which TileLink cannot read" in entry, entry
    assert "define the helper in the kernel's file" in entry, entry


def _order_of(path) -> str:
    source = path.read_text()
    report = generate(source, str(path), requests_in(source, str(path))).report
    (entry,) = [str(e) for e in report.entries if "order" in e.message]
    return entry


def test_an_absolute_import_in_a_package_is_not_read_beside_the_file(tmp_path, monkeypatch) -> None:
    # Python binds `from tile_helpers_abs import tile_of` in pkg/kern.py to the top-level module on the import path,
    # never to pkg/tile_helpers_abs.py: the one beside the file (whose pair keeps the rotation) is not the helper
    kernel, pair = _imported("helper_pair", "tile_helpers_abs")
    _, whole = _imported("helper_whole", "tile_helpers_abs")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tile_helpers_abs.py").write_text(pair)
    (pkg / "kern.py").write_text(kernel)
    entry = _order_of(pkg / "kern.py")  # no top-level tile_helpers_abs: not found, the kernel's order
    assert entry.startswith("[not applied]") and "which TileLink cannot read" in entry, entry
    top = tmp_path / "top"
    top.mkdir()
    (top / "tile_helpers_abs.py").write_text(whole)
    monkeypatch.syspath_prepend(str(top))
    entry = _order_of(pkg / "kern.py")  # the top-level one, read: its first value holds the parity too
    assert entry.startswith("[not applied]") and "which TileLink cannot read" not in entry, entry
    (pkg / "__init__.py").unlink()  # a folder of scripts: its own folder is first on the import path
    entry = _order_of(pkg / "kern.py")
    assert entry.startswith("[applied]"), entry


def test_a_relative_import_of_the_package_itself_reads_its_init(tmp_path) -> None:
    # `from . import tile_of` reads pkg/__init__.py, never a pkg.py beside the package's folder
    kernel, pair = _imported("helper_pair", "tile_helpers_rel")
    _, whole = _imported("helper_whole", "tile_helpers_rel")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(pair)
    (tmp_path / "pkg.py").write_text(whole)
    (pkg / "kern.py").write_text(kernel.replace("from tile_helpers_rel import", "from . import"))
    entry = _order_of(pkg / "kern.py")
    assert entry.startswith("[applied]") and "pid_m rotated" in entry, entry


def _parity(path: str, form: str) -> float:
    spec = importlib.util.spec_from_file_location(f"parity_{form}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 48, 8
    x = torch.randn(N, generator=torch.Generator().manual_seed(8))
    lo, hi = rows_of(rank, world, N)
    device = current_world().device
    y = torch.full((N,), float("nan"), device=device)
    module.parity_kernel[(N // block,)](x[lo:hi].contiguous().to(device), y, N, BLOCK=block)
    got = y.cpu()
    tiles = torch.arange(N) // block
    want = x * (tiles % 2 if form in WRONG else tiles % 2 + 1 if form in ("helper_whole", "helper_early_return") else 1)
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(WRONG) + sorted(RIGHT) + sorted(HELPERS))
def test_the_pairs_equal_torch_on_the_race_exposing_schedule(form: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"parity_{form}.py"
    path.write_text(_form(form if form in HELPERS else {**WRONG, **RIGHT}[form]))
    errors = tilelink.spawn(_parity, 2, str(path), form)
    assert all(e < 1e-5 for e in errors), errors


@pytest.mark.slow
def test_an_imported_helpers_pair_equals_torch_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.syspath_prepend(str(tmp_path))
    # the helper beside the kernel's file, its first value holding the parity too: the kernel's order
    kernel, helpers = _imported("helper_whole", "tile_helpers_beside")
    (tmp_path / "tile_helpers_beside.py").write_text(helpers)
    path = tmp_path / "parity_imported.py"
    path.write_text(kernel)
    errors = tilelink.spawn(_parity, 2, str(path), "helper_whole")
    assert all(e < 1e-5 for e in errors), errors
