"""The tile-order rotation gives each program another tile by rotating the variable its rows start from (`pid`). A
kernel that also reads its position directly, for rows of its own (`o = tl.program_id(0) * BLOCK + ...`) or in an
address (`tl.store(sum_ptr + pid, ...)` with `pid_m = pid`), would then write one tile's values at another tile's
rows: the rotation is not applied there (the report says why), and the kernel keeps its own order."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.runtime import current_world

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

# the gathered rows doubled, written at rows the kernel computes from the program id itself
OWN_ROWS = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def double_kernel(x_ptr, y_ptr, sum_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + o, 2 * x, mask=o < N)
'''

# each tile's sum, at the program's own index
OWN_INDEX = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def double_kernel(x_ptr, y_ptr, sum_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    pid_m = pid
    offs = pid_m * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, 2 * x, mask=offs < N)
    tl.store(sum_ptr + pid, tl.sum(x))
'''

FORMS = {"own_rows": OWN_ROWS, "own_index": OWN_INDEX}

# the program id copied into a variable of its own, which the rows then scale
COPIED = OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK", "    blk = tl.program_id(0)\n    o = blk * BLOCK")

# the rows' start made by a shift, for a BLOCK of 8
SHIFTED = OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
                           "    row = tl.program_id(0) << 3\n    o = row + tl.arange(0, BLOCK)")

# the rows' start passed down a chain of twelve variables
CHAINED = OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
                           "    r0 = tl.program_id(0) * BLOCK\n"
                           + "".join(f"    r{i} = r{i - 1} + 0\n" for i in range(1, 12))
                           + "    o = r11 + tl.arange(0, BLOCK)")

# the other coordinate of a one-axis grid (`pid % 1`, the only column tile) beside `pid // 1`: the mapping's pair
PAIRED = OWN_ROWS.replace(
    "    pid = tl.program_id(0)\n", "    pid = tl.program_id(0) // 1\n    col = tl.program_id(0) % 1\n").replace(
    "    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    o = pid * BLOCK + col + tl.arange(0, BLOCK)")

MORE_FORMS = {"copied": COPIED, "shifted": SHIFTED, "chained": CHAINED}


def _report(source: str) -> list[str]:
    text = HEAD + textwrap.dedent(source)
    return [str(e) for e in generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).report.entries
            if "order" in e.message]


@pytest.mark.parametrize("form, says", [
    ("own_rows", "the offsets `o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)` start from the program id"),
    ("own_index", "reads the program id (`tl.store(sum_ptr + pid, tl.sum(x))`)"),
])
def test_a_kernel_reading_its_position_other_than_through_the_rotated_variable_keeps_its_order(form: str,
                                                                                             says: str) -> None:
    (entry,) = _report(FORMS[form])
    assert entry.startswith("[not applied]") and says in entry, entry


@pytest.mark.parametrize("form, says", [
    ("copied", "the offsets `o = blk * BLOCK + tl.arange(0, BLOCK)` start from the program id"),
    ("shifted", "the offsets `o = row + tl.arange(0, BLOCK)` start from the program id"),
    ("chained", "the offsets `o = r11 + tl.arange(0, BLOCK)` start from the program id"),
])
def test_a_position_copied_shifted_or_passed_down_a_chain_keeps_its_order(form: str, says: str) -> None:
    (entry,) = _report(MORE_FORMS[form])
    assert entry.startswith("[not applied]") and says in entry and "not through pid" in entry, entry


@pytest.mark.parametrize("extra, says", [
    ("    pid_b, blk = tl.program_id(0), tl.program_id(0)\n    tl.store(sum_ptr + blk, 0.0)\n",
     "reads the program id (`tl.store(sum_ptr + blk, 0.0)`)"),
    ("    ticket = tl.atomic_add(sum_ptr + tl.program_id(0) // 2, 1.0)\n",
     "`ticket = tl.atomic_add(sum_ptr + tl.program_id(0) // 2, 1.0)` reads the program id"),
])
def test_a_position_read_in_a_tuple_or_an_atomic_keeps_its_order(extra: str, says: str) -> None:
    (entry,) = _report(OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n", extra
                                        + "    o = pid * BLOCK + tl.arange(0, BLOCK)\n"))
    assert entry.startswith("[not applied]") and says in entry, entry


def test_the_mappings_other_coordinate_and_an_unread_copy_keep_the_rotation() -> None:
    (entry,) = _report(PAIRED)
    assert entry.startswith("[applied]") and "pid rotated" in entry, entry
    unread = OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK", "    blk = tl.program_id(0)\n    o = pid * BLOCK")
    (entry,) = _report(unread)
    assert entry.startswith("[applied]") and "pid rotated" in entry, entry


def test_a_kernel_reading_its_position_through_the_rotated_variable_only_is_rotated() -> None:
    (entry,) = _report(OWN_INDEX.replace("tl.store(sum_ptr + pid, tl.sum(x))", "tl.store(sum_ptr + pid_m, tl.sum(x))"))
    assert entry.startswith("[applied]") and "pid_m rotated" in entry, entry


def _double(path: str, form: str) -> float:
    spec = importlib.util.spec_from_file_location(f"bypass_{form}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 48, 8
    x = torch.randn(N, generator=torch.Generator().manual_seed(8))
    lo, hi = rows_of(rank, world, N)
    device = current_world().device
    y, sums = (torch.full((n,), float("nan"), device=device) for n in (N, N // block))
    module.double_kernel[(N // block,)](x[lo:hi].contiguous().to(device), y, sums, N, BLOCK=block)
    y, sums = y.cpu(), sums.cpu()
    got = torch.cat([y - 2 * x, sums - x.view(-1, block).sum(dim=1)]) if form == "own_index" else y - 2 * x
    return float("inf") if got.isnan().any() else got.abs().max().item()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_kernels_reading_their_position_equal_torch_on_the_race_exposing_schedule(form: str, world: int, tmp_path,
                                                                                  monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"bypass_{form}.py"
    path.write_text(HEAD + textwrap.dedent(FORMS[form]))
    errors = tilelink.spawn(_double, world, str(path), form)
    assert all(e < 1e-5 for e in errors), errors


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(MORE_FORMS))
def test_copied_shifted_and_chained_positions_equal_torch_on_the_race_exposing_schedule(form: str, tmp_path,
                                                                                        monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"bypass_{form}.py"
    path.write_text(HEAD + textwrap.dedent(MORE_FORMS[form]))
    errors = tilelink.spawn(_double, 2, str(path), form)
    assert all(e < 1e-5 for e in errors), errors

# the reduce-scatter side: the partial products of a tile stored at the rotated variable's rows, read from rows the
# kernel computes from its position another way
PARTIAL = '''
@tilelink.overlap(tilelink.reduce_scatter("y_ptr", dim=0, size="N"))
@triton.jit
def partial_scale_kernel(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    SOURCE
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + src, mask=src < N, other=0.0)
    w = tl.load(w_ptr + src, mask=src < N, other=0.0)
    tl.store(y_ptr + offs, x * w, mask=offs < N)
'''

PARTIAL_SOURCES = {
    "copied": "blk = tl.program_id(0)\n    src = blk * BLOCK + tl.arange(0, BLOCK)",
    "shifted": "row = tl.program_id(0) << 3\n    src = row + tl.arange(0, BLOCK)",
    "chained": "r0 = tl.program_id(0) * BLOCK\n    " + "".join(f"r{i} = r{i - 1} + 0\n    " for i in range(1, 12))
               + "src = r11 + tl.arange(0, BLOCK)",
}


def _partial_scale(path: str, form: str) -> float:
    spec = importlib.util.spec_from_file_location(f"partial_{form}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 48, 8
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(N, generator=g) for _ in range(world)]
    w = torch.randn(N, generator=g)
    lo, hi = rows_of(rank, world, N)
    device = current_world().device
    y = torch.full((hi - lo,), float("nan"), device=device)
    module.partial_scale_kernel[(N // block,)](xs[rank].to(device), w.to(device), y, N, BLOCK=block)
    got = y.cpu() - sum(x * w for x in xs)[lo:hi]
    return float("inf") if got.isnan().any() else got.abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(PARTIAL_SOURCES))
def test_reduce_scatter_positions_read_another_way_keep_their_order_and_equal_torch(form: str, tmp_path,
                                                                                    monkeypatch) -> None:
    source = PARTIAL.replace("SOURCE", PARTIAL_SOURCES[form])
    (entry,) = _report(source)
    assert entry.startswith("[not applied]") and "start from the program id, not through pid" in entry, entry
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"partial_{form}.py"
    path.write_text(HEAD + textwrap.dedent(source))
    errors = tilelink.spawn(_partial_scale, 2, str(path), form)
    assert all(e < 1e-5 for e in errors), errors


#: the rows' start read through a helper of the kernel's file that reads the program id itself, through another
#: spelling of `tl.program_id`, and through an axis that is not an int literal
HELPER = '''
@triton.jit
def block_start(BLOCK: tl.constexpr):
    return tl.program_id(0) * BLOCK
''' + OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK", "    o = block_start(BLOCK)")
SPELLED = {
    "helper": HELPER,
    "module": OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK", "    o = triton.language.program_id(0) * BLOCK"),
    "named_axis": OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK",
                                   "    AXIS: tl.constexpr = 0\n    o = tl.program_id(AXIS) * BLOCK"),
}


@pytest.mark.parametrize("form", sorted(SPELLED))
def test_a_position_read_through_a_helper_or_spelled_otherwise_keeps_its_order(form: str) -> None:
    (entry,) = _report(SPELLED[form])
    assert entry.startswith("[not applied]") and "start from the program id, not through pid" in entry, entry


@pytest.mark.parametrize("form", ["helper", pytest.param("module", marks=pytest.mark.slow),
                                  pytest.param("named_axis", marks=pytest.mark.slow)])
def test_positions_read_through_a_helper_or_spelled_otherwise_equal_torch(form: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"bypass_{form}.py"
    path.write_text(HEAD + textwrap.dedent(SPELLED[form]))
    errors = tilelink.spawn(_double, 2, str(path), form)
    assert all(e < 1e-5 for e in errors), errors


def test_a_position_read_through_a_function_of_an_imported_module_keeps_its_order(tmp_path, monkeypatch) -> None:
    """`import tile_helpers` ... `tile_helpers.block_start(BLOCK)`: the module's file, found beside the kernel's, is
    read for what the function reads."""
    (tmp_path / "tile_helpers.py").write_text(HEAD + textwrap.dedent(HELPER.split("@tilelink.overlap")[0]))
    source = ("import tile_helpers\n" + HEAD + textwrap.dedent(OWN_ROWS).replace(
        "    o = tl.program_id(0) * BLOCK", "    o = tile_helpers.block_start(BLOCK)"))
    path = tmp_path / "module_helper.py"
    path.write_text(source)
    (entry,) = [str(e) for e in generate(source, str(path), requests_in(source, str(path))).report.entries
                if "order" in e.message]
    assert entry.startswith("[not applied]") and "tile_helpers.block_start(BLOCK)" in entry, entry
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.syspath_prepend(str(tmp_path))
    errors = tilelink.spawn(_double, 2, str(path), "module_helper")
    assert all(e < 1e-5 for e in errors), errors


def test_a_helper_that_only_mentions_the_program_id_in_a_comment_keeps_the_rotation() -> None:
    source = '''
@triton.jit
def start_of(p, BLOCK: tl.constexpr):
    # p is tl.program_id(0), rotated by the caller
    return p * BLOCK
''' + OWN_ROWS.replace("    o = tl.program_id(0) * BLOCK", "    o = start_of(pid, BLOCK)")
    (entry,) = _report(source)
    assert entry.startswith("[applied]") and "pid rotated" in entry, entry


def test_a_module_function_reading_the_position_through_another_keeps_its_order(tmp_path) -> None:
    """`helpers.block_start` calls the module's `_here`, which reads `tl.program_id`: a read of the position too."""
    (tmp_path / "nested_helpers.py").write_text(HEAD + textwrap.dedent('''
        @triton.jit
        def _here():
            return tl.program_id(0)


        @triton.jit
        def block_start(BLOCK: tl.constexpr):
            return _here() * BLOCK
        '''))
    source = ("import nested_helpers\n" + HEAD + textwrap.dedent(OWN_ROWS).replace(
        "    o = tl.program_id(0) * BLOCK", "    o = nested_helpers.block_start(BLOCK)"))
    path = tmp_path / "nested.py"
    path.write_text(source)
    (entry,) = [str(e) for e in generate(source, str(path), requests_in(source, str(path))).report.entries
                if "order" in e.message]
    assert entry.startswith("[not applied]") and "nested_helpers.block_start(BLOCK)" in entry, entry
