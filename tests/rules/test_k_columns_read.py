"""Under a reduction each rank runs the loop that sums over its own slice of K. These forms of that loop read other
columns of each rank's slice than of the full K, and built without being read: a block of K columns that starts at
a tile's position (also through a pointer or the parameter moved before the loop), a step counted by another block
size beside columns with no stride, a parameter the loop advances past its block, a block pointer made afresh on
each step at a shifted offset (bound to a name or written in the load, or at a base that moves), and a load that
fills the columns past K with anything but zero (`other=1.0`, `padding_option="nan"`). Each is now refused at its
line; the forms beside them that do tile K still build and equal the kernel. Refused kernels that the interpreter
runs are also run plain on the two ranks' slices, to show that their sum is not the kernel's on the full K."""

from __future__ import annotations

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, plain_module, rows_of
from tests.rules.test_carried_accumulator import _generate
from tests.rules.test_split_k_steps import SPLIT, STEP, _split_on
from tilelink.errors import AnnotationError, LaunchError

#: `SPLIT`'s kernel without a split: one program along the grid's third axis, its write-back a store
PLAIN = SPLIT.replace("tl.atomic_add(", "tl.store(")

#: the K columns start at the tile's column position: the first columns of each rank's slice are left out
AT_TILE_POINTERS = '''    offs_k = pid_n * BLOCK_K + lanes
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (offs_k[None, :] < k_remaining), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_remaining) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk'''
#: `{offs}` made on each step of a range by columns
COLUMNS = '''    for k in range(0, K, {step}):
        offs_k = {offs}
''' + STEP
#: A and B read with no column stride (contiguous along K), over a range that moves by `{step}`
UNSTRIDED = '''    for k in range(0, K, {step}):
        offs_k = k + lanes
        a = tl.load(a_ptr + rm[:, None] * K + offs_k[None, :], mask=(rm[:, None] < M) & (offs_k[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] + rn[None, :] * K, mask=(offs_k[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc = tl.dot(a, b, acc)'''
#: block pointers made on each step at `({a_at})` and `({b_at})`
AFRESH = '''    for k in range({range}):
        a_bp = tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), ({a_at}), (BLOCK_M, BLOCK_K), (1, 0))
        b_bp = tl.make_block_ptr(b_ptr, (K, N), (stride_bk, stride_bn), ({b_at}), (BLOCK_K, BLOCK_N), (1, 0))
        a = tl.load(a_bp, boundary_check=(0, 1), padding_option="zero")
        b = tl.load(b_bp, boundary_check=(0, 1), padding_option="zero")
        acc = tl.dot(a, b, acc)'''


def _sliced_sum_error(source: str, tmp_path, K: int = 72, world: int = 2, b_rows_major: bool = True,
                      block_m: int = 16) -> float:
    """How far the sum of the plain kernel run on each of ``world`` ranks' slices of K is from the plain kernel on
    the whole of K: what a reduction of the kernel's partial sums would make of it, were it built."""
    path = tmp_path / "mm_plain.py"
    path.write_text(source)
    kernel = plain_module(str(path)).mm_split
    M, N = 40, 32
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, 16), 1)
    meta = dict(BLOCK_M=block_m, BLOCK_N=16, BLOCK_K=16, SPLIT_K=1)

    def run(ka, kb, k):
        out = torch.zeros(M, N)
        kb = kb if b_rows_major else kb.t().contiguous().t()
        kernel[grid](ka, kb, out, M, N, k, ka.stride(0), 1, kb.stride(0), kb.stride(1), N, 1, **meta)
        return out

    want = run(a.contiguous(), b.contiguous(), K)
    got = sum(run(a[:, lo:hi].contiguous(), b[lo:hi].contiguous(), hi - lo)
              for lo, hi in (rows_of(r, world, K) for r in range(world)))
    return (got - want).abs().max().item()


@pytest.mark.parametrize("loop, term", [
    (AT_TILE_POINTERS, "BLOCK_K * tl.program_id(1)"),
    (COLUMNS.format(step="BLOCK_K", offs="k + pid_n * BLOCK_K + lanes"), "BLOCK_K * tl.program_id(1)"),
    (COLUMNS.format(step="BLOCK_K", offs="k + (pid_m % 2) * BLOCK_K + lanes"), "BLOCK_K * (pid_m % 2)"),
], ids=["pointers", "columns", "alternating"])
def test_k_columns_from_a_tile_s_position_are_refused(loop: str, term: str, tmp_path) -> None:
    """Each built before, and summed 10 to 16 away from the kernel at world 2."""
    source = PLAIN.format(loop=loop)
    with pytest.raises(AnnotationError) as err:
        _generate(source)
    text = str(err.value)
    assert f"reads `a_ptr`'s columns along K from `{term}` on" in text, text
    assert "a program's position" in text and "pid_k * BLOCK_K" in err.value.hint, err.value
    assert _sliced_sum_error(source, tmp_path) > 1.0


@pytest.mark.parametrize("loop", [
    COLUMNS.format(step="BLOCK_K", offs="k + lanes"),
    COLUMNS.format(step="BLOCK_K", offs="k + 0 * pid_n + lanes"),
], ids=["columns", "times-zero"])
def test_k_columns_from_the_step_build(loop: str) -> None:
    assert _generate(PLAIN.format(loop=loop)).plans


@pytest.mark.parametrize("step", ["BLOCK_M + BLOCK_N", "BLOCK_M"])
def test_a_step_counted_by_another_width_beside_unstrided_columns_is_refused(step: str, tmp_path) -> None:
    """`k + tl.arange(0, BLOCK_K)` indexes columns whatever their stride, so a loop moving by another block's width
    leaves out or reads twice columns of each rank's slice. It built where no column stride was written."""
    source = PLAIN.format(loop=UNSTRIDED.format(step=step))
    with pytest.raises(AnnotationError, match=rf"reads `BLOCK_K` columns of `a_ptr` along K on each step .*, and "
                                              rf"moves them by `{step.replace('+', '[+]')}` a step"):
        _generate(source)
    assert _sliced_sum_error(source, tmp_path, b_rows_major=False, block_m=32) > 1.0


def test_unstrided_columns_moved_by_their_own_width_build() -> None:
    assert _generate(PLAIN.format(loop=UNSTRIDED.format(step="BLOCK_K"))).plans


@pytest.mark.parametrize("a_at, b_at, says", [
    ("pid_m * BLOCK_M, k + BLOCK_K", "k + BLOCK_K, pid_n * BLOCK_N", r"from `BLOCK_K` on, past where the step's block"),
    ("pid_m * BLOCK_M, 2 * k", "2 * k, pid_n * BLOCK_N", r"moves them by `2 \* BLOCK_K` a step"),
    ("pid_m * BLOCK_M, k + pid_n * BLOCK_K", "k + pid_n * BLOCK_K, pid_n * BLOCK_N",
     r"from `BLOCK_K \* tl.program_id\(1\)` on"),
], ids=["shifted", "gaps", "at-tile"])
def test_block_pointers_made_afresh_at_other_columns_are_refused(a_at: str, b_at: str, says: str) -> None:
    """A block pointer made on each step is read as a descriptor's load: its offset along K must start at the
    step's block. Each of these built before (the interpreter has no block pointers, so they are not run here)."""
    loop = AFRESH.format(range="0, K, BLOCK_K", a_at=a_at, b_at=b_at)
    with pytest.raises(AnnotationError, match=says):
        _generate(PLAIN.format(loop=loop))


@pytest.mark.parametrize("range_, at, split_steps", [
    ("0, K, BLOCK_K", "k", []),
    ("0, tl.cdiv(K, BLOCK_K)", "k * BLOCK_K", []),
    ("pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K", "k", [("SPLIT_K", 2)]),
], ids=["columns", "tiles", "split"])
def test_block_pointers_made_afresh_at_the_step_build(range_: str, at: str, split_steps: list) -> None:
    source = SPLIT if split_steps else PLAIN
    loop = AFRESH.format(range=range_, a_at=f"pid_m * BLOCK_M, {at}", b_at=f"{at}, pid_n * BLOCK_N")
    built = _generate(source.format(loop=loop))
    assert [e[:2] for e in built.plans[0].launch.split_steps] == split_steps


@pytest.mark.parametrize("other", ["1.0", "-1", "fill"])
def test_a_non_zero_fill_past_k_is_refused(other: str, tmp_path) -> None:
    """The columns a mask by K leaves out are past the end of each rank's slice, not of the full K: a product of two
    loads filled there with anything but zero is summed once per rank whose slice ends inside a block (at world 2
    and K = 72, each rank's 36 columns end inside their third block)."""
    loop = COLUMNS.format(step="BLOCK_K", offs="k + lanes").replace("other=0.0", f"other={other}")
    source = PLAIN.format(loop=loop)
    if other == "fill":
        source = source.replace("    acc = tl.zeros", "    fill = 1.0\n    acc = tl.zeros")
    with pytest.raises(AnnotationError, match=rf"the update of `acc` at line \d+, .* adds something other than zero "
                                              rf"at the columns its loads masked by K leave out \(`tl.dot\(a, b, "
                                              rf"acc\)`, its loads filled with `other={other}` at line \d+") as err:
        _generate(source)
    assert "other=0.0" in err.value.hint
    assert _sliced_sum_error(source, tmp_path) > 1.0


@pytest.mark.parametrize("update", ["tl.dot(a + 1.0, b + 1.0, acc)", "acc + tl.sum(tl.exp(a), axis=1)[:, None]",
                                    "tl.dot(tl.exp(a), tl.exp(b), acc)"], ids=["shifted", "exp", "exp-product"])
def test_an_update_that_adds_other_than_zero_past_k_is_refused(update: str, tmp_path) -> None:
    """Zero-filled loads, but an update that is not zero where they are (`a + 1.0`, `exp(0)`): summed past the end
    of each rank's slice."""
    source = PLAIN.format(loop=COLUMNS.format(step="BLOCK_K", offs="k + lanes")).replace(
        "acc = tl.dot(a, b, acc)", f"acc = {update}")
    with pytest.raises(AnnotationError, match=r"the update of `acc` at line 23, .* adds something other than zero"):
        _generate(source)
    assert _sliced_sum_error(source, tmp_path) > 1.0


def _filled_on(path: str, K: int) -> float:
    """`PLAIN`'s kernel at ``path`` at this rank's slice of K against the plain kernel on the whole of K."""
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N = 40, 32
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    grid, meta = (triton.cdiv(M, 16), triton.cdiv(N, 16), 1), dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT_K=1)
    want = torch.zeros(M, N)
    plain_module(path).mm_split[grid](a, b, want, M, N, K, K, 1, N, 1, N, 1, **meta)
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M)
    got = torch.full((hi - lo, N), float("nan"))
    module_at(path).mm_split[grid](a[:, klo:khi].contiguous(), b[klo:khi].contiguous(), got, M, N, khi - klo,
                                   khi - klo, 1, N, 1, N, 1, **meta)
    return (got - want[lo:hi]).abs().max().item()


@pytest.mark.parametrize("update", ["tl.dot(a, b, acc)", "tl.dot(a, (b - 0.5) * 2.0, acc)"],
                         ids=["product", "shifted-beside-zero"])
def test_a_fill_a_product_makes_zero_builds(update: str, tmp_path, monkeypatch) -> None:
    """`a` filled with `1.0` beside `b` filled with zero, or `b` shifted (a zero point) beside a zero-filled `a`: the
    product is zero past K. Built, and equal to the kernel at world 2 with K = 72."""
    loop = COLUMNS.format(step="BLOCK_K", offs="k + lanes").replace("other=0.0", "other=1.0", 1).replace(
        "acc = tl.dot(a, b, acc)", f"acc = {update}")
    if "b - 0.5" in update:
        loop = loop.replace("other=1.0", "other=0.0")
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_split.py"
    path.write_text(PLAIN.format(loop=loop))
    assert all(e < 1e-4 for e in tilelink.spawn(_filled_on, 2, str(path), 72))


@pytest.mark.parametrize("other", ["0", "0.", "-0.0", "0x0", "zero", "tl.zeros((1, 1), dtype=tl.float32)",
                                   "tl.full((1, 1), 0, tl.float32)"])
def test_a_zero_fill_past_k_builds(other: str) -> None:
    loop = COLUMNS.format(step="BLOCK_K", offs="k + lanes").replace("other=0.0", f"other={other}")
    source = PLAIN.format(loop=loop).replace("    acc = tl.zeros", "    zero = 0.0\n    acc = tl.zeros")
    assert _generate(source).plans


def test_block_pointers_written_in_the_load_are_read() -> None:
    """`tl.load(tl.make_block_ptr(...))` is read as a block pointer bound to a name: shifted, refused; at the step,
    built."""
    made = ("        a = tl.load(tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BLOCK_M, {at}), "
            "(BLOCK_M, BLOCK_K), (1, 0)),\n                    boundary_check=(0, 1), padding_option=\"zero\")\n"
            "        b = tl.load(tl.make_block_ptr(b_ptr, (K, N), (stride_bk, stride_bn), ({at}, pid_n * BLOCK_N), "
            "(BLOCK_K, BLOCK_N), (1, 0)),\n                    boundary_check=(0, 1), padding_option=\"zero\")\n"
            "        acc = tl.dot(a, b, acc)")
    loop = "    for k in range(0, K, BLOCK_K):\n" + made
    with pytest.raises(AnnotationError, match=r"reads `a_ptr`'s columns along K from `BLOCK_K` on, past where"):
        _generate(PLAIN.format(loop=loop.format(at="k + BLOCK_K")))
    assert _generate(PLAIN.format(loop=loop.format(at="k"))).plans


@pytest.mark.parametrize("edit, says", [
    # the columns moved through the base, the offsets at 0: TileLink reads the offsets
    (("tl.make_block_ptr(a_ptr, (M, K)", "tl.make_block_ptr(a_ptr + k * stride_ak, (M, K)"),
     r"through the block pointer `a_bp`, which is made at a base that moves with the loop"),
    # NaN past the end of each rank's slice, where the full K's block has columns
    (('b = tl.load(b_bp, boundary_check=(0, 1), padding_option="zero")',
      'b = tl.load(b_bp, boundary_check=(0, 1), padding_option="nan")'),
     r"pads what it reads past the tensor's bounds with `padding_option=\"nan\"`"),
], ids=["moving-base", "nan-padding"])
def test_block_pointers_made_afresh_otherwise_are_refused(edit: tuple[str, str], says: str) -> None:
    loop = AFRESH.format(range="0, K, BLOCK_K", a_at="pid_m * BLOCK_M, k", b_at="k, pid_n * BLOCK_N")
    assert edit[0] in loop
    with pytest.raises(AnnotationError, match=says) as err:
        _generate(PLAIN.format(loop=loop.replace(*edit)))
    assert err.value.hint


#: pointers made at the first block and moved before the loop by `{shift}`, then by `BLOCK_K` a step
MOVED_BEFORE = '''    a_ptrs = a_ptr + rm[:, None] * stride_am + lanes[None, :] * stride_ak
    b_ptrs = b_ptr + lanes[:, None] * stride_bk + rn[None, :] * stride_bn
    a_ptrs += {shift} * stride_ak
    b_ptrs += {shift} * stride_bk
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kofs = {shift} + k * BLOCK_K + lanes
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (kofs[None, :] < K), other=0.0)
        b = tl.load(b_ptrs, mask=(kofs[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk'''
#: the parameters themselves moved before the loop by `{shift}`
PARAMS_MOVED = '''    a_ptr += {shift} * stride_ak
    b_ptr += {shift} * stride_bk
''' + COLUMNS.format(step="BLOCK_K", offs="k + lanes").replace(
    "offs_k[None, :] < K)", "({shift} + offs_k)[None, :] < K)").replace(
    "offs_k[:, None] < K)", "({shift} + offs_k)[:, None] < K)")
#: the parameters advanced by the loop itself, by `{advance}` a step
PARAMS_ADVANCED = '''    for k in range(0, K, BLOCK_K):
        kk = k + lanes
        a = tl.load(a_ptr + rm[:, None] * stride_am + lanes[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + lanes[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptr += {advance} * stride_ak
        b_ptr += {advance} * stride_bk'''


@pytest.mark.parametrize("template", [MOVED_BEFORE, PARAMS_MOVED], ids=["pointers", "parameters"])
def test_pointers_moved_before_the_loop_are_read_from_where_the_loop_starts(template: str, tmp_path,
                                                                            monkeypatch) -> None:
    """A pointer (or the parameter itself, `a_ptr += ...`) moved before the loop starts there: by a tile's position,
    refused (it built before, 13 to 16 away at world 2); by nothing along K, built and equal to the kernel."""
    source = PLAIN.format(loop=template.format(shift="pid_n * BLOCK_K"))
    with pytest.raises(AnnotationError, match=r"reads `a_ptr`'s columns along K from `BLOCK_K \* tl.program_id\(1\)`"):
        _generate(source)
    assert _sliced_sum_error(source, tmp_path) > 1.0
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_split.py"
    path.write_text(PLAIN.format(loop=template.format(shift="0")))
    assert all(e < 1e-4 for e in tilelink.spawn(_split_on, 2, str(path), 1, 1))


def test_parameters_advanced_by_the_loop_are_read(tmp_path, monkeypatch) -> None:
    """`a_ptr += 2 * BLOCK_K * stride_ak` on each step over `BLOCK_K` columns leaves every other block out: refused
    (it built before); by `BLOCK_K`, built and equal to the kernel at world 2."""
    with pytest.raises(AnnotationError, match=r"reads `BLOCK_K` columns of `a_ptr` along K .* moves them by `2 \* "
                                              r"BLOCK_K` a step"):
        _generate(PLAIN.format(loop=PARAMS_ADVANCED.format(advance="2 * BLOCK_K")))
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_split.py"
    path.write_text(PLAIN.format(loop=PARAMS_ADVANCED.format(advance="BLOCK_K")))
    assert all(e < 1e-4 for e in tilelink.spawn(_split_on, 2, str(path), 1, 1))


def test_unstrided_columns_counted_by_another_block_size_are_refused() -> None:
    """`k * BLOCK_M + tl.arange(0, BLOCK_K)` over `range(0, tl.cdiv(K, BLOCK_M))`, no column stride: block sizes
    alone move columns (it built before)."""
    loop = UNSTRIDED.format(step="BLOCK_K").replace("range(0, K, BLOCK_K)", "range(0, tl.cdiv(K, BLOCK_M))").replace(
        "offs_k = k + lanes", "offs_k = k * BLOCK_M + lanes")
    with pytest.raises(AnnotationError, match=r"reads `BLOCK_K` columns of `a_ptr` along K .* moves them by "
                                              r"`BLOCK_M` a step"):
        _generate(PLAIN.format(loop=loop))


#: a grouped GEMM whose B holds one (K, N) matrix an expert, contiguous: `e * K * N` is the expert's, not a K start
EXPERTS = '''import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def mm_experts(a_ptr, b_ptr, c_ptr, expert_ptr, M, N, K,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(expert_ptr + pid_m)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * K + offs_k[None, :], mask=(rm[:, None] < M) & (offs_k[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + e * K * N + offs_k[:, None] * N + rn[None, :],
                    mask=(offs_k[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


def _experts_on(path: str, K: int) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N = 40, 32
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g), torch.randn(3, K, N, generator=g)
    experts = torch.tensor([2, 0, 1], dtype=torch.int32)
    grid, meta = (triton.cdiv(M, 16), triton.cdiv(N, 16)), dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    want = torch.zeros(M, N)
    plain_module(path).mm_experts[grid](a, b, want, experts, M, N, K, **meta)
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M)
    got = torch.full((hi - lo, N), float("nan"))
    module_at(path).mm_experts[grid](a[:, klo:khi].contiguous(), b[:, klo:khi].contiguous(), got, experts, M, N,
                                     khi - klo, **meta)
    return (got - want[lo:hi]).abs().max().item()


def test_an_expert_s_offset_times_the_extent_is_no_k_start(tmp_path, monkeypatch) -> None:
    """A position times a run-time parameter is another dim's term: each rank's `(E, K_r, N)` slice makes `e * K * N`
    the expert's start on it. Built, and equal to the kernel at world 2."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_experts.py"
    path.write_text(EXPERTS)
    assert all(e < 1e-4 for e in tilelink.spawn(_experts_on, 2, str(path), 72))


@pytest.mark.parametrize("fills, update", [
    (("1.0", "0.0"), "acc += a.sum(axis=1)[:, None]"),  # a method reads the tensor it is called on
    (("1.0", "1.0"), "acc = tl.dot(a.trans().trans(), b.trans().trans(), acc)"),
    (("0.0", "0.0"), "acc += tl.sum(tl.where(a == 0.0, 1.0, 0.0), axis=1)[:, None]"),  # a test holds there
    (("0.0", "0.0"), "acc += tl.sum((a == 0.0).to(tl.float32), axis=1)[:, None]"),
    (("0", "0"), "acc += tl.sum((~a.to(tl.int32)).to(tl.float32), axis=1)[:, None]"),  # `~0` is -1
    (("0.0", 'float("inf")'), "acc = tl.dot(a, b, acc)"),  # zero times infinity is no zero
    (("0.0", "0.0"), "acc = tl.dot(a, b / b, acc)"),  # divided by a zero-filled load
], ids=["method", "trans", "where-test", "comparison", "invert", "infinity", "division"])
def test_what_zero_fills_do_not_make_zero_is_refused(fills: tuple[str, str], update: str) -> None:
    loop = COLUMNS.format(step="BLOCK_K", offs="k + lanes").replace("other=0.0", f"other={fills[0]}", 1).replace(
        "other=0.0)", f"other={fills[1]})", 1).replace("        acc = tl.dot(a, b, acc)", f"        {update}")
    with pytest.raises(AnnotationError, match=r"the update of `acc` at line \d+, .* adds something other than zero"):
        _generate(PLAIN.format(loop=loop))


@pytest.mark.parametrize("edit, says", [
    (("(M, K), (stride_am", "(M, K - BLOCK_K), (stride_am"), r"is made with `K - BLOCK_K` along K where the loop runs "
                                                             r"over `K`"),
    (("    for k in range(", "    a_ptr += BLOCK_K * stride_ak\n    for k in range("),
     r"is made at a base moved along K \(`BLOCK_K \* stride_ak`\) where the loop starts"),
], ids=["shape", "base-moved-before"])
@pytest.mark.parametrize("form", ["afresh", "in-load", "advanced"])
def test_block_pointers_along_other_columns_than_k_are_refused(edit: tuple[str, str], says: str, form: str) -> None:
    """A block pointer's shape along K must be the extent the loop runs over, and its base must not be moved along K
    before the loop: each built before, and would read other columns of each rank's slice than of the full K."""
    loop = AFRESH.format(range="0, K, BLOCK_K", a_at="pid_m * BLOCK_M, k", b_at="k, pid_n * BLOCK_N")
    if form == "in-load":
        made = ("tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BLOCK_M, k), (BLOCK_M, BLOCK_K), "
                "(1, 0))")
        loop = loop.replace(f"        a_bp = {made}\n", "").replace("tl.load(a_bp,", f"tl.load({made},")
    elif form == "advanced":
        made = ("tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BLOCK_M, 0), (BLOCK_M, BLOCK_K), "
                "(1, 0))")
        loop = loop.replace("        a_bp = tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BLOCK_M, "
                            "k), (BLOCK_M, BLOCK_K), (1, 0))\n", "").replace(
            "    for k in range(", f"    a_bp = {made}\n    for k in range(").replace(
            "        acc = tl.dot(a, b, acc)", "        acc = tl.dot(a, b, acc)\n        a_bp = tl.advance(a_bp, (0, "
                                              "BLOCK_K))")
    assert edit[0] in loop
    with pytest.raises(AnnotationError, match=says):
        _generate(PLAIN.format(loop=loop.replace(*edit, 1)))
    assert _generate(PLAIN.format(loop=loop)).plans


#: a loop that reads whole blocks along K, with no mask along K
UNMASKED = COLUMNS.format(step="BLOCK_K", offs="k + lanes").replace(
    "mask=(rm[:, None] < M) & (offs_k[None, :] < K)", "mask=rm[:, None] < M").replace(
    "mask=(offs_k[:, None] < K) & (rn[None, :] < N)", "mask=rn[None, :] < N")


def test_whole_blocks_along_k_are_checked_at_each_call(tmp_path, monkeypatch) -> None:
    """Unmasked along K, the loop's last block ends at each rank's last column only where its slice is a whole
    number of blocks: K = 80 is 5 blocks of 16, each rank's 40 columns are not, and it built and read past them
    (NaN at world 2). Each call with more than one rank checks it before anything runs; K = 64 runs and equals the
    kernel."""
    assert "offs_k[None, :] < K" not in UNMASKED and "offs_k[:, None] < K" not in UNMASKED
    built = _generate(PLAIN.format(loop=UNMASKED))
    assert {(e[0], e[1]) for e in built.plans[0].launch.row_multiples} == {(("K",), "BLOCK_K")}
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_split.py"
    path.write_text(PLAIN.format(loop=UNMASKED))
    said = tilelink.spawn(_checked_on, 2, str(path), 80)
    for text in said:
        assert isinstance(text, str) and "reads columns of this rank's slice of K, whose sum over the ranks is the " \
            "kernel's only with K a multiple of BLOCK_K" in text and "here K=40 and BLOCK_K=16" in text, said
    assert all(e < 1e-4 for e in tilelink.spawn(_checked_on, 2, str(path), 64))


def _checked_on(path: str, K: int) -> float | str:
    """:func:`_filled_on`, or what the call is refused with."""
    try:
        return _filled_on(path, K)
    except LaunchError as error:
        return str(error)


#: a persistent GEMM: each program takes tiles `NUM_SMS` apart, and `{body}` sums and stores each tile
PERSISTENT = '''import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def mm_tiles(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_SMS: tl.constexpr):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
{before}
    for tile in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * num_pid_n, NUM_SMS):
        rm = (tile // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tile % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
{made}
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load({a}, mask=(rm[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
            b = tl.load({b}, mask=(offs_k[:, None] < K - k * BLOCK_K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
{advance}
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
                 mask=(rm[:, None] < M) & (rn[None, :] < N))
'''
#: the pointers the loop that sums advances, made with `{rows}` and `{cols}` (the tile's) or without
_MADE = ("{ind}a_ptrs = a_ptr + {rows}offs_k[None, :] * stride_ak\n"
         "{ind}b_ptrs = b_ptr + offs_k[:, None] * stride_bk{cols}")
_ADVANCE = "            {a} += BLOCK_K * stride_ak\n            {b} += BLOCK_K * stride_bk"


def _persistent(where: str) -> str:
    if where == "parameters":  # the parameters themselves advanced
        return PERSISTENT.format(before="", made="", a="a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak",
                                 b="b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn",
                                 advance=_ADVANCE.format(a="a_ptr", b="b_ptr"))
    advance = _ADVANCE.format(a="a_ptrs", b="b_ptrs")
    if where == "outside":  # made once, before the tile loop
        return PERSISTENT.format(before=_MADE.format(ind="    ", rows="", cols=""), made="",
                                 a="a_ptrs + rm[:, None] * stride_am", b="b_ptrs + rn[None, :] * stride_bn",
                                 advance=advance)
    return PERSISTENT.format(before="", made=_MADE.format(ind="        ", rows="rm[:, None] * stride_am + ",
                                                          cols=" + rn[None, :] * stride_bn"),
                             a="a_ptrs", b="b_ptrs", advance=advance)


def _tiles_on(path: str) -> float:
    """The persistent kernel at ``path`` on this rank's slice of K against torch on the whole of K, two calls."""
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 40, 32, 72
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    kernel, err = module_at(path).mm_tiles, 0.0
    for _ in range(2):
        got = torch.full((hi - lo, N), float("nan"))
        kernel[(3,)](ar, br, got, M, N, khi - klo, khi - klo, 1, N, 1, N, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
                     NUM_SMS=3)
        err = max(err, (got - (a @ b)[lo:hi]).abs().max().item())
    return err


@pytest.mark.parametrize("where, name", [("outside", "a_ptrs"), ("parameters", "a_ptr")])
def test_pointers_the_loop_advances_made_once_around_a_tile_loop_are_refused(where: str, name: str) -> None:
    """Made (or passed) once and advanced by the loop that sums inside a persistent tile loop, a pointer starts each
    tile where the last tile's loop ended, past K; each rank's slice ends elsewhere. It built before."""
    source = _persistent(where)
    lines = source.splitlines()
    tiles, load = (next(i for i, line in enumerate(lines, 1) if text in line) for text in ("for tile", "a = tl.load"))
    with pytest.raises(AnnotationError) as err:
        _generate(source)
    text = str(err.value)
    assert f"`{name}` is {'a parameter' if name == 'a_ptr' else 'made before it'} and is not made again on the " \
           f"passes of the loop at line {tiles} around it, so each pass starts it where the last one ended, past K" \
           in text, text
    assert err.value.line == load and f"on each pass of the loop at line {tiles}" in err.value.hint, err.value


def test_pointers_made_on_each_tile_build_and_equal_torch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "mm_tiles.py"
    path.write_text(_persistent("each tile"))
    assert all(e < 1e-4 for e in tilelink.spawn(_tiles_on, 2, str(path))), path


def test_pointers_made_again_on_each_pass_or_at_the_first_step_build_and_others_are_refused() -> None:
    """Made again at the tile loop's top under the tile loop's own `if`s, or at the first step of the loop that sums
    (`if k == 0:`), the pointers start each tile at its first column: built. Made again only under an `if` of their
    own, or from themselves (`a_ptrs = a_ptrs + 0`), they may carry the last tile's end: refused."""
    outside = _persistent("outside")
    made = ("            if k == 0:\n"
            "                a_ptrs = a_ptr + offs_k[None, :] * stride_ak\n"
            "                b_ptrs = b_ptr + offs_k[:, None] * stride_bk\n")
    first_step = outside.replace("            a = tl.load(", made + "            a = tl.load(", 1)
    assert _generate(first_step).plans
    for again in ("        if K < 0:\n            a_ptrs = a_ptr + offs_k[None, :] * stride_ak\n",
                  "        a_ptrs = a_ptrs + 0 * stride_ak\n"):
        source = outside.replace("        acc = tl.zeros(", again + "        acc = tl.zeros(", 1)
        assert again in source
        with pytest.raises(AnnotationError, match=r"`a_ptrs` is made before it and is not made again on the passes"):
            _generate(source)
