"""Kernel forms users bring, with only their annotation: the ones TileLink follows build and equal torch on the
race-exposing schedule at worlds 1-4 (odd sizes, uneven shards); the ones it cannot follow are refused at the
line that needs changing, saying what to write instead."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
import torch

import tilelink
from tests.rules.forms_cases import FORMS, RUNS, run_forms
from tests.rules.mutations import run_form_mutants
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_followed_forms_equal_torch_on_the_race_exposing_schedule(world: int, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    names = sorted(RUNS)
    failures = [f"{name}, rank {rank}: {value}" for rank, results in enumerate(tilelink.spawn(run_forms, world, names))
                for name, value in results.items() if not (isinstance(value, float) and value < 1e-3)]
    assert not failures, "\n".join(failures)


#: mutants that are harmless to these kernels: K and V are gathered together, and a channel is notified once both
#: tensors' rows of it are in, so the wait before the keys of a block also covers its values; a GEMM never stores
#: the rows its offsets wrap to (`% M`), so the wait for them guards only values that are dropped (#0 of each kernel is
#: its read of every channel at the start, `channels_ready`)
COVERED = {"attention_descriptor_advance": {"attn_fwd#2 (consumer_tile_wait)"},
           "attention_helper_inner": {"attn_fwd#2 (consumer_tile_wait)", "attn_fwd#4 (consumer_tile_wait)"},
           "attention_flat_heads": {"attn_fwd_flat#2 (consumer_tile_wait)"},
           "attention_stages_tile": {"attn_fwd#2 (consumer_tile_wait)", "attn_fwd#4 (consumer_tile_wait)",
                                     "attn_fwd#6 (consumer_tile_wait)"},
           "attention_batched_rows": {"attn_fwd_batched#2 (consumer_tile_wait)"},
           "gemm_row_wrap": {"matmul_wrap#2 (consumer_tile_wait)"},
           "gemm_row_wrap_hints": {"matmul_wrap_hints#2 (consumer_tile_wait)"},
           "gemm_row_clamp": {"matmul_clamp#2 (consumer_tile_wait)"},
           "gemm_block_scales": {"block_scaled_matmul#2 (consumer_tile_wait)"}}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_dropping_any_inserted_wait_or_notify_of_a_form_is_caught(name: str, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")
    # a reduce-scatter form run in two epilogue variants spends most of each mutant in timed-out waits: about 90 s a
    # mutant on two CPU cores, 270-290 s for three
    results = tilelink.spawn(run_form_mutants, 2, name, timeout=600)
    assert results[0], f"{name}: the rewrite inserted no wait or notify"
    caught = {what for outcomes in results for what, outcome in outcomes if outcome.startswith("failed")}
    missed = [f"{what} -> {outcome}" for what, outcome in results[0]
              if what not in caught and what not in COVERED.get(name, ())]
    assert not missed, "\n".join(missed)
    assert len(caught) + len(COVERED.get(name, ())) == len(results[0])


def _rewritten(name: str, kernel: str) -> cst.FunctionDef:
    path = FORMS / f"{name}.py"
    text = path.read_text()
    generated = generate(text, str(path), requests_in(text, str(path)))
    module = cst.parse_module(generated.rewritten[kernel])
    return next(s for s in module.body if isinstance(s, cst.FunctionDef))


def test_a_key_offset_advanced_in_the_loop_is_waited_for_on_every_iteration() -> None:
    fn = _rewritten("attention_descriptor_advance", "attn_fwd")
    loop = next(s for s in fn.body.body if isinstance(s, cst.For))
    body = cst.Module(body=[]).code_for_node(loop.body)
    # one wait per block of keys and one per block of values, on the offsets of that iteration
    assert body.count("tll.consumer_tile_wait(") == 2, body
    flat = " ".join(body.split())
    assert "tlm.tl_channels_of_rows( offsetk_y, " in flat and "offsetk_y = offsetk_y + tlk_token" in flat, body
    assert "tlm.tl_channels_of_rows( offsetv_y, " in flat and "offsetv_y = offsetv_y + tlk_token" in flat, body
    before = cst.Module(body=[]).code_for_node(fn).split("for start_n in")[0]
    assert "consumer_tile_wait" not in before


def test_a_descriptor_over_rows_counted_by_a_local_takes_its_size_from_the_parameters() -> None:
    # `shape=[y_dim, HEAD_DIM]` with `y_dim = Z * H * N_CTX`, as the attention tutorial writes it: the launch reads
    # the full size from the arguments, so the local's value is what it evaluates (it asked for an argument 'y_dim')
    path = FORMS / "attention_batched_rows.py"
    text = path.read_text()
    assert "'size_param': 'Z * H * N_CTX'" in generate(text, str(path), requests_in(text, str(path))).text
    bound_twice = text.replace("    y_dim = Z * H * N_CTX\n", "    y_dim = Z * H * N_CTX\n    if off_hz > 9:\n"
                                                           "        y_dim = N_CTX\n")
    with pytest.raises(AnnotationError, match="cannot find the parameter holding the full size of dim 0"):
        generate(bound_twice, str(path), requests_in(bound_twice, str(path)))
    # nor is a parameter the kernel binds again: the launch would read the argument, not the kernel's value
    rebound = text.replace("    y_dim = Z * H * N_CTX\n", "    H = H * 2\n    y_dim = Z * H * N_CTX\n")
    with pytest.raises(AnnotationError, match="cannot find the parameter holding the full size of dim 0"):
        generate(rebound, str(path), requests_in(rebound, str(path)))
    # an update in place binds a name again too (`y_dim *= 2` after `y_dim = Z * H * N_CTX`, `H *= 2`)
    for updated in (text.replace("    y_dim = Z * H * N_CTX\n", "    y_dim = Z * H\n    y_dim *= N_CTX\n"),
                    text.replace("    y_dim = Z * H * N_CTX\n", "    H *= 2\n    y_dim = Z * H * N_CTX\n")):
        assert updated != text
        with pytest.raises(AnnotationError, match="cannot find the parameter holding the full size of dim 0"):
            generate(updated, str(path), requests_in(updated, str(path)))


def test_a_size_other_than_the_rows_of_the_descriptor_shape_is_refused() -> None:
    # the tutorial's descriptors span every head (`Z * H * N_CTX` rows); size="N_CTX" would gather one head's rows
    # and the second head's blocks would read past them
    path = FORMS / "attention_batched_rows.py"
    plain = path.read_text()
    text = plain.replace('all_gather(("desc_k", "desc_v"), dim=0)', 'all_gather(("desc_k", "desc_v"), dim=0, '
                                                                    'size="N_CTX")')
    assert text != plain
    with pytest.raises(AnnotationError) as info:
        generate(text, str(path), requests_in(text, str(path)))
    err = info.value
    assert (err.file, err.line) == (str(path), 27), err  # the first load of desc_k, in the inlined helper
    assert "size='N_CTX' for 'desc_k' is not the rows the descriptor `desc_k` spans along dim 0" in str(err), err
    assert "(`y_dim` is `Z * H * N_CTX`)" in str(err), err
    assert err.hint.startswith("leave size= out: TileLink reads the rows from the descriptor's shape= "
                               "(Z * H * N_CTX)"), err.hint
    # the same rows written another way are the descriptor's rows
    same = plain.replace('all_gather(("desc_k", "desc_v"), dim=0)', 'all_gather(("desc_k", "desc_v"), dim=0, '
                                                                    'size="N_CTX * H * Z")')
    assert "'size_param': 'N_CTX * H * Z'" in generate(same, str(path), requests_in(same, str(path))).text


def test_a_gather_along_a_dimension_a_descriptor_reads_whole_says_which_one_moves() -> None:
    # the attention tutorial's 2-D descriptors over flat rows, annotated as a sequence gather along dim 1: each key
    # block reads columns [0, HEAD_DIM) of them, and the hint names the dimension its blocks move along
    path = FORMS / "attention_batched_rows.py"
    annotation = 'all_gather(("desc_k", "desc_v"), dim=1, tile=("start_n", "BLOCK_N"), size="N_CTX")'
    text = path.read_text().replace('all_gather(("desc_k", "desc_v"), dim=0)', annotation)
    with pytest.raises(AnnotationError) as info:
        generate(text, str(path), requests_in(text, str(path)))
    err = info.value
    assert "its offsets give rows [0, 0 + HEAD_DIM), the same for every block: it does not move along dim 1" in \
        str(err), err
    assert err.hint.startswith("annotate the dimension its offsets move along (dim=0") and "tile=('0'" not in err.hint


HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"


def _error(source: str) -> AnnotationError:
    text = HEAD + textwrap.dedent(source)
    with pytest.raises(AnnotationError) as info:
        generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    return info.value


def _generated(source: str):
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


HELPER_KERNEL = '''
    @triton.jit
    def _inner(acc, k_ptrs{params}):
        {body}

    @tilelink.overlap(tilelink.all_gather("k_ptr"))
    @triton.jit
    def kernel(k_ptr, o_ptr, N, stride, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(k_ptr + offs, mask=offs < N)
        {call}
        tl.store(o_ptr + offs, acc, mask=offs < N)
    '''


def test_loads_inside_a_helper_are_inlined_and_waited_for() -> None:
    generated = _generated(HELPER_KERNEL.format(params="", body="x = tl.load(k_ptrs)\n        return acc + x",
                                                call="acc = _inner(x, k_ptr + offs)"))
    body = generated.rewritten["kernel"]
    # the helper's body stands in for the call, its `x` renamed away from the kernel's, and the pointer made after
    # the wait from the pointer that carries its token
    assert "# _inner(...), inlined" in body and "x_2 = tl.load(k_ptrs)" in body and "acc = x + x_2" in body, body
    assert body.index("k_ptr = k_ptr + tlk_token") < body.index("k_ptrs = k_ptr + offs"), body
    assert "k_ptrs = k_ptrs + tlk_token" not in body and "_inner(" not in body.replace("# _inner(", ""), body


def test_helpers_calling_helpers_are_inlined_and_a_helper_without_the_tensor_stays_a_call() -> None:
    generated = _generated('''
        @triton.jit
        def _row_ptrs(base, offs):
            return base + offs

        @triton.jit
        def _scaled(ptr_like, offs, N, scale):
            ptrs = _row_ptrs(ptr_like, offs)
            return tl.load(ptrs, mask=offs < N) * scale

        @tilelink.overlap(tilelink.all_gather("k_ptr"))
        @triton.jit
        def kernel(k_ptr, w_ptr, o_ptr, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            k = _scaled(k_ptr, offs, N, 2.0)
            w = _scaled(w_ptr, offs, N, 0.5)
            tl.store(o_ptr + offs, k + w, mask=offs < N)
        ''')
    body = generated.rewritten["kernel"]
    # the tensor's call is inlined twice over (the inner helper too), each pointer made from the waited-for one;
    # the call on another tensor stays a call, and the helpers it needs stay in the module
    assert "# _scaled(...), inlined" in body and "# _row_ptrs(...), inlined" in body, body
    assert "ptrs = k_ptr + offs" in body and "w = _scaled(w_ptr, offs, N, 0.5)" in body, body
    assert body.index("ptrs = k_ptr + offs") < body.index("ptrs = ptrs + tlk_token") < body.index("k = tl.load"), body
    assert "def _scaled(" in generated.text and "def _row_ptrs(" in generated.text


def test_an_access_a_helper_makes_wrongly_is_refused_at_the_helpers_line() -> None:
    err = _error('''
        @triton.jit
        def _reversed(k_ptr, offs, N):
            return tl.load(k_ptr + (N - 1 - offs), mask=offs < N)

        @tilelink.overlap(tilelink.all_gather("k_ptr"))
        @triton.jit
        def kernel(k_ptr, o_ptr, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(k_ptr + offs, mask=offs < N)
            y = _reversed(k_ptr, offs, N)
            tl.store(o_ptr + offs, x + y, mask=offs < N)
        ''')
    # the line and column of the load in the helper, not of its inlined copy, and the call it was inlined at
    assert (err.line, err.column) == (8, 12) and "which are not the tile's rows `offs`" in str(err), err
    assert "the load at line 8 " in str(err) and "in the @triton.jit helper `_reversed`, called at line 15" in str(
        err), err


@pytest.mark.parametrize(("helper", "call", "line", "says"), [
    ("def _inner(acc, k_ptrs):\n    return _inner(acc, k_ptrs) + tl.load(k_ptrs)", "acc = _inner(x, k_ptr + offs)",
     17, "calls itself"),
    ("def _inner(acc, ptrs):\n    return acc + tl.load(ptrs[0])", "acc = _inner(x, (k_ptr + offs, o_ptr))", 17,
     "inside a tuple"),
    ("def _inner(acc, k_ptrs):\n    return acc + tl.load(k_ptrs)", "acc = 2.0 * _inner(x, k_ptr + offs)", 17,
     "inside a larger statement"),
    ("def _inner(acc, k_ptrs):\n    if acc is None:\n        return acc\n    return acc + tl.load(k_ptrs)",
     "acc = _inner(x, k_ptr + offs)", 11, "returns before its end"),
    ("def _inner(acc, k_ptrs):\n    if acc is None:\n        acc = acc + tl.load(k_ptrs)\n    else:\n"
     "        return acc", "acc = _inner(x, k_ptr + offs)", 20, "does not return a value on every path"),
    (None, "acc = load_rows(x, k_ptr + offs)", 17, "imported from another module"),
])
def test_a_helper_that_cannot_be_inlined_is_refused(helper: str | None, call: str, line: int, says: str) -> None:
    source = textwrap.dedent('''
        from kernels_lib import load_rows

        @triton.jit
        {helper}

        @tilelink.overlap(tilelink.all_gather("k_ptr"))
        @triton.jit
        def kernel(k_ptr, o_ptr, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(k_ptr + offs, mask=offs < N)
            {call}
            tl.store(o_ptr + offs, acc, mask=offs < N)
        ''').format(helper=textwrap.indent(helper or "def unused(x):\n    return x", " " * 8).lstrip(),
                     call=call)
    err = _error(source)
    assert err.line == line and says in str(err), err


def test_the_key_loops_inlined_from_a_helper_wait_on_every_iteration() -> None:
    fn = _rewritten("attention_helper_inner", "attn_fwd")
    text = cst.Module(body=[]).code_for_node(fn)
    assert "_attn_fwd_inner(" not in text.replace("# _attn_fwd_inner(", "")
    # both copies of the helper's key loop (stage 1, then the diagonal's stage 2) wait for the block of keys and the
    # block of values of each iteration, on the offsets of that copy
    loops = [node for node in fn.body.body if isinstance(node, cst.If) and "STAGE" in cst.Module(
        body=[]).code_for_node(node.test)]
    assert len(loops) == 2, text
    # the descriptor helper is inlined for K and V (a `return` in each branch of its `if`), with its literal
    # shapes, and stays a call for Q and O
    assert "desc_k = tl.make_tensor_descriptor(desc_k, [N_CTX, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])" in text
    assert "desc_q = _maybe_make_tensor_desc(desc_q, " in text and "desc_v = _maybe" not in text, text
    for branch, suffix in zip(loops, ("", "_2"), strict=True):
        loop = next(s for s in branch.body.body if isinstance(s, cst.For))
        body = " ".join(cst.Module(body=[]).code_for_node(loop.body).split())
        assert body.count("tll.consumer_tile_wait(") == 2, body
        assert f"offsetk_y{suffix} = offsetk_y{suffix} + tlk_token" in body, body
        assert f"offsetv_y{suffix} = offsetv_y{suffix} + tlk_token" in body, body
        before = " ".join(cst.Module(body=[]).code_for_node(branch).split()).split("for start_n")[0]
        assert "consumer_tile_wait" not in before


def _flat_shard_launched_flat() -> str:
    """The flat-heads form launched with each rank's flat (Z * H * S_r, D) shard instead of its 3-D view."""
    import torch

    from tests.rules.forms_cases import load_form

    kernel = load_form("attention_flat_heads").attn_fwd_flat
    q, k = torch.randn(2 * 3 * 8, 16), torch.randn(2 * 3 * 5, 16)
    try:
        kernel[(1, 6)](q, k, k, torch.empty_like(q), 0.25, 8, 10, 16, 16, 16, 16, HEAD_DIM=16, BLOCK_M=16,
                       BLOCK_N=16)
    except tilelink.LaunchError as exc:
        return str(exc)
    return "launched"


@pytest.mark.slow
def test_a_flat_shard_passed_for_a_gather_of_its_inner_dim_is_refused_saying_which_view_to_pass() -> None:
    for message in tilelink.spawn(_flat_shard_launched_flat, 2):
        assert "must pass rows [" in message and "of k_ptr along dim 1" in message, message
        assert "pass its view with the sharded dim as dim 1, e.g. `k_ptr.view(Z * H, S_r, D)`" in message, message


def test_the_zeros_a_helper_stores_for_another_ranks_expert_are_notified_before_the_blocks_return() -> None:
    fn = _rewritten("moe_rs_expert_zeros", "fused_moe_kernel")
    branch = next(s for s in fn.body.body if isinstance(s, cst.If))
    body = [" ".join(cst.Module(body=[]).code_for_node(s).split()) for s in branch.body.body]
    store = next(i for i, s in enumerate(body) if s.startswith("tl.store(c_ptrs_2, accumulator_2"))
    notify = next(i for i, s in enumerate(body) if s.startswith("tll.producer_tile_notify_channels("))
    assert store < notify < len(body) - 1 and body[-1] == "return", body
    # and the kernel's own store after the branch has its own notify
    rest = " ".join(cst.Module(body=[]).code_for_node(fn).split()).split("return", 1)[1]
    assert rest.count("tll.producer_tile_notify_channels(") == 1, rest


def test_the_down_projection_without_index_asks_for_index_topk_and_size() -> None:
    # without index= the rows are not found; the helper's zeros are followed by `return`, so the two stores cannot
    # both run: the refusal is about the index, not about storing twice
    path = FORMS / "moe_rs_expert_zeros.py"
    plain = path.read_text()
    annotation = ('reduce_scatter("c_ptr", dim=0, index="sorted_token_ids_ptr", topk="top_k",\n'
                  '                                          size="num_valid_tokens // top_k")')
    text = plain.replace(annotation, 'reduce_scatter("c_ptr")')
    assert text != plain
    with pytest.raises(AnnotationError) as info:
        generate(text, str(path), requests_in(text, str(path)))
    err = info.value
    assert "may both write" not in str(err), err
    assert "cannot tell which rows of 'c_ptr' this store writes: they come through an index, `offs_token`, loaded " \
           "from 'sorted_token_ids_ptr'" in str(err), err
    assert err.hint.startswith('pass index="sorted_token_ids_ptr", topk="top_k"') and "size=" in err.hint, err.hint
    # with no return after the helper's zeros, both stores may run: that is still refused first
    both = text.replace("                              BLOCK_SIZE_N, compute_type)\n        return\n",
                        "                              BLOCK_SIZE_N, compute_type)\n")
    assert both != text
    with pytest.raises(AnnotationError, match="the stores to 'c_ptr' at lines 19, 57 may both write"):
        generate(both, str(path), requests_in(both, str(path)))


def test_a_helpers_keyword_and_default_parameters_are_bound_as_a_call_binds_them() -> None:
    body = _generated('''
        @triton.jit
        def _load_scaled(ptrs, mask, scale=2.0, other=0.0):
            return tl.load(ptrs, mask=mask, other=other) * scale

        @tilelink.overlap(tilelink.all_gather("k_ptr"))
        @triton.jit
        def kernel(k_ptr, o_ptr, N, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = _load_scaled(mask=offs < N, ptrs=k_ptr + offs, other=1.0)
            tl.store(o_ptr + offs, x, mask=offs < N)
        ''').rewritten["kernel"]
    flat = " ".join(body.split())
    assert "ptrs = k_ptr + offs mask = offs < N scale = 2.0 other = 1.0" in flat, body
    assert "x = tl.load(ptrs, mask=mask, other=other) * scale" in flat, body


def test_a_flat_layout_gathered_along_its_rows_says_which_view_and_annotation_to_use() -> None:
    path = FORMS / "attention_flat_heads.py"
    text = path.read_text().replace('dim=1, tile=("start_n", "BLOCK_N"), size="N_CTX"', "dim=0")
    with pytest.raises(AnnotationError) as info:
        generate(text, str(path), requests_in(text, str(path)))
    err = info.value
    assert err.line == 32 and "cannot tell which rows along dim 0 of 'k_ptr'" in str(err), err
    assert "the rows `(kv_offset + cols)` are a block's rows of a flat layout" in err.hint, err.hint
    assert "its (Z * H, S_r, D) view and annotate dim=1" in err.hint, err.hint


@pytest.mark.parametrize(("advance", "says"), [
    ("k_ptrs += BLOCK * stride_k", "along the rows of 'k_ptr'"),
    ("k_ptrs = k_ptrs + BLOCK", "cannot place on a dimension other than the rows"),
    ("k_ptrs = tl.advance(k_ptrs, (BLOCK, 0))", "is passed to `tl.advance` at line 15"),
])
def test_a_pointer_advanced_along_the_rows_is_refused(advance: str, says: str) -> None:
    err = _error(f'''
        @tilelink.overlap(tilelink.all_gather("k_ptr"))
        @triton.jit
        def kernel(k_ptr, o_ptr, N, D, stride_k, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
            offs = tl.arange(0, BLOCK) + 0
            cols = tl.arange(0, BLOCK_D)
            k_ptrs = k_ptr + offs[:, None] * stride_k + cols[None, :]
            acc = tl.zeros((BLOCK_D,), tl.float32)
            for start in range(0, N, BLOCK):
                acc += tl.sum(tl.load(k_ptrs, mask=(start + offs)[:, None] < N, other=0.0), 0)
                {advance}
            tl.store(o_ptr + cols, acc)
        ''')
    assert err.line in (14, 15) and says in str(err), err


def test_tile_naming_the_rows_its_offsets_give_rewrites_as_without_it() -> None:
    # the matmul tutorial's `a_ptrs += BLOCK_K * stride_ak` builds without tile=; a tile= naming the rows its offsets
    # give is the same access, rewritten the same way (only the header naming the annotation differs)
    path = FORMS / "gemm_row_wrap.py"
    plain = path.read_text()
    text = plain.replace('all_gather("a_ptr", dim=0, size="M")',
                         'all_gather("a_ptr", dim=0, tile=("pid_m * BLOCK_M", "BLOCK_M"), size="M")')
    assert text != plain
    named = generate(text, str(path), requests_in(text, str(path))).text
    unnamed = generate(plain, str(path), requests_in(plain, str(path))).text
    body = [line for line in named.splitlines() if not line.startswith(("# source sha256", "# kernel matmul_wrap"))]
    assert body == [line for line in unnamed.splitlines()
                    if not line.startswith(("# source sha256", "# kernel matmul_wrap"))]


#: one row of W per program, read as a flat address: the column vector `offs_k` is what TileLink finds as a 1-D
#: tile's offsets, and `row * stride_wn` the rows actually read
ROW_PER_PROGRAM = '''
@tilelink.overlap(tilelink.all_gather("w_ptr", dim=0{tile}))
@triton.jit
def gemv(w_ptr, x_ptr, y_ptr, N, K, stride_wn, stride_wk, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        acc += tl.load(w_ptr + row * stride_wn + offs_k * stride_wk, mask=offs_k < K, other=0.0) * tl.load(
            x_ptr + offs_k, mask=offs_k < K, other=0.0)
    tl.store(y_ptr + row, tl.sum(acc, axis=0))
'''


@pytest.mark.parametrize("tile", ["", ', tile=("k", "BLOCK_K"), size="N"'])
def test_a_tile_naming_a_column_vector_beside_computed_rows_is_refused(tile: str) -> None:
    """With or without tile=, `row * stride_wn` moves the read onto rows its wait does not cover: a tile= that names
    the offsets TileLink finds does not skip the checks of the address around them."""
    text = HEAD + ROW_PER_PROGRAM.format(tile=tile)
    with pytest.raises(AnnotationError, match=r"adds `row \* stride_wn` along the rows of 'w_ptr', a value the "
                                              r"kernel computes") as info:
        generate(text, "gemv.py", requests_in(text, "gemv.py"))
    assert "if `row` is the row this program reads, read it as a tile of one row: `rows = row + tl.arange(0, 1)`, " \
           "the address `w_ptr + rows[:, None] * stride_wn + ...[None, :]`" in info.value.hint, info.value.hint


def _row_per_program(path: str) -> float:
    """The hint's one-row tile: each rank passes its rows of W, and every row of W @ x is computed."""
    from tests.rules.cases import module_at, rows_of

    rank, world = tilelink.rank(), tilelink.world_size()
    N, K = 13, 40
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(N, K, generator=g), torch.randn(K, generator=g)
    lo, hi = rows_of(rank, world, N)
    y = torch.full((N,), float("nan"))
    module_at(path).gemv[(N,)](w[lo:hi].contiguous(), x, y, N, K, K, 1, BLOCK_K=16)
    return (y - w @ x).abs().max().item()


def test_the_one_row_tile_the_hint_gives_equals_torch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = ROW_PER_PROGRAM.format(tile="").replace(
        "    row = tl.program_id(0)\n    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)\n",
        "    rows = tl.program_id(0) + tl.arange(0, 1)\n    acc = tl.zeros((1, BLOCK_K), dtype=tl.float32)\n").replace(
        "tl.load(w_ptr + row * stride_wn + offs_k * stride_wk, mask=offs_k < K, other=0.0)",
        "tl.load(w_ptr + rows[:, None] * stride_wn + offs_k[None, :] * stride_wk,\n"
        "                       mask=(rows[:, None] < N) & (offs_k[None, :] < K), other=0.0)").replace(
        "x_ptr + offs_k, mask=offs_k < K, other=0.0)", "x_ptr + offs_k, mask=offs_k < K, other=0.0)[None, :]").replace(
        "tl.store(y_ptr + row, tl.sum(acc, axis=0))", "tl.store(y_ptr + rows, tl.sum(acc, axis=1), mask=rows < N)")
    assert "row * stride_wn" not in source and "rows[:, None] < N" in source
    path = tmp_path / "one_row.py"
    path.write_text(HEAD + source)
    errors = tilelink.spawn(_row_per_program, 3, str(path))
    assert all(e < 1e-4 for e in errors), errors


RS_EPILOGUE = '''
@tilelink.overlap(tilelink.reduce_scatter("c_ptr"{extra}))
@triton.jit
def kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    acc = tl.dot(tl.load(a_ptr + offs_m[:, None] * N + offs_n[None, :]), tl.load(b_ptr + offs_n[:, None] * N
                 + offs_n[None, :]))
    {epilogue}
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], out.to(tl.float16), mask=offs_m[:, None] < M)
'''


@pytest.mark.parametrize(("epilogue", "says"), [
    ("out = tl.maximum(acc, 0.0)", "goes through `maximum` applied to the partial sums (`tl.maximum(acc, 0.0)`)"),
    ("out = acc * tl.sigmoid(acc)", "goes through `sigmoid` applied to the partial sums"),
    ("act = tl.exp(acc)\n    out = act * 2.0", "goes through `exp` applied to the partial sums"),
    ("out = act(acc)", "goes through the helper `act` (TileLink does not read its body) applied to the partial"),
    ("out = tl.where(acc > 0, acc, 0.0)", "goes through a comparison of the partial sums"),
    # a bias made from this rank's data (`b_ptr`, an operand of the dot): the ranks' biases differ
    ("out = acc + tl.load(b_ptr + offs_n)[None, :]", "goes through a data term added to the partial sums, "
                                                      "which every rank would add"),
    ("out = acc + 1.0", "goes through a constant term added to the partial sums"),
    ("out = acc * acc", "goes through a product of partial sums"),
    ("out = acc / tl.sum(acc, 1)[:, None]", "goes through `/` with the partial sums"),
    ("out = (acc > 0).to(tl.float32) * acc", "goes through a comparison of the partial sums"),
    # the same applied to the accumulator in place, as the tutorials' "fuse an activation here" comment invites
    ("acc = acc * tl.sigmoid(acc)\n    out = acc", "goes through `sigmoid` applied to the partial sums"),
    ("acc = acc * acc\n    out = acc", "goes through a product of partial sums"),
    ("acc = acc.to(tl.float16)\n    acc = tl.exp(acc)\n    out = acc", "goes through `exp` applied to the partial"),
    ("if ACTIVATION == 'leaky_relu':\n        acc = leaky_relu(acc)\n    out = acc",
     "goes through the helper `leaky_relu` (TileLink does not read its body) applied to the partial sums"),
])
def test_a_non_linear_epilogue_before_a_reduce_scatter_store_is_refused(epilogue: str, says: str) -> None:
    err = _error(RS_EPILOGUE.format(extra="", epilogue=epilogue))
    assert says in str(err) and "that sum would not be the full problem's value" in str(err), err
    assert "linear_epilogue=True" in err.hint and "apply the function after the reduction" in err.hint


@pytest.mark.parametrize("epilogue", [
    "out = acc * 0.5",  # scaling is linear
    "out = acc * tl.load(bias_ptr + offs_m)[:, None]",  # so is scaling by loaded weights (MoE routing weights)
    "out = tl.cumsum(acc, 1)",
    "out = tl.where(offs_n[None, :] < tl.minimum(N, 64), acc, 0.0)",  # masking: the condition is index arithmetic
    "out = acc",
    "acc = acc * tl.load(bias_ptr + offs_m)[:, None]\n    out = acc.to(tl.float16)",  # in place, as vLLM's MoE
    # a bias the first rank alone reads (the others get zeros in its place): added once over the ranks
    "out = acc + tl.load(bias_ptr + offs_n)[None, :]",
])
def test_a_linear_epilogue_is_accepted(epilogue: str) -> None:
    text = HEAD + RS_EPILOGUE.format(extra="", epilogue=epilogue)
    generated = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    assert "tll.producer_tile_notify" in generated.rewritten["kernel"]


def test_the_user_can_vouch_for_a_linear_epilogue() -> None:
    text = HEAD + RS_EPILOGUE.format(extra=", linear_epilogue=True", epilogue="out = scale_only(acc)")
    generated = generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))
    assert "tll.producer_tile_notify" in generated.rewritten["kernel"]


@pytest.mark.slow
def test_forms_compile_for_sm90_with_the_plain_kernels_loads() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, "-m", "tests.rules.compile_forms"], env=env, capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    profiles = {}
    for line in result.stdout.splitlines():
        name, variant, rest = line.split(" ", 2)
        profiles[(name, variant)] = ast.literal_eval(rest)
    for name in ("gemm_row_wrap", "gemm_row_wrap_hints", "gemm_row_clamp", "gemm_rs_epilogue_branch",
                 "gemm_rs_split_k", "gemm_ar_split_k",
                 "moe_rs_expert_zeros", "gemm_rs_persistent_grouped", "gemm_persistent_counter",
                 "gemm_columns_beside"):
        plain, rewritten = profiles[(name, "plain")], profiles[(name, "rewritten")]
        assert plain["cp.async 16B"] > 0 and rewritten == plain, (name, plain, rewritten)
    # on descriptors made on the host, the wait and notifies keep the bulk tensor copies of the pipelined K loop
    for name in ("gemm_host_descriptor_ag", "gemm_host_descriptor_rs"):
        plain, rewritten = profiles[(name, "plain")], profiles[(name, "rewritten")]
        assert plain["tma 2d"] > 2 and rewritten == plain, (name, plain, rewritten)
    # a wait on every iteration of the key loop keeps the bulk tensor copies, but Triton no longer software-
    # pipelines the loop (the wait is a spin loop): one copy per tensor in the loop, not one per stage
    plain, rewritten = (profiles[("attention_descriptor_advance", v)] for v in ("plain", "rewritten"))
    assert plain["tma 2d"] > rewritten["tma 2d"] == 2 and rewritten["ld.global.b16"] == 0, (plain, rewritten)
    # the same for the key loops inlined from a helper: the query's copy and one per tensor in each of the two loops
    plain, rewritten = (profiles[("attention_helper_inner", v)] for v in ("plain", "rewritten"))
    assert plain["tma 2d"] > rewritten["tma 2d"] == 5 and rewritten["ld.global.b16"] == 0, (plain, rewritten)
    # and for the tutorial's batch of heads: the query's copy and one per tensor in the one key loop
    plain, rewritten = (profiles[("attention_batched_rows", v)] for v in ("plain", "rewritten"))
    assert plain["tma 2d"] > rewritten["tma 2d"] == 3 and rewritten["ld.global.b16"] == 0, (plain, rewritten)
    # pointer loads waited for on every key block are not pipelined either, but stay 16-byte vector loads
    plain, rewritten = (profiles[("attention_flat_heads", v)] for v in ("plain", "rewritten"))
    assert plain["cp.async 16B"] > 0 and rewritten["cp.async <16B"] == rewritten["ld.global.b16"] == 0, (plain,
                                                                                                       rewritten)


def test_a_tensor_gathered_with_another_is_waited_for_before_its_first_load() -> None:
    """Row scales gathered with A and loaded before the K loop that loads A: the tile's one wait goes before the
    scales' load, whichever tensor the spec names first."""
    text = generate((FORMS / "gemm_row_scales.py").read_text(), "gemm_row_scales.py",
                    requests_in((FORMS / "gemm_row_scales.py").read_text(), "gemm_row_scales.py")).rewritten[
        "matmul_row_scales"]
    lines = text.splitlines()
    wait = next(i for i, line in enumerate(lines) if "consumer_tile_wait(" in line)
    scale_load = next(i for i, line in enumerate(lines) if "a_scale = tl.load(" in line)
    assert wait < scale_load and sum("consumer_tile_wait(" in line for line in lines) == 1, text


BLOCK_POINTER = '''
@tilelink.overlap(tilelink.all_gather("a_ptr"))
@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_blocks = tl.make_block_ptr(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                 offsets=(pid_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0))
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        acc += tl.dot(tl.load(a_blocks, boundary_check=(0, 1), padding_option="zero"),
                      tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn, mask=rk[:, None] < K))
        a_blocks = tl.advance(a_blocks, (0, BLOCK_K))
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc, mask=rm[:, None] < M)
'''


def test_a_block_pointer_is_refused_with_the_descriptor_to_write() -> None:
    text = HEAD + BLOCK_POINTER
    with pytest.raises(AnnotationError, match=r"a_ptr \(from the annotated 'a_ptr'\) is passed to `tl.make_block_ptr`"
                                              r" at line 12") as info:
        generate(text, "blocks.py", requests_in(text, "blocks.py"))
    assert info.value.hint.startswith("make the block a tensor descriptor, `desc = tl.make_tensor_descriptor(a_ptr, "
                                      "shape=[...], strides=[...], block_shape=[...])`"), info.value.hint


def test_a_dim_the_kernel_s_descriptor_does_not_have_is_refused_saying_so() -> None:
    """`dim=2` (the sequence of a (Z, H, N_CTX, D) tensor) on the attention tutorial's flat 2-D descriptors: it was
    refused with a message about rows "along dim 2" that may start before the tile."""
    path = FORMS / "attention_batched_rows.py"
    text = path.read_text().replace('("desc_k", "desc_v"), dim=0)', '("desc_k", "desc_v"), dim=2)')
    with pytest.raises(AnnotationError, match=r"'desc_k' is gathered along dim 2, but the kernel reads it through the "
                                              r"descriptor `desc_k`, made with 2 dims \(shape=\[y_dim, HEAD_DIM\]\)"
                       ) as err:
        generate(text, str(path), requests_in(text, str(path)))
    assert "dim=0" in err.value.hint
