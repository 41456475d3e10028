"""Each element of a reduced tensor is stored once by a program. Every store's notify adds the elements it wrote to its
channels' counts, so a tile stored twice (zeros first, then the sums; the same helper called twice) counts its rows
twice: the channel reaches its target while other tiles of it are unstored, and the reduction reads them (NaN at 2
ranks on the race-exposing schedule). Two stores a program may both run are refused unless they write disjoint columns;
stores on the two sides of an `if`, or one followed by a `return` before the other, are not both run. Where only the
compiled kernel knows a block width (a host descriptor's), a static assert before the later store checks it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError
from tilelink.runtime import current_world

FORMS = Path(__file__).parent / "forms"
HALVES = FORMS / "partial_sums_helper_stores.py"
LEFT = "    store_columns(y_ptr, rows, 0, M, D, stride_ym, left * scale, HALF)\n"
RIGHT = "    store_columns(y_ptr, rows, HALF, M, D, stride_ym, right * scale, HALF)\n"


def _build(source: str, name: str = "partial_sums_helper_stores.py"):
    return generate(source, name, requests_in(source, name))


def _refusal(source: str) -> str:
    with pytest.raises(AnnotationError) as info:
        _build(source)
    return str(info.value)


def test_disjoint_halves_stored_by_a_helper_build() -> None:
    report = [str(e) for e in _build(HALVES.read_text()).report.entries]
    assert sum("producer_tile_notify after the store" in e for e in report) == 2, report


def test_a_tile_stored_twice_through_a_helper_is_refused() -> None:
    text = HALVES.read_text()
    zeros = "    store_columns(y_ptr, rows, 0, M, D, stride_ym, tl.zeros((BLOCK_M, HALF), tl.float32), HALF)\n"
    said = _refusal(text.replace(LEFT, zeros + LEFT))
    assert "may both write the same elements in one program" in said and "in the @triton.jit helper" in said, said
    # the second half starting inside the first
    said = _refusal(text.replace(RIGHT, RIGHT.replace("HALF, M, D", "HALF - 1, M, D")))
    assert "may both write the same elements" in said, said


@pytest.mark.parametrize("store", [
    # the same tile twice in the kernel: zeros, then the sums
    "tl.store(y_ptr + offs[:, None] * D + cols[None, :], tl.zeros((BLOCK_M, BLOCK_D), tl.float32))\n"
    "    tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)",
    # zeros under a run-time test that does not return, then the sums
    "if x0 > 0:\n        tl.store(y_ptr + offs[:, None] * D + cols[None, :],\n"
    "                 tl.zeros((BLOCK_M, BLOCK_D), tl.float32))\n"
    "    tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)",
    # a descriptor store of the same box twice
    "desc = tl.make_tensor_descriptor(y_ptr, shape=[M, D], strides=[D, 1], block_shape=[BLOCK_M, BLOCK_D])\n"
    "    desc.store([pid * BLOCK_M, 0], x)\n    desc.store([pid * BLOCK_M, 0], x)",
    # a pointer store of the same rows inside and after a loop
    "for j in range(2):\n        tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)\n"
    "    tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)",
    # zeros over the tiles in one loop, the sums in another: two tile loops store the same rows
    "for j in range(2):\n        tl.store(y_ptr + offs[:, None] * D + cols[None, :], tl.zeros((BLOCK_M, BLOCK_D), "
    "tl.float32))\n    for j in range(2):\n        tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)",
    # the second half past the first by a run-time parameter, which may be negative
    "c2 = BLOCK_D + G + cols\n    tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)\n"
    "    tl.store(y_ptr + offs[:, None] * D + c2[None, :], x)",
])
def test_two_stores_a_program_may_both_run_are_refused(store: str) -> None:
    source = KERNEL.format(store=store)
    said = _refusal(source)
    assert "may both write the same elements in one program" in said, said


@pytest.mark.parametrize("store", [
    "if x0 > 0:\n        tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)\n"
    "    else:\n        tl.store(y_ptr + offs[:, None] * D + cols[None, :], 2 * x)",
    "if x0 > 0:\n        tl.store(y_ptr + offs[:, None] * D + cols[None, :],\n"
    "                 tl.zeros((BLOCK_M, BLOCK_D), tl.float32))\n"
    "        return\n    tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)",
    "desc = tl.make_tensor_descriptor(y_ptr, shape=[M, D], strides=[D, 1], block_shape=[BLOCK_M, BLOCK_D // 2])\n"
    "    desc.store([pid * BLOCK_M, 0], tl.zeros((BLOCK_M, BLOCK_D // 2), tl.float32))\n"
    "    desc.store([pid * BLOCK_M, BLOCK_D // 2], tl.zeros((BLOCK_M, BLOCK_D // 2), tl.float32))",
])
def test_stores_on_two_sides_past_a_return_or_of_disjoint_boxes_build(store: str) -> None:
    _build(KERNEL.format(store=store))


def test_a_constexpr_gap_between_two_stores_is_asserted_at_compile_time() -> None:
    source = KERNEL.replace("G, BLOCK_M", "G: tl.constexpr, BLOCK_M").format(
        store="c2 = BLOCK_D + G + cols\n    tl.store(y_ptr + offs[:, None] * D + cols[None, :], x)\n"
              "    tl.store(y_ptr + offs[:, None] * D + c2[None, :], x)")
    kernel = _build(source).rewritten["copy_rows"]
    assert "tl.static_assert(G >= 0" in kernel, kernel


@pytest.mark.parametrize(("first", "second", "asserted"), [
    # the first block `BLOCK_D + G` wide, the second from `BLOCK_D + 2 * G`: apart by `G`, which may be below 0
    ("BLOCK_D + G", "BLOCK_D + 2 * G", "tl.static_assert(G >= 0"),
    # the second one column past a block of `BLOCK_D + 2 * G`: apart for `G = 0` only, not for every width
    ("BLOCK_D + 2 * G", "BLOCK_D + 1", "tl.static_assert(-2 * G + 1 >= 0"),
], ids=["gap-of-a-part", "one-launch-apart"])
def test_a_width_made_of_a_sum_is_not_read_as_positive_in_each_part(first: str, second: str, asserted: str) -> None:
    """Triton compiles an arange only above 0 wide, but a width that is a sum says nothing of each of its parts: the
    gap between the stores is asserted at compile time, neither taken as non-negative nor refused as never so."""
    source = KERNEL.replace("G, BLOCK_M", "G: tl.constexpr, BLOCK_M").format(
        store=f"c1 = tl.arange(0, {first})\n    c2 = {second} + cols\n"
              f"    tl.store(y_ptr + offs[:, None] * D + c1[None, :], tl.zeros((BLOCK_M, {first}), tl.float32),\n"
              "             mask=c1[None, :] < D)\n"
              "    tl.store(y_ptr + offs[:, None] * D + c2[None, :], x, mask=c2[None, :] < D)")
    kernel = _build(source).rewritten["copy_rows"]
    assert asserted in kernel, kernel


def test_a_host_descriptors_block_width_is_asserted_at_compile_time() -> None:
    path = FORMS / "gemm_host_descriptor_rs.py"
    text = path.read_text()
    generated = generate(text, str(path), requests_in(text, str(path)))
    kernel = generated.rewritten["matmul_descriptor_persistent_rs"]
    assert "tl.static_assert((BLOCK_N // 2) - c_desc.block_shape[1] >= 0" in kernel, kernel
    notes = [str(e) for e in generated.report.entries if "checks at compile time" in str(e)]
    assert len(notes) == 1 and "stores at lines 48, 49" in notes[0], notes


KERNEL = '''
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.reduce_scatter("y_ptr", size="M"))
@triton.jit
def copy_rows(x_ptr, y_ptr, M, D, G, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    x = tl.load(x_ptr + offs[:, None] * D + cols[None, :])
    x0 = tl.load(x_ptr + pid * BLOCK_M * D)
    {store}
'''


def _halves(path: str) -> float:
    spec = importlib.util.spec_from_file_location("partial_sums_helper_stores_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    M, D = 24, 8
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(M, D, generator=g) for _ in range(world)]
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    y = torch.full((hi - lo, D), float("nan"), device=device)
    for _ in range(2):
        module.scaled_halves[(M // 4,)](xs[rank].to(device), y, M, D, 0.5, D, D, BLOCK_M=4, BLOCK_D=D)
    want = (0.5 * sum(xs))[lo:hi]
    got = y.cpu()
    return float("inf") if got.isnan().any() else (got - want).abs().max().item()


@pytest.mark.slow
def test_disjoint_halves_equal_torch_on_the_race_exposing_schedule(monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert all(e < 1e-5 for e in tilelink.spawn(_halves, 2, str(HALVES)))
