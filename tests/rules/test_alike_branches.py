"""An ``if`` whose two sides bind the same values up to casts to int64 (unsloth's ``LONG_INDEXING`` twins) is read as
that one binding (``tilelink.branches``): the kernel builds, keeps both sides, and equals torch on the race-exposing
schedule at two ranks with either side taken. Sides that differ otherwise, or a cast of a value that may change, are
read as before; code the rewrite would insert between a side's statements is refused, naming the ``if``."""

from __future__ import annotations

import libcst as cst
import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of, worst
from tilelink.branches import alike_branches
from tilelink.errors import AnnotationError
from tilelink.runtime import current_world

ELEMENTWISE = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("e", dim=0))
@triton.jit
def _fg_kernel(e, g, h, n_elements, BLOCK_SIZE: tl.constexpr, LONG_INDEXING: tl.constexpr):
    block_idx = tl.program_id(0)
    if LONG_INDEXING:
        offsets = block_idx.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE).to(tl.int64)
        n_elements = tl.cast(n_elements, tl.int64)
    else:
        offsets = {narrow}
    mask = offsets < n_elements

    e_row = tl.load(e + offsets, mask=mask, other=0).to(tl.float32)
    g_row = tl.load(g + offsets, mask=mask, other=0)
    f_row = e_row * tl.sigmoid(e_row)
    h_row = f_row.to(g_row.dtype) * g_row
    tl.store(h + offsets, h_row, mask=mask)
'''
NARROW = "block_idx * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)"

GEMM = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.{rule})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if WIDE:
{wide}
    else:
{narrow}
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_am[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
'''
#: the tile index on both sides, then its pair after the `if` (the rotation of pid_m moves after the `if`)
ONE = ("        pid_m = pid.to(tl.int64) // num_pid_n", "        pid_m = pid // num_pid_n")
#: the cast of the whole quotient, which reads the parameter N through `num_pid_n`
QUOTIENT = ("        pid_m = (pid // num_pid_n).to(tl.int64)", "        pid_m = pid // num_pid_n")
#: both coordinates on both sides: the rotation of pid_m moves past `pid_n = ...`, which reads `pid` only
TWO = ("        pid_m = pid.to(tl.int64) // num_pid_n\n        pid_n = pid % num_pid_n",
       "        pid_m = pid // num_pid_n\n        pid_n = pid % num_pid_n")
ROWS = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def double_rows(x_ptr, y_ptr, n_rows, n_cols, stride, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    if WIDE:
        r = tl.program_id(0).to(tl.int64)
        x = tl.load(x_ptr + r * stride + cols, mask=cols < n_cols)
    else:
        r = tl.program_id(0)
        x = tl.load(x_ptr + r * stride + cols, mask=cols < n_cols)
    tl.store(y_ptr + r * stride + cols, x * 2, mask=cols < n_cols)
'''
N_ELEMENTS, BLOCK = 300, 32
M, N, K = 37, 24, 40


def gemm(tmp_path, rule: str, sides: tuple[str, str]) -> str:
    path = tmp_path / f"gemm_{rule[:6]}_{abs(hash(sides))}.py"
    body = GEMM.format(rule=rule, wide=sides[0], narrow=sides[1])
    if "pid_n =" not in sides[0]:
        body = body.replace("    offs_am = pid_m", "    pid_n = pid % num_pid_n\n    offs_am = pid_m", 1)
    path.write_text(body)
    return str(path)


def elementwise(path: str, long_indexing: bool) -> float:
    """``h = silu(e) * g`` with ``e`` gathered from each rank's slice, two calls, against torch."""
    rank, world = tilelink.rank(), tilelink.world_size()
    device = current_world().device
    gen = torch.Generator().manual_seed(7)
    e, g = torch.randn(N_ELEMENTS, generator=gen), torch.randn(N_ELEMENTS, generator=gen)
    lo, hi = rows_of(rank, world, N_ELEMENTS)
    kernel = module_at(path)._fg_kernel
    error = 0.0
    for _ in range(2):
        h = torch.full((N_ELEMENTS,), float("nan"), device=device)
        kernel[(triton.cdiv(N_ELEMENTS, BLOCK),)](e[lo:hi].contiguous().to(device), g.to(device), h, N_ELEMENTS,
                                                  BLOCK_SIZE=BLOCK, LONG_INDEXING=long_indexing)
        error = worst(error, (h.cpu() - torch.nn.functional.silu(e) * g).abs().max().item())
    return error


def multiply(path: str, reduce: bool, wide: bool) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    gen = torch.Generator().manual_seed(43)
    a, b = torch.randint(-3, 4, (M, K), generator=gen).float(), torch.randint(-3, 4, (K, N), generator=gen).float()
    lo, hi = rows_of(rank, world, M)
    klo, khi = rows_of(rank, world, K) if reduce else (0, K)
    device = current_world().device
    dtype = torch.float16 if device.type == "cuda" else torch.float32  # small ints: exact either way
    ar = (a[:, klo:khi] if reduce else a[lo:hi]).contiguous().to(device=device, dtype=dtype)
    br = b[klo:khi].contiguous().to(device=device, dtype=dtype)
    kernel = module_at(path).matmul_kernel
    error = 0.0
    for _ in range(2):
        c = torch.full((hi - lo, N) if reduce else (M, N), float("nan"), device=device)
        kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](ar, br, c, M, N, khi - klo, ar.stride(0), ar.stride(1),
                                                           br.stride(0), br.stride(1), c.stride(0), c.stride(1),
                                                           BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, WIDE=wide)
        want = (a @ b)[lo:hi] if reduce else a @ b
        error = worst(error, (c.cpu() - want).abs().max().item())
    return error


def test_the_long_indexing_twin_is_read_as_one_binding_and_both_sides_are_kept(tmp_path) -> None:
    path = tmp_path / "fg.py"
    path.write_text(ELEMENTWISE.format(narrow=NARROW))
    built = tilelink.build(str(path))
    notes = [e.message for e in built.report.entries if e.status == "note"]
    assert any("the `if LONG_INDEXING` at line 11 binds the same values on both sides" in n for n in notes), notes
    assert built.report.applied, [str(e) for e in built.report.entries]
    kernel = built.rewritten["_fg_kernel"]
    assert "if LONG_INDEXING:" in kernel and "n_elements = tl.cast(n_elements, tl.int64)" in kernel
    # the rows the wait computes are the 64-bit side's: as wide as the kernel's where it needs them
    rows = kernel.split("tl_channels_of_rows")[1].split("consumer_tile_wait")[0]
    assert "block_idx.to(tl.int64) * BLOCK_SIZE" in rows, rows


@pytest.mark.slow
@pytest.mark.parametrize("long_indexing", [True, False], ids=["long", "short"])
def test_the_long_indexing_twin_equals_torch_on_either_side(long_indexing: bool, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "fg.py"
    path.write_text(ELEMENTWISE.format(narrow=NARROW))
    errors = tilelink.spawn(elementwise, 2, str(path), long_indexing)
    assert all(e < 1e-5 for e in errors), errors  # sigmoid's rounding against torch's silu; a row read early is NaN


def test_sides_that_bind_other_values_are_still_refused(tmp_path) -> None:
    path = tmp_path / "fg_off.py"
    path.write_text(ELEMENTWISE.format(narrow=NARROW + " + 1"))
    with pytest.raises(AnnotationError, match="the row offsets `offsets` at line 15 are bound again"):
        tilelink.build(str(path))


@pytest.mark.parametrize(("side", "other"), [
    ("x = tl.load(p).to(tl.int64)", "x = tl.load(p)"),  # a loaded value: the cast may truncate it
    ("x = (acc * 2).to(tl.int64)", "x = acc * 2"),  # an accumulator
    ("x = pid.to(tl.int32)", "x = pid"),  # a narrowing cast
    ("x = pid.to(tl.int64) + 1", "x = pid + 2"),  # other values
])
def test_only_casts_of_ints_are_dropped(side: str, other: str) -> None:
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(p, F: tl.constexpr):\n"
              "    pid = tl.program_id(0)\n    acc = tl.load(p + pid)\n"
              f"    if F:\n        {side}\n    else:\n        {other}\n    tl.store(p, x)\n")
    assert alike_branches(cst.parse_module(source), "k").regions == ()


@pytest.mark.parametrize(("side", "other"), [
    ("x = tl.cast(pid + 1, tl.int64) * B", "x = pid + 1 * B"),  # the cast's operand is `(pid + 1)`
    ("x = pid.to(tl.int64); y = 1", "x = pid; y = 1"),  # one statement a line
    ("x = pid.to(tl.int64)\n        return", "x = pid\n        return"),  # code moved past it would not run
])
def test_sides_read_as_one_must_be_one_binding_a_line_and_equal_as_syntax(side: str, other: str) -> None:
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(p, F: tl.constexpr, "
              "B: tl.constexpr):\n    pid = tl.program_id(0)\n"
              f"    if F:\n        {side}\n    else:\n        {other}\n    tl.store(p + x + tl.arange(0, B), 0)\n")
    assert alike_branches(cst.parse_module(source), "k").regions == ()


def test_a_tab_indented_if_keeps_its_tabs(tmp_path) -> None:
    path = tmp_path / "fg_tabs.py"
    path.write_text(ELEMENTWISE.format(narrow=NARROW).replace("    ", "\t"))
    built = tilelink.build(str(path))
    assert built.report.applied and "\tif LONG_INDEXING:\n\t\toffsets" in built.rewritten["_fg_kernel"]


def test_the_parameters_a_dropped_cast_takes_as_ints_are_in_the_launch_plan(tmp_path) -> None:
    path = tmp_path / "fg.py"
    path.write_text(ELEMENTWISE.format(narrow=NARROW))
    # a constexpr an arange reads is an int already; `n_elements` is cast to itself on one side
    assert tilelink.build(str(path)).plans[0].launch.int_params == (("n_elements", 11),)
    # a cast of the tile index's quotient by `num_pid_n`, counted from the parameter N (not of `pid` alone)
    assert tilelink.build(gemm(tmp_path, 'reduce_scatter("c_ptr")', ONE)).plans[0].launch.int_params == ()
    assert tilelink.build(gemm(tmp_path, 'reduce_scatter("c_ptr")', QUOTIENT)).plans[0].launch.int_params == (
        ("N", 13),)
    # a constexpr no arange reads (a group size) is checked too; one an arange reads is an int already
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(p, F: tl.constexpr, "
              "G: tl.constexpr, B: tl.constexpr):\n    pid = tl.program_id(0)\n    if F:\n"
              "        x = (pid // G * B).to(tl.int64)\n    else:\n        x = pid // G * B\n"
              "    tl.store(p + x + tl.arange(0, B), 0)\n")
    assert [r.ints for r in alike_branches(cst.parse_module(source), "k").regions] == [("G",)]


def _float_n(path: str) -> str:
    """A call with N a float whose value is an int's: the `if` took N as an int, so the call is refused."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(M, K, generator=gen), torch.randn(K, N, generator=gen)
    lo, hi = rows_of(tilelink.rank(), tilelink.world_size(), M)
    c = torch.empty(M, N)
    kernel = module_at(path).matmul_kernel
    args = (a[lo:hi].contiguous(), b, c, M, N, K, K, 1, N, 1, N, 1)
    kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](*args, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, WIDE=True)
    try:
        kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16),)](*args[:4], float(N), *args[5:], BLOCK_M=16, BLOCK_N=16,
                                                           BLOCK_K=16, WIDE=True)
    except tilelink.LaunchError as exc:
        return str(exc)
    return "launched"


@pytest.mark.slow
def test_a_float_where_an_if_read_as_one_took_an_int_is_refused_at_the_call(tmp_path) -> None:
    # the kernel's own tile order: the rotation's check would refuse the float N first, for its grid
    said = tilelink.spawn(_float_n, 2, gemm(tmp_path, 'all_gather("a_ptr"), order="mesh"', QUOTIENT))
    assert all("argument 'N' is 24.0, not an int" in s and "`if` at" in s and "was read as one binding" in s
               for s in said), said


def test_an_if_of_a_widened_size_alone_is_read_as_nothing() -> None:
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(p, n, F: tl.constexpr):\n"
              "    if F:\n        n = tl.cast(n, tl.int64)\n    offs = tl.arange(0, 16)\n"
              "    tl.store(p + offs, 0, mask=offs < n)\n")
    alike = alike_branches(cst.parse_module(source), "k")
    assert [(r.first, r.last, r.test, r.read) for r in alike.regions] == [(7, 8, "F", ())]
    assert alike.module.code.splitlines()[6:8] == ["    pass", "    pass"]


def test_a_test_that_calls_is_not_read_away() -> None:
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(p, n):\n"
              "    pid = tl.program_id(0)\n    if tl.load(p) > 0:\n        x = pid.to(tl.int64)\n    else:\n"
              "        x = pid\n    tl.store(p + x, 0)\n")
    assert alike_branches(cst.parse_module(source), "k").regions == ()


@pytest.mark.parametrize("sides", [ONE, TWO], ids=["index", "both_coordinates"])
@pytest.mark.parametrize("rule", ['reduce_scatter("c_ptr")', 'all_gather("a_ptr")'], ids=["reduce", "gather"])
def test_a_tile_index_bound_alike_on_both_sides_is_rotated_after_the_if(rule: str, sides, tmp_path) -> None:
    built = tilelink.build(gemm(tmp_path, rule, sides))
    assert built.report.applied, [str(e) for e in built.report.entries]
    kernel = built.rewritten["matmul_kernel"]
    before, after = kernel.split("    else:\n", 1)
    assert "tl_remap_tile" not in before and "tl_remap_tile" in after.split("offs_am =")[0], kernel
    # reported where it goes: after the whole `if`, not after a line of one side
    rotated = [e for e in built.report.entries if "rotated" in e.message]
    assert rotated and rotated[0].message.endswith("rotated after the `if WIDE` at line 13"), rotated
    assert rotated[0].where.line == 13, rotated


@pytest.mark.slow
@pytest.mark.parametrize("wide", [True, False], ids=["wide", "narrow"])
@pytest.mark.parametrize("rule", ['reduce_scatter("c_ptr")', 'all_gather("a_ptr")'], ids=["reduce", "gather"])
def test_a_tile_index_bound_alike_on_both_sides_equals_torch(rule: str, wide: bool, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = gemm(tmp_path, rule, TWO)
    assert tilelink.spawn(multiply, 2, path, rule.startswith("reduce"), wide) == [0.0, 0.0]


def test_code_that_cannot_leave_the_if_is_refused_naming_it(tmp_path) -> None:
    """The row's wait reads `r`, which the side binds before its load: it can go neither before the `if` nor into
    one side alone."""
    path = tmp_path / "rows.py"
    path.write_text(ROWS)
    with pytest.raises(AnnotationError, match=r"TileLink would insert its code between the statements of a side of "
                                              r"the `if WIDE` at line 11, whose sides bind the same values"):
        tilelink.build(str(path))
