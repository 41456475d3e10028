"""torch Inductor's matmul template, annotated and nothing else, builds under each rule and equals the plain kernel on
the race-exposing schedule. What it takes: the pointer made in two steps (`A = arg_A`, then `A = A + (ram[:, None] *
stride_am + ...)`), the row offsets bound alike on both sides of a run-time `if` (a contiguity test around the compiler
hints), rows wrapped `% M`, K counted down from K under an `EVEN_K` constexpr, and the epilogue's indices through
names and `tl.broadcast_to` (`xindex = idx_n + N * idx_m`, `tl.store(out_ptr0 + tl.broadcast_to(xindex, mask.shape),
acc, mask)`)."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.cases import module_at, plain_module, rows_of, worst
from tests.rules.test_carried_accumulator import _generate
from tilelink.errors import AnnotationError
from tilelink.runtime import current_world

TEMPLATE = '''\
import triton
import triton.language as tl
import tilelink
from tilelink.errors import AnnotationError


@tilelink.overlap(tilelink.{rule}({tensor}))
@triton.jit
def mm_template(arg_A, arg_B, out_ptr0, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    A = arg_A
    B = arg_B
    if M * N == 0:
        return
    pid = tl.program_id(0)
    grid_m = (M + BLOCK_M - 1) // BLOCK_M
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    width = GROUP_M * grid_n
    group_id = pid // width
    group_size = min(grid_m - group_id * GROUP_M, GROUP_M)
    pid_m = group_id * GROUP_M + (pid % group_size)
    pid_n = (pid % width) // (group_size)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
{rows}    rk = tl.arange(0, BLOCK_K)
    A = A + (ram[:, None] * stride_am + rk[None, :] * stride_ak)
    B = B + (rk[:, None] * stride_bk + rbn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(K, 0, -BLOCK_K):
        if EVEN_K:
            a = tl.load(A)
            b = tl.load(B)
        else:
            a = tl.load(A, mask=rk[None, :] < k, other=0.)
            b = tl.load(B, mask=rk[:, None] < k, other=0.)
        acc += tl.dot(a, b)
        A += BLOCK_K * stride_ak
        B += BLOCK_K * stride_bk
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    idx_m = rm[:, None]
    idx_n = rn[None, :]
    mask = (idx_m < M) & (idx_n < N)
    xindex = idx_n + N * idx_m
    tl.store(out_ptr0 + (tl.broadcast_to(xindex, mask.shape)), acc, mask)
'''

#: the rows and columns behind the compiler's hints, wrapped at the sizes
HINTED = '''\
    ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
'''
#: the same, with the hints only where a run-time test finds the layout contiguous
TESTED = '''\
    if (stride_am == 1 and stride_ak == M) or (stride_am == K and stride_ak == 1):
        ram = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    else:
        ram = rm % M
    if (stride_bk == 1 and stride_bn == K) or (stride_bk == N and stride_bn == 1):
        rbn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    else:
        rbn = rn % N
'''
TENSORS = {"all_gather": '"arg_A", dim=0', "reduce_scatter": '"out_ptr0"', "all_reduce": '"out_ptr0"'}
M, N, K = 50, 24, 40
META = dict(GROUP_M=2, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


def _source(rule: str, rows: str) -> str:
    return TEMPLATE.format(rule=rule, tensor=TENSORS[rule], rows=rows)


def _launch(kernel, a, b, out, m: int, k: int) -> None:
    grid = (triton_cdiv(m, META["BLOCK_M"]) * triton_cdiv(N, META["BLOCK_N"]),)
    kernel[grid](a, b, out, m, N, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                 EVEN_K=k % META["BLOCK_K"] == 0, **META)


def triton_cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _against_plain(path: str, rule: str) -> float:
    """The rewrite on this rank's part against the plain kernel on the whole problem."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    want = torch.full((M, N), float("nan"))
    _launch(plain_module(path).mm_template, a, b, want, M, K)
    kernel = module_at(path).mm_template
    lo, hi = rows_of(rank, world, M)
    if rule == "all_gather":
        got = torch.full((M, N), float("nan"))
        _launch(kernel, a[lo:hi].contiguous(), b, got, M, K)
        return worst((got - want).abs().max().item())
    klo, khi = rows_of(rank, world, K)
    got = torch.full((hi - lo if rule == "reduce_scatter" else M, N), float("nan"))
    _launch(kernel, a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), got, M, khi - klo)
    return worst((got - (want[lo:hi] if rule == "reduce_scatter" else want)).abs().max().item())


@pytest.mark.parametrize("rows", [HINTED, TESTED], ids=["hinted", "tested"])
@pytest.mark.parametrize("rule", sorted(TENSORS))
def test_the_template_builds_and_equals_the_plain_kernel(tmp_path, monkeypatch, rule: str, rows: str) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source(rule, rows)
    body = _generate(source).rewritten["mm_template"]
    assert ("consumer_tile_wait" if rule == "all_gather" else "producer_tile_notify") in body, body
    if rule == "all_gather":  # the wrapped rows of the last tile are waited for too
        assert "the rows its offsets wrap to" in body, body
    path = tmp_path / f"inductor_{rule}.py"
    path.write_text(source)
    errors = tilelink.spawn(_against_plain, 2, str(path), rule)
    assert all(e < 1e-4 for e in errors), errors


def test_a_pointer_made_in_two_steps_reads_the_first_only_once() -> None:
    # the first value read between the two steps: the pointer is no longer made once, and its advance is judged
    source = _source("all_gather", HINTED).replace("    if M * N == 0:\n", "    if arg_A == A:\n", 1)
    assert source != _source("all_gather", HINTED)
    with pytest.raises(AnnotationError, match="is advanced at line"):
        _generate(source)


def test_rows_bound_on_both_sides_of_an_if_to_values_that_differ_are_refused() -> None:
    # the same text on both sides, but `rm` bound again on one side first: the sides hold other rows
    source = _source("all_gather", TESTED).replace(
        "        ram = rm % M\n", "        rm = rm + BLOCK_M\n        ram = rm % M\n", 1)
    with pytest.raises(AnnotationError, match="row offsets"):
        _generate(source)


#: the spellings of later torch releases: sizes passed as `ks0..ks2` and named once at the top (`M = ks0`), an
#: index type bound once as a local constexpr and every `tl.arange` and the program id cast to it, and the names
#: `idx_m` / `idx_n` bound again for each operand and the store
SPELLED = '''\
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.all_gather("arg_A", dim=0))
@triton.jit
def mm_spelled(arg_A, arg_B, out_ptr0, ks0, ks1, ks2, stride_am, stride_ak, stride_bk, stride_bn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    INDEX_DTYPE: tl.constexpr = tl.int32
    M = ks0
    N = ks1
    K = ks2
    pid = tl.program_id(0).to(INDEX_DTYPE)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // grid_n
    pid_n = pid % grid_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(INDEX_DTYPE)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(INDEX_DTYPE)
    offs_k = tl.arange(0, BLOCK_K).to(INDEX_DTYPE)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_idx in range(0, tl.cdiv(K, BLOCK_K)):
        ks = k_idx * BLOCK_K + offs_k
        idx_m = rm[:, None]
        idx_n = ks[None, :]
        a = tl.load(arg_A + idx_m * stride_am + idx_n * stride_ak,
                    mask=(idx_m < M) & (offs_k[None, :] < K - k_idx * BLOCK_K), other=0.0)
        idx_m = ks[:, None]
        idx_n = rn[None, :]
        b = tl.load(arg_B + idx_m * stride_bk + idx_n * stride_bn,
                    mask=(offs_k[:, None] < K - k_idx * BLOCK_K) & (idx_n < N), other=0.0)
        acc += tl.dot(a, b)
    idx_m = rm[:, None]
    idx_n = rn[None, :]
    mask = (idx_m < M) & (idx_n < N)
    xindex = idx_n + N * idx_m
    tl.store(out_ptr0 + (tl.broadcast_to(xindex, mask.shape)), acc, mask)
'''


def _spelled(path: str) -> float:
    """The gathered matmul on this rank's rows of A against torch."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    kernel = module_at(path).mm_spelled
    lo, hi = rows_of(rank, world, M)
    device = current_world().device  # the CPU in the emulated world, this rank's GPU with NVSHMEM
    shard, bd = a[lo:hi].contiguous().to(device), b.to(device)
    err = 0.0
    for _ in range(2):
        got = torch.full((M, N), float("nan"), device=device)
        kernel[(triton_cdiv(M, 16) * triton_cdiv(N, 16),)](shard, bd, got, M, N, K, K, 1, N, 1,
                                                            BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        err = worst(err, (got.cpu() - a @ b).abs().max().item())
    return err


def test_later_torch_spellings_build_and_equal_torch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    body = _generate(SPELLED).rewritten["mm_spelled"]
    assert body.count("tll.consumer_tile_wait(") == 1, body
    path = tmp_path / "spelled.py"
    path.write_text(SPELLED)
    for world in (2, 3):
        errors = tilelink.spawn(_spelled, world, str(path))
        assert all(e < 1e-4 for e in errors), (world, errors)


@pytest.mark.parametrize(("old", "new", "says"), [
    # a cast that can wrap a block's offsets (an int8 holds 127 at most) is not read as the same values
    ("tl.arange(0, BLOCK_M).to(INDEX_DTYPE)", "tl.arange(0, BLOCK_M).to(tl.int8)", "cannot tell which rows"),
    # an index type passed by the caller: TileLink does not know what it holds
    ("    INDEX_DTYPE: tl.constexpr = tl.int32\n", "", "cannot tell which rows"),
    # an alias of the size bound again: it no longer holds the argument the launch reads
    ("    M = ks0\n", "    M = ks0\n    M = M + 1\n", "cannot find the parameter holding the full size"),
    # the load's row name bound on one side of an `if` only: which binding reaches the load depends on the run
    ("        idx_m = rm[:, None]\n        idx_n = ks[None, :]\n",
     "        idx_m = rm[:, None]\n        if k_idx > 0:\n            idx_m = ks[:, None]\n"
     "        idx_n = ks[None, :]\n",
     "cannot tell which rows"),
], ids=["int8-cast", "passed-index-type", "alias-bound-again", "row-name-in-a-branch"])
def test_spellings_that_could_hold_other_values_are_refused(old: str, new: str, says: str) -> None:
    source = SPELLED.replace(old, new, 1)
    if not new:  # the index type a parameter instead
        source = source.replace("BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, INDEX_DTYPE: tl.constexpr):")
    assert source != SPELLED
    with pytest.raises(AnnotationError, match=says):
        _generate(source)


#: the template as torch 2.13 renders it with dynamic shapes: sizes passed as `ks0..ks2` and named at the top, the
#: blocks and the index type local constexprs, the row offsets wrapped behind hints under a run-time layout test, a
#: K loop counting tiles with the masks and column offsets in locals, and `idx_m` / `idx_n` / `xindex` bound again
#: for each operand and the store. ``{loop}`` is the tile loop of the persistent rendering, or nothing.
LATER = '''\
import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.{rule}({tensor}))
@triton.jit
def mm_later(arg_A, arg_B, out_ptr0, ks0, ks1, ks2):
    EVEN_K: tl.constexpr = False
    ACC_TYPE: tl.constexpr = tl.float32
    BLOCK_M: tl.constexpr = 16
    BLOCK_N: tl.constexpr = 16
    BLOCK_K: tl.constexpr = 16
    GROUP_M: tl.constexpr = 2
    NUM_SMS: tl.constexpr = 4
    INDEX_DTYPE: tl.constexpr = tl.int32
    A = arg_A
    B = arg_B
    M = ks0
    N = ks1
    K = ks2
    if M * N == 0:
        return
    stride_am = ks2
    stride_ak = 1
    stride_bk = ks1
    stride_bn = 1
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
{head}        width = GROUP_M * grid_n
        group_id = pid // width
        group_size = min(grid_m - group_id * GROUP_M, GROUP_M)
        pid_m = group_id * GROUP_M + (pid % group_size)
        pid_n = (pid % width) // (group_size)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(INDEX_DTYPE)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(INDEX_DTYPE)
        if ((stride_am == 1 and stride_ak == M) or (stride_am == K and stride_ak == 1)) and M >= BLOCK_M:
            offs_a_m = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
        else:
            offs_a_m = rm % M
        if ((stride_bk == 1 and stride_bn == K) or (stride_bk == N and stride_bn == 1)) and N >= BLOCK_N:
            offs_b_n = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
        else:
            offs_b_n = rn % N
        offs_k = tl.arange(0, BLOCK_K).to(INDEX_DTYPE)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_TYPE)
        for k_idx in range(0, tl.cdiv(K, BLOCK_K)):
            a_mask = offs_k[None, :] < (K - k_idx * BLOCK_K)
            b_mask = offs_k[:, None] < (K - k_idx * BLOCK_K)
            a_k_idx_vals = offs_k[None, :] + (k_idx * BLOCK_K)
            b_k_idx_vals = offs_k[:, None] + (k_idx * BLOCK_K)
            idx_m = offs_a_m[:, None]
            idx_n = a_k_idx_vals
            xindex = idx_n + ks2 * idx_m
            a = tl.load(A + (xindex), a_mask, other=0.0)
            idx_m = b_k_idx_vals
            idx_n = offs_b_n[None, :]
            xindex = idx_n + ks1 * idx_m
            b = tl.load(B + (xindex), b_mask, other=0.0)
            acc += tl.dot(a, b, out_dtype=ACC_TYPE)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(INDEX_DTYPE)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(INDEX_DTYPE)
        idx_m = rm[:, None]
        idx_n = rn[None, :]
        mask = (idx_m < M) & (idx_n < N)
        xindex = idx_n + ks1 * idx_m
        tl.store(out_ptr0 + (tl.broadcast_to(xindex, mask.shape)), acc, mask)
'''
#: one program a tile, or a persistent loop over the tiles
ONE_TILE = "    pid = tl.program_id(0).to(INDEX_DTYPE)\n    if True:\n"
PERSISTENT = ("    start_pid = tl.program_id(0).to(INDEX_DTYPE)\n    num_tiles = grid_m * grid_n\n"
              "    for pid in tl.range(start_pid, num_tiles, NUM_SMS):\n")


def _later(path: str, rule: str, persistent: bool, K: int = K) -> float:  # noqa: N803 - the problem's K
    """The template's rewrite on this rank's part against torch on the whole problem."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    want = a @ b
    kernel = module_at(path).mm_later
    tiles = triton_cdiv(M, 16) * triton_cdiv(N, 16)
    grid = (min(4, tiles),) if persistent else (tiles,)
    lo, hi = rows_of(rank, world, M)
    klo, khi = rows_of(rank, world, K)
    device = current_world().device  # the CPU in the emulated world, this rank's GPU with NVSHMEM
    if rule == "all_gather":
        args, rows, k, ref = (a[lo:hi].contiguous().to(device), b.to(device)), M, K, want
    else:
        args = (a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device))
        rows, k, ref = (hi - lo, khi - klo, want[lo:hi]) if rule == "reduce_scatter" else (M, khi - klo, want)
    err = 0.0
    for _ in range(2):
        got = torch.full((rows, N), float("nan"), device=device)
        kernel[grid](*args, got, M, N, k)
        err = worst(err, (got.cpu() - ref).abs().max().item())
    return err


@pytest.mark.parametrize("persistent", [False, True], ids=["one-tile", "persistent"])
@pytest.mark.parametrize("rule", sorted(TENSORS))
def test_the_later_template_builds_and_equals_torch(tmp_path, monkeypatch, rule: str, persistent: bool) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = LATER.format(rule=rule, tensor=TENSORS[rule], head=PERSISTENT if persistent else ONE_TILE)
    body = _generate(source).rewritten["mm_later"]
    assert ("consumer_tile_wait" if rule == "all_gather" else "tile_notify") in body, body
    path = tmp_path / f"later_{rule}.py"
    path.write_text(source)
    for world in (2, 3):
        errors = tilelink.spawn(_later, world, str(path), rule, persistent)
        assert all(e < 1e-4 for e in errors), (world, errors)


def _later_refused(path: str, rule: str, k: int) -> str:
    from tests.rules.cases import launch_refusal

    return launch_refusal(lambda: _later(path, rule, False, k))


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_the_later_template_with_unmasked_blocks_asks_whole_blocks_of_each_rank(tmp_path, monkeypatch,
                                                                                rule: str) -> None:
    """`EVEN_K: tl.constexpr = True` and the loads unmasked, as the template is rendered for a K of whole blocks:
    each rank's slice of K must be whole blocks too (the block a local constexpr, `BLOCK_K: tl.constexpr = 16`). A K
    of 64 (32 a rank at world 2) equals torch; 40 (20 a rank) is refused at the call, naming the multiple, where
    reading past the slice would add other columns."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = LATER.format(rule=rule, tensor=TENSORS[rule], head=ONE_TILE).replace(
        "EVEN_K: tl.constexpr = False", "EVEN_K: tl.constexpr = True").replace(
        "tl.load(A + (xindex), a_mask, other=0.0)", "tl.load(A + (xindex))").replace(
        "tl.load(B + (xindex), b_mask, other=0.0)", "tl.load(B + (xindex))")
    assert source.count("tl.load(") == 2 and "a_mask, other" not in source
    path = tmp_path / f"later_even_{rule}.py"
    path.write_text(source)
    errors = tilelink.spawn(_later, 2, str(path), rule, False, 64)
    assert all(e < 1e-4 for e in errors), errors
    for said in tilelink.spawn(_later_refused, 2, str(path), rule, 40):
        assert "only with ks2 a multiple of 16" in said and "here ks2=20" in said, said


@pytest.mark.parametrize("even", [False, True], ids=["odd-local", "even-local"])
def test_unmasked_blocks_on_a_side_a_local_decides_are_asked_only_where_compiled(tmp_path, monkeypatch,
                                                                                 even: bool) -> None:
    """The unmasked loads under `if EVEN_K:`, the masked ones under its `else`, with `EVEN_K` a local constexpr: the
    launch asks whole blocks of each rank only where the local makes the unmasked side the one compiled. With `False`
    a slice of 20 columns equals torch; with `True` it is refused, naming the multiple."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    rule = "reduce_scatter"
    source = LATER.format(rule=rule, tensor=TENSORS[rule], head=ONE_TILE).replace(
        "EVEN_K: tl.constexpr = False", f"EVEN_K: tl.constexpr = {even}")
    for operand in ("a", "b"):
        load = f"{operand} = tl.load({operand.upper()} + (xindex), {operand}_mask, other=0.0)"
        assert load in source
        source = source.replace(load, f"if EVEN_K:\n                {operand} = tl.load({operand.upper()} + (xindex))"
                                      f"\n            else:\n                {load}")
    path = tmp_path / f"sides_{even}.py"
    path.write_text(source)
    if even:
        for said in tilelink.spawn(_later_refused, 2, str(path), rule, 40):
            assert "only with ks2 a multiple of 16" in said and "here ks2=20" in said, said
    else:
        errors = tilelink.spawn(_later, 2, str(path), rule, False, 40)
        assert all(e < 1e-4 for e in errors), errors
