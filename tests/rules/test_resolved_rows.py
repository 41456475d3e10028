"""Row vectors read through a second name (``ram = tl.max_contiguous(tl.multiple_of(rm % M, B), B)``, as
``triton.ops.matmul`` hints them): the wait reads what that name was made from, so a wrap there is waited for, a
start changed between the two is refused, and so is a clamp or an index the wait could not follow."""

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

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

#: each tile reads the rows of the next tile, wrapped at M, through a hinted second name
ROLLED = '''
@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0, size="M"), comm_block=8)
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    {rows}
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + ram[:, None] * stride_am + kk[None, :] * stride_ak, mask=kk[None, :] < K, other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_bn[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(c_ptr + offs_cm[:, None] * stride_cm + offs_bn[None, :] * stride_cn, acc,
             mask=(offs_cm[:, None] < M) & (offs_bn[None, :] < N))
'''
WRAPPED = """offs_am = ((pid_m + 1) * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    ram = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)"""


def _source(rows: str) -> str:
    return HEAD + textwrap.dedent(ROLLED).replace("{rows}", rows)


def _error(text: str) -> str:
    with pytest.raises(AnnotationError) as err:
        generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    return str(err.value)


def _rolled(path: str, M: int = 50) -> float:
    kernel = module_at(path).matmul
    rank, world = tilelink.rank(), tilelink.world_size()
    N, K = 24, 40
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    lo, hi = rows_of(rank, world, M)
    ref = a[(torch.arange(M) + 16) % M] @ b  # row r of C is row (r + BLOCK_M) % M of A times B
    err = 0.0
    for _ in range(2):
        c = torch.full((M, N), float("nan"))
        kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](
            a[lo:hi].contiguous(), b, c, M, N, K, K, 1, N, 1, N, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        err = worst(err, (c - ref).abs().max().item())
    return err


def test_rows_wrapped_under_another_name_wait_for_the_rows_they_wrap_to(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "rolled.py"
    path.write_text(_source(WRAPPED))
    errors = tilelink.spawn(_rolled, 3, str(path))
    assert all(e < 1e-4 for e in errors), errors


def test_a_start_changed_between_the_rows_and_their_hinted_name_is_refused() -> None:
    rows = """start = pid_m * BLOCK_M
    rm = start + tl.arange(0, BLOCK_M)
    start = pid_n * BLOCK_N
    ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)"""
    assert "cannot tell which rows along dim 0 of 'a_ptr'" in _error(_source(rows))
    # the start bound once: the wait reads it
    body = generate(_source(rows.replace("    start = pid_n * BLOCK_N\n", "")), "user_kernels.py", requests_in(
        _source(rows.replace("    start = pid_n * BLOCK_N\n", "")), "user_kernels.py")).rewritten["matmul"]
    assert "tll.consumer_tile_wait" in body, body


def test_rows_clamped_at_another_bound_than_the_size_are_refused() -> None:
    rows = """ram = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ram = tl.where(ram < {bound}, ram, 0)"""
    assert "the rows `ram` are clamped to row 0 at `M_VALID`, not at the size of 'a_ptr' (M)" in _error(
        _source(rows.format(bound="M_VALID")).replace("stride_cm, stride_cn,", "stride_cm, stride_cn, M_VALID,"))
    generate(text := _source(rows.format(bound="M")), "user_kernels.py", requests_in(text, "user_kernels.py"))


INDEXED = '''
@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0, index="src_ptr", size="M"))
@triton.jit
def gather_mm(a_ptr, b_ptr, c_ptr, src_ptr, dst_ptr, L, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.load(src_ptr + offs_i, mask=offs_i < L, other=0)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    {again}
    a = tl.load(a_ptrs, mask=(offs_i[:, None] < L) & (offs_k[None, :] < K), other=0.0)
    b = tl.load(b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    tl.store(c_ptr + rows[:, None] * stride_cm + offs_bn[None, :] * stride_cn, tl.dot(a, b),
             mask=offs_i[:, None] < L)
'''


def test_index_rows_bound_again_after_the_pointer_is_made_are_refused() -> None:
    """The wait computes its channels from the rows' name at the access: bound again after the pointer was made
    from it, the name holds other rows than the load reads."""
    text = HEAD + textwrap.dedent(INDEXED).replace("{again}", "rows = tl.load(dst_ptr + offs_i, mask=offs_i < L)")
    said = _error(text)
    assert "the rows of the load at line 17 come through `rows`, bound at lines 14 and 16" in said, said
    assert "bind `rows` once, or once on each side of one `if`" in said, said
    text = HEAD + textwrap.dedent(INDEXED).replace("{again}", "")
    body = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).rewritten["gather_mm"]
    assert "tll.consumer_tile_wait_channels" in body, body


LOOPED = '''
@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    start = tl.program_id(0) * BLOCK_M
    rm = tl.arange(0, BLOCK_M)
    rm = start + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + tl.arange(0, BLOCK_K)
        a = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        if k == 1:
            ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
            a = tl.load(a_ptr + ram[:, None] * stride_am + kk[None, :] * stride_ak, mask=kk[None, :] < K, other=0.0)
        acc = tl.dot(a, tl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn), acc)
        {step}
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=rm[:, None] < M)
'''


def test_a_start_changed_later_in_a_loop_that_reads_the_rows_again_is_refused() -> None:
    """`start` moves at the end of each pass of the loop that reads `ram`, made before the loop: on the pass that
    first reads it the wait would compute the moved start, not the rows `rm` holds."""
    text = HEAD + textwrap.dedent(LOOPED).replace("{step}", "start = start + BLOCK_M")
    assert "cannot tell which rows along dim 0 of 'a_ptr'" in _error(text)
    text = HEAD + textwrap.dedent(LOOPED).replace("{step}", "")
    generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


WALRUS = '''
@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = -4 + tl.arange(0, BLOCK_K)
    {made}
    rk = tl.arange(0, BLOCK_K)
    a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    tl.store(c_ptr + rm[:, None] * BLOCK_K + rk[None, :], a, mask=rm[:, None] < M)
'''


def test_columns_bound_again_after_a_named_expression_made_the_pointer_are_refused() -> None:
    """A pointer made by a named expression inside another assignment's value reads the columns bound before it:
    the mask bounds the later ones, so the first columns read the row before."""
    for made in ("junk = (a_ptrs := a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak)",
                 "a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak"):
        assert "the columns `rk` of the load" in _error(HEAD + textwrap.dedent(WALRUS).replace("{made}", made))


def test_rows_wrapped_then_widened_under_another_name_wait_for_the_rows_they_wrap_to(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "rolled_wide.py"
    path.write_text(_source(WRAPPED.replace("ram = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)",
                                            "ram = offs_am.to(tl.int64)")))
    assert "offs_am.to(tl.int64)" in path.read_text()
    errors = tilelink.spawn(_rolled, 3, str(path))
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("address", ["a_ptr + stride_am + rows[:, None] * stride_am + offs_k[None, :] * stride_ak",
                                     "a_ptr + L * stride_am + rows[:, None] * stride_am + offs_k[None, :] * stride_ak",
                                     "a_ptr + rows[:, None] * stride_am + rows[:, None] + offs_k[None, :] * stride_ak",
                                     "a_ptr + (rows[:, None] + 1) * stride_am + offs_k[None, :] * stride_ak"])
def test_index_rows_moved_by_another_term_are_refused(address: str) -> None:
    """The wait covers the channels of the index's rows: any other term along the rows reads other rows."""
    text = HEAD + textwrap.dedent(INDEXED).replace("{again}", "").replace(
        "a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak", address)
    assert address in text
    assert "cannot tell which rows along dim 0 of 'a_ptr'" in _error(text)


def _indexed(path: str, factor: int) -> float | str:
    kernel = module_at(path).gather_mm
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K, L = 40, 16, 16, 32
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    src, dst = torch.randperm(M, generator=g)[:L].to(torch.int32), torch.arange(L, dtype=torch.int32)
    lo, hi = rows_of(rank, world, M)
    c = torch.full((M, N), float("nan"))  # the kernel stores row r of the product at row r
    try:
        kernel[(triton.cdiv(L, 16),)](a[lo:hi].contiguous(), b, c, src, dst, L, M, N, K, K, 1, N, 1, N, 1,
                                      BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    except tilelink.LaunchError as exc:
        return str(exc)
    return worst(0.0, (c[src.long()] - a[src.long()] @ b).abs().max().item())


@pytest.mark.parametrize("factor", [1, 2])
def test_index_rows_are_scaled_by_the_gathered_buffer_s_row_stride(factor: int, tmp_path, monkeypatch) -> None:
    """`rows[:, None] * stride_am * 2` with the row stride passed reads every other row: the rows the index names
    are read only where the product is the gathered buffer's row stride, which each call compares."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"indexed_{factor}.py"
    path.write_text(HEAD + textwrap.dedent(INDEXED).replace("{again}", "").replace(
        "rows[:, None] * stride_am", f"rows[:, None] * stride_am * {factor}"))
    outcomes = tilelink.spawn(_indexed, 2, str(path), factor)
    if factor == 1:
        assert all(isinstance(e, float) and e < 1e-4 for e in outcomes), outcomes
    else:
        assert all("addressed 32 elements apart" in str(o) for o in outcomes), outcomes


def test_index_rows_widened_in_place_are_the_same_rows() -> None:
    """vLLM's MoE kernel widens its token ids in place (`offs_token = offs_token.to(tl.int64)`): the same rows."""
    text = HEAD + textwrap.dedent(INDEXED).replace("{again}", "rows = rows.to(tl.int64)")
    body = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).rewritten["gather_mm"]
    assert "tll.consumer_tile_wait_channels" in body, body


@pytest.mark.parametrize("columns", ["(stride_am + offs_k)[None, :] * stride_ak", "offs_k[None, :] * stride_am",
                                     "tl.load(src_ptr + offs_k)[None, :] * stride_ak"])
def test_index_rows_beside_columns_that_move_them_are_refused(columns: str) -> None:
    text = HEAD + textwrap.dedent(INDEXED).replace("{again}", "").replace(
        "a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak",
        f"a_ptr + rows[:, None] * stride_am + {columns}")
    assert columns in text
    assert "cannot tell which rows along dim 0 of 'a_ptr'" in _error(text)


def test_a_tile_index_wrapped_inside_the_rows_start_is_not_a_wrap_of_the_rows(tmp_path, monkeypatch) -> None:
    """`((pid_m + 1) % num_pid_m) * BLOCK_M + tl.arange(0, BLOCK_M)`: the `%` picks the next tile, whose rows are
    whole; only a `%` of the rows themselves (`(... + tl.arange(0, B)) % M`) wraps them, at a bound that must be the
    size."""
    rows = ("num_pid_m = tl.cdiv(M, BLOCK_M)\n    offs_am = ((pid_m + 1) % num_pid_m) * BLOCK_M + tl.arange(0, BLOCK_M)"
            "\n    ram = offs_am")
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "next_tile.py"
    path.write_text(_source(rows))
    errors = tilelink.spawn(_rolled, 2, str(path), 64)
    assert all(e < 1e-4 for e in errors), errors


def test_a_wrap_of_the_rows_that_reads_like_part_of_the_start_is_still_a_wrap() -> None:
    """`rows = id % R` with `id = (pid % R) * BLOCK + ...`: the text `id%R` is inside `(pid%R)*BLOCK`, but only a `%`
    of the start itself picks the tile."""
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
        @triton.jit
        def wrap_kernel(x_ptr, y_ptr, N, R, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            id = (pid % R) * BLOCK + tl.arange(0, BLOCK)
            rows = id % R
            x = tl.load(x_ptr + rows, mask=rows < N, other=0.0)
            o = pid * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + o, 2 * x, mask=o < N)
        ''')
    assert "the rows `rows` wrap at `R`, not at the size of 'x_ptr' (N)" in _error(text)
