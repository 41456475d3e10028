"""Two forms upstream GEMMs take: tensor descriptors built on the host (`TensorDescriptor`, the persistent-matmul
tutorial's `a_desc`), annotated by the descriptor parameter's name, and a split-K write-back with `tl.atomic_add`
into a reduce-scattered output. What each is rewritten to, and the neighbouring forms that stay refused with what
to write instead (the kernels themselves run in tests/rules/forms, through test_forms.py)."""

from __future__ import annotations

import textwrap

import pytest

from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"


def _generated(source: str):
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


def _error(source: str) -> AnnotationError:
    with pytest.raises(AnnotationError) as info:
        _generated(source)
    return info.value


HOST_AG = '''
@tilelink.overlap(tilelink.all_gather("a_desc"{extra}))
@triton.jit
def kernel(a_desc, c_ptr, {size}N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    {count}
    offs_am = pid_m * BLOCK_M
    a = a_desc.load([offs_am, 0])
    offs = offs_am + tl.arange(0, BLOCK_M)
    tl.store(c_ptr + offs, tl.sum(a, 1))
'''


def test_a_host_descriptor_is_waited_for_by_its_block_height_and_sized_by_the_tile_count() -> None:
    generated = _generated(HOST_AG.format(extra="", size="M, ", count="num_pid_m = tl.cdiv(M, BLOCK_M)"))
    body = " ".join(generated.rewritten["kernel"].split())
    # the rows are the load's first offset, the height the descriptor's own block (the host chose it)
    assert "tlm.tl_channels_of_rows( offs_am, offs_am + a_desc.block_shape[0]," in body, body
    assert "offs_am = offs_am + tlk_token" in body, body
    assert body.index("tll.consumer_tile_wait(") < body.index("a_desc.load(")
    # the full size is the parameter the kernel counts its row tiles over
    assert generated.plans[0].launch.size_param == "M"


def test_a_host_descriptor_kernel_with_no_row_count_says_to_pass_size() -> None:
    err = _error(HOST_AG.format(extra="", size="M, ", count=""))
    assert "cannot find the parameter holding the full size" in str(err) and 'size="M"' in err.hint, err
    generated = _generated(HOST_AG.format(extra=', size="M"', size="M, ", count=""))
    assert generated.plans[0].launch.size_param == "M"


def test_a_host_descriptor_store_is_notified_with_the_columns_of_its_box() -> None:
    generated = _generated('''
        @tilelink.overlap(tilelink.reduce_scatter("c_desc"))
        @triton.jit
        def kernel(a_ptr, c_desc, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_n = tl.program_id(1)
            num_pid_m = tl.cdiv(M, BLOCK_M)
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.dot(tl.load(a_ptr + rows[:, None] * N + cols[None, :]), tl.load(a_ptr + cols[:, None] * N
                         + cols[None, :]))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc)
        ''')
    body = " ".join(generated.rewritten["kernel"].split())
    assert "tll.bulk_store_wait()" in body, body
    # the box's columns inside the tensor, from the descriptor's shape on the host; a loop-free notify (the
    # descriptor's block height is a compile-time constant)
    assert ("tl.minimum(pid_n * BLOCK_N + c_desc.block_shape[1], c_desc.shape[1]) - tl.maximum(pid_n * BLOCK_N, 0)"
            in body), body
    assert "tll.producer_tile_notify_rows(tlk_barriers, pid_m * BLOCK_M, pid_m * BLOCK_M + c_desc.block_shape[0]," \
        in body and "tlk_channels_per_rank, c_desc.block_shape[0])" in body, body


@pytest.mark.parametrize(("line", "says"), [
    ("a_desc = a_desc", "is used as a tensor descriptor and bound again in the kernel"),
    ("a_desc.atomic_add([offs_am, 0], a)", "is used by `a_desc.atomic_add` at line 13"),
])
def test_a_host_descriptor_used_other_than_by_load_and_store_is_refused(line: str, says: str) -> None:
    err = _error(HOST_AG.format(extra="", size="M, ", count="num_pid_m = tl.cdiv(M, BLOCK_M)")
                 .replace("    offs = offs_am", f"    {line}\n    offs = offs_am"))
    assert says in str(err), err


SPLIT_K = '''
@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    {split}
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.dot(tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :]),
                 tl.load(b_ptr + offs_k[:, None] * N + offs_n[None, :]))
    c_ptrs = c_ptr + offs_m[:, None] * N + offs_n[None, :]
    {write}
'''
ADD = "tl.atomic_add(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))"


def test_a_split_k_atomic_add_is_notified_with_what_it_added() -> None:
    generated = _generated(SPLIT_K.format(rule="reduce_scatter", split="pid_k = tl.program_id(axis=1)", write=ADD))
    body = " ".join(generated.rewritten["kernel"].split())
    assert body.index("tl.atomic_add(c_ptrs") < body.index("tll.producer_tile_notify_rows("), body
    assert "tlk_cols = tl.minimum(tl.maximum((N) - (pid_n * BLOCK_N), 0), BLOCK_N)" in body, body
    # the launcher counts the adds per element from the grid's axes the address does not use (axis 1: the splits)
    assert generated.plans[0].launch.atomic_axes == (0,)
    assert any("split-K write-back" in e.message for e in generated.plans[0].report)


@pytest.mark.parametrize(("rule", "split", "write", "says"), [
    ("reduce_scatter", "pid_k = tl.program_id(1)", "tl.atomic_max(c_ptrs, acc)",
     "is passed to the atomic `tl.atomic_max` at line 20"),
    ("reduce_scatter", "pid_k = tl.program_id(1)", "old = tl.atomic_add(c_ptrs, acc)\n    tl.store(c_ptrs, old)",
     "is passed to the atomic `tl.atomic_add` at line 20"),
    ("reduce_scatter", "pid_k = pid % 2", ADD, "has no K split that TileLink can count"),
    ("reduce_scatter", "pid_k = tl.program_id(1)",
     f"tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))\n    {ADD}",
     "and adds to it with tl.atomic_add at line 21"),
    ("reduce_scatter", "pid_k = tl.program_id(1)", ADD.replace("c_ptrs, acc", "c_ptrs, tl.maximum(acc, 0.0)"),
     "goes through `maximum` applied to the partial sums"),
    ("reduce_scatter", "pid_k = tl.program_id(1)", f"if pid_k == 0:\n        {ADD}", "is in a loop or a branch"),
    ("reduce_scatter", "pid_k = tl.program_id(1)", f"for i in range(2):\n        {ADD}",
     "the loop at line 20 stores the same elements of 'c_ptr' on every iteration (line 21)"),
])
def test_an_atomic_that_cannot_be_counted_is_refused(rule: str, split: str, write: str, says: str) -> None:
    err = _error(SPLIT_K.format(rule=rule, split=split, write=write))
    assert says in str(err), err
    assert err.line is not None and err.hint


def test_another_atomic_on_a_gathered_tensor_is_refused() -> None:
    err = _error(SPLIT_K.format(rule="all_gather", split="pid_k = tl.program_id(1)",
                                write="tl.atomic_add(c_ptrs, acc)").replace('all_gather("c_ptr")',
                                                                            'all_gather("a_ptr")')
                 .replace("tl.atomic_add(c_ptrs", "tl.atomic_add(a_ptr + offs_m")
                 # the columns of the gathered rows bounded by the row, as the gather asks
                 .replace("tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :])",
                          "tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :], mask=offs_k[None, :] < K)"))
    assert "adds to 'a_ptr' with tl.atomic_add, which all_gather replaces" in str(err), err
