"""A pointer made from a tile's offsets holds the rows those offsets had where it was made. Offsets bound again
between the pointer and its access give the wait or notify, which reads the binding that reaches the access, other
rows than the access touches: refused, through a 2-D pointer (`ptrs = base + offs[:, None]`) and through a block of
pointers given its axis at the access (`ptrs = base + offs`, `ptrs[:, None]`). A stored value with an effect is not
run again by the notify."""

from __future__ import annotations

import pytest

import tilelink
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n\n"

GEMV = HEAD + '''@tilelink.overlap(tilelink.{rule}("{tensor}"))
@triton.jit
def gemv(a_ptr, x_ptr, y_ptr, M, K, stride_am, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    {made}
    {again}
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        ks = k * BLOCK_K + offs_k
        a = tl.load({a_at}, mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
        x = tl.load(x_ptr + ks, mask=ks < K, other=0.0)
        acc += a * x[None, :]
    tl.store({y_at}, tl.sum(acc, axis=1)[:, None], mask=(offs_m < M)[:, None])
'''
AGAIN = "offs_m = (pid + 1) % tl.num_programs(0) * BLOCK_M + tl.arange(0, BLOCK_M)"
A_FLAT = "a_ptr + offs_m[:, None] * stride_am + ks[None, :]"
Y_FLAT = "y_ptr + offs_m[:, None]"


@pytest.mark.parametrize(("rule", "tensor", "made", "a_at", "y_at", "says"), [
    ("reduce_scatter", "y_ptr", "y_ptrs = y_ptr + offs_m[:, None]", A_FLAT, "y_ptrs",
     "the pointer `y_ptrs` of this store is made from the rows `offs_m` at line 12, and `offs_m` is bound again at "
     "line 13, before the store"),
    ("reduce_scatter", "y_ptr", "y_ptrs = y_ptr + offs_m", A_FLAT, "y_ptrs[:, None]", "its notify would cover"),
    ("all_gather", "a_ptr", "a_rows = a_ptr + offs_m * stride_am", "a_rows[:, None] + ks[None, :]", Y_FLAT,
     "the pointer `a_rows` of this load is made from the rows `offs_m`"),
])
def test_offsets_bound_again_after_a_pointer_made_from_them_are_refused(rule, tensor, made, a_at, y_at, says,
                                                                        tmp_path) -> None:
    path = tmp_path / "gemv.py"
    path.write_text(GEMV.format(rule=rule, tensor=tensor, made=made, again=AGAIN, a_at=a_at, y_at=y_at))
    with pytest.raises(AnnotationError) as refused:
        tilelink.build(str(path))
    assert says in str(refused.value), refused.value
    # made after the last binding, the same pointer is read as the tile's rows
    path.write_text(GEMV.format(rule=rule, tensor=tensor, made=AGAIN, again=made, a_at=a_at, y_at=y_at))
    assert any(e.status == "applied" for e in tilelink.build(str(path)).report.entries)


ATOMIC = HEAD + '''@tilelink.overlap(tilelink.reduce_scatter("y_ptr"))
@triton.jit
def scaled(x_ptr, w_ptr, y_ptr, cnt_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    w = tl.load(w_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + offs, {value}, mask={mask})
'''


def test_a_stored_value_with_an_effect_is_not_run_again_by_the_notify() -> None:
    text = ATOMIC.format(value="x * w + 0.0 * tl.atomic_add(cnt_ptr + offs, 1.0, mask=offs < N)", mask="offs < N")
    rewritten = generate(text, "k.py", requests_in(text, "k.py")).rewritten["scaled"]
    assert rewritten.count("tl.atomic_add(") == 1, rewritten
    assert "tl.zeros((y_ptr + offs).shape, tl.int32)" in rewritten, rewritten


def test_a_store_mask_with_an_effect_is_refused() -> None:
    text = ATOMIC.format(value="x * w", mask="(offs < N) & (tl.atomic_add(cnt_ptr + offs, 1.0) >= 0.0)")
    with pytest.raises(AnnotationError, match=r"the mask of the store to 'y_ptr' calls `tl.atomic_add\(cnt_ptr \+ "
                                              r"offs, 1.0\)`, which has an effect"):
        generate(text, "k.py", requests_in(text, "k.py"))
