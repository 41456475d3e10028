"""vLLM's scaled matmul form under all_gather (tests/rules/forms/gemm_columns_beside.py), annotated and nothing else:
the offsets grid held in a local of its own (`offsets_a = stride_am * offsets_am[:, None] + stride_ak * offsets_k[None,
:]`, then `a_ptrs = a_ptr + offsets_a`), the column vector advanced beside the pointer (`offsets_k += BLOCK_K` with
`a_ptrs += BLOCK_K * stride_ak`) and the mask made of locals in the loop (`masks_k = offsets_k < K`, `masks_a =
masks_am[:, None] & masks_k[None, :]`). It builds and equals the plain kernel on the race-exposing schedule at worlds 2
and 3, with K not a multiple of the block (the mask, not whole blocks, bounds the last step). A vector that moves
otherwise than the pointer, a mask not made on each step, and a grid whose rows change before the pointer is made
from it are refused."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import launch_refusal, module_at, plain_module, rows_of, worst
from tests.rules.forms_cases import FORMS
from tests.rules.test_carried_accumulator import _generate
from tilelink.errors import AnnotationError

KERNEL = (FORMS / "gemm_columns_beside.py").read_text()
M, N, K = 50, 24, 40
META = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


def _launch(kernel, a, b, scale, c) -> None:
    kernel[(triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]),)](
        a, b, scale, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1), **META)


def _against_plain(path: str) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    scale = torch.rand(M, generator=g) + 0.5
    want = torch.full((M, N), float("nan"))
    _launch(plain_module(path).scaled_mm_kernel, a, b, scale, want)
    kernel = module_at(path).scaled_mm_kernel
    lo, hi = rows_of(rank, world, M)
    error = 0.0
    for _ in range(2):
        got = torch.full((M, N), float("nan"))
        _launch(kernel, a[lo:hi].contiguous(), b, scale, got)
        error = worst(error, (got - want).abs().max().item())
    return error


def test_the_columns_advanced_beside_the_pointer_build_and_equal_the_plain_kernel(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    generated = _generate(KERNEL)
    assert "consumer_tile_wait" in generated.rewritten["scaled_mm_kernel"]
    path = tmp_path / "scaled_ag.py"
    path.write_text(KERNEL)
    for world in (2, 3):
        errors = tilelink.spawn(_against_plain, world, str(path))
        assert errors == [0.0] * world, (world, errors)


LOOP = "    for k in range(0, tl.cdiv(K, BLOCK_K)):"


@pytest.mark.parametrize("old, new, message", [
    # the vector moves by half the pointer's step: `offsets_k < K` lets the last steps read the next row
    ("        offsets_k += BLOCK_K\n", "        offsets_k += BLOCK_K // 2\n", "bound again"),
    # the mask made once, before the loop, holds the first step's columns on every step
    ("        masks_k = offsets_k < K\n" + "", "", "mask does not bound"),
    # moved on some steps only
    ("        offsets_k += BLOCK_K\n", "        if k % 2 == 0:\n            offsets_k += BLOCK_K\n", "bound again"),
    # moved twice, once before the loads: TileLink reads one advance, after the access
    ("        masks_k = offsets_k < K\n", "        offsets_k += 0\n        masks_k = offsets_k < K\n", "bound again"),
    # the grid's rows bound again between the grid and the pointer made from it: not the rows the grid was made of
    ("    a_ptrs = a_ptr + offsets_a\n", "    offsets_am = offsets_am + 1\n    a_ptrs = a_ptr + offsets_a\n",
     "cannot tell which rows"),
    # a step that skips the vector's advance
    ("        offsets_k += BLOCK_K\n", "        if k == 0:\n            continue\n        offsets_k += BLOCK_K\n",
     "bound again"),
    # the address made afresh from the moving vector, bounded by the rows only
    ("        a = tl.load(a_ptrs, mask=masks_a)\n",
     "        a = tl.load(a_ptr + stride_am * offsets_am[:, None] + stride_ak * offsets_k[None, :],\n"
     "                    mask=masks_am[:, None])\n", "move from step to step"),
], ids=["half-step", "mask-before-loop", "in-a-branch", "moved-twice", "rows-rebound", "continue",
        "afresh-unmasked"])
def test_columns_that_do_not_move_with_the_pointer_are_refused(old: str, new: str, message: str) -> None:
    source = KERNEL.replace(old, new)
    if not new:  # the mask before the loop
        assert LOOP in source
        source = source.replace(LOOP, "    masks_k = offsets_k < K\n" + LOOP)
    assert source != KERNEL
    with pytest.raises(AnnotationError, match=message):
        _generate(source)



def test_columns_the_load_adds_again_beside_the_advanced_pointer_are_refused() -> None:
    # the pointer holds the rows only and the load adds the moving vector: the columns move twice a step (the
    # pointer's advance and the vector's), while the mask bounds them once
    source = KERNEL.replace("    a_ptrs = a_ptr + offsets_a\n",
                            "    a_ptrs = a_ptr + stride_am * offsets_am[:, None]\n")
    source = source.replace("        a = tl.load(a_ptrs, mask=masks_a)\n",
                            "        a = tl.load(a_ptrs + stride_ak * offsets_k[None, :], mask=masks_a)\n")
    with pytest.raises(AnnotationError, match="bound again"):
        _generate(source)


@pytest.mark.parametrize("old, new", [
    ("        offsets_k += BLOCK_K\n", "        offsets_k = offsets_k + BLOCK_K\n"),
    # the address made afresh from the moving vector, masked by the row where it is read
    ("        a = tl.load(a_ptrs, mask=masks_a)\n",
     "        a = tl.load(a_ptr + stride_am * offsets_am[:, None] + stride_ak * offsets_k[None, :],\n"
     "                    mask=masks_am[:, None] & (offsets_k[None, :] < K))\n"),
], ids=["assigned-advance", "afresh-masked"])
def test_other_spellings_of_the_moving_columns_build(old: str, new: str) -> None:
    source = KERNEL.replace(old, new)
    assert source != KERNEL
    assert "consumer_tile_wait" in _generate(source).rewritten["scaled_mm_kernel"]


def _past_the_row_with_a_bool_stride(path: str) -> str:
    rank, world = tilelink.rank(), tilelink.world_size()
    a, b = torch.randn(M, K), torch.randn(K + 8, N)
    scale, c = torch.ones(M), torch.full((M, N), float("nan"))
    lo, hi = rows_of(rank, world, M)
    # K + 8 columns of rows of K, stepped by `stride_ak=True` (1): the last steps read the next row
    return launch_refusal(lambda: module_at(path).scaled_mm_kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](
        a[lo:hi].contiguous(), b, scale, c, M, N, K + 8, K, True, b.stride(0), b.stride(1), c.stride(0),
        c.stride(1), **META))


def test_a_bool_column_stride_is_read_as_its_int_at_the_call(tmp_path) -> None:
    path = tmp_path / "scaled_ag.py"
    path.write_text(KERNEL)
    said = tilelink.spawn(_past_the_row_with_a_bool_stride, 2, str(path))
    assert all("walks the columns of 'a_ptr'" in s for s in said), said
