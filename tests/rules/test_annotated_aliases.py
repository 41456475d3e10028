"""Aliases Triton binds without a plain `=`: an annotated assignment (`xp: tl.tensor = x_ptr + offs`), a named
expression (`(xq := x_ptr + offs)`) and an offsets vector the tensor is added to in place (`xp += x_ptr`) make a
pointer like any assignment, so an access through them is waited for, notified or refused like one through
`xp = x_ptr + offs`, never left unseen."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

#: a 1-D kernel that also reads the next block's elements through an alias
NEXT_BLOCK = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def shift_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    nxt = (offs + BLOCK) % N
    {load_next}
    tl.store(y_ptr + offs, x + x2, mask=offs < N)
'''

#: a 1-D kernel whose only load goes through an annotated alias
ANNOTATED_ONLY = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def double_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    xp: tl.tensor = x_ptr + offs
    x = tl.load(xp, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, x + x, mask=offs < N)
'''


def _generated(source: str):
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


@pytest.mark.parametrize("load_next", [
    "xp: tl.tensor = x_ptr + nxt\n    x2 = tl.load(xp, mask=offs < N, other=0.0)",
    "x2 = 0.0\n    if (xq := x_ptr + nxt) is not None:\n        x2 = tl.load(xq, mask=offs < N, other=0.0)",
    "xp = nxt\n    xp += x_ptr\n    x2 = tl.load(xp, mask=offs < N, other=0.0)",
    "n, (xp, w) = 0, (x_ptr + nxt, 1.0)\n    x2 = tl.load(xp, mask=offs < N, other=0.0)",
], ids=["annotated", "named-expression", "augmented", "nested-tuple"])
def test_a_load_of_other_rows_through_an_alias_bound_without_equals_is_refused_at_its_line(load_next: str) -> None:
    # as the same load through `xp = x_ptr + nxt` is: the rows are not the tile the kernel waits for
    with pytest.raises(AnnotationError) as info:
        _generated(NEXT_BLOCK.format(load_next=load_next))
    err = info.value
    assert "cannot tell which rows along dim 0 of 'x_ptr'" in str(err), err
    source = (HEAD + textwrap.dedent(NEXT_BLOCK.format(load_next=load_next))).splitlines()
    assert "tl.load(x" in source[err.line - 1] and "x_ptr + offs" not in source[err.line - 1], err


def test_a_load_through_an_annotated_alias_is_waited_for() -> None:
    body = _generated(ANNOTATED_ONLY).rewritten["double_kernel"]
    assert body.index("tll.consumer_tile_wait(") < body.index("x = tl.load(xp"), body


def _double(path: str) -> float:
    spec = importlib.util.spec_from_file_location("annotated_alias_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 61, 16
    x = torch.randn(N, generator=torch.Generator().manual_seed(21))
    lo, hi = rows_of(rank, world, N)
    err = 0.0
    for _ in range(2):
        y = torch.full((N,), float("nan"))
        module.double_kernel[(triton.cdiv(N, block),)](x[lo:hi].contiguous(), y, N, BLOCK=block)
        err = max(err, (y - 2 * x).abs().max().item()) if err == err else err
        err = float("nan") if y.isnan().any() else err
    return err


@pytest.mark.slow
def test_a_load_through_an_annotated_alias_equals_torch_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "annotated_alias_kernel.py"
    path.write_text(HEAD + textwrap.dedent(ANNOTATED_ONLY))
    errors = tilelink.spawn(_double, 3, str(path))
    assert all(e == 0.0 for e in errors), errors


#: a descriptor of the gathered tensor read through a tuple holding it (Triton indexes tuples by constants)
DESCRIPTOR_IN_A_TUPLE = '''
@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0))
@triton.jit
def pair_kernel(x_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    x = desc.load([pid * BLOCK_M, 0])
    descs = (desc, desc)
    nxt = ((pid + 1) % tl.num_programs(0)) * BLOCK_M
    x2 = {read}
    offs = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    tl.store(y_ptr + offs[:, None] * N + cols[None, :], x + x2, mask=(offs[:, None] < M) & (cols[None, :] < N))
'''


@pytest.mark.parametrize("read", ["descs[1].load([nxt, 0])", "(desc if pid >= 0 else desc).load([nxt, 0])"])
def test_a_descriptor_method_called_through_an_expression_is_refused(read: str) -> None:
    # the access is there, but not on a name TileLink follows: the rows it reads would not be waited for
    with pytest.raises(AnnotationError) as info:
        _generated(DESCRIPTOR_IN_A_TUPLE.format(read=read))
    err = info.value
    assert "from the annotated 'x_ptr'" in str(err) and ".load([nxt, 0])" in str(err), err
    assert err.line == 14 and "by its own name" in err.hint, err


def test_a_host_descriptor_read_under_another_name_is_refused() -> None:
    # `d = a_desc` then `d.load(...)`: the rows of the next tile, read through a name that is not the annotated one
    with pytest.raises(AnnotationError) as info:
        _generated('''
            @tilelink.overlap(tilelink.all_gather("a_desc"))
            @triton.jit
            def kernel(a_desc, c_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
                pid_m = tl.program_id(0)
                num_pid_m = tl.cdiv(M, BLOCK_M)
                offs_am = pid_m * BLOCK_M
                a = a_desc.load([offs_am, 0])
                d = a_desc
                nxt = ((pid_m + 1) % num_pid_m) * BLOCK_M
                a2 = d.load([nxt, 0])
                offs = offs_am + tl.arange(0, BLOCK_M)
                tl.store(c_ptr + offs, tl.sum(a + a2, 1))
            ''')
    err = info.value
    assert err.line == 15 and "`d.load`" in str(err) and "from the annotated 'a_desc'" in str(err), err
    assert "by its own name" in err.hint, err


#: GEMMs that cast a value to the element type of an annotated tensor (`acc.to(c_ptr.dtype.element_ty)`, as the
#: tutorials' epilogues and split-K kernels do): the value reads the tensor's type, not its memory, so it is no alias
CAST_GEMM = '''
@tilelink.overlap({annotation})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    pid_m = pid // tl.cdiv(N, BLOCK_N)
    pid_n = pid % tl.cdiv(N, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k * BLOCK_K + offs_k)[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & ((k * BLOCK_K + offs_k)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=((k * BLOCK_K + offs_k)[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        b = {cast_b}
        acc = tl.dot(a, b, acc)
    acc = {cast_acc}
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
'''
CAST_TO_ELEMENT_TYPE = {
    "reduce_scatter": CAST_GEMM.format(annotation='tilelink.reduce_scatter("c_ptr", dim=0)', cast_b="b",
                                       cast_acc="acc.to(c_ptr.dtype.element_ty)"),
    "all_gather": CAST_GEMM.format(annotation='tilelink.all_gather("a_ptr", dim=0)',
                                   cast_b="b.to(a_ptr.dtype.element_ty)", cast_acc="acc"),
}


def _cast_gemm(rule: str, path: str) -> float:
    from tests.rules import cases

    kernel = cases.module_at(path).matmul_kernel
    run = cases._rs_gemm if rule == "reduce_scatter" else cases._ag_gemm
    return run(kernel, tilelink.rank(), tilelink.world_size(), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)


@pytest.mark.parametrize("rule", sorted(CAST_TO_ELEMENT_TYPE))
def test_a_value_cast_to_the_annotated_tensors_element_type_is_no_alias(rule: str, tmp_path, monkeypatch) -> None:
    body = _generated(CAST_TO_ELEMENT_TYPE[rule]).rewritten["matmul_kernel"]
    assert ("producer_tile_notify" if rule == "reduce_scatter" else "consumer_tile_wait") in body, body
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"cast_{rule}.py"
    path.write_text(HEAD + textwrap.dedent(CAST_TO_ELEMENT_TYPE[rule]))
    errors = tilelink.spawn(_cast_gemm, 2, rule, str(path))
    assert all(e < 1e-4 for e in errors), errors
