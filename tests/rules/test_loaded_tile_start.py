"""A grouped GEMM whose tiles start at rows loaded through an index, as Liger's fused MoE kernels write it: each tile
loads its first row (`row_start = tl.load(tile_row_start_ptr + pid_m)`) and its expert, and reads the block
`row_offs = (row_start + m_offs).to(tl.int64)` masked by the expert's last row. The block's values are the rows, as
a loaded vector's are: with `index=` it builds under both rules, each tile waits for (or notifies) the channels of
those rows, and the result equals torch on the race-exposing schedule. A parameter keyword given a literal
(`topk="1"`) is refused where the annotation is, saying what it takes."""

from __future__ import annotations

import textwrap

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of, worst
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError
from tilelink.runtime import current_world

KERNEL = '''
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.{rule})
@triton.jit
def grouped_mm(a_ptr, w_ptr, expert_start_ptr, tile_row_start_ptr, tile_expert_ptr, y_ptr, TK, H, I, stride_a,
               stride_we, stride_wh, stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    row_start = tl.load(tile_row_start_ptr + pid_m)
    expert_idx = tl.load(tile_expert_ptr + pid_m).to(tl.int64)
    expert_end = tl.load(expert_start_ptr + expert_idx + 1)
    m_offs = tl.arange(0, BLOCK_M)
    n_offs = tl.arange(0, BLOCK_N)
    k_offs = tl.arange(0, BLOCK_K)
    row_offs = (row_start + m_offs).to(tl.int64)
    row_mask = row_offs < expert_end
    n_idx = pid_n * BLOCK_N + n_offs
    n_mask = n_idx < H
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, I, BLOCK_K):
        k_idx = k + k_offs
        k_mask = k_idx < I
        a_ptrs = a_ptr + row_offs[:, None] * stride_a + k_idx[None, :]
        a_tile = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w_ptrs = w_ptr + expert_idx * stride_we + n_idx[:, None] * stride_wh + k_idx[None, :]
        w_tile = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(a_tile, tl.trans(w_tile), acc=acc)
    y_ptrs = y_ptr + row_offs[:, None] * stride_y + n_idx[None, :]
    tl.store(y_ptrs, acc, mask=row_mask[:, None] & n_mask[None, :])
'''
RULES = {"gather": 'all_gather("a_ptr", index="tile_row_start_ptr", size="TK")',
         "reduce": 'reduce_scatter("y_ptr", index="tile_row_start_ptr", size="TK")'}
TK, H, I, E, BM = 45, 24, 40, 4, 16


def _tiles() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows sorted by expert (expert 2 has none): each expert's first row, and each tile's first row and expert."""
    counts = [13, 20, 0, 12]
    start = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    tiles = [(int(start[e]) + r, e) for e in range(E) for r in range(0, counts[e], BM)]
    return start, torch.tensor([t[0] for t in tiles], dtype=torch.int32), torch.tensor([t[1] for t in tiles],
                                                                                        dtype=torch.int32)


def _run(path: str, rule: str) -> float:
    kernel = module_at(path).grouped_mm
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(31)
    a, w = torch.randn(TK, I, generator=g), torch.randn(E, H, I, generator=g)
    start, tile_start, tile_expert = _tiles()
    experts = torch.repeat_interleave(torch.arange(E), torch.diff(start).long())
    ref = torch.einsum("ti,thi->th", a, w[experts])
    lo, hi = rows_of(rank, world, TK)
    device = current_world().device  # the CPU in the emulated world, this rank's GPU with NVSHMEM
    index = [t.to(device) for t in (start, tile_start, tile_expert)]
    if rule == "gather":
        x, wd, rows, i, want = a[lo:hi].contiguous().to(device), w.to(device), TK, I, ref
    else:
        klo, khi = rows_of(rank, world, I)
        x, wd, rows, i = a[:, klo:khi].contiguous().to(device), w[:, :, klo:khi].contiguous().to(device), hi - lo, \
            khi - klo
        want = ref[lo:hi]
    err = 0.0
    for _ in range(2):
        y = torch.full((rows, H), float("nan"), device=device)
        kernel[(tile_start.numel(), triton.cdiv(H, 16))](x, wd, *index, y, TK, H, i, x.stride(0), wd.stride(0),
                                                          wd.stride(1), y.stride(0), BLOCK_M=BM, BLOCK_N=16,
                                                          BLOCK_K=16)
        err = worst(err, (y.cpu() - want).abs().max().item() if y.numel() else 0.0)
    return err


@pytest.mark.parametrize("rule", sorted(RULES))
def test_tiles_started_at_loaded_rows_equal_torch(rule: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"grouped_{rule}.py"
    path.write_text(textwrap.dedent(KERNEL).replace("{rule}", RULES[rule]))
    for world in (2, 3):
        errors = tilelink.spawn(_run, world, str(path), rule)
        assert all(e < 1e-4 for e in errors), (world, errors)


def test_without_index_the_reduction_asks_for_index_and_size_and_not_a_top_k_it_cannot_name() -> None:
    source = textwrap.dedent(KERNEL).replace("{rule}", 'reduce_scatter("y_ptr")')
    with pytest.raises(AnnotationError) as info:
        generate(source, "grouped.py", requests_in(source, "grouped.py"))
    hint = info.value.hint
    assert hint.startswith('pass index="tile_row_start_ptr" and size="<the full row count of the output>"'), hint
    assert 'topk="<the parameter holding the slots of one token>" where several rows' in hint, hint


@pytest.mark.parametrize(("rule", "says"), [
    # a literal where a parameter's name goes
    ('reduce_scatter("y_ptr", index="tile_row_start_ptr", topk="1", size="TK")',
     "reduce_scatter: topk= names a parameter of the kernel, e.g. topk=\"top_k\", got '1'"),
    ('all_gather("a_ptr", index="tile_row_start_ptr + 0", size="TK")',
     "all_gather: index= names a parameter of the kernel, e.g. index=\"sorted_token_ids_ptr\""),
    # a name the kernel does not take
    ('reduce_scatter("y_ptr", index="tile_row_start_ptr", topk="top_k", size="TK")',
     "topk='top_k' names no parameter of 'grouped_mm': each call's count of slots per token is read"),
    ('all_gather("a_ptr", index="row_start_ptr", size="TK")',
     "index='row_start_ptr' names no parameter of 'grouped_mm': each call's index is read"),
    # a pointer where the count of slots goes
    ('reduce_scatter("y_ptr", index="tile_row_start_ptr", topk="tile_expert_ptr", size="TK")',
     "topk='tile_expert_ptr' of 'grouped_mm' is a pointer the kernel loads through: topk= names the int parameter"),
], ids=["literal-topk", "expression-index", "unknown-topk", "unknown-index", "pointer-topk"])
def test_an_index_or_top_k_other_than_a_parameter_is_refused_at_the_annotation(rule: str, says: str) -> None:
    source = textwrap.dedent(KERNEL).replace("{rule}", rule)
    with pytest.raises(AnnotationError) as info:
        generate(source, "grouped.py", requests_in(source, "grouped.py"))
    assert says in str(info.value) and info.value.line == 7, info.value
    if "names no parameter" in says:
        assert "name one of its parameters (a_ptr, w_ptr, " in info.value.hint, info.value.hint


@pytest.mark.parametrize("extra", [
    "    e2 = tl.load(expert_ids_ptr + pid_m + top_k)\n",  # the count added after the pointer
    "    end = pid_m + top_k\n    e2 = tl.load(expert_ids_ptr + end)\n",  # through a local
    "    j = top_k\n    for j in range(2):\n        e2 = tl.load(expert_ids_ptr + j)\n",  # a local bound again
], ids=["added", "through-a-local", "rebound-local"])
def test_an_int_top_k_added_to_an_address_is_not_taken_for_a_pointer(extra: str) -> None:
    """Only the term an address starts from is its pointer: an int count added to it stays a count."""
    from pathlib import Path

    source = (Path(__file__).parent / "reduce_scatter" / "moe_scatter_topk.before.py").read_text()
    anchor = "    expert = tl.load(expert_ids_ptr + pid_m)\n"
    assert anchor in source and "topk=" in source
    source = source.replace(anchor, anchor + extra)
    assert generate(source, "moe.py", requests_in(source, "moe.py")).rewritten
