"""A store of one element a program at its id (`tl.store(y_ptr + row, y)`, `row = tl.program_id(0)`: the GEMV of a
decode step) is read as that row, one element, without `tile=`: its row count is the grid's programs along the axis,
or the bound of a `row < M` mask. The two forms run at worlds 1-4 and through their mutants in
``test_forms.py`` (``matvec_rows_rs``, ``matvec_rows_masked_ar``); here, what is read and what is not."""

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
def matvec(a_ptr, x_ptr, y_ptr, M, K, stride_am, BLOCK_K: tl.constexpr):
    row = {row}
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + row * stride_am + offs_k, mask=offs_k < K, other=0.0)
        x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
        acc += a * x
{store}
'''
STORE = "    tl.store(y_ptr + row, tl.sum(acc, axis=0))"


def written(tmp_path, rule: str = "reduce_scatter", row: str = "tl.program_id(0)", store: str = STORE) -> str:
    path = tmp_path / "matvec.py"
    path.write_text(KERNEL.format(rule=rule, row=row, store=store))
    return str(path)


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
@pytest.mark.parametrize(("row", "store", "size"), [
    ("tl.program_id(0)", STORE, "tl.num_programs(0)"),
    ("tl.program_id(axis=1).to(tl.int64)", STORE, "tl.num_programs(1)"),
    ("tl.program_id(0)", "    tl.store(y_ptr + row, tl.sum(acc, axis=0), mask=row < M)", "M"),
    ("tl.program_id(0)", "    tl.store(row + y_ptr, tl.sum(acc, axis=0))", "tl.num_programs(0)"),
    # through an alias bound once, or the pointer moved to the element in place (Liger's `loss_ptr += row`)
    ("tl.program_id(0)", "    y_ptrs = y_ptr + row\n    tl.store(y_ptrs, tl.sum(acc, axis=0))", "tl.num_programs(0)"),
    ("tl.program_id(0)", "    y_ptr += row\n    tl.store(y_ptr, tl.sum(acc, axis=0), mask=row < M)", "M"),
])
def test_one_element_a_program_is_its_row(rule: str, row: str, store: str, size: str, tmp_path) -> None:
    built = tilelink.build(written(tmp_path, rule, row, store))
    assert built.report.applied, [str(e) for e in built.report.entries]
    notify = [e.message for e in built.report.entries if "producer_tile_notify" in e.message]
    assert notify and "(tile rows row .. +1)" in notify[0], notify
    assert built.plans[0].launch.size_param == size
    line = 16 + len(store.splitlines())  # the store's
    assert built.plans[0].launch.row_scales == (("y_ptr", ("1",), line),), built.plans[0].launch.row_scales


@pytest.mark.parametrize(("row", "store"), [
    # not the program's id: which rows the programs store together is not known
    ("tl.program_id(0) * 2", STORE),
    # stored in a branch or a loop: a program may store its row twice, or not at all
    ("tl.program_id(0)", "    if M > 0:\n        tl.store(y_ptr + row, tl.sum(acc, axis=0))"),
    ("tl.program_id(0)", "    for _ in range(2):\n        tl.store(y_ptr + row, tl.sum(acc, axis=0))"),
    # a mask that is not the row's bound, or bound by a local
    ("tl.program_id(0)", "    tl.store(y_ptr + row, tl.sum(acc, axis=0), mask=K > 0)"),
    ("tl.program_id(0)", "    n = M - 1\n    tl.store(y_ptr + row, tl.sum(acc, axis=0), mask=row < n)"),
    # an alias bound in a branch, or twice; the pointer moved by something else too, or twice
    ("tl.program_id(0)", "    if M > 0:\n        y_ptrs = y_ptr + row\n    else:\n        y_ptrs = y_ptr + 1\n"
                         "    tl.store(y_ptrs, tl.sum(acc, axis=0))"),
    ("tl.program_id(0)", "    y_ptrs = y_ptr + row\n    y_ptrs = y_ptr + row\n"
                         "    tl.store(y_ptrs, tl.sum(acc, axis=0))"),
    ("tl.program_id(0)", "    y_ptr += 1\n    tl.store(y_ptr + row, tl.sum(acc, axis=0))"),
    ("tl.program_id(0)", "    y_ptr += row\n    y_ptr += row\n    tl.store(y_ptr, tl.sum(acc, axis=0))"),
    ("tl.program_id(0)", "    y_ptr += row * 2\n    tl.store(y_ptr, tl.sum(acc, axis=0))"),
])
def test_other_forms_are_refused_with_the_annotation_that_names_the_rows(row: str, store: str, tmp_path) -> None:
    with pytest.raises(AnnotationError) as refused:
        tilelink.build(written(tmp_path, row=row, store=store))
    assert "y_ptr" in str(refused.value), str(refused.value)
    assert "tile=(\"y_ptrs\"" not in str(refused.value), str(refused.value)  # a pointer is not a row


def test_a_row_bound_twice_is_refused(tmp_path) -> None:
    with pytest.raises(AnnotationError):
        tilelink.build(written(tmp_path, row="tl.program_id(0)\n    row = row + 0"))


def _refusals(path: str) -> tuple[str, str]:
    import torch

    kernel = module_at(path).matvec
    a, x = torch.ones(6, 4), torch.ones(4)
    wide = launch_refusal(lambda: kernel[(6,)](a, x, torch.zeros(6 // 2, 2), 6, 4, 4, BLOCK_K=4))
    longer = launch_refusal(lambda: kernel[(8,)](a, x, torch.zeros(3), 6, 4, 4, BLOCK_K=4))
    return wide, longer


def test_the_call_refuses_an_output_with_wider_rows_or_a_grid_past_them(tmp_path) -> None:
    wide, longer = tilelink.spawn(_refusals, 2, written(tmp_path))[0]
    assert "'y_ptr' is addressed one element a row at" in wide and "(shape (rows,) or (rows, 1))" in wide, wide
    assert "rank 0 must pass its output rows [0, 4) as y_ptr" in longer, longer


def test_the_notify_counts_the_one_element_the_address_writes(tmp_path) -> None:
    """A scalar address takes a value of any shape (a vector left unsummed broadcasts onto it) and writes one element:
    counted by the value's shape, the notify would add a block's worth to the row's channel and complete it before the
    other rows are stored."""
    store = "    tl.store(y_ptr + row, acc)"
    rewritten = tilelink.build(written(tmp_path, store=store)).rewritten["matvec"]
    assert "tlk_stored = tl.full((y_ptr + row).shape, 1, tl.int32)" in rewritten, rewritten


@pytest.mark.parametrize("store", [
    "    tl.store(y_ptr + row, tl.sum(acc, axis=0)) if row != 3 else tl.debug_barrier()",
    "    row > 2 and tl.store(y_ptr + row, tl.sum(acc, axis=0))",
    "    tl.store(y_ptr + row, tl.sum(acc, axis=0)); return",
])
def test_a_store_inside_an_expression_that_may_skip_it_is_refused(store: str, tmp_path) -> None:
    """The notify goes after the line: it would count the row where the expression skipped its store."""
    with pytest.raises(AnnotationError, match="is inside an expression .* that may skip it, or followed on its "
                                              "line by a `return`") as refused:
        tilelink.build(written(tmp_path, store=store))
    assert "write the store as a statement of its own line" in refused.value.hint, refused.value


def test_a_tile_store_inside_an_expression_is_refused_too(tmp_path) -> None:
    from tests.rules.matmul_variants import VARIANTS

    source = VARIANTS[0].source("reduce_scatter").replace("    tl.store(c_ptrs, c, mask=c_mask)\n",
                                                         "    tl.store(c_ptrs, c, mask=c_mask) if M > 3 else None\n")
    assert " if M > 3 else None" in source
    path = tmp_path / "gemm.py"
    path.write_text(source)
    with pytest.raises(AnnotationError, match="the store to 'c_ptr' is inside an expression"):
        tilelink.build(str(path))


def test_a_mask_bound_the_kernel_binds_again_is_not_the_row_count(tmp_path) -> None:
    store = "    M = M - 3\n    tl.store(y_ptr + row, tl.sum(acc, axis=0), mask=row < M)"
    with pytest.raises(AnnotationError, match="cannot tell which rows of 'y_ptr'"):
        tilelink.build(written(tmp_path, store=store))


def _unstored(path: str, grid: int, rows: int, m: int) -> str:
    import torch

    kernel = module_at(path).matvec
    a, x = torch.ones(8, 4), torch.ones(4)
    return launch_refusal(lambda: kernel[(grid,)](a, x, torch.zeros(rows), m, 4, 4, BLOCK_K=4))


def test_rows_no_program_stores_in_a_vector_output_are_refused_at_the_call(tmp_path) -> None:
    """Each row's channel counts one element: a grid short of the mask's bound, or the bound short of `size=`, leaves
    rows no program stores, whose waits would time out."""
    masked = "    tl.store(y_ptr + row, tl.sum(acc, axis=0), mask=row < M)"
    short = tilelink.spawn(_unstored, 2, written(tmp_path, "all_reduce", store=masked), 6, 8, 8)[0]
    assert "no program stores rows [6, 7) of 'y_ptr'" in short, short
    path = tmp_path / "sized.py"
    path.write_text(KERNEL.format(rule="all_reduce", row="tl.program_id(0)", store=masked).replace(
        'all_reduce("y_ptr")', 'all_reduce("y_ptr", size="K + 6")'))
    sized = tilelink.spawn(_unstored, 2, str(path), 8, 10, 6)[0]
    assert "no program stores rows [6, 7) of 'y_ptr'" in sized, sized


def test_a_store_whose_value_is_bound_builds(tmp_path) -> None:
    """`_ = tl.store(...)` runs the store as a statement does."""
    built = tilelink.build(written(tmp_path, store="    _ = tl.store(y_ptr + row, tl.sum(acc, axis=0))"))
    assert built.report.applied, [str(e) for e in built.report.entries]


def test_the_tile_order_is_kept_where_the_index_shares_its_line(tmp_path, monkeypatch) -> None:
    """The rotation goes after the line that binds the index: `row = tl.program_id(0); y_ptrs = y_ptr + row` would
    store the unrotated row's element at the rotated row's value."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = written(tmp_path, row="tl.program_id(0); y_ptrs = y_ptr + row",
                   store="    tl.store(y_ptrs, tl.sum(acc, axis=0))")
    built = tilelink.build(path)
    kept = [e.message for e in built.report.entries if e.status == "not applied"]
    assert kept and "row is bound at line 10 before other statements of that line" in kept[0], kept
    assert "tl_remap_tile" not in built.rewritten["matvec"]
    assert tilelink.spawn(_matvec, 2, path) == [0.0, 0.0]


def _matvec(path: str) -> float:
    import torch

    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(3)
    a, x = torch.randint(-3, 4, (9, 10), generator=g).float(), torch.randint(-3, 4, (10,), generator=g).float()
    klo, khi = rows_of(rank, world, 10)
    lo, hi = rows_of(rank, world, 9)
    ar = a[:, klo:khi].contiguous()
    error = 0.0
    for _ in range(2):
        y = torch.full((hi - lo,), float("nan"))
        module_at(path).matvec[(9,)](ar, x[klo:khi].contiguous(), y, 9, khi - klo, ar.stride(0), BLOCK_K=4)
        error = worst(error, (y - (a @ x)[lo:hi]).abs().max().item())
    return error
