"""The rows' bound of a mask may be written either way round, or with `<=`: `offs_cm[:, None] < M`, `M >
offs_cm[:, None]` and `offs_cm[:, None] <= M - 1` all name M as the full row count (a store under reduce_scatter, a
load under all_gather), and each builds and equals torch on the race-exposing schedule at two ranks."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of, worst
from tilelink.errors import AnnotationError
from tilelink.runtime import current_world

KERNEL = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.{rule})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=({a_rows}) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=({c_rows}) & (offs_cn[None, :] < N))
'''

SPELLINGS = {"less": "{v}[:, None] < M", "greater": "M > {v}[:, None]", "at_most": "{v}[:, None] <= M - 1",
             "at_least": "M - 1 >= {v}[:, None]"}
M, N, K = 37, 24, 40


def _written(tmp_path, rule: str, spelling: str) -> str:
    rows = SPELLINGS[spelling]
    path = tmp_path / f"mask_{spelling}.py"
    path.write_text(KERNEL.format(rule=rule, a_rows=rows.format(v="offs_am"), c_rows=rows.format(v="offs_cm")))
    return str(path)


def _multiply(path: str, reduce: bool) -> float:
    """The kernel on this rank's rows of A (gathered) or slice of K (reduced), against torch, two calls."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(43)
    a, b = torch.randint(-3, 4, (M, K), generator=g).float(), torch.randint(-3, 4, (K, N), generator=g).float()
    lo, hi = rows_of(rank, world, M)
    klo, khi = rows_of(rank, world, K) if reduce else (0, K)
    ar = a[:, klo:khi].contiguous() if reduce else a[lo:hi].contiguous()
    br = b[klo:khi].contiguous()
    device = current_world().device  # the CPU in the emulated world, this rank's GPU with NVSHMEM
    ar, br = ar.to(device), br.to(device)
    kernel = module_at(path).matmul_kernel
    error = 0.0
    for _ in range(2):
        c = torch.full((hi - lo, N) if reduce else (M, N), float("nan"), device=device)
        kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](ar, br, c, M, N, khi - klo, ar.stride(0), ar.stride(1),
                                                          br.stride(0), br.stride(1), c.stride(0), c.stride(1),
                                                          BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        want = (a @ b)[lo:hi] if reduce else a @ b
        error = worst(error, (c.cpu() - want).abs().max().item())
    return error


@pytest.mark.slow
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("rule", ['reduce_scatter("c_ptr")', 'all_gather("a_ptr")'], ids=["reduce", "gather"])
def test_a_rows_bound_written_either_way_names_the_row_count(rule: str, spelling: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path, rule, spelling)
    errors = tilelink.spawn(_multiply, 2, path, rule.startswith("reduce"))
    assert errors == [0.0, 0.0], errors


#: K columns masked through a 1-D local made a column of A's block and a row of B's (`k_mask[None, :]`, as Liger's and
#: LoRA-style kernels write it)
LOCAL_MASK = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.{rule})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        ks = k * BLOCK_K + rk
        k_mask = {k_mask}
        a = tl.load(a_ptr + rm[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & k_mask[None, :], other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=k_mask[:, None] & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


@pytest.mark.parametrize(("within", "past", "says"), [
    ("ks < K", "ks < 2 * K", "adds 79 elements (2 * K=40 * stride_ak=1 + -1 * stride_ak=1) to the rows of 'a_ptr'"),
    # the bound written first: the same comparison turned round (it was refused, "not bounded by the mask")
    ("K > ks", "K >= ks", "adds 40 elements (K=40 * stride_ak=1) to the rows of 'a_ptr', whose rows are 40 elements "
                          "long"),
], ids=["vector-first", "bound-first"])
@pytest.mark.parametrize("rule", ['reduce_scatter("c_ptr")', 'all_gather("a_ptr")'], ids=["reduce", "gather"])
def test_a_column_mask_through_a_local_made_a_column_builds(rule: str, within: str, past: str, says: str, tmp_path,
                                                            monkeypatch) -> None:
    """`k_mask = ks < K` (or `K > ks`), then `k_mask[None, :]`: the same bound as `ks[None, :] < K`. Under all_gather
    it was refused ("not bounded by the mask"); it builds, equals torch on the race-exposing schedule, and the same
    local bounding the columns past the row (reading the next row) is refused at the call."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "local_mask.py"
    path.write_text(LOCAL_MASK.format(rule=rule, k_mask=within))
    assert tilelink.spawn(_multiply, 2, str(path), rule.startswith("reduce")) == [0.0, 0.0]
    if rule.startswith("all_gather"):
        path.write_text(LOCAL_MASK.format(rule=rule, k_mask=past))
        said = tilelink.spawn(_refused, 2, str(path))
        assert all(says in s for s in said), said


def _refused(path: str) -> str:
    from tests.rules.cases import launch_refusal

    return launch_refusal(lambda: _multiply(path, False))


@pytest.mark.parametrize("k_mask, mask", [
    ("ks >= 0", "k_mask[None, :]"),  # bounds the columns from below only
    ("ks != K", "k_mask[None, :]"),
    ("(ks < K) | (ks < 2 * K)", "k_mask[None, :]"),
    ("ks < K", "(ks[None, :] < k_end)"),  # a bound bound again on each step, which the launch cannot read
], ids=["below", "unequal", "either", "bound-in-loop"])
def test_a_column_mask_that_bounds_nothing_the_launch_reads_is_refused(k_mask: str, mask: str, tmp_path) -> None:
    """Each of these built under all_gather and read, at a tile ending on a rank's last row, the next rank's first
    row, which no wait covered (NaN at world 2): a mask that changes from step to step was taken for the walk of what
    is left of the row even where the vector itself changed and not its bound."""
    from tests.rules.test_carried_accumulator import _generate

    source = LOCAL_MASK.format(rule='all_gather("a_ptr")', k_mask=k_mask).replace(
        "        k_mask = ", "        k_end = K + BLOCK_K\n        k_mask = ").replace(
        "mask=(rm[:, None] < M) & k_mask[None, :]", f"mask=(rm[:, None] < M) & {mask}")
    assert f"& {mask}" in source
    with pytest.raises(AnnotationError, match=r"the columns `ks` of the load at line \d+ are (not bounded by the mask|"
                                              r"bounded by a mask that changes from one step)"):
        _generate(source)

