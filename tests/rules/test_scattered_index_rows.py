"""Rows gathered through an index in no order (a random permutation, not MoE's sorted slots): a tile's rows span more
channels than the scalar polls take, and its wait reads each 32-channel word with one vector of acquires. On the
race-exposing schedule that read delivers the channels it needs, as each scalar wait does, and the result equals
torch. The columns of each gathered row are bounded at the launch as a tile's are: unmasked past the row's end,
they read the next row, which no wait covers."""

from __future__ import annotations

import textwrap

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of, worst
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

KERNEL = '''
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0, index="src_ptr", size="M"), comm_block=8)
@triton.jit
def gather_mm(a_ptr, b_ptr, c_ptr, src_ptr, dst_ptr, L, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.load(src_ptr + offs_i, mask=offs_i < L, other=0)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    out_rows = tl.load(dst_ptr + offs_i, mask=offs_i < L, other=0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_i[:, None] < L) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + offs_k)[:, None] * stride_bk + offs_bn[None, :] * stride_bn,
                    mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
    tl.store(c_ptr + out_rows[:, None] * stride_cm + offs_bn[None, :] * stride_cn, acc,
             mask=(offs_i[:, None] < L) & (offs_bn[None, :] < N))
'''

M, N, K, L = 50, 24, 40, 48


def _indices() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randperm(M, generator=g)[:L].to(torch.int32), torch.randperm(L, generator=g).to(torch.int32)


def _run(path: str, block_k: int = 16) -> float:
    kernel = module_at(path).gather_mm
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    src, dst = _indices()
    lo, hi = rows_of(rank, world, M)
    ref = torch.empty(L, N)
    ref[dst.long()] = a[src.long()] @ b
    device = current_world().device  # the CPU in the emulated world, this rank's GPU with NVSHMEM
    shard, b, src, dst = (t.to(device) for t in (a[lo:hi].contiguous(), b, src, dst))
    err = 0.0
    for _ in range(2):
        c = torch.full((L, N), float("nan"), device=device)
        kernel[(triton.cdiv(L, 16) * triton.cdiv(N, 16),)](shard, b, c, src, dst, L, M, N, K, K, 1, N, 1, N, 1,
                                                           BLOCK_M=16, BLOCK_N=16, BLOCK_K=block_k)
        err = worst(err, (c.cpu() - ref).abs().max().item())
    return err


def test_rows_of_an_unsorted_index_equal_torch_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    from tilelink.runtime.language import SCALAR_SPAN

    # the first tile's rows span more channels than the scalar polls take (8-row channels, 25 rows a rank)
    src, _ = _indices()
    channels = [(r // 25) * 4 + (r % 25) // 8 for r in src[:16].tolist()]
    assert max(channels) - min(channels) >= SCALAR_SPAN
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "gather_mm.py"
    path.write_text(textwrap.dedent(KERNEL))
    for world in (2, 3):
        errors = tilelink.spawn(_run, world, str(path))
        assert all(e < 1e-4 for e in errors), (world, errors)


ONE_STEP = KERNEL.split("    acc = tl.zeros")[0] + '''\
    a = tl.load(a_ptrs, mask=(offs_i[:, None] < L){columns}, other=0.0)
    b = tl.load(b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn,
                mask=(offs_k[:, None] < K) & (offs_bn[None, :] < N), other=0.0)
    tl.store(c_ptr + out_rows[:, None] * stride_cm + offs_bn[None, :] * stride_cn, tl.dot(a, b),
             mask=(offs_i[:, None] < L) & (offs_bn[None, :] < N))
'''


def test_gathered_rows_whose_columns_pass_the_row_s_end_are_refused_at_the_launch(tmp_path, monkeypatch) -> None:
    """One block of 64 columns over rows of 40: masked by the row's length, the kernel equals torch; unmasked, its
    last 24 columns are the next row's first, and each call is refused."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    masked, unmasked = tmp_path / "masked.py", tmp_path / "unmasked.py"
    masked.write_text(textwrap.dedent(ONE_STEP).replace("{columns}", " & (offs_k[None, :] < K)"))
    unmasked.write_text(textwrap.dedent(ONE_STEP).replace("{columns}", ""))
    errors = tilelink.spawn(_run, 2, str(masked), 64)
    assert all(e < 1e-4 for e in errors), errors
    with pytest.raises(LaunchError, match=r"adds 63 elements .* whose rows are 40 elements long"):
        tilelink.spawn(_run, 2, str(unmasked), 64)


def test_gathered_rows_addressed_afresh_on_each_step_equal_torch(tmp_path, monkeypatch) -> None:
    """`a_ptrs + k * BLOCK_K * stride_ak` instead of the advance: a scalar term of the address the launch bounds
    with the columns, as for a tile."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = textwrap.dedent(KERNEL).replace("        a_ptrs += BLOCK_K * stride_ak\n", "").replace(
        "a = tl.load(a_ptrs,", "a = tl.load(a_ptrs + k * BLOCK_K * stride_ak,")
    assert "a_ptrs +=" not in source and "k * BLOCK_K * stride_ak" in source
    path = tmp_path / "gather_mm_afresh.py"
    path.write_text(source)
    errors = tilelink.spawn(_run, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("cast", [".to(tl.int64)", ".to(dtype=tl.int64)"])
def test_an_index_widened_where_it_is_loaded_equals_torch(cast: str, tmp_path, monkeypatch) -> None:
    """`tl.load(src_ptr + offs_i, ...).to(tl.int64)` holds the index's values, as a widening bound on a line of its
    own does (vLLM's `offs_token.to(tl.int64)`). It was refused ("cannot tell which rows"); it builds, each tile
    waits for its rows, and the kernel equals torch on the race-exposing schedule."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    loaded = "rows = tl.load(src_ptr + offs_i, mask=offs_i < L, other=0)"
    source = textwrap.dedent(KERNEL).replace(loaded, loaded + cast)
    assert loaded + cast in source
    path = tmp_path / "gather_mm_widened.py"
    path.write_text(source)
    errors = tilelink.spawn(_run, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors
