"""A store of one row a program (`tl.store(y_ptr + row * stride_ym + cols, acc, mask=cols < N)`, `row =
tl.program_id(0)`: a row-parallel linear one token row a program, or one whose columns a loop sweeps in blocks, as
Triton's layer-norm tutorial sweeps a row) is read as that row under reduce_scatter and all_reduce, without `tile=`:
the notify counts the columns the store's address and mask let through, and each call checks that the stores write
every element of each row. Two forms run at worlds 1-4 and through their mutants in ``test_forms.py``
(``row_outputs_rs``, ``row_sweep_ar``); here, the spellings that build, and what is refused."""

from __future__ import annotations

import pytest

import tilelink
from tests.rules.cases import launch_refusal, module_at, rows_of, worst
from tilelink.errors import AnnotationError

KERNEL = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.{rule}("y_ptr"))
@triton.jit
def row_linear(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
{body}'''

# the K loop of a row: `acc` holds the row's columns `cols` of x @ w.T (`w` is (N, K), as a linear layer's weight)
DOT = '''acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
for k in range(0, K, BLOCK_K):
    offs_k = k + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_xm + offs_k, mask=offs_k < K, other=0.0)
    w = tl.load(w_ptr + cols[:, None] * stride_wn + offs_k[None, :], mask=(cols[:, None] < N) & (offs_k[None, :] < K),
                other=0.0)
    acc += tl.sum(w * x[None, :], axis=1)
'''


def _indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in text.splitlines())


def body(row: str, store: str, cols: str = "cols = tl.arange(0, BLOCK_N)", sweep: str | None = None) -> str:
    """The kernel's body: ``row`` bound, the columns, the K loop and ``store``; inside the column loop ``sweep``
    when given (the columns then made in it)."""
    if sweep is None:
        return _indent(f"{row}\n{cols}\n{DOT}{store}", 4)
    return _indent(row, 4) + _indent(sweep, 4) + _indent(f"{cols}\n{DOT}{store}", 8)


STORE = "tl.store(y_ptr + row * stride_ym + cols, acc, mask=cols < N)"
FOLLOWED = {
    "one block": body("row = tl.program_id(0)", STORE),
    # the output pointer moved to the row in place, the mask a local (Liger's, unsloth's row kernels)
    "moved in place": body("row = tl.program_id(0)\ny_ptr += row * stride_ym",
                           "mask = cols < N\ntl.store(y_ptr + cols, acc, mask=mask)"),
    "offsets local": body("row = tl.program_id(0)", "offs = row * stride_ym + cols\n"
                                                    "tl.store(y_ptr + offs, acc, mask=cols < N)"),
    # a persistent grid: a loop over the rows, the row its target
    "row loop": _indent("for row in tl.range(tl.program_id(0), M, tl.num_programs(0)):", 4) + _indent(
        f"cols = tl.arange(0, BLOCK_N)\n{DOT}{STORE}", 8),
    # the columns swept in blocks: stepped by the block, or counted
    "swept": body("row = tl.program_id(0)", STORE, "cols = off + tl.arange(0, BLOCK_N)",
                  "for off in range(0, N, BLOCK_N):"),
    "swept by count": body("row = tl.program_id(0)", STORE, "cols = t * BLOCK_N + tl.arange(0, BLOCK_N)",
                           "for t in range(0, tl.cdiv(N, BLOCK_N)):"),
}


HELPER = '''

@triton.jit
def first_lane(B: tl.constexpr):
    return 1 // (tl.arange(0, B) + 1)
'''


def written(tmp_path, form: str, rule: str) -> str:
    """The kernel of body ``form`` under ``rule``, in a file of its own (with the helper ``first_lane``)."""
    path = tmp_path / f"row_linear_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(KERNEL.format(rule=rule, body=form) + HELPER)
    return str(path)


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("name", sorted(FOLLOWED))
def test_one_row_a_program_is_read_as_that_row(name: str, rule: str, tmp_path) -> None:
    built = tilelink.build(written(tmp_path, FOLLOWED[name], rule))
    said = " ".join(e.message for e in built.report.entries if e.status == "applied")
    assert "(tile rows row .. +1)" in said or "notifies once, after the loop" in said, built.report
    assert ("stores the same rows on every iteration" in said) == name.startswith("swept"), said
    plan = built.plans[0].launch
    assert [scale for _, scale, _ in plan.row_scales] == [("stride_ym",)], plan.row_scales
    assert plan.size_param == ("M" if name == "row loop" else "tl.num_programs(0)"), plan.size_param


def _linear(paths: list[tuple[str, str]], block: int, grid: int | None = None) -> float:
    """Each kernel's largest error against torch over two calls: 9 rows of 6 columns in blocks of ``block``, K = 10
    split over the ranks."""
    import torch

    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(5)
    M, N, K = 9, 6, 10
    x, w = torch.randint(-3, 4, (M, K), generator=g).float(), torch.randint(-3, 4, (N, K), generator=g).float()
    klo, khi = rows_of(rank, world, K)
    lo, hi = rows_of(rank, world, M)
    xr, wr = x[:, klo:khi].contiguous(), w[:, klo:khi].contiguous()
    error = 0.0
    for path, rule in paths:
        rows = (lo, hi) if rule == "reduce_scatter" else (0, M)
        for _ in range(2):
            y = torch.full((rows[1] - rows[0], N), float("nan"))
            module_at(path).row_linear[(grid or M,)](xr, wr, y, M, N, khi - klo, xr.stride(0), wr.stride(0),
                                                    y.stride(0), BLOCK_N=block, BLOCK_K=4)
            error = worst(error, (y - (x @ w.T)[rows[0]:rows[1]]).abs().max().item())
    return error


@pytest.mark.slow
def test_the_followed_spellings_equal_torch_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    """The swept forms store each row of 6 in two blocks of 4, the last half masked; the others store it in one block
    of 8, the persistent one on a grid of 4 programs over the 9 rows."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    swept = [(written(tmp_path, FOLLOWED[n], rule), rule) for n in ("swept", "swept by count")
             for rule in ("reduce_scatter", "all_reduce")]
    assert tilelink.spawn(_linear, 3, swept, 4) == [0.0, 0.0, 0.0]
    wide = [(written(tmp_path, FOLLOWED[n], rule), rule)
            for n in ("one block", "moved in place", "offsets local") for rule in ("reduce_scatter", "all_reduce")]
    assert tilelink.spawn(_linear, 2, wide, 8) == [0.0, 0.0]
    loop = [(written(tmp_path, FOLLOWED["row loop"], rule), rule) for rule in ("reduce_scatter", "all_reduce")]
    assert tilelink.spawn(_linear, 2, loop, 8, 4) == [0.0, 0.0]


def _refusals(one_block: str, branch: str) -> tuple[str, ...]:
    import torch

    x, w = torch.ones(8, 4), torch.ones(6, 4)
    kernel = module_at(one_block).row_linear

    def run(y, stride_ym=6, block=4, grid=8, kernel=kernel):
        return launch_refusal(lambda: kernel[(grid,)](x, w, y, 8, 6, 4, 4, 4, stride_ym, BLOCK_N=block, BLOCK_K=4))

    return (run(torch.zeros(4, 6)),  # a block of 4 columns, rows of 6
            run(torch.zeros(4, 8), stride_ym=8, block=8),  # rows padded to 8, the mask stops at 6
            run(torch.zeros(4, 6), stride_ym=7, block=8),  # a stride other than the output's rows
            run(torch.zeros(4, 6), block=8, kernel=module_at(branch).row_linear))


def test_a_call_that_leaves_part_of_a_row_unstored_is_refused(tmp_path) -> None:
    """Each row's channel counts its elements to the row's width: a block narrower than the row, a padded row, or a
    row no program stores would never complete it (a wait that times out); a stride other than the row's would store
    into other rows than the notify counts."""
    branch = FOLLOWED["one block"].replace(f"    {STORE}", f"    if row % 2 == 0:\n        {STORE}")
    narrow, padded, strided, skipped = tilelink.spawn(
        _refusals, 2, written(tmp_path, FOLLOWED["one block"], "reduce_scatter"),
        written(tmp_path, branch, "reduce_scatter"))[0]
    assert "the stores write 4 of the 6 elements of each row of 'y_ptr' in rows [0, 1)" in narrow, narrow
    assert "the stores write 6 of the 8 elements of each row of 'y_ptr'" in padded, padded
    assert "stride_ym" in strided and "ran" != strided, strided
    assert "no program stores rows [1, 2) of 'y_ptr'" in skipped, skipped


@pytest.mark.parametrize(("sweep", "cols"), [
    # a step of half the block: each column stored twice
    ("for off in range(0, N, BLOCK_N // 2):", "cols = off + tl.arange(0, BLOCK_N)"),
    # a block twice the step
    ("for off in range(0, N, BLOCK_N):", "cols = off + tl.arange(0, 2 * BLOCK_N)"),
    # columns that do not start at the loop's target
    ("for off in range(0, N, BLOCK_N):", "cols = 2 * off + tl.arange(0, BLOCK_N)"),
])
def test_a_sweep_whose_iterations_may_store_the_same_columns_is_refused(sweep: str, cols: str, tmp_path) -> None:
    with pytest.raises(AnnotationError, match="the loop at line 12 stores the same rows of 'y_ptr' on every "
                                              "iteration") as refused:
        tilelink.build(written(tmp_path, body("row = tl.program_id(0)", STORE, cols, sweep), "all_reduce"))
    assert "for off in range(0, N, BLOCK_N):` with `cols = off + tl.arange(0, BLOCK_N)" in refused.value.hint


@pytest.mark.parametrize(("store", "says"), [
    # no bound on the columns: they may run into the next row
    ("tl.store(y_ptr + row * stride_ym + cols, acc)", "its mask does not bound `cols` by the row's length"),
    # two stores of the row
    (f"{STORE}\n{STORE}", "may both write the same elements in one program"),
])
def test_other_row_stores_are_refused(store: str, says: str, tmp_path) -> None:
    with pytest.raises(AnnotationError) as refused:
        tilelink.build(written(tmp_path, body("row = tl.program_id(0)", store), "reduce_scatter"))
    assert says in str(refused.value) + (refused.value.hint or ""), refused.value


@pytest.mark.parametrize(("cols", "sweep", "says"), [
    # lanes that repeat a column: the notify counts lanes, and would count the column twice
    ("cols = tl.arange(0, BLOCK_N) // 2", None, "are not made as `start + tl.arange(0, BLOCK)`"),
    ("cols = tl.arange(0, BLOCK_N) % 4", None, "are not made as `start + tl.arange(0, BLOCK)`"),
    ("cols = tl.maximum(tl.arange(0, BLOCK_N), 2)", None, "are not made as `start + tl.arange(0, BLOCK)`"),
    # a start a helper makes: TileLink does not show it one value for every lane (here `[1, 0, 0, ...]`)
    ("cols = first_lane(BLOCK_N) + tl.arange(0, BLOCK_N)", None, "are not made as `start + tl.arange(0, BLOCK)`"),
    # a sweep's columns made after the store, or a step that leaves before it
    ("cols = off + tl.arange(0, BLOCK_N)", "for off in range(0, N, BLOCK_N):\n    if off > N:\n        break",
     "a step may leave it before the store"),
])
def test_row_columns_that_may_repeat_or_go_uncounted_are_refused(cols: str, sweep: str | None, says: str,
                                                                 tmp_path) -> None:
    with pytest.raises(AnnotationError) as refused:
        tilelink.build(written(tmp_path, body("row = tl.program_id(0)", STORE, cols, sweep), "reduce_scatter"))
    assert says in str(refused.value) + (refused.value.hint or ""), refused.value


def test_a_sweep_whose_columns_are_made_after_the_store_is_refused(tmp_path) -> None:
    """Its first step stores the columns made before the loop, its second the first step's again."""
    made = "        cols = off + tl.arange(0, BLOCK_N)\n"
    form = FOLLOWED["swept"].replace(made, "").replace(f"        {STORE}\n", f"        {STORE}\n{made}").replace(
        "    row = tl.program_id(0)\n", "    row = tl.program_id(0)\n    cols = tl.arange(0, BLOCK_N)\n")
    assert form.index(STORE) < form.index(made)
    with pytest.raises(AnnotationError, match="cannot tell that each iteration stores other columns"):
        tilelink.build(written(tmp_path, form, "all_reduce"))


def test_a_row_store_not_taken_as_one_row_says_why_not_of_blocks_of_rows(tmp_path) -> None:
    """A sweep whose start is bound again in the loop (`off = 0`) is no row TileLink reads; the refusal says which
    store and why it is not one row a program, not what reading its columns as a block of rows would need."""
    form = body("row = tl.program_id(0)", STORE, "cols = off + tl.arange(0, BLOCK_N)",
                "for off in range(0, N, BLOCK_N):\n    off = 0")
    with pytest.raises(AnnotationError) as refused:
        tilelink.build(written(tmp_path, form, "reduce_scatter"))
    said = str(refused.value)
    assert "cannot tell which rows of 'y_ptr' this store writes (pointer `y_ptr + row * stride_ym + cols`)" in said
    assert refused.value.hint.startswith("this store writes one row a program, `row` times `stride_ym`"), said
    assert "indexed by `cols` itself" not in said and "cols[:, None] * stride" not in said, said
