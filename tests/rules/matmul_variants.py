"""Matmul kernels composed from the spellings upstream GEMMs use, one choice per part: the tile order, the row
offsets, the K loop, the accumulation, the epilogue and the store. Every spelling here is one TileLink follows on its
own; a composition of them must build under each rule and equal torch on the race-exposing schedule
(``test_matmul_variants.py``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of, worst
from tilelink.runtime import current_world

HEAD = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.{rule})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
'''

ORDERS = {
    "rows_first": '''    pid = tl.program_id(axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
''',
    "grouped": '''    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
''',
    "two_axes": '''    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
''',
}

#: the rows and columns of the tile; `masked`: the loads need the rows' and columns' masks (not wrapped)
OFFSETS = {
    "plain": ('''    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
''', True),
    "wrapped": ('''    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
''', False),
    "wide": ('''    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
''', True),
    "hinted": ('''    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_am = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
''', False),
}

POINTERS = '''    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
'''
ADVANCE = '''        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
'''

#: the K loop: its header and the K masks of A's and B's loads (``{k}``: what is left of the row, or the columns'
#: bound), the loads' addresses, and what follows them in the loop
LOOPS = {
    "count": ("    for k in range(0, tl.cdiv(K, BLOCK_K)):\n", "offs_k[None, :] < K - k * BLOCK_K",
              "offs_k[:, None] < K - k * BLOCK_K", "a_ptrs", "b_ptrs", ADVANCE, True),
    "step": ("    for k in range(0, K, BLOCK_K):\n", "offs_k[None, :] < K - k", "offs_k[:, None] < K - k",
             "a_ptrs", "b_ptrs", ADVANCE, True),
    "down": ("    for k in range(K, 0, -BLOCK_K):\n", "offs_k[None, :] < k", "offs_k[:, None] < k", "a_ptrs",
             "b_ptrs", ADVANCE, True),
    "remaining": ("    for k in range(0, tl.cdiv(K, BLOCK_K)):\n        k_remaining = K - k * BLOCK_K\n",
                  "offs_k[None, :] < k_remaining", "offs_k[:, None] < k_remaining", "a_ptrs", "b_ptrs", ADVANCE,
                  True),
    "pipelined": ("    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=2):\n", "offs_k[None, :] < K - k * BLOCK_K",
                  "offs_k[:, None] < K - k * BLOCK_K", "a_ptrs", "b_ptrs", ADVANCE, True),
    "afresh": ("    for k in range(0, tl.cdiv(K, BLOCK_K)):\n", "(k * BLOCK_K + offs_k)[None, :] < K",
               "(k * BLOCK_K + offs_k)[:, None] < K",
               "a_ptr + offs_am[:, None] * stride_am + (k * BLOCK_K + offs_k)[None, :] * stride_ak",
               "b_ptr + (k * BLOCK_K + offs_k)[:, None] * stride_bk + offs_bn[None, :] * stride_bn", "", False),
    # the step's columns widened to 64 bits (FlagGems' `rk = (start_k + tl.arange(0, BLOCK_K)).to(tl.int64)`)
    "widened": ("    for start_k in range(0, K, BLOCK_K):\n"
                "        rk = (start_k + tl.arange(0, BLOCK_K)).to(tl.int64)\n", "rk[None, :] < K", "rk[:, None] < K",
                "a_ptr + (offs_am[:, None] * stride_am + rk[None, :] * stride_ak)",
                "b_ptr + (rk[:, None] * stride_bk + offs_bn[None, :] * stride_bn)", "", False),
    # the columns widened, masked through the unwidened block from 0 (the persistent tutorial's `offs_k_for_mask`, as
    # vLLM's batch-invariant matmul widens it for large tensors)
    "for_mask": ("    for ki in range(0, tl.cdiv(K, BLOCK_K)):\n"
                 "        offs_kk = ki * BLOCK_K + tl.arange(0, BLOCK_K).to(tl.int64)\n",
                 "offs_k[None, :] < K - ki * BLOCK_K", "offs_k[:, None] < K - ki * BLOCK_K",
                 "a_ptr + (offs_am[:, None] * stride_am + offs_kk[None, :] * stride_ak)",
                 "b_ptr + (offs_kk[:, None] * stride_bk + offs_bn[None, :] * stride_bn)", "", False),
    # the offsets grids in locals of their own, made on each step and added at the loads (`tl.load(a_ptr + offs_a)`)
    "grid_local": ("    for k in range(0, tl.cdiv(K, BLOCK_K)):\n"
                   "        ks = k * BLOCK_K + offs_k\n"
                   "        offs_a = offs_am[:, None] * stride_am + ks[None, :] * stride_ak\n"
                   "        offs_b = ks[:, None] * stride_bk + offs_bn[None, :] * stride_bn\n",
                   "ks[None, :] < K", "ks[:, None] < K", "a_ptr + offs_a", "b_ptr + offs_b", "", False),
}

ACCUMULATE = {"add": "        accumulator += tl.dot(a, b)\n",
              "acc": "        accumulator = tl.dot(a, b, accumulator)\n"}

STORES = {
    "tutorial": '''    c = accumulator.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)
''',
    "inline": '''    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn, accumulator,
             mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
''',
}

RULES = {"all_gather": 'all_gather("a_ptr", dim=0)', "reduce_scatter": 'reduce_scatter("c_ptr")',
         "all_reduce": 'all_reduce("c_ptr")'}


@dataclass(frozen=True)
class Variant:
    order: str
    offsets: str
    loop: str
    accumulate: str
    store: str

    def source(self, rule: str) -> str:
        offsets, masked = OFFSETS[self.offsets]
        header, a_k, b_k, a_at, b_at, after, pointers = LOOPS[self.loop]
        a_mask = f"(offs_am[:, None] < M) & ({a_k})" if masked else a_k
        b_mask = f"({b_k}) & (offs_bn[None, :] < N)" if masked else b_k
        body = (f"        a = tl.load({a_at}, mask={a_mask}, other=0.0)\n"
                f"        b = tl.load({b_at}, mask={b_mask}, other=0.0)\n" + ACCUMULATE[self.accumulate] + after)
        return (HEAD.format(rule=RULES[rule]) + ORDERS[self.order] + offsets
                + (POINTERS if pointers else "    offs_k = tl.arange(0, BLOCK_K)\n")
                + "    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n" + header + body
                + STORES[self.store])

    def __str__(self) -> str:
        return "-".join((self.order, self.offsets, self.loop, self.accumulate, self.store))


VARIANTS = tuple(Variant(*choice) for choice in itertools.product(ORDERS, OFFSETS, LOOPS, ACCUMULATE, STORES))
#: every tile order, row offsets and K loop together once, the accumulation and the store taken in turn (each pair
#: of them 18 times): what each build covers at a quarter of the builds
COVERING = tuple(Variant(order, offsets, loop, tuple(ACCUMULATE)[i % 2], tuple(STORES)[i // 2 % 2])
                 for i, (order, offsets, loop) in enumerate(itertools.product(ORDERS, OFFSETS, LOOPS)))


def multiply(path: str, rule: str, two_axes: bool, M: int = 45, N: int = 40, K: int = 52,
             blocks: tuple[int, int, int] = (16, 16, 16)) -> float:
    """``A @ B`` through the kernel at ``path`` under ``rule``, twice, each rank's share as the rule's operator takes
    it: its rows of A (a gather), or its slice of K (a reduction, this rank's rows or all of them); the largest
    error."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(7)
    a, b = torch.randint(-3, 4, (M, K), generator=g).float(), torch.randint(-3, 4, (K, N), generator=g).float()
    want = a @ b
    if rule == "all_gather":
        lo, hi = rows_of(rank, world, M)
        ar, br, rows = a[lo:hi].contiguous(), b, (0, M)
    else:
        klo, khi = rows_of(rank, world, K)
        ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
        rows = rows_of(rank, world, M) if rule == "reduce_scatter" else (0, M)
    device = current_world().device
    ar, br = ar.to(device), br.to(device)
    kernel = module_at(path).matmul_kernel
    bm, bn, bk = blocks
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn)) if two_axes else (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    error = 0.0
    for _ in range(2):
        c = torch.full((rows[1] - rows[0], N), float("nan"), device=device)
        kernel[grid](ar, br, c, M, N, ar.shape[1], ar.stride(0), ar.stride(1), br.stride(0), br.stride(1),
                     c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2)
        error = worst(error, (c.cpu() - want[rows[0]:rows[1]]).abs().max().item())
    return error
