"""Kernels that read one row a program, as Triton's softmax and layer-norm tutorials do
(tests/rules/forms/row_softmax.py and row_layer_norm.py), gathered along the rows: `row_start_ptr = input_ptr +
row_idx * input_row_stride` then `tl.load(row_start_ptr + col_offsets, mask=col_offsets < n_cols)` (softmax, its rows
counted by `tl.range(row_start, n_rows, row_step)`), and `X += row * stride` then `tl.load(X + cols, mask=cols < N)`
in three column loops (layer norm; it counts no rows: its grid does, one program a row). Each builds, waits for the
one row the program reads, and equals the plain kernel on the race-exposing schedule at worlds 2 and 3 (each rank
passing its rows; the row length checked at each call against the stride and the columns' bound). Columns that can
leave the row, a row that is not the program's own, and an unbounded column vector are refused."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.cases import launch_refusal, module_at, plain_module, rows_of, worst
from tests.rules.forms_cases import FORMS
from tests.rules.test_carried_accumulator import _generate
from tilelink.errors import AnnotationError

SOFTMAX = (FORMS / "row_softmax.py").read_text()
LAYER_NORM = (FORMS / "row_layer_norm.py").read_text()

ROWS, COLS = 37, 20


def _softmax(path: str) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(3))
    want = torch.full((ROWS, COLS), float("nan"))
    plain_module(path).softmax_kernel[(5,)](want, x, x.stride(0), want.stride(0), ROWS, COLS, BLOCK_SIZE=32,
                                           num_stages=1)
    kernel = module_at(path).softmax_kernel
    lo, hi = rows_of(rank, world, ROWS)
    error = 0.0
    for _ in range(2):
        got = torch.full((ROWS, COLS), float("nan"))
        kernel[(5,)](got, x[lo:hi].contiguous(), x.stride(0), got.stride(0), ROWS, COLS, BLOCK_SIZE=32,
                     num_stages=1)
        error = worst(error, (got - want).abs().max().item())
    return error


def _layer_norm(path: str, grid=(ROWS,)) -> float | str:
    """The rewritten layer norm on this rank's rows launched on ``grid`` against the plain kernel launched on
    ``(ROWS,)``: the largest difference, or what the call is refused with."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(ROWS, COLS, generator=g), torch.randn(COLS, generator=g), torch.randn(COLS, generator=g)

    def run(launch, xs):
        y = torch.full((ROWS, COLS), float("nan"))
        mean, rstd = torch.full((ROWS,), float("nan")), torch.full((ROWS,), float("nan"))
        launch(xs, y, w, b, mean, rstd, COLS, COLS, 1e-5, BLOCK_SIZE=8)
        return torch.cat([y.flatten(), mean, rstd])

    want = run(plain_module(path)._layer_norm_fwd_fused[(ROWS,)], x)
    kernel = module_at(path)._layer_norm_fwd_fused
    lo, hi = rows_of(rank, world, ROWS)
    error = 0.0
    try:
        for _ in range(2):
            error = worst(error, (run(kernel[grid], x[lo:hi].contiguous()) - want).abs().max().item())
    except tilelink.LaunchError as refused:
        return str(refused)
    return error


@pytest.mark.parametrize("source, run", [(SOFTMAX, _softmax), (LAYER_NORM, _layer_norm)],
                         ids=["softmax", "layer-norm"])
def test_one_row_a_program_waits_for_its_row_and_equals_the_plain_kernel(source, run, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    generated = _generate(source)
    (kernel,) = generated.rewritten.values()
    assert "consumer_tile_wait" in kernel and ", row" in kernel and " + 1," in kernel, kernel
    # a row that is the program's id is rotated as a block of rows is: this rank's rows first
    rotated = [str(e) for e in generated.report.entries if "rotated" in e.message]
    assert bool(rotated) == (source is LAYER_NORM), rotated
    path = tmp_path / "rows.py"
    path.write_text(source)
    for world in (2, 3):
        errors = tilelink.spawn(run, world, str(path))
        assert errors == [0.0] * world, (world, errors)


def _softmax_call(path: str, n_cols=COLS, stride=None, row_length: int = COLS) -> str:
    """What the rewritten softmax's call on this rank's rows is refused with, or "ran": rows of ``row_length``
    elements (of which the kernel reads ``COLS``), passed with ``stride`` (the rows' own by default)."""
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(ROWS, row_length)[:, :COLS]
    lo, hi = rows_of(rank, world, ROWS)
    y = torch.full((ROWS, COLS), float("nan"))
    return launch_refusal(lambda: module_at(path).softmax_kernel[(5,)](
        y, x[lo:hi], x.stride(0) if stride is None else stride, y.stride(0), ROWS, n_cols, BLOCK_SIZE=32,
        num_stages=1))


@pytest.mark.parametrize("n_cols, said", [
    (COLS + 1, "next rows"),  # the columns' bound past the row: the last column is the next row's first
    (COLS + 0.5, "not an int"),  # compared as a float: column COLS, the next row's first, gets through
], ids=["past-the-row", "float"])
def test_a_column_bound_past_the_row_is_refused_at_the_call(tmp_path, n_cols, said: str) -> None:
    path = tmp_path / "rows.py"
    path.write_text(SOFTMAX)
    errors = tilelink.spawn(_softmax_call, 2, str(path), n_cols)
    assert all(said in e for e in errors), errors


@pytest.mark.parametrize("old, new, message", [
    # the columns may start before the row: the end of the row before
    ("        col_offsets = tl.arange(0, BLOCK_SIZE)\n", "        col_offsets = tl.arange(0, BLOCK_SIZE) - 1\n",
     "cannot tell which rows"),
    # unmasked: the block of columns may run past the row
    ("        row = tl.load(input_ptrs, mask=mask, other=-float('inf'))\n", "        row = tl.load(input_ptrs)\n",
     "cannot tell which rows"),
    # the bound is not what the launch reads: a vector
    ("        mask = col_offsets < n_cols\n", "        mask = col_offsets < col_offsets + 1\n",
     "cannot tell which rows"),
    # the row is the next program's, not the one the loop counts
    ("        row_start_ptr = input_ptr + row_idx * input_row_stride\n",
     "        row_start_ptr = input_ptr + (row_idx + 1) * input_row_stride\n", "cannot tell which rows"),
    # the stride is a value the kernel computes: the launch cannot compare it with the row
    ("        row_start_ptr = input_ptr + row_idx * input_row_stride\n",
     "        row_start_ptr = input_ptr + row_idx * (input_row_stride // 2)\n", "cannot tell which rows"),
], ids=["negative-columns", "unmasked", "vector-bound", "next-row", "computed-stride"])
def test_columns_or_rows_that_can_leave_the_programs_row_are_refused(old: str, new: str, message: str) -> None:
    source = SOFTMAX.replace(old, new)
    assert source != SOFTMAX
    with pytest.raises(AnnotationError, match=message):
        _generate(source)


def _rows_grid(meta: dict) -> tuple[int]:
    return (ROWS,)


def test_rows_nothing_counts_are_counted_by_the_grid(tmp_path, monkeypatch) -> None:
    # the layer norm counts no rows: launched one program a row, the grid's programs are the gathered rows
    (plan,) = _generate(LAYER_NORM).plans
    assert plan.launch.size_param == "tl.num_programs(0)"
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "rows.py"
    path.write_text(LAYER_NORM)
    # a grid function of the arguments is evaluated as Triton does
    assert tilelink.spawn(_layer_norm, 2, str(path), _rows_grid) == [0.0, 0.0]
    # a grid of more programs than rows: the shards are not the rows of so many, on every rank
    said = tilelink.spawn(_layer_norm, 2, str(path), (2 * ROWS,))
    assert all("must pass rows [" in s and f"{2 * ROWS} rows (the grid's programs along axis 0" in s
               and "pass size= to the annotation" in s for s in said), said


def test_a_row_the_grid_does_not_count_says_what_to_pass() -> None:
    # the row is the program's place in a 2-D grid, flattened: not one axis's programs
    source = LAYER_NORM.replace("    row = tl.program_id(0)\n",
                                "    row = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)\n")
    assert source != LAYER_NORM
    with pytest.raises(AnnotationError, match="one row a program") as info:
        _generate(source)
    assert 'size="<the full row count>"' in info.value.hint


AUTOTUNED = LAYER_NORM.replace("@triton.jit\n", """@triton.autotune(configs=[triton.Config({"BLOCK_SIZE": 8}),
                             triton.Config({"BLOCK_SIZE": 16})], key=["N"])
@triton.jit
""")


def test_a_grid_the_launch_cannot_count_rows_from_is_refused_saying_what_to_pass(tmp_path) -> None:
    path = tmp_path / "rows.py"
    path.write_text(AUTOTUNED)
    kernel = module_at(str(path))._layer_norm_fwd_fused
    bound = dict(N=COLS, eps=1e-5)
    assert kernel.grid_size((ROWS, 2), bound, 0) == ROWS
    assert kernel.grid_size(lambda meta: (meta["N"] + ROWS - COLS,), bound, 0) == ROWS  # of the arguments
    # a count that changes with the configuration the autotuner picks
    with pytest.raises(tilelink.LaunchError, match="8 programs under the autotuning configuration BLOCK_SIZE=8, 16 "):
        kernel.grid_size(lambda meta: (meta["BLOCK_SIZE"],), bound, 0)
    with pytest.raises(tilelink.LaunchError, match="cannot evaluate the grid"):
        kernel.grid_size(lambda meta: (meta["M"],), bound, 0)
    # the gathered tensor is this rank's shard here and the gathered rows where Triton evaluates the grid
    with pytest.raises(tilelink.LaunchError, match="the grid or a heuristic reads 'X'"):
        kernel.grid_size(lambda meta: (meta["X"].shape[0],), dict(bound, X=torch.zeros(ROWS, COLS)), 0)
    with pytest.raises(tilelink.LaunchError, match=r"launch it as `_layer_norm_fwd_fused\[grid\]"):
        kernel.grid_size(None, bound, 0)


SMALL = """import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.all_gather("X", dim=0, size="M"))
@triton.jit
def kernel(X, Y, stride, N, M, SHIFT, BLOCK: tl.constexpr):
    row = tl.program_id(0)
{body}
    tl.store(Y + row * BLOCK + tl.arange(0, BLOCK), v)
"""


@pytest.mark.parametrize("body", [
    # the address took the columns shifted by SHIFT, the mask bounds the ones bound after it
    """    cols = tl.arange(0, BLOCK) + SHIFT
    p = X + row * stride + cols
    cols = tl.arange(0, BLOCK)
    v = tl.load(p, mask=cols < N, other=0.)""",
    # the mask made once before the loop that moves the columns: the last steps read the next row
    """    cols = tl.arange(0, 8)
    mask = cols < N
    acc = tl.zeros([8], dtype=tl.float32)
    for off in range(0, N, 8):
        acc += tl.load(X + row * stride + cols, mask=mask, other=0.)
        cols = cols + 8
    v = tl.sum(acc, axis=0) + tl.zeros([BLOCK], dtype=tl.float32)""",
    # the alias made before the tensor is advanced to the row: it reads row 0
    """    cols = tl.arange(0, BLOCK)
    p = X + cols
    X += row * stride
    v = tl.load(p, mask=cols < N, other=0.)""",
    # four rows, not one
    """    rows = row * 4 + tl.arange(0, 4)
    cols = tl.arange(0, 4) * 0
    w = tl.load(X + rows * stride + cols, mask=cols < N, other=0.)
    v = tl.sum(w, axis=0) + tl.zeros([BLOCK], dtype=tl.float32)""",
], ids=["columns-rebound", "mask-before-loop", "alias-before-advance", "vector-row"])
def test_a_row_or_columns_that_are_not_the_loads_own_are_refused(body: str) -> None:
    with pytest.raises(AnnotationError) as info:
        _generate(SMALL.format(body=body))
    if "SHIFT" in body:  # the refusal says what moved
        assert "`cols` is bound again between where the address reads it and the load" in info.value.hint


@pytest.mark.parametrize("mask", ["cols <= N - 1", "N > cols", "N - 1 >= cols"])
def test_the_columns_bound_may_be_written_either_way(mask: str) -> None:
    body = f"""    cols = tl.arange(0, BLOCK)
    v = tl.load(X + row * stride + cols, mask={mask}, other=0.)"""
    generated = _generate(SMALL.format(body=body))
    (plan,) = generated.plans
    bounds = {terms for _, terms, stride, _ in plan.launch.row_bounds if stride == "1"}
    assert bounds == {((False, ("N",)),) if "- 1" not in mask else ((False, ("N",)), (True, ("1",)), (False, ("1",)))}


SWIGLU = '''import triton
import triton.language as tl
import tilelink


@triton.jit
def silu(x):
    return x * tl.sigmoid(x)


@tilelink.overlap(tilelink.all_gather(("a_ptr", "b_ptr"), dim=0))
@triton.jit
def _swiglu_forward_kernel(a_ptr, b_ptr, c_ptr, stride, n_cols: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    program_id = tl.program_id(0).to(tl.int64)
    a_ptr += program_id * stride
    b_ptr += program_id * stride
    c_ptr += program_id * stride
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    a_row = tl.load(a_ptr + col_offsets, mask=mask, other=0).to(tl.float32)
    b_row = tl.load(b_ptr + col_offsets, mask=mask, other=0)
    c_row = silu(a_row).cast(b_row.dtype) * b_row
    tl.store(c_ptr + col_offsets, c_row, mask=mask)
'''


def test_a_local_named_program_id_holds_a_value() -> None:
    # Liger's row kernels name the program's id `program_id`: a value, not the function read through another name
    generated = _generate(SWIGLU)
    assert "consumer_tile_wait" in generated.rewritten["_swiglu_forward_kernel"]
    aliased = SWIGLU.replace("    program_id = tl.program_id(0).to(tl.int64)\n",
                             "    pf = tl.program_id\n    program_id = pf(0).to(tl.int64)\n")
    with pytest.raises(AnnotationError, match="`pf`"):  # the function through another name: still refused
        _generate(aliased)


CONSTEXPR_STRIDE = SOFTMAX.replace("def softmax_kernel(output_ptr, input_ptr, input_row_stride,",
                                   "def softmax_kernel(output_ptr, input_ptr, input_row_stride: tl.constexpr,")


def test_a_constexpr_row_stride_is_read_and_checked_at_each_call(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    assert CONSTEXPR_STRIDE != SOFTMAX
    path = tmp_path / "rows.py"
    path.write_text(CONSTEXPR_STRIDE)
    assert tilelink.spawn(_softmax, 2, str(path)) == [0.0, 0.0]
    # a row stride of COLS + 4: not the gathered buffer's rows
    said = tilelink.spawn(_softmax_call, 2, str(path), COLS, None, COLS + 4)
    assert all("apart" in s for s in said), said


TWO_PASSES = """    acc = tl.zeros([8], dtype=tl.float32)
    for off in range(0, N, 8):
        cols = off + tl.arange(0, 8)
        mask = cols < N
        acc += tl.load(X + row * stride + cols, mask=mask, other=0.)
    for off in range(0, N, 8):
        cols = off + tl.arange(0, 8)
        {second}
        acc += tl.load(X + row * stride + cols, mask=mask, other=0.) * 2
    v = tl.sum(acc, axis=0) + tl.zeros([BLOCK], dtype=tl.float32)"""


def _two_passes(path: str) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(6))

    def run(kernel, xs):
        y = torch.full((ROWS, 32), float("nan"))
        kernel[(ROWS,)](xs, y, COLS, COLS, ROWS, 0, BLOCK=32)
        return y

    want = run(plain_module(path).kernel, x)
    lo, hi = rows_of(rank, world, ROWS)
    return (run(module_at(path).kernel, x[lo:hi].contiguous()) - want).abs().max().item()


def test_a_mask_bound_in_each_of_two_column_loops_is_read_in_each(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = SMALL.format(body=TWO_PASSES.format(second="mask = cols < N"))
    assert "consumer_tile_wait" in _generate(source).rewritten["kernel"]
    path = tmp_path / "two_passes.py"
    path.write_text(source)
    assert tilelink.spawn(_two_passes, 2, str(path)) == [0.0, 0.0]
    # the second loop's columns under the first loop's mask: not bounded where they are read
    with pytest.raises(AnnotationError):
        _generate(SMALL.format(body=TWO_PASSES.format(second="pass")))


def test_the_position_function_read_through_a_module_name_is_refused() -> None:
    # a module-level alias of the function, and the function imported under its name beside a local of that name
    # (a read before the local is bound finds the module's)
    aliased = SWIGLU.replace("import tilelink\n", "import tilelink\n\nPF = tl.program_id\n", 1).replace(
        "    program_id = tl.program_id(0).to(tl.int64)\n", "    program_id = PF(0).to(tl.int64)\n")
    with pytest.raises(AnnotationError, match="`PF"):
        _generate(aliased)
    imported = SWIGLU.replace("import tilelink\n", "import tilelink\nfrom triton.language import program_id\n", 1)
    with pytest.raises(AnnotationError, match="used without being called"):
        _generate(imported)


def test_a_bool_row_stride_is_read_as_its_int_at_the_call(tmp_path) -> None:
    path = tmp_path / "rows.py"
    path.write_text(SOFTMAX)
    said = tilelink.spawn(_softmax_call, 2, str(path), COLS, True)  # `row_idx * True` is `row_idx`: not a row apart
    assert all("addressed 1 elements apart" in s for s in said), said


SIZED = LAYER_NORM.replace('all_gather("X", dim=0)', 'all_gather("X", dim=0, size="M")').replace(
    "N, eps, BLOCK_SIZE: tl.constexpr)", "N, eps, M, BLOCK_SIZE: tl.constexpr)")


def _short_grid(path: str) -> str:
    """The sized layer norm launched on fewer programs than rows: what the call is refused with, or "ran"."""
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(ROWS, COLS)
    lo, hi = rows_of(rank, world, ROWS)
    y, mean, rstd = torch.zeros(ROWS, COLS), torch.zeros(ROWS), torch.zeros(ROWS)
    return launch_refusal(lambda: module_at(path)._layer_norm_fwd_fused[(ROWS // 2,)](
        x[lo:hi].contiguous(), y, torch.ones(COLS), torch.zeros(COLS), mean, rstd, COLS, COLS, 1e-5, ROWS,
        BLOCK_SIZE=8))


@pytest.mark.parametrize("row", ["tl.program_id(0).to(tl.int64)", "tl.cast(tl.program_id(0), tl.int64)"])
def test_a_widened_row_is_rotated_under_the_grids_check(row: str, tmp_path) -> None:
    # rotated among the M rows, the programs of a grid shorter than M would compute other rows than as written
    source = SIZED.replace("    row = tl.program_id(0)\n", f"    row = {row}\n")
    assert source != SIZED and SIZED != LAYER_NORM
    path = tmp_path / "rows.py"
    path.write_text(source)
    said = tilelink.spawn(_short_grid, 2, str(path))
    assert all("the tile order rotates the tile index" in s and f"gives it {ROWS // 2} of them" in s
               for s in said), said


@pytest.mark.parametrize("cast", ["stride.to(tl.int64)", "tl.cast(stride, tl.int64)"])
def test_a_row_stride_widened_in_the_kernel_is_read_as_passed(cast: str, tmp_path, monkeypatch) -> None:
    # vLLM and Liger widen their strides (`stride = stride.to(tl.int64)`): the same value, which the launch checks
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = LAYER_NORM.replace("    row = tl.program_id(0)\n", f"    stride = {cast}\n    row = tl.program_id(0)\n")
    assert source != LAYER_NORM
    path = tmp_path / "rows.py"
    path.write_text(source)
    assert tilelink.spawn(_layer_norm, 2, str(path)) == [0.0, 0.0]
    # a narrowing cast may change it: not the argument the launch reads
    with pytest.raises(AnnotationError):
        _generate(source.replace(cast, "stride.to(tl.int16)"))


def test_a_row_stride_through_a_function_it_does_not_read_names_the_call() -> None:
    # unsloth's cross entropy: `logits_ptr += row_idx * triton_cast(logits_row_stride, tl.int64)`, `triton_cast`
    # imported from its utilities
    source = LAYER_NORM.replace("X += row * stride", "X += row * triton_cast(stride, tl.int64)")
    assert source != LAYER_NORM
    with pytest.raises(AnnotationError) as info:
        _generate(source)
    assert "its row's stride is `triton_cast(stride, tl.int64)`, a call TileLink does not read" in info.value.hint
    assert "`tl.cast(stride, tl.int64)`" in info.value.hint, info.value


HEURISTIC = LAYER_NORM.replace('tilelink.all_gather("X", dim=0)', 'tilelink.all_gather("X", dim=0, size="M")').replace(
    "stride, N, eps,", "stride, N, M, eps,").replace(
    "@triton.jit\n", '@triton.heuristics({"BLOCK_SIZE": lambda args: 8 if args["X"].shape[0] < args["M"] else 16})\n'
                     "@triton.jit\n")


def test_the_checks_evaluate_grids_and_heuristics_on_the_tensors_the_launch_gives(tmp_path) -> None:
    # Triton evaluates them on the rewritten kernel's arguments: the gathered rows, not the caller's shard
    assert HEURISTIC.count("@triton.heuristics") == 1 and "stride, N, M, eps," in HEURISTIC
    path = tmp_path / "rows.py"
    path.write_text(HEURISTIC)
    kernel = module_at(str(path))._layer_norm_fwd_fused
    shard = torch.zeros(ROWS // 2, COLS)
    bound = dict(X=shard, N=COLS, M=ROWS, eps=1e-5)
    seen = kernel.launcher.as_launched(bound, (ROWS,))
    assert seen["X"].shape == (ROWS, COLS) and seen["X"].dtype == shard.dtype and seen["X"].is_contiguous()
    assert bound["X"] is shard  # the call's own arguments are left as they are
    from tilelink.rules.launch import metas

    assert [meta["BLOCK_SIZE"] for meta, _ in metas(kernel.kernel, seen)] == [16]
    assert [meta["BLOCK_SIZE"] for meta, _ in metas(kernel.kernel, bound)] == [8]
    # neither a grid function nor a heuristic to evaluate: nothing is made
    path = tmp_path / "untuned.py"
    path.write_text(HEURISTIC.replace(HEURISTIC[HEURISTIC.index("@triton.heuristics"):HEURISTIC.index("@triton.jit")],
                                      ""))
    untuned = module_at(str(path))._layer_norm_fwd_fused
    assert untuned.launcher.as_launched(bound, (ROWS,)) is bound
    assert untuned.launcher.as_launched(bound, lambda meta: (ROWS,))["X"].shape == (ROWS, COLS)


#: the row through a straight-line helper, as FlagGems writes every program id (`row = tle.program_id(0)`)
HELPER = LAYER_NORM.replace("@tilelink.overlap", "@triton.jit\ndef program_id(axis: tl.constexpr):\n"
                                                 "    return tl.program_id(axis).to(tl.int64)\n\n\n@tilelink.overlap",
                            1).replace("    row = tl.program_id(0)\n", "    row = program_id(0)\n")


def test_a_row_read_through_a_straight_line_helper_is_the_programs_own(tmp_path, monkeypatch) -> None:
    assert HELPER.count("row = program_id(0)") == 1 and "def program_id(axis" in HELPER
    generated = _generate(HELPER)
    (plan,) = generated.plans
    assert plan.launch.size_param == "tl.num_programs(0)", plan.launch.size_param
    assert any("row rotated" in str(e) for e in generated.report.entries), generated.report.entries
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "rows.py"
    path.write_text(HELPER)
    assert tilelink.spawn(_layer_norm, 2, str(path)) == [0.0, 0.0]


def test_a_row_from_a_helper_with_an_effect_is_refused() -> None:
    # the helper takes the next row from a counter: the wait's placement would call it again, and take another row
    source = HELPER.replace("    return tl.program_id(axis).to(tl.int64)\n",
                            "    return tl.atomic_add(axis, 1)\n").replace("def program_id(axis: tl.constexpr):",
                                                                            "def program_id(axis):").replace(
        "    row = program_id(0)\n", "    row = program_id(Mean)\n")
    with pytest.raises(AnnotationError, match=r"start at `program_id\(Mean\)`, which calls `program_id`, a function "
                                              r"TileLink does not read") as info:
        _generate(source)
    assert "with no atomic or store" in info.value.hint, info.value.hint
    # an effect in a binding the helper's value leaves out (`t = tl.atomic_add(...)`, then `return tl.program_id(0)`)
    # keeps it unread too: called again where the wait is placed, it would take another counter value
    dead = HELPER.replace("    return tl.program_id(axis).to(tl.int64)\n",
                          "    t = tl.atomic_add(axis, 1)\n    return tl.program_id(0).to(tl.int64)\n").replace(
        "def program_id(axis: tl.constexpr):", "def program_id(axis):").replace(
        "    row = program_id(0)\n", "    row = program_id(Mean)\n")
    with pytest.raises(AnnotationError, match=r"which calls `program_id`, a function TileLink does not read"):
        _generate(dead)


#: the row's offset bound to a local of its own, as SGLang's fused RMSNorms write it (`input_start = pid *
#: hidden_dim`, then `activ_ptr + input_start + offsets`)
OFFSET = LAYER_NORM.replace("    Y += row * stride\n    X += row * stride\n",
                            "    start = row * stride\n    Y += start\n    X += start\n")


def test_a_row_offset_bound_to_a_local_of_its_own_is_read_as_its_product(tmp_path, monkeypatch) -> None:
    assert OFFSET != LAYER_NORM
    (plan,) = _generate(OFFSET).plans
    assert plan.launch.size_param == "tl.num_programs(0)", plan.launch.size_param
    assert plan.launch.row_scales and all(f == ("stride",) for _, f, _ in plan.launch.row_scales), plan.launch
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "rows.py"
    path.write_text(OFFSET)
    assert tilelink.spawn(_layer_norm, 2, str(path)) == [0.0, 0.0]
    # bound twice: the offset is read as its product only where it is bound once
    moved = OFFSET.replace("    X += start\n", "    X += start\n    start = start + 1\n")
    with pytest.raises(AnnotationError):
        _generate(moved)


HELPER_MODULE = '''import triton
import triton.language as tl


@triton.jit
def program_id(axis: tl.constexpr):
    return tl.program_id(axis).to(tl.int64)


@triton.jit
def _halved(axis: tl.constexpr):
    return tl.program_id(axis) // 2
'''


def test_a_helper_of_an_imported_module_is_read_only_where_that_module_binds_it_once(tmp_path) -> None:
    from tilelink.annotations import requests_in
    from tilelink.codegen import generate

    source = HELPER.replace("@triton.jit\ndef program_id(axis: tl.constexpr):\n"
                            "    return tl.program_id(axis).to(tl.int64)\n\n\n", "").replace(
        "import tilelink\n", "import tilelink\nimport tle_helpers as tle\n").replace(
        "    row = program_id(0)\n", "    row = tle.program_id(0)\n")
    assert "row = tle.program_id(0)" in source and "def program_id" not in source
    path = tmp_path / "rows.py"
    path.write_text(source)
    (tmp_path / "tle_helpers.py").write_text(HELPER_MODULE)
    (plan,) = generate(source, str(path), requests_in(source, str(path))).plans
    assert plan.launch.size_param == "tl.num_programs(0)", plan.launch.size_param
    # bound again after its `def`: the module's `program_id` is whatever ran last, here two programs a row
    (tmp_path / "tle_helpers.py").write_text(HELPER_MODULE + "\n\nprogram_id = _halved\n")
    with pytest.raises(AnnotationError, match=r"which calls `tle.program_id`, a function TileLink does not read"):
        generate(source, str(path), requests_in(source, str(path)))


def test_a_stand_in_for_the_launched_tensor_has_its_layout_and_device_and_no_values(tmp_path) -> None:
    path = tmp_path / "rows.py"
    path.write_text(HEURISTIC)
    kernel = module_at(str(path))._layer_norm_fwd_fused
    seen = kernel.launcher.as_launched(dict(X=torch.zeros(ROWS // 2, COLS), N=COLS, M=ROWS, eps=1e-5), (ROWS,))["X"]
    assert (seen.shape, seen.stride(), seen.dim(), seen.numel()) == ((ROWS, COLS), (COLS, 1), 2, ROWS * COLS)
    assert seen.is_cpu and not seen.is_cuda and seen.device == torch.device("cpu") and seen.element_size() == 4
    assert (seen.itemsize, seen.nbytes, seen.storage_offset(), seen.is_floating_point()) == (4, 4 * ROWS * COLS, 0,
                                                                                          True)
    from tilelink.rules.launch import ReadsValues

    with pytest.raises(ReadsValues):
        seen.abs()


VALUES = HEURISTIC.replace('lambda args: 8 if args["X"].shape[0] < args["M"] else 16',
                           'lambda args: 8 if args["X"].abs().max().item() < 100 else 16')


def test_a_heuristic_that_reads_the_values_of_the_gathered_tensor_is_refused_at_the_call(tmp_path,
                                                                                        monkeypatch) -> None:
    # Triton evaluates it on the gathered buffer before the launch, while the peers' rows are still in flight
    assert VALUES != HEURISTIC
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "rows.py"
    path.write_text(VALUES)
    said = tilelink.spawn(_layer_norm_sized, 2, str(path))
    assert all("the @triton.heuristics value 'BLOCK_SIZE' reads `.abs` of the tensors TileLink gives the rewritten "
               "kernel in place of 'X'" in s for s in said), said


def _layer_norm_sized(path: str) -> str:
    """The sized layer norm (`size="M"`) on this rank's rows, its block left to the heuristic: what the call is
    refused with, or "ran"."""
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(ROWS, COLS, generator=g), torch.randn(COLS, generator=g), torch.randn(COLS, generator=g)
    lo, hi = rows_of(rank, world, ROWS)
    y = torch.full((ROWS, COLS), float("nan"))
    mean, rstd = torch.full((ROWS,), float("nan")), torch.full((ROWS,), float("nan"))
    kernel = module_at(path)._layer_norm_fwd_fused
    return launch_refusal(lambda: kernel[(ROWS,)](x[lo:hi].contiguous(), y, w, b, mean, rstd, COLS, COLS, ROWS, 1e-5))


def test_a_host_descriptor_is_seen_over_the_gathered_rows_by_a_grid_function() -> None:
    # the launch passes the same descriptor (block shape, padding) over the gathered rows (`rebuilt`)
    from triton.tools.tensor_descriptor import TensorDescriptor

    kernel = module_at(str(FORMS / "gemm_host_descriptor_ag.py")).matmul_descriptor_persistent
    shard = torch.zeros(ROWS // 2, COLS)
    desc = TensorDescriptor(shard, list(shard.shape), list(shard.stride()), [8, 16])
    seen = kernel.launcher.as_launched(dict(a_desc=desc, M=ROWS, N=8, K=COLS), lambda meta: (1,))["a_desc"]
    assert (list(seen.shape), list(seen.strides), list(seen.block_shape)) == ([ROWS, COLS], [COLS, 1], [8, 16])
    assert tuple(seen.base.shape) == (ROWS, COLS) and desc.shape == [ROWS // 2, COLS]


def test_a_row_offset_local_widened_where_it_is_bound_is_read_as_its_product() -> None:
    widened = OFFSET.replace("    start = row * stride\n", "    start = (row * stride).to(tl.int64)\n")
    assert widened != OFFSET
    (plan,) = _generate(widened).plans
    assert plan.launch.size_param == "tl.num_programs(0)" and plan.launch.row_scales, plan.launch


ROW_AND_COLUMNS = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def scale_rows(x_ptr, y_ptr, stride_x, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    offs = row * stride_x + cols
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, x * 2.0, mask=mask)
'''


def _scaled_rows(path: str) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    x = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(6))
    lo, hi = rows_of(rank, world, ROWS)
    kernel = module_at(path).scale_rows
    error = 0.0
    for _ in range(2):
        y = torch.full((ROWS, COLS), float("nan"))
        kernel[(ROWS,)](x[lo:hi].contiguous(), y, COLS, COLS, BLOCK=32)
        error = worst(error, (y - 2 * x).abs().max().item())
    return error


def test_a_row_offset_bound_with_its_columns_in_one_local_is_read_as_its_terms(tmp_path, monkeypatch) -> None:
    (plan,) = _generate(ROW_AND_COLUMNS).plans
    assert plan.launch.size_param == "tl.num_programs(0)", plan.launch.size_param
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "rows.py"
    path.write_text(ROW_AND_COLUMNS)
    assert tilelink.spawn(_scaled_rows, 2, str(path)) == [0.0, 0.0]
    # the columns less one: the terms are not a row's product and its columns
    with pytest.raises(AnnotationError):
        _generate(ROW_AND_COLUMNS.replace("offs = row * stride_x + cols", "offs = row * stride_x - cols"))


#: Liger's DyT form: the columns a product of the program's place along axis 0 (`col = pid0 * BLOCK_N +
#: tl.arange(0, BLOCK_N)`), the row the program's place along axis 1; the columns stay one vector, not a row's offset
COLUMN_BLOCKS = '''import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("X", dim=0))
@triton.jit
def scale_blocks(X, Y, Gamma, N: tl.constexpr, BLOCK_N: tl.constexpr):
    col = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = col < N
    row = tl.program_id(1)
    X += row * N
    Y += row * N
    gamma = tl.load(Gamma + col, mask=mask, other=0.0)
    x = tl.load(X + col, mask=mask, other=0.0)
    tl.store(Y + col, x * gamma, mask=mask)
'''


def _scaled_blocks(path: str) -> float:
    rank, world = tilelink.rank(), tilelink.world_size()
    g = torch.Generator().manual_seed(8)
    x, gamma = torch.randn(ROWS, COLS, generator=g), torch.randn(COLS, generator=g)
    lo, hi = rows_of(rank, world, ROWS)
    kernel = module_at(path).scale_blocks
    error = 0.0
    for _ in range(2):
        y = torch.full((ROWS, COLS), float("nan"))
        kernel[(3, ROWS)](x[lo:hi].contiguous(), y, gamma, N=COLS, BLOCK_N=8)
        error = worst(error, (y - x * gamma).abs().max().item())
    return error


def test_columns_made_of_a_product_stay_the_columns_beside_a_row_on_another_axis(tmp_path, monkeypatch) -> None:
    (plan,) = _generate(COLUMN_BLOCKS).plans
    assert plan.launch.size_param == "tl.num_programs(1)", plan.launch.size_param
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "blocks.py"
    path.write_text(COLUMN_BLOCKS)
    assert tilelink.spawn(_scaled_blocks, 2, str(path)) == [0.0, 0.0]


def test_a_helper_a_star_import_after_it_may_bind_again_is_not_read() -> None:
    # the import runs after the `def`, and may bind `program_id` to whatever its module has of that name
    starred = HELPER.replace("\n\n@tilelink.overlap",
                             "\n\nfrom os.path import *  # noqa: F403\n\n\n@tilelink.overlap", 1)
    assert starred != HELPER
    with pytest.raises(AnnotationError, match=r"which calls `program_id`, a function TileLink does not read"):
        _generate(starred)
