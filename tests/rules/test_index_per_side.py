"""Token rows bound one way on each side of a compile-time `if`, as vLLM's fused MoE kernel binds them: loaded
from the sorted slot index when blocks hold many slots, or made from the program id when each block holds one
slot (`naive_block_assignment`, the decode path: no index at all, its parameter `None`). After the `if` the name
holds one side's values on every run, and the wait or notify computes its channels from those values: both sides
build, and both equal torch on the race-exposing schedule under both rules. A pointer made inside the `if` from
one of two bindings of a side, or bindings in a loop, are refused."""

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

#: the up projection: gathered token rows, one row of C per slot
UP = '''
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.all_gather("a_ptr", index="sorted_token_ids_ptr", size="num_valid_tokens // top_k"))
@triton.jit
def fused_moe_up(a_ptr, b_ptr, c_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr, N, K,
                 EM, num_valid_tokens, stride_am, stride_ak, stride_be, stride_bk, stride_bn, stride_cm, stride_cn,
                 top_k: tl.constexpr, naive_block_assignment: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                 BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs = tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    num_tokens_post_padded = tl.load(num_tokens_post_padded_ptr)
    if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded:
        return
    if not naive_block_assignment:
        offs_token_id = pid_m * BLOCK_SIZE_M + offs
        offs_token = tl.load(sorted_token_ids_ptr + offs_token_id, mask=offs_token_id < EM, other=num_valid_tokens)
    else:
        offs_token = tl.where(offs == 0, pid_m, num_valid_tokens)
    token_mask = offs_token < num_valid_tokens
    off_experts = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N).to(tl.int64)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_token[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + off_experts * stride_be + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < K - k * BLOCK_SIZE_K), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator += tl.dot(a, b)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, accumulator, mask=token_mask[:, None] & (offs_cn[None, :] < N))
'''

#: the down projection: one row per slot, reduced over each token's slots and over the ranks, scattered by token
DOWN = UP.replace(
    '@tilelink.overlap(tilelink.all_gather("a_ptr", index="sorted_token_ids_ptr", size="num_valid_tokens // top_k"))',
    '@tilelink.overlap(tilelink.reduce_scatter("c_ptr", index="sorted_token_ids_ptr", topk="top_k",\n'
    '                                          size="num_valid_tokens // top_k"))').replace(
    "def fused_moe_up(", "def fused_moe_down(").replace(
    "offs_token[:, None] // top_k * stride_am", "offs_token[:, None] * stride_am")

M, K, N, E, TOPK, BM = 9, 40, 24, 6, 2, 16


def _routing() -> torch.Tensor:
    g = torch.Generator().manual_seed(21)
    return torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(M)])


def _assignment(naive: bool) -> tuple[torch.Tensor | None, torch.Tensor, int]:
    """What the kernel walks: the sorted, padded slots and each block's expert, or with one block per slot none of
    the first and each slot's expert; the number of slots the blocks cover."""
    from tilelink.ops.moe_routing import align_tokens

    topk_ids = _routing()
    if naive:
        return None, topk_ids.flatten().to(torch.int32), M * TOPK * BM
    sorted_ids, expert_ids = (t.cpu() for t in align_tokens(topk_ids.to(current_world().device), E, BM))
    return sorted_ids, expert_ids, sorted_ids.numel()


def _launch(kernel, a, b, c, naive: bool, k: int) -> None:
    sorted_ids, expert_ids, em = _assignment(naive)
    device = a.device
    sorted_d = sorted_ids.to(device) if sorted_ids is not None else None
    padded = torch.tensor([em], dtype=torch.int32, device=device)
    blocks = M * TOPK if naive else triton.cdiv(em, BM)
    kernel[(blocks * triton.cdiv(N, 16),)](
        a, b, c, sorted_d, expert_ids.to(device), padded, N, k, em, M * TOPK, a.stride(0), a.stride(1),
        b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1), top_k=TOPK, naive_block_assignment=naive,
        BLOCK_SIZE_M=BM, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16)


def _up(path: str, naive: bool) -> float:
    """Each rank holds its rows of the tokens; every rank computes every slot's row."""
    kernel = module_at(path).fused_moe_up
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(22)
    x, w = torch.randn(M, K, generator=g), torch.randn(E, K, N, generator=g)
    ref = torch.einsum("sk,skn->sn", x.repeat_interleave(TOPK, 0), w[_routing().flatten()])
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    shard, wd = x[lo:hi].contiguous().to(device), w.to(device)
    err = 0.0
    for _ in range(2):
        c = torch.full((M * TOPK, N), float("nan"), device=device)
        _launch(kernel, shard, wd, c, naive, K)
        err = worst(err, (c.cpu() - ref).abs().max().item())
    return err


def _down(path: str, naive: bool) -> float:
    """Each rank holds its columns of every slot's activations and its rows of the weights; the slots' rows summed
    over ranks and over each token's slots, this rank's tokens."""
    kernel = module_at(path).fused_moe_down
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(23)
    h, w = torch.randn(M * TOPK, K, generator=g), torch.randn(E, K, N, generator=g)
    ref = torch.einsum("sk,skn->sn", h, w[_routing().flatten()]).view(M, TOPK, N).sum(1)
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M)
    device = current_world().device
    hd, wd = h[:, klo:khi].contiguous().to(device), w[:, klo:khi].contiguous().to(device)
    err = 0.0
    for _ in range(2):
        y = torch.full((hi - lo, N), float("nan"), device=device)
        _launch(kernel, hd, wd, y, naive, khi - klo)
        err = worst(err, (y.cpu() - ref[lo:hi]).abs().max().item() if hi > lo else 0.0)
    return err


def _written(tmp_path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


@pytest.mark.parametrize("naive", [False, True], ids=["sorted", "one-slot-blocks"])
@pytest.mark.parametrize("rule", ["gather", "reduce"])
def test_tokens_bound_on_each_side_of_an_if_equal_torch(rule: str, naive: bool, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path, f"moe_{rule}", UP if rule == "gather" else DOWN)
    for world in (2, 3):
        errors = tilelink.spawn(_up if rule == "gather" else _down, world, path, naive)
        assert all(e < 1e-4 for e in errors), (world, naive, errors)


def test_both_sides_wait_for_the_rows_of_the_tokens_after_the_if() -> None:
    text = generate(textwrap.dedent(UP), "moe_up.py", requests_in(textwrap.dedent(UP), "moe_up.py")).text
    body = text.split("def fused_moe_up(", 1)[1]
    # one wait, after the `if` (both sides' values), before the loop, on the rows the pointer reads
    assert body.count("tll.consumer_tile_wait_channels(") == 1, body
    branch, wait, loop = (body.index(s) for s in ("if not naive_block_assignment:", "tlk_src = offs_token // top_k",
                                                   "for k in range("))
    assert branch < wait < loop, body


SIDES = """\
    if not naive_block_assignment:
        offs_token_id = pid_m * BLOCK_SIZE_M + offs
        offs_token = tl.load(sorted_token_ids_ptr + offs_token_id, mask=offs_token_id < EM, other=num_valid_tokens)
    else:
        offs_token = tl.where(offs == 0, pid_m, num_valid_tokens)
"""


BOUND_TWICE = ("the rows `offs_token // top_k` of the load at line 35 come through `offs_token`, bound at lines "
               "{lines}: the wait computes its channels from the values `offs_token` holds where it is placed")


@pytest.mark.parametrize(("sides", "says"), [
    # a side binds the tokens twice, and a pointer is made between the two: after the `if` the name holds the
    # second values, which the wait would read, while the pointer reads the first
    (SIDES.replace("    else:\n", "        a_ptrs = a_ptr + offs_token[:, None] // top_k * stride_am\n"
                                   "        offs_token = offs_token + 1\n    else:\n"),
     "cannot tell which rows along dim 0 of 'a_ptr' this load reads (pointer `a_ptrs`)"),
    # the `if` in a loop: each pass binds the tokens again
    ("    for _ in range(2):\n" + textwrap.indent(SIDES, "    "), BOUND_TWICE.format(lines="24 and 26")),
    # bound again after the `if`
    (SIDES + "    offs_token = offs_token % num_valid_tokens\n", BOUND_TWICE.format(lines="23, 25 and 26")),
], ids=["pointer-between-two-bindings", "in-a-loop", "bound-again-after"])
def test_tokens_bound_where_the_wait_could_read_other_values_are_refused(sides: str, says: str) -> None:
    source = UP.replace(SIDES, sides)
    assert source != UP
    source = textwrap.dedent(source)
    with pytest.raises(AnnotationError) as info:
        generate(source, "moe_up.py", requests_in(source, "moe_up.py"))
    assert says in str(info.value), info.value
    if "bound at lines" in says:
        assert "bind `offs_token` once, or once on each side of one `if`" in info.value.hint, info.value.hint
