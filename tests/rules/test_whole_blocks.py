"""A kernel that walks the columns of the gathered rows without a column mask where the launch says the blocks are
whole (`if EVEN_K: a = tl.load(A)`, as triton.ops.matmul and the kernels written after it do, `EVEN_K` set by a
heuristic `K % BLOCK_K == 0`): its columns are `tl.arange(0, BLOCK_K)` and its loop takes `tl.cdiv(K, BLOCK_K)`
steps of BLOCK_K, so where BLOCK_K divides K the last step ends at the row's last column. It builds; each call where
the unmasked side is compiled checks that K is a multiple of BLOCK_K and that K columns lie in a row, and one where
it is not is refused before it runs. It equals torch on the race-exposing schedule with whole and partial blocks.
Columns that start past 0 (triton.ops.matmul's split-K `pid_z * BLOCK_K + tl.arange(0, BLOCK_K)`) are checked over
each call's grid to end within a step. Walks whose loop count the launch cannot relate to the columns stay refused."""

from __future__ import annotations

import textwrap

import pytest

import tilelink
from tests.rules.cases import _ag_gemm, module_at
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError

KERNEL = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
    @triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
    @triton.jit
    def mm(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
        pid = tl.program_id(0)
        grid_n = tl.cdiv(N, BLOCK_N)
        rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
        rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        A = a_ptr + (ram[:, None] * stride_am + rk[None, :] * stride_ak)
        B = b_ptr + (rk[:, None] * stride_bk + rbn[None, :] * stride_bn)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            if EVEN_K:
                a = tl.load(A)
                b = tl.load(B)
            else:
                k_remaining = K - k * BLOCK_K
                a = tl.load(A, mask=rk[None, :] < k_remaining, other=0.0)
                b = tl.load(B, mask=rk[:, None] < k_remaining, other=0.0)
            acc += tl.dot(a, b)
            A += BLOCK_K * stride_ak
            B += BLOCK_K * stride_bk
        mask = (rm < M)[:, None] & (rn < N)[None, :]
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=mask)
''')
HEURISTIC = '    @triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})\n'.lstrip()


def _build(source: str):
    return generate(source, "whole_blocks.py", requests_in(source, "whole_blocks.py"))


def _multiply(path: str, K: int, **meta) -> float:
    kernel = module_at(path).mm
    return _ag_gemm(kernel, tilelink.rank(), tilelink.world_size(), K=K, BLOCK_M=16, BLOCK_N=8, BLOCK_K=8, **meta)


def test_the_whole_block_side_is_checked_at_the_call_and_equals_torch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    gen = _build(KERNEL)
    launch = gen.plans[0].launch
    assert (("K",), "BLOCK_K", "(EVEN_K)") in {f[:3] for f in launch.row_multiples}, launch.row_multiples
    assert any(b[1] == ((False, ("K",)),) for b in launch.row_bounds), launch.row_bounds
    path = tmp_path / "whole_blocks.py"
    path.write_text(KERNEL)
    for K in (48, 44):  # whole blocks (the unmasked side), then a partial last block (the masked side)
        errors = tilelink.spawn(_multiply, 2, str(path), K)
        assert all(e < 1e-4 for e in errors), (K, errors)


def test_a_call_that_takes_the_unmasked_side_with_a_partial_block_is_refused(tmp_path, monkeypatch) -> None:
    """Without the heuristic the caller passes EVEN_K: with K = 44 and BLOCK_K = 8 the unmasked loads would read
    4 columns past each gathered row, into the next row, which the tile's wait does not cover."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert HEURISTIC in KERNEL
    path = tmp_path / "whole_blocks_passed.py"
    path.write_text(KERNEL.replace(HEURISTIC, ""))
    with pytest.raises(LaunchError, match=r"K a multiple of BLOCK_K \(the load is compiled where `\(EVEN_K\)` "
                                          r"holds, as it does here\)"):
        tilelink.spawn(_multiply, 2, str(path), 44, EVEN_K=True)
    errors = tilelink.spawn(_multiply, 2, str(path), 44, EVEN_K=False)
    assert all(e < 1e-4 for e in errors), errors
    # columns started one past the row's first: each unmasked step reads one column past its block, so the last reads
    # the next row's first column
    shifted = tmp_path / "whole_blocks_shifted.py"
    shifted.write_text(KERNEL.replace("rk = tl.arange(0, BLOCK_K)", "rk = 1 + tl.arange(0, BLOCK_K)"))
    with pytest.raises(LaunchError, match=r"reads BLOCK_K=8 columns a step from `1` without a mask, moving by "
                                          r"BLOCK_K=8: over the grid \(12, 1, 1\) the start reaches 1, so that "
                                          r"program's columns end at 9"):
        tilelink.spawn(_multiply, 2, str(shifted), 48)


@pytest.mark.parametrize("old, new", [
    ("for k in range(0, tl.cdiv(K, BLOCK_K)):", "for k in range(0, tl.cdiv(K + 1, BLOCK_K)):"),  # a step too many
    ("for k in range(0, tl.cdiv(K, BLOCK_K)):", "for k in range(0, N):"),  # a count the columns do not set
])
def test_unmasked_walks_that_may_pass_the_row_are_refused(old: str, new: str) -> None:
    assert old in KERNEL
    with pytest.raises(AnnotationError, match="nor do the loop's steps take whole blocks of the row") as err:
        _build(KERNEL.replace(old, new))
    assert "the load at line 25 may touch rows of 'a_ptr' its wait does not cover" in str(err.value), err.value


#: triton.ops.matmul's split-K form: program `pid_z` of SPLIT_K along grid axis 1 starts its columns at
#: `pid_z * BLOCK_K` and steps by `BLOCK_K * SPLIT_K`, adding its partial product into C
SPLIT = KERNEL.replace(HEURISTIC, HEURISTIC.replace('args["BLOCK_K"]', 'args["BLOCK_K"] * args["SPLIT_K"]')).replace(
    "EVEN_K: tl.constexpr):", "SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr):").replace(
    "    rk = tl.arange(0, BLOCK_K)\n", "    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)\n").replace(
    "range(0, tl.cdiv(K, BLOCK_K))", "range(0, tl.cdiv(K, BLOCK_K * SPLIT_K))").replace(
    "k_remaining = K - k * BLOCK_K", "k_remaining = K - k * (BLOCK_K * SPLIT_K)").replace(
    "A += BLOCK_K * stride_ak", "A += BLOCK_K * SPLIT_K * stride_ak").replace(
    "B += BLOCK_K * stride_bk", "B += BLOCK_K * SPLIT_K * stride_bk").replace(
    "    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=mask)\n",
    "    if SPLIT_K == 1:\n"
    "        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=mask)\n"
    "    else:\n"
    "        tl.atomic_add(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=mask)\n")


def _split(path: str, K: int, split: int, programs_z: int) -> float:
    """C = A @ B by the split-K kernel on ``programs_z`` programs along the split axis, A's rows gathered: the worst
    error over two calls against torch on the same (on a GPU, half-precision) inputs."""
    import torch
    import triton

    from tests.rules.cases import rows_of
    from tilelink.runtime import current_world

    rank, world = tilelink.rank(), tilelink.world_size()
    device = current_world().device
    gpu = device.type == "cuda"  # tl.dot takes blocks of 16 and half-precision inputs there
    M, N, block_n, block_k = 50, 24, 16 if gpu else 8, 16 if gpu else 8
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    if gpu:
        a, b = a.half(), b.half()
    want = (a.float() @ b.float()).to(device)
    lo, hi = rows_of(rank, world, M)
    worst = 0.0
    for _ in range(2):
        c = torch.zeros(M, N, device=device)
        grid = (triton.cdiv(M, 16) * triton.cdiv(N, block_n), programs_z)
        module_at(path).mm[grid](a[lo:hi].contiguous().to(device), b.to(device), c, M, N, K, K, 1, N, 1, N, 1,
                                 BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split)
        worst = max(worst, (c - want).abs().max().item())
    return worst


def test_triton_ops_split_k_form_is_checked_over_the_grid_and_equals_torch(tmp_path, monkeypatch) -> None:
    """Two splits over whole blocks (K = 48) and over a partial last block (K = 44) equal torch. A grid of three
    programs along the split axis with SPLIT_K = 2 would start the third's columns at 16, and its last unmasked step
    would read 8 columns past the row: refused at the call."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert "tl.program_id(1) * BLOCK_K" in SPLIT and "BLOCK_K * SPLIT_K * stride_ak" in SPLIT
    launch = _build(SPLIT).plans[0].launch
    assert [e[:4] for e in launch.column_ends] == [("tl.program_id(1) * BLOCK_K", ("BLOCK_K",), ("BLOCK_K", "SPLIT_K"),
                                                    "(EVEN_K)")], launch.column_ends
    path = tmp_path / "split_whole_blocks.py"
    path.write_text(SPLIT)
    for K in (48, 44):
        errors = tilelink.spawn(_split, 2, str(path), K, 2, 2)
        assert all(e < 1e-4 for e in errors), (K, errors)
    with pytest.raises(LaunchError, match=r"reads BLOCK_K=8 columns a step from `tl.program_id\(1\) \* BLOCK_K` "
                                          r"without a mask, moving by BLOCK_K=8 \* SPLIT_K=2: over the grid "
                                          r"\(12, 3, 1\) the start reaches 16"):
        tilelink.spawn(_split, 2, str(path), 48, 2, 3)
    errors = tilelink.spawn(_split, 2, str(path), 44, 2, 3)  # the masked side: the columns stay in the row
    assert all(e == e for e in errors), errors


#: the same before Triton 2.2: the loop counts down what is left of K (`rk[None, :] < k` masks the partial block)
DOWN = SPLIT.replace("range(0, tl.cdiv(K, BLOCK_K * SPLIT_K))", "range(K, 0, -BLOCK_K * SPLIT_K)").replace(
    "            k_remaining = K - k * (BLOCK_K * SPLIT_K)\n", "").replace(
    "mask=rk[None, :] < k_remaining", "mask=rk[None, :] < k").replace("mask=rk[:, None] < k_remaining",
                                                                      "mask=rk[:, None] < k")


def test_a_loop_counting_down_what_is_left_of_k_equals_torch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert "range(K, 0, -BLOCK_K * SPLIT_K)" in DOWN and "k_remaining" not in DOWN
    launch = _build(DOWN).plans[0].launch
    assert any(b[1] == ((False, ("K",)),) for b in launch.row_bounds), launch.row_bounds
    path = tmp_path / "counting_down.py"
    path.write_text(DOWN)
    for K, split in ((48, 2), (44, 2), (44, 1)):
        errors = tilelink.spawn(_split, 2, str(path), K, split, split)
        assert all(e < 1e-4 for e in errors), (K, split, errors)


def test_a_loop_counting_down_by_less_than_the_pointer_moves_is_refused() -> None:
    """`range(K, 0, -BLOCK_K)` beside `A += BLOCK_K * SPLIT_K * stride_ak`: the loop takes a step for each BLOCK_K
    of K while the pointer moves SPLIT_K blocks a step, past the row's end."""
    source = DOWN.replace("range(K, 0, -BLOCK_K * SPLIT_K)", "range(K, 0, -BLOCK_K)")
    with pytest.raises(AnnotationError, match="nor down to 0 by the advance's own step") as err:
        _build(source)
    assert "may touch rows of 'a_ptr' its wait does not cover" in str(err.value), err.value


@pytest.mark.parametrize("masked", [False, True])
def test_columns_added_twice_to_the_address_are_refused(masked: bool) -> None:
    """`rk[None, :] * stride_ak` twice reads the columns `2 * rk`: past what the steps or the mask bound."""
    source = KERNEL.replace("rk[None, :] * stride_ak)", "rk[None, :] * stride_ak + rk[None, :] * stride_ak)")
    if masked:
        source = source.replace("            a = tl.load(A)\n", "            a = tl.load(A, mask=rk[None, :] < K - k * "
                                                                   "BLOCK_K, other=0.0)\n")
    with pytest.raises(AnnotationError, match=r"its address adds the columns `rk\[None, :\] \* stride_ak` 2 times"):
        _build(source)
