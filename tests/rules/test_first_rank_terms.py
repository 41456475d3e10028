"""Under a reduction each rank stores its partial sums, and the ranks' stores are summed. A term the kernel adds to
them that is not a partial sum (a bias, `acc + bias[None, :]`, FlagGems' `acc * alpha + bias * beta`, an accumulator
started from the bias) would be added once per rank. Where the tensor it comes from is read only in such terms, every
rank but the first is launched with zeros of the same layout in its place (as a row-parallel linear adds its bias on
rank 0 only): the sum adds it once, and equals torch. Anything else that reads that tensor (a mask, an address, a
test, another store, an add inside the K loop, a non-linear function of it) keeps the kernel refused."""

from __future__ import annotations

import textwrap

import pytest
import torch

import tilelink
from tests.rules.cases import module_at, rows_of, worst
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError
from tilelink.runtime import current_world

HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"

LINEAR = '''
@tilelink.overlap(tilelink.{rule}("c_ptr"))
@triton.jit
def linear(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, alpha, beta, stride_am, stride_ak, stride_bk, stride_bn,
           stride_biasm, stride_biasn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    bias_ptrs = bias_ptr + rm[:, None] * stride_biasm + rn[None, :] * stride_biasn
    acc = {start}
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k * BLOCK_K + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k * BLOCK_K + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        {update}
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    {epilogue}
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, out, mask=c_mask)
'''

ZEROS = "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"
BIAS = "tl.load(bias_ptrs, mask=c_mask, other=0.0)"

#: (accumulator start, update, epilogue): each adds the bias once to `a @ b` times alpha where `alpha` is read
FORMS = {
    "epilogue": (ZEROS, "acc += tl.dot(a, b)", f"out = acc + {BIAS}"),
    "addmm": (ZEROS, "acc += tl.dot(a, b)", f"bias = {BIAS}\n    out = acc * alpha + bias * beta"),
    "started": ("tl.load(bias_ptrs, mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)",
                "acc = tl.dot(a, b, acc)", "out = acc"),
}


def _source(form: str, rule: str = "reduce_scatter", via: str = "") -> str:
    """``via``: the reduce-scatter's partner (`"copy_engine"`: the hybrid one), or its default."""
    start, update, epilogue = FORMS[form]
    text = HEAD + textwrap.dedent(LINEAR).format(rule=rule, start=start, update=update, epilogue=epilogue)
    return text.replace('("c_ptr"))', f'("c_ptr"), via="{via}")') if via else text


def _generate(text: str):
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


def _run(path: str, rule: str, form: str) -> float:
    """The rewritten kernel on this rank's slice of K, against torch on the whole problem; the bias is a broadcast
    view (stride 0 along the rows), as FlagGems' addmm passes it."""
    rank, world = tilelink.rank(), tilelink.world_size()
    device = current_world().device
    M, N, K = 50, 24, 40
    g = torch.Generator().manual_seed(7)
    a, b, bias = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g), torch.randn(N, generator=g)
    alpha, beta = (0.5, 2.0) if form == "addmm" else (1.0, 1.0)
    want = alpha * (a @ b) + beta * bias[None, :]
    klo, khi = rows_of(rank, world, K)
    ar, br = a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device)
    lo, hi = rows_of(rank, world, M) if rule == "reduce_scatter" else (0, M)
    wide = bias.to(device)[None, :].expand(M, N)
    err = 0.0
    for _ in range(3):  # the later calls of the same shapes take the launch kept for them
        out = torch.full((hi - lo, N), float("nan"), device=device)
        module_at(path).linear[(triton_cdiv(M, 16) * triton_cdiv(N, 16),)](
            ar, br, wide, out, M, N, khi - klo, alpha, beta, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1),
            wide.stride(0), wide.stride(1), out.stride(0), out.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        err = worst(err, (out.cpu() - want[lo:hi]).abs().max().item())
    return err


def triton_cdiv(x: int, y: int) -> int:
    return -(-x // y)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_bias_is_read_by_the_first_rank_only(rule: str, form: str) -> None:
    generated = _generate(_source(form, rule))
    (plan,) = generated.plans
    assert plan.launch.first_rank_only == ("bias_ptr",), plan.launch
    said = [str(e) for e in generated.report.entries if "first" in e.message]
    assert said and "'bias_ptr' is read only in terms added to the partial sums" in said[0], said
    assert "launched with zeros in its place" in generated.rewritten["linear"], generated.rewritten["linear"]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("form, rule", [("epilogue", "reduce_scatter"), ("addmm", "all_reduce"),
                                        pytest.param("started", "reduce_scatter", marks=pytest.mark.slow),
                                        pytest.param("addmm", "reduce_scatter", marks=pytest.mark.slow)])
def test_a_bias_added_once_equals_torch(form: str, rule: str, world: int, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"bias_{form}_{rule}.py"
    path.write_text(_source(form, rule))
    errors = tilelink.spawn(_run, world, str(path), rule, form)
    assert all(e < 1e-4 for e in errors), errors


def test_a_bias_added_once_on_the_copy_engine_equals_torch(tmp_path, monkeypatch) -> None:
    """The hybrid reduce-scatter keeps a prepared launch for the calls after the first: it passes zeros too."""
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / "bias_copy_engine.py"
    path.write_text(_source("addmm", via="copy_engine"))
    errors = tilelink.spawn(_run, 2, str(path), "reduce_scatter", "addmm")
    assert all(e < 1e-4 for e in errors), errors


def test_a_kernel_that_builds_as_it_is_reads_every_argument_on_every_rank() -> None:
    text = _source("epilogue").replace(f"out = acc + {BIAS}", "out = acc * alpha")
    (plan,) = _generate(text).plans
    assert plan.launch.first_rank_only == (), plan.launch


@pytest.mark.parametrize("change", [
    # added on every step of the loop over the rank's slice of K: as many times as the rank has steps
    ("acc += tl.dot(a, b)", f"acc += tl.dot(a, b) + {BIAS}"),
    # a non-linear function of it: zeros would not give zero
    (f"out = acc + {BIAS}", f"out = acc + tl.exp({BIAS})"),
    # a constant beside it, which every rank would still add
    (f"out = acc + {BIAS}", f"out = acc + ({BIAS} + 1.0)"),
    # the bias also decides a mask: zeros would change what the other ranks load
    (f"out = acc + {BIAS}", f"bias = {BIAS}\n    w = tl.load(bias_ptrs, mask=bias > 0.0, other=1.0)\n"
                            "    out = acc * w + bias"),
], ids=["in-the-k-loop", "exp", "constant", "mask"])
def test_a_term_that_zeros_would_change_stays_refused(change: tuple[str, str]) -> None:
    text = _source("epilogue").replace(*change)
    assert change[1] in text
    with pytest.raises(AnnotationError, match="a data term added to the partial sums"):
        _generate(text)


def test_a_loaded_scale_is_read_on_every_rank() -> None:
    """`acc * scale` scales each rank's partial sums alike: it builds as it is, nothing passed as zeros."""
    (plan,) = _generate(_source("epilogue").replace(f"out = acc + {BIAS}", f"out = acc * {BIAS}")).plans
    assert plan.launch.first_rank_only == (), plan.launch


def test_a_bias_also_stored_elsewhere_stays_refused() -> None:
    text = _source("epilogue").replace("c_ptr, M, N, K,", "c_ptr, aux_ptr, M, N, K,").replace(
        f"out = acc + {BIAS}", f"bias = {BIAS}\n    tl.store(aux_ptr + rn, tl.sum(bias, axis=0))\n"
                               "    out = acc + bias")
    with pytest.raises(AnnotationError, match="a data term added to the partial sums"):
        _generate(text)


@pytest.mark.parametrize("change", [
    # a masked-out lane reads `other`, which every rank would still add
    (f"out = acc + {BIAS}", "out = acc + tl.load(bias_ptrs, mask=c_mask, other=1.0)"),
    # a name holding the bias's addresses on one path and another tensor's on another
    (f"out = acc + {BIAS}", "p = bias_ptrs\n    if alpha > 0:\n        p = a_ptr + rm[:, None] * stride_am\n"
                            "    out = acc + tl.load(p, mask=c_mask, other=0.0)"),
    # handed to a helper that stores it through another helper
    (f"out = acc + {BIAS}", f"bias = {BIAS}\n    kept = save(a_ptr + rm[:, None] * stride_am, bias, c_mask)\n"
                            "    out = acc + bias"),
], ids=["other", "rebound", "nested-helper"])
def test_a_bias_read_where_zeros_would_differ_stays_refused(change: tuple[str, str]) -> None:
    helpers = ("@triton.jit\ndef put(p, v, m):\n    tl.store(p, v, mask=m)\n\n\n"
               "@triton.jit\ndef save(p, v, m):\n    put(p, v, m)\n    return v\n\n")
    text = _source("epilogue").replace(*change).replace(HEAD, HEAD + helpers)
    assert change[1] in text
    with pytest.raises(AnnotationError, match="a data term added to the partial sums"):
        _generate(text)


def _optional(path: str) -> float:
    """A launch that does not load the bias (`HAS_BIAS=False`) may pass `None` for it, on every rank."""
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 50, 24, 40
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    klo, khi = rows_of(rank, world, K)
    ar, br = a[:, klo:khi].contiguous(), b[klo:khi].contiguous()
    lo, hi = rows_of(rank, world, M)
    out = torch.full((hi - lo, N), float("nan"))
    module_at(path).linear[(triton_cdiv(M, 16) * triton_cdiv(N, 16),)](
        ar, br, None, out, M, N, khi - klo, 1.0, 1.0, ar.stride(0), ar.stride(1), br.stride(0), br.stride(1), 0, 0,
        out.stride(0), out.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, HAS_BIAS=False)
    return (out - (a @ b)[lo:hi]).abs().max().item()


def test_an_optional_bias_left_out_passes_none_on_every_rank(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    text = _source("epilogue").replace("BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr):")
    made = "    bias_ptrs = bias_ptr + rm[:, None] * stride_biasm + rn[None, :] * stride_biasn\n"
    assert made in text
    text = text.replace(made, "").replace(
        f"    out = acc + {BIAS}", f"    out = acc\n    if HAS_BIAS:\n    {made}        out = acc + {BIAS}")
    assert _generate(text).plans[0].launch.first_rank_only == ("bias_ptr",)
    path = tmp_path / "optional_bias.py"
    path.write_text(text)
    errors = tilelink.spawn(_optional, 2, str(path))
    assert all(e < 1e-4 for e in errors), errors


@pytest.mark.parametrize("epilogue, says", [
    (f"out = acc + {BIAS} * K", "a data term added to the partial sums"),
    ("out = acc / K", "scaled by `K`, the K extent of the loop that sums them"),
    ("out = acc * (1.0 / K)", "scaled by `K`, the K extent of the loop that sums them"),
])
def test_a_value_scaled_by_the_k_extent_is_refused(epilogue: str, says: str) -> None:
    """`K`, the extent of the loop that sums, is each rank's own slice's: scaled by it, the ranks' terms are not the
    full problem's (the first rank's bias times its K, each rank's sums over its own K)."""
    text = _source("epilogue").replace(f"out = acc + {BIAS}", epilogue)
    with pytest.raises(AnnotationError, match=says):
        _generate(text)


def test_zeros_keep_the_layout_of_what_they_stand_for_and_are_made_once() -> None:
    from tilelink.rules import launch

    wide = torch.randn(24)[None, :].expand(50, 24)  # a broadcast bias: stride 0 along the rows
    seen = torch.randn(8, 6).t()  # a transposed view
    for t in (wide, seen):
        z = launch.zeros_in_layout(t, "linear", "bias_ptr")
        assert z.shape == t.shape and z.stride() == t.stride() and z.dtype == t.dtype, (z.stride(), t.stride())
        assert not z.any() and z.untyped_storage().nbytes() == (1 + sum(
            (n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))) * t.element_size()
    again = launch.zeros_in_layout(wide, "linear", "bias_ptr")
    assert again is launch.zeros_in_layout(wide, "linear", "bias_ptr")
    for n in range(1, launch._ZEROS_KEPT + 2):  # other layouts push the oldest out
        launch.zeros_in_layout(torch.zeros(n, 3), "linear", "bias_ptr")
    assert len(launch._ZEROS) == launch._ZEROS_KEPT
    with pytest.raises(Exception, match="argument 'bias_ptr' is read only in terms the kernel adds"):
        launch.zeros_in_layout(3, "linear", "bias_ptr")
