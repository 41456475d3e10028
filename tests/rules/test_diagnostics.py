"""Bad annotations stop with the user's file, line and column and what to write instead."""

from __future__ import annotations

import textwrap

import pytest

from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = """\
import triton
import triton.language as tl
import tilelink

"""

GEMM_BODY = """\
def kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    a = tl.load(a_ptr + offs_m[:, None] * K + offs_n[None, :], mask=offs_m[:, None] < M)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], a, mask=offs_m[:, None] < M)
"""


def _error(source: str) -> AnnotationError:
    text = HEAD + textwrap.dedent(source)
    with pytest.raises(AnnotationError) as info:
        generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    return info.value


def test_missing_parameter_names_the_parameters() -> None:
    err = _error('@tilelink.overlap(tilelink.all_gather("x_ptr"))\n@triton.jit\n' + GEMM_BODY)
    assert err.file == "user_kernels.py" and err.line == 5
    assert "'x_ptr', which is not a parameter of 'kernel'" in str(err) and "a_ptr, b_ptr" in str(err)
    assert "what to do:" in str(err)


def test_tensor_never_loaded() -> None:
    err = _error('@tilelink.overlap(tilelink.all_gather("b_ptr"))\n@triton.jit\n' + GEMM_BODY)
    assert "never loads from 'b_ptr'" in str(err) and err.line is not None


def test_tensor_never_stored() -> None:
    err = _error('@tilelink.overlap(tilelink.reduce_scatter("a_ptr"))\n@triton.jit\n' + GEMM_BODY)
    assert "never stores to 'a_ptr'" in str(err)


def test_tile_that_cannot_be_inferred_points_at_the_load() -> None:
    err = _error('''
        @tilelink.overlap(tilelink.all_gather("a_ptr"))
        @triton.jit
        def kernel(a_ptr, idx_ptr, c_ptr, BLOCK: tl.constexpr):
            rows = tl.load(idx_ptr + tl.arange(0, BLOCK))
            a = tl.load(a_ptr + rows)
            tl.store(c_ptr + tl.arange(0, BLOCK), a)
        ''')
    assert err.line == 10 and err.column == 9
    # the rows are loaded from idx_ptr: the fix is a dynamic mapping, not a tile
    assert "pass index=\"idx_ptr\"" in err.hint and "cannot tell which rows" in str(err), err


def test_missing_size_parameter_asks_for_size() -> None:
    err = _error('''
        @tilelink.overlap(tilelink.all_gather("a_ptr"))
        @triton.jit
        def kernel(a_ptr, c_ptr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(c_ptr + offs, tl.load(a_ptr + offs))
        ''')
    assert 'size="M"' in err.hint


def test_size_given_explicitly_is_accepted() -> None:
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.all_gather("a_ptr", size="n_rows"))
        @triton.jit
        def kernel(a_ptr, c_ptr, n_rows, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(c_ptr + offs, tl.load(a_ptr + offs))
        ''')
    gen = generate(text, "k.py", requests_in(text, "k.py"))
    assert gen.plans[0].launch.size_param == "n_rows"


def test_tile_override_is_used() -> None:
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.all_gather("a_ptr", tile=("row0", "BLOCK"), size="M"))
        @triton.jit
        def kernel(a_ptr, c_ptr, M, BLOCK: tl.constexpr):
            row0 = tl.program_id(0) * BLOCK
            tl.store(c_ptr + row0 + tl.arange(0, BLOCK), tl.load(a_ptr + row0 + tl.arange(0, BLOCK)))
        ''')
    gen = generate(text, "k.py", requests_in(text, "k.py"))
    body = gen.rewritten["kernel"]
    assert "tl_channels_of_rows(\n        row0, row0 + BLOCK" in body


def test_a_tile_over_rows_read_from_an_index_is_refused() -> None:
    # the rows come from a loaded index, so they may be any rows: the wait for [row0, row0 + BLOCK) covers none
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.all_gather("a_ptr", tile=("row0", "BLOCK"), size="M"))
        @triton.jit
        def kernel(a_ptr, idx_ptr, c_ptr, M, BLOCK: tl.constexpr):
            row0 = tl.program_id(0) * BLOCK
            rows = tl.load(idx_ptr + tl.arange(0, BLOCK))
            tl.store(c_ptr + rows, tl.load(a_ptr + row0 + rows))
        ''')
    with pytest.raises(AnnotationError) as info:
        generate(text, "k.py", requests_in(text, "k.py"))
    err = info.value
    assert (err.file, err.line, err.column) == ("k.py", 11, 28), err
    assert "this load of 'a_ptr' reads, along dim 0, rows that TileLink cannot find" in str(err), err
    assert "tile=('row0', 'BLOCK') states rows [row0, row0 + BLOCK)" in str(err), err


def test_not_a_triton_kernel() -> None:
    err = _error('@tilelink.overlap(tilelink.all_gather("a_ptr"))\n' + GEMM_BODY)
    assert "is not a @triton.jit function" in str(err) and err.line == 5 and "@triton.jit" in err.hint


def test_two_specs_on_one_kernel_is_refused_with_a_way_out() -> None:
    err = _error('@tilelink.overlap(tilelink.all_gather("a_ptr"), tilelink.reduce_scatter("c_ptr"))\n'
                 '@triton.jit\n' + GEMM_BODY)
    assert "2 specs" in str(err) and "split the kernel" in err.hint


def test_reduce_scatter_store_in_a_branch_is_notified_there_with_a_note() -> None:
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
        @triton.jit
        def kernel(a_ptr, c_ptr, M, FLAG: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(a_ptr + offs, mask=offs < M)
            if FLAG:
                tl.store(c_ptr + offs, x, mask=offs < M)
        ''')
    generated = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    lines = generated.rewritten["kernel"].splitlines()
    at = next(i for i, line in enumerate(lines) if "tl.store(c_ptr" in line)
    assert lines[at + 1].startswith(" " * 8 + "# tilelink: notify"), generated.rewritten["kernel"]
    assert any("in a branch of the `if` at line 11" in e.message for e in generated.report.entries)


def test_reduce_scatter_store_in_an_inner_loop_is_refused() -> None:
    err = _error('''
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
        @triton.jit
        def kernel(a_ptr, c_ptr, M, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(a_ptr + offs, mask=offs < M)
            for i in range(0, 2):
                if i == 0:
                    tl.store(c_ptr + offs, x, mask=offs < M)
        ''')
    assert "must be a statement of its own" in str(err) and err.line == 13 and "nested block" in err.hint


def test_reduce_scatter_descriptor_store_without_a_literal_box() -> None:
    err = _error('''
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
        @triton.jit
        def kernel(a_ptr, c_ptr, M, N, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK, BLOCK])
            offsets = [pid * BLOCK, 0]
            x = tl.load(a_ptr + tl.arange(0, BLOCK)[:, None] + tl.arange(0, BLOCK)[None, :])
            c_desc.store(offsets, x)
        ''')
    assert "cannot tell which rows of 'c_ptr' this store writes (descriptor `c_desc`)" in str(err)
    assert err.line == 13 and "literal offsets list" in err.hint


def test_reduce_scatter_other_dim_unsupported() -> None:
    err = _error('@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=1))\n@triton.jit\n' + GEMM_BODY)
    assert "dim 1 is not supported" in str(err)


def test_non_literal_spec_argument_for_the_cli() -> None:
    err = _error('NAME = "a_ptr"\n@tilelink.overlap(tilelink.all_gather(NAME))\n@triton.jit\n' + GEMM_BODY)
    assert "must be a literal" in str(err) and err.line == 6


def test_bad_option_value() -> None:
    err = _error('@tilelink.overlap(tilelink.all_gather("a_ptr"), via="dma")\n@triton.jit\n' + GEMM_BODY)
    assert "via='dma'" in str(err)


def test_syntax_error_is_reported_with_position() -> None:
    err = _error("def broken(:\n    pass\n")
    assert err.line is not None and err.line >= 5 and "cannot parse" in str(err)


def test_a_warp_specialised_loop_runs_without_warp_specialisation() -> None:
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
        @triton.jit
        def kernel(a_ptr, c_ptr, M, WS: tl.constexpr, BLOCK: tl.constexpr):
            for t in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK), 4, warp_specialize=WS, num_stages=2):
                offs = t * BLOCK + tl.arange(0, BLOCK)
                tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=offs < M), mask=offs < M)
        ''')
    generated = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    rewritten = generated.rewritten["kernel"]
    assert "tl.range(tl.program_id(0), tl.cdiv(M, BLOCK), 4, num_stages=2)" in rewritten, rewritten
    assert "warp_specialize" not in rewritten and "tll.producer_tile_notify" in rewritten
    notes = [e for e in generated.report.entries if "runs without warp specialisation" in e.message]
    assert len(notes) == 1 and notes[0].where.line == 9, generated.report


SWEEP = """
@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def kernel(c_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    for pid_n in range(0, tl.cdiv(N, BLOCK_N)):
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
{inside}
"""


@pytest.mark.parametrize(("inside", "line", "says"), [
    # the rows change inside the loop: one notify after it cannot name them
    ("        offs_m = offs_m + 0\n"
     "        tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], 1.0, mask=offs_m[:, None] < M)", 13,
     ("the row offsets `offs_m` at line 12 are bound again between their definition and the store",
      "compute the row offsets once per tile")),
    # the store is not a statement of the loop's own body
    ("        if pid_n > 0:\n"
     "            tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], 1.0,\n"
     "                     mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))", 13,
     ("directly in the body of a loop over the tile's columns", "compute its row offsets outside the loop")),
])
def test_store_in_a_column_loop_that_cannot_be_counted_says_why(inside: str, line: int, says) -> None:
    err = _error(SWEEP.format(inside=inside))
    assert err.line == line, err
    for text in says:
        assert text in str(err), err


def test_store_in_a_column_loop_with_an_entangled_mask_says_what_to_write() -> None:
    # the mask bounds no column vector by itself: nothing says the address stays in the row
    err = _error(SWEEP.format(inside="        tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], 1.0, "
                                     "mask=(offs_m[:, None] + offs_n[None, :]) < M)"))
    assert err.line == 12, err
    assert "the columns `offs_n` of the store at line 12 are bounded by a mask that changes from one step of a loop " \
        "to the next" in str(err) and "by the row's length (`offs_n[None, :] < D`)" in err.hint, err
    # a bounded column vector, but a mask the count cannot split into rows x columns
    err = _error(SWEEP.format(inside="        tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], 1.0, "
                                     "mask=(offs_m[:, None] < M) & (offs_n[None, :] < N) & (offs_m[:, None] >= 0))"))
    assert err.line == 12, err
    assert "cannot count the elements the store to 'c_ptr' writes in each iteration of the loop at line 10" in str(err)


AG_TILE = """\
@tilelink.overlap(tilelink.all_gather("a_ptr"{spec}))
@triton.jit
""" + GEMM_BODY


@pytest.mark.parametrize(("spec", "says", "hint"), [
    (', tile=("pid_m * BLOCK_N", "BLOCK_N")', "does not name the rows this load of 'a_ptr' touches along dim 0: "
     "its offsets give rows [pid_m * BLOCK_M, pid_m * BLOCK_M + BLOCK_M)", "drop tile="),
    (', tile=("row0", "BLOCK_M")', "tile= start `row0` for 'a_ptr' names row0, which the kernel neither takes "
     "nor assigns", "name the kernel's own variables"),
    (', tile=("pid_m *", "BLOCK_M")', "tile= start `pid_m *` is not a Python expression", "source expression"),
    (', size="rows"', "size='rows' for 'a_ptr' names rows, which is not a parameter of 'kernel'",
     "write the size from parameters (a_ptr, b_ptr, c_ptr, M, N, K)"),
])
def test_tile_and_size_are_checked_at_build_time(spec: str, says: str, hint: str) -> None:
    err = _error(AG_TILE.format(spec=spec))
    assert says in str(err) and hint in err.hint, err
    assert err.file == "user_kernels.py" and err.line in (5, 11), err  # the annotation, or the load


def test_a_correct_tile_needs_no_size() -> None:
    text = HEAD + AG_TILE.format(spec=', tile=("pid_m * BLOCK_M", "BLOCK_M")')
    generated = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    assert "tll.consumer_tile_wait(" in generated.rewritten["kernel"]
    assert generated.plans[0].launch.size_param == "M"


def test_rows_from_a_loaded_index_suggest_index() -> None:
    err = _error('''
        @tilelink.overlap(tilelink.all_gather("a_ptr"))
        @triton.jit
        def kernel(a_ptr, ids_ptr, c_ptr, M, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            rows = tl.load(ids_ptr + offs, mask=offs < N, other=0)
            a = tl.load(a_ptr + rows[:, None] * N + tl.arange(0, BLOCK)[None, :])
            tl.store(c_ptr + offs[:, None] * N + tl.arange(0, BLOCK)[None, :], a)
        ''')
    assert "the rows come from `rows`, loaded from 'ids_ptr': pass index=\"ids_ptr\"" in err.hint, err


PAGED = '''
    @tilelink.overlap(tilelink.all_gather("k_ptr"{index}))
    @triton.jit
    def kernel(k_ptr, table_ptr, c_ptr, N, D, PAGE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        page = tl.load(table_ptr + offs // PAGE, mask=offs < N, other=0)
        loc = page * PAGE + offs % PAGE
        cols = tl.arange(0, BLOCK)
        k = tl.load(k_ptr + loc[:, None] * D + cols[None, :], mask=cols[None, :] < D)
        tl.store(c_ptr + offs[:, None] * D + cols[None, :], k, mask=cols[None, :] < D)
    '''


@pytest.mark.parametrize("index", ["", ', index="table_ptr", size="N"'])
def test_rows_computed_from_a_loaded_index_say_index_does_not_read_them(index: str) -> None:
    """Rows made from loaded page numbers (`loc = page * PAGE + offs % PAGE`) are not the loaded values index= reads:
    the refusal says so, with or without index=, rather than suggesting it."""
    err = _error(PAGED.format(index=index))
    assert "cannot tell which rows along dim 0 of 'k_ptr' this load reads" in str(err), err
    assert err.hint.startswith("the rows are `loc`, computed from `page`, loaded from 'table_ptr' (`loc = page * PAGE "
                               "+ offs % PAGE`)"), err.hint
    assert "pass index=" not in err.hint, err.hint


#: a descriptor made two ways on the sides of `if {test}:`, a compile-time or a run-time test
TWO_WAYS = '''
    @tilelink.overlap(tilelink.all_gather("v_ptr"))
    @triton.jit
    def kernel(v_ptr, o_ptr, S, D: tl.constexpr, BLOCK: tl.constexpr, TRANS: tl.constexpr):
        if {test}:
            desc = tl.make_tensor_descriptor(v_ptr, shape=[D, S], strides=[S, 1], block_shape=[D, BLOCK])
        else:
            desc = tl.make_tensor_descriptor(v_ptr, shape=[S, D], strides=[D, 1], block_shape=[BLOCK, D])
        v = desc.load([tl.program_id(0) * BLOCK, 0])
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(o_ptr + offs[:, None] * D + tl.arange(0, D)[None, :], v)
    '''


def test_a_descriptor_made_two_ways_by_a_compile_time_branch_names_the_branch() -> None:
    """The fused-attention tutorial makes V's descriptor transposed under `if FP8_OUTPUT:`: its rows lie along another
    dim on that side, so the refusal names the `if` and the two shapes, and says to annotate one side."""
    err = _error(TWO_WAYS.format(test="TRANS"))
    assert "the descriptor `desc` of 'v_ptr' is made in more than one way, on the two sides of `if TRANS:` (shape " \
           "`[D, S]` and `[S, D]`)" in str(err), err
    assert err.hint.startswith("annotate a kernel that makes it one way, the side of `if TRANS:` your calls take"), err


def test_a_descriptor_made_two_ways_by_a_run_time_branch_is_not_called_a_choice_of_the_call() -> None:
    err = _error(TWO_WAYS.format(test="tl.program_id(0) % 2 == 0"))
    assert "is made in more than one way:" in str(err) and "your calls take" not in err.hint, err


def test_rows_computed_from_the_loaded_index_alone_say_to_write_them_in_the_address() -> None:
    """`rows = tok // top_k` is what index= reads written in the address (`tok[:, None] // top_k`): said so, not "a
    table of pages"."""
    err = _error('''
        @tilelink.overlap(tilelink.all_gather("a_ptr", index="ids_ptr", size="M"))
        @triton.jit
        def kernel(a_ptr, ids_ptr, c_ptr, M, N, top_k, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tok = tl.load(ids_ptr + offs, mask=offs < N, other=0)
            rows = tok // top_k
            a = tl.load(a_ptr + rows[:, None] * N + tl.arange(0, BLOCK)[None, :])
            tl.store(c_ptr + offs[:, None] * N + tl.arange(0, BLOCK)[None, :], a)
        ''')
    assert "write them so, `tok[:, None]` (also `tok[:, None] // top_k`)" in err.hint, err.hint
    assert "page" not in err.hint, err.hint


SHIFTED = '''
    @tilelink.overlap(tilelink.all_gather("a_ptr", size="M"))
    @triton.jit
    def kernel(a_ptr, b_ptr, c_ptr, M, N, K, SH, stride_am, stride_ak, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            ks = k * BLOCK_K + offs_k
            acc += tl.load(a_ptr + offs_m[:, None] * stride_am + {shift} * stride_ak + ks[None, :] * stride_ak,
                           mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
        tl.store(c_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :], acc, mask=offs_m[:, None] < M)
    '''


def test_a_fixed_column_offset_beside_moving_columns_is_checked_or_refused() -> None:
    """`(K // 2) * stride_ak` beside the K columns `ks < K` reads past the row's end into the next row, which the
    wait does not cover: an offset the launch cannot read is refused at the load; one it reads (`SH`) is checked
    by each call with the columns' last element, `SH + K - 1`."""
    err = _error(SHIFTED.format(shift="(K // 2)"))
    assert "adds `(K // 2) * stride_ak` along the rows of 'a_ptr', an offset TileLink cannot read at the launch" in \
        str(err), err
    text = HEAD + textwrap.dedent(SHIFTED.format(shift="SH"))
    plan = generate(text, "k.py", requests_in(text, "k.py")).plans[0].launch
    ways = [way for _, way, _ in plan.row_shifts]
    assert ((False, ("SH", "stride_ak")), (False, ("K", "stride_ak")), (True, ("1", "stride_ak"))) in ways, ways


def test_a_user_comment_after_the_last_parameter_is_kept() -> None:
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.all_gather("a_ptr"))
        @triton.jit
        def kernel(a_ptr, c_ptr,  # pointers
                   M, N,  # sizes
                   BLOCK_M: tl.constexpr = 16):
            offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
            tl.store(c_ptr + offs_m, tl.load(a_ptr + offs_m, mask=offs_m < M), mask=offs_m < M)
        ''')
    rewritten = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).rewritten["kernel"]
    lines = rewritten.splitlines()
    at = next(i for i, line in enumerate(lines) if "# sizes" in line)
    assert lines[at].strip() == "M, N,  # sizes", rewritten
    assert lines[at + 1] == " " * 11 + "# added by TileLink:", rewritten
    assert lines[at + 2].startswith(" " * 11 + "tlk_barriers, tlk_epoch"), rewritten


@pytest.mark.parametrize(("signature", "expected"), [
    # the last parameter's comment, no comma before it
    ("def kernel(a_ptr, c_ptr, M,\n           BLOCK: tl.constexpr  # block size\n           ):",
     ["           BLOCK: tl.constexpr,  # block size", "           # added by TileLink:",
      "           tlk_barriers, tlk_epoch, tlk_rank, tlk_world, tlk_rows,"]),
    # one parameter a line: the new ones go under the kernel's own
    ("def kernel(\n    a_ptr,  # A\n    c_ptr,  # C\n    M,  # rows\n    BLOCK: tl.constexpr,  # tile\n):",
     ["    BLOCK: tl.constexpr,  # tile", "    # added by TileLink:",
      "    tlk_barriers, tlk_epoch, tlk_rank, tlk_world, tlk_rows,"]),
])
def test_the_added_parameters_follow_the_signature_s_layout(signature: str, expected: list[str]) -> None:
    text = (HEAD + '@tilelink.overlap(tilelink.all_gather("a_ptr"))\n@triton.jit\n' + signature + '''
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=offs < M), mask=offs < M)
''')
    rewritten = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).rewritten["kernel"]
    lines = rewritten.splitlines()
    at = lines.index(expected[0])
    assert lines[at:at + len(expected)] == expected, rewritten


ROWS = """\
@tilelink.overlap(tilelink.all_gather("a_ptr"))
@triton.jit
def kernel(a_ptr, o_ptr, M, stride_am, D: tl.constexpr, BLOCK_M: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
{body}
    tl.store(o_ptr + offs[:, None] * D + cols[None, :], x, mask=offs[:, None] < M)
"""


@pytest.mark.parametrize(("body", "says"), [
    ("    x = tl.load(a_ptr + (M - 1 - offs[:, None]) * stride_am + cols[None, :])",
     "touches the rows `(M - 1 - offs[:, None]) * stride_am` of 'a_ptr', which are not the tile's rows `offs`"),
    ("    x = tl.load(a_ptr + (offs[:, None] // 2) * stride_am + cols[None, :])", "which are not the tile's rows"),
    ("    nxt = offs + BLOCK_M\n    p = a_ptr + offs[:, None] * stride_am + cols[None, :]\n"
     "    x = tl.load(p + nxt[:, None] * stride_am)", "adds `nxt[:, None] * stride_am` along the rows of 'a_ptr'"),
    ("    x = tl.load(a_ptr + (offs % 4)[:, None] * stride_am + cols[None, :])", "which are not the tile's rows"),
    # subtracted: the message keeps the sign
    ("    x = tl.load(a_ptr - offs[:, None] * stride_am + cols[None, :])",
     "touches the rows `-offs[:, None] * stride_am` of 'a_ptr', which are not the tile's rows `offs`"),
    ("    desc = tl.make_tensor_descriptor(a_ptr + D, shape=[M, D], strides=[D, 1], block_shape=[BLOCK_M, D])\n"
     "    x = desc.load([pid * BLOCK_M, 0])", "is made from `a_ptr + D`, not from 'a_ptr' itself"),
    ("    x = tl.load(a_ptr + offs[:, None] * stride_am + cols[None, :])\n"
     "    tl.store(a_ptr + offs[:, None] * stride_am + cols[None, :], x)", "stores to 'a_ptr', which all_gather"),
    # Liger's cross entropy: the pointer moved to the program's row, the gradient written in place; the store is
    # what must change, whatever TileLink makes of the advance
    ("    a_ptr += pid * stride_am\n    x = tl.load(a_ptr + cols)\n    tl.store(a_ptr + cols, x)\n"
     "    x = x[None, :] + tl.zeros((BLOCK_M, D), tl.float32)", "stores to 'a_ptr', which all_gather"),
])
def test_rows_other_than_the_tile_s_are_refused(body: str, says: str) -> None:
    err = _error(ROWS.format(body=body))
    assert says in str(err), err


def test_two_loads_around_a_change_of_their_start_wait_each() -> None:
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.all_gather("a_ptr"))
        @triton.jit
        def kernel(a_ptr, o_ptr, M, D: tl.constexpr, BLOCK_M: tl.constexpr):
            desc = tl.make_tensor_descriptor(a_ptr, shape=[M, D], strides=[D, 1], block_shape=[BLOCK_M, D])
            row = tl.program_id(0) * BLOCK_M
            x = desc.load([row, 0])
            row += BLOCK_M
            y = desc.load([row, 0])
            tl.store(o_ptr + tl.arange(0, D), tl.sum(x + y, 0))
        ''')
    rewritten = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).rewritten["kernel"]
    assert rewritten.count("tll.consumer_tile_wait(") == 2, rewritten


def test_a_reduce_scatter_kernel_that_reads_its_output_is_refused() -> None:
    err = _error('''
        @tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
        @triton.jit
        def kernel(a_ptr, c_ptr, M, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            c = tl.load(c_ptr + offs, mask=offs < M)
            tl.store(c_ptr + offs, c + tl.load(a_ptr + offs, mask=offs < M), mask=offs < M)
        ''')
    assert "reads 'c_ptr', which reduce_scatter replaces by a buffer of this rank's partial sums" in str(err), err


def test_the_tile_order_is_kept_when_the_start_does_not_step_by_the_height() -> None:
    text = HEAD + textwrap.dedent('''
        @tilelink.overlap(tilelink.all_gather("a_ptr"))
        @triton.jit
        def kernel(a_ptr, o_ptr, M, STEP: tl.constexpr, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            offs = pid * STEP + tl.arange(0, BLOCK)
            tl.store(o_ptr + offs, tl.load(a_ptr + offs, mask=offs < M), mask=offs < M)
        ''')
    generated = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    assert "tl_remap_tile" not in generated.rewritten["kernel"]
    assert any("does not step by the tile height BLOCK" in e.message for e in generated.report.entries)


BATCHED = """\
@tilelink.overlap(tilelink.all_gather("a_ptr", dim=1{extra}))
@triton.jit
def bmm(a_ptr, b_ptr, c_ptr, M, N, K, stride_ab, stride_am, stride_ak, stride_bk, stride_bn, stride_cb, stride_cm,
        stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + pid_b * stride_ab + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    tl.store(c_ptr + pid_b * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=offs_m[:, None] < M)
"""


def test_a_gather_along_an_inner_dim_indexed_as_the_block_s_rows_is_told_the_tile_to_name() -> None:
    """Along dim 1 the rows are read from the block's axis 1: a batched kernel that indexes dim 1 as its block's rows
    (`offs_m[:, None]`) is told the tile= that names them, with the size it passed, and that its advanced pointer
    must be made where it is read."""
    err = _error(BATCHED.format(extra=', size="M"'))
    assert "cannot tell which rows along dim 1 of 'a_ptr'" in err.reason
    assert ("all_gather('a_ptr', dim=1, tile=(\"pid_m * BLOCK_M\", \"BLOCK_M\"), size=\"M\")" in err.hint
            and "instead of advancing `a_ptrs` in place" in err.hint), err.hint
    err = _error(BATCHED.format(extra=', tile=("pid_m * BLOCK_M", "BLOCK_M"), size="M"'))
    assert "`a_ptrs` is bound more than once (lines 14, 21)" in err.reason, err.reason


GROUPED = """\
@tilelink.overlap(tilelink.{rule}("{tensor}"))
@triton.jit
def grouped(group_a_ptrs, group_c_ptrs, sizes, group_size, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    tile = tl.program_id(0)
    for g in range(group_size):
        m = tl.load(sizes + g * 2)
        k = tl.load(sizes + g * 2 + 1)
        a_ptr = tl.load(group_a_ptrs + g).to(tl.pointer_type(tl.float16))
        c_ptr = tl.load(group_c_ptrs + g).to(tl.pointer_type(tl.float16))
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + offs_m[:, None] * k + offs_k[None, :], mask=offs_m[:, None] < m)
        tl.store(c_ptr + offs_m[:, None] * k + offs_k[None, :], a, mask=offs_m[:, None] < m)
"""


@pytest.mark.parametrize(("rule", "tensor", "line"), [("all_gather", "group_a_ptrs", 12),
                                                      ("reduce_scatter", "group_c_ptrs", 13)])
def test_a_table_of_pointers_is_refused_saying_so(rule: str, tensor: str, line: int) -> None:
    """The grouped-GEMM tutorial's form: the annotated tensor holds the addresses of the group's matrices. Refused
    for that, at the load that reads them (it was refused for its rows, or for never being stored to)."""
    err = _error(GROUPED.format(rule=rule, tensor=tensor))
    assert err.line == line, err
    assert f"reads pointers from {tensor!r} (`tl.load({tensor} + g).to(tl.pointer_type(tl.float16))`)" in str(err)
    assert "takes the tensor itself as a parameter" in err.hint
