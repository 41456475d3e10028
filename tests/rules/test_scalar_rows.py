"""A GEMV that gives each program one output row (`row = tl.program_id(0)`, its K loop summing `w * x` and
`tl.store(y_ptr + row, tl.sum(acc, axis=0))`, one scalar per program), under a reduction of `y` with its tile named
(`tile=("row", "1")`, `size="N"`): each store writes one element of one row, so its notify counts one element of
that row's channel. Equal to torch on the race-exposing schedule, each rank holding a slice of K; without `tile=` the
store is read as that tile (``tests/rules/test_scalar_store_rows.py``)."""

from __future__ import annotations

import textwrap

import pytest

import tilelink
from tests.rules.cases import module_at, rows_of, worst

KERNEL = textwrap.dedent('''
    import triton
    import triton.language as tl

    import tilelink


    @tilelink.overlap(tilelink.{rule}("y_ptr", tile=("row", "1"), size="N"))
    @triton.jit
    def gemv(w_ptr, x_ptr, y_ptr, N, K, stride_wn, stride_wk, BLOCK_K: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            offs_k = k + tl.arange(0, BLOCK_K)
            w = tl.load(w_ptr + row * stride_wn + offs_k * stride_wk, mask=offs_k < K, other=0.0)
            x = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
            acc += w * x
        tl.store(y_ptr + row, tl.sum(acc, axis=0))
''')


def _gemv(path: str, all_reduce: bool) -> float:
    import torch

    rank, world = tilelink.rank(), tilelink.world_size()
    N, K = 40, 50
    g = torch.Generator().manual_seed(13)
    w, x = torch.randn(N, K, generator=g), torch.randn(K, generator=g)
    klo, khi = rows_of(rank, world, K)
    lo, hi = (0, N) if all_reduce else rows_of(rank, world, N)
    wr, xr = w[:, klo:khi].contiguous(), x[klo:khi].contiguous()
    err = 0.0
    for _ in range(2):  # a context is reused: the second call runs at epoch 2
        y = torch.full((hi - lo,), float("nan"))
        module_at(path).gemv[(N,)](wr, xr, y, N, khi - klo, wr.stride(0), wr.stride(1), BLOCK_K=16)
        err = worst(err, (y - (w @ x)[lo:hi]).abs().max().item() if hi > lo else 0.0)
    return err


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_gemv_storing_one_scalar_per_program_equals_torch(rule: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "gemv.py"
    path.write_text(KERNEL.format(rule=rule))
    for world in (2, 3):
        errors = tilelink.spawn(_gemv, world, str(path), rule == "all_reduce")
        assert all(e < 1e-4 for e in errors), (world, errors)


def test_without_the_tile_it_is_read_as_that_tile(tmp_path, monkeypatch) -> None:
    """The store names its row itself: without `tile=` and `size=` the rows are the grid's programs."""
    from tilelink.annotations import requests_in
    from tilelink.codegen import generate

    monkeypatch.setenv("TILELINK_RACES", "1")
    source = KERNEL.format(rule="all_reduce").replace(', tile=("row", "1"), size="N"', "")
    generated = generate(source, "gemv.py", requests_in(source, "gemv.py"))
    assert generated.plans[0].launch.size_param == "tl.num_programs(0)", generated.plans[0].launch
    path = tmp_path / "gemv.py"
    path.write_text(source)
    errors = tilelink.spawn(_gemv, 2, str(path), True)
    assert all(e < 1e-4 for e in errors), errors


def test_a_store_it_does_not_read_says_how_to_name_the_tile() -> None:
    from tilelink.annotations import requests_in
    from tilelink.codegen import generate
    from tilelink.errors import AnnotationError

    store = "tl.store(y_ptr + row, tl.sum(acc, axis=0))"
    source = KERNEL.format(rule="all_reduce").replace(', tile=("row", "1"), size="N"', "").replace(
        f"    {store}", f"    if K > 0:\n        {store}")
    assert "if K > 0:" in source
    with pytest.raises(AnnotationError, match="cannot tell which rows of 'y_ptr' this store writes") as err:
        generate(source, "gemv.py", requests_in(source, "gemv.py"))
    assert 'all_reduce("y_ptr", tile=("row", "1"), size="<the rows of the output>")' in err.value.hint, err.value.hint
