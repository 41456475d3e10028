"""FP8 (e4m3) ``ag_gemm``, ``gemm_rs`` and ``TPMLP(fp8=True)`` in emulated worlds of 1-3 ranks, odd shapes, against
the float64 product of the dequantised operands.

Triton 3.9's interpreter loads ``float8e4nv`` and takes it in ``tl.dot`` (the first test checks it on a tiny
kernel), so the emulated worlds run the FP8 kernels themselves, e4m3 operands and all: the scales' epilogue, the
gathered row scales and the reduction of scaled partial sums are checked here, on the race-exposing schedule.
"""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.ops.fp8_worlds import (
    fp8_bad_inputs,
    fp8_compiled_mlp_matches_eager,
    fp8_mlp_matches_reference,
    fp8_ops_match_reference,
)


def test_the_interpreter_loads_and_multiplies_e4m3() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def scaled_dot(a_ptr, b_ptr, s_ptr, c_ptr, B: tl.constexpr):
        offs = tl.arange(0, B)
        a = tl.load(a_ptr + offs[:, None] * B + offs[None, :])
        b = tl.load(b_ptr + offs[:, None] * B + offs[None, :])
        acc = tl.dot(a, b) * tl.load(s_ptr + offs)[:, None]
        tl.store(c_ptr + offs[:, None] * B + offs[None, :], acc)

    g = torch.Generator().manual_seed(3)
    a, b = ((torch.randn(16, 16, generator=g) * 4).to(torch.float8_e4m3fn) for _ in range(2))
    s, c = torch.rand(16, generator=g) + 0.5, torch.empty(16, 16)
    scaled_dot[(1,)](a, b, s, c, B=16)
    ref = (a.double() @ b.double()) * s.double()[:, None]
    assert torch.allclose(c.double(), ref, rtol=1e-6, atol=1e-4)


def test_quantize_fp8_keeps_each_row_within_e4m3_precision() -> None:
    from tilelink.ops.tp_fp8 import quantize_fp8

    x = torch.randn(5, 33) * torch.tensor([1e-3, 1.0, 50.0, 0.0, 7.0])[:, None]
    q, s = quantize_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (5,)
    deq = q.float() * s[:, None]
    assert torch.equal(deq[3], torch.zeros(33))  # a zero row stays zero (its scale is not 0)
    assert ((deq - x).abs() <= x.abs().amax(1, keepdim=True) * 2**-4 + 1e-30).all()  # 3 mantissa bits
    assert torch.allclose(q.float().abs().amax(1)[[0, 1, 2, 4]], torch.full((4,), 448.0))
    q, s = quantize_fp8(x, rowwise=False)
    assert s.shape == () and float(s) == pytest.approx(x.abs().max().item() / 448.0)
    q, s = quantize_fp8(torch.empty(0, 8))  # a rank without rows
    assert q.shape == (0, 8) and s.shape == (0,)


@pytest.mark.slow
def test_the_reduce_scatter_rule_takes_the_scaled_epilogue_as_written() -> None:
    """Scaling the partial sums by loaded per-row and per-column scales is linear in them: the GEMM+RS kernels
    need no ``linear_epilogue=True``, and the AG kernels gather the row scales with the rows."""
    from pathlib import Path

    from click.testing import CliRunner

    import tilelink.ops
    from tilelink.cli.main import main as tlxform

    source = Path(tilelink.ops.__file__).parent / "tp_fp8_kernels.py"
    assert "linear_epilogue" not in source.read_text().split('"""', 2)[2]  # the kernels' code, not the docstring
    result = CliRunner().invoke(tlxform, ["check", str(source)])
    assert result.exit_code == 0, result.output
    for kernel in ("gemm_rs_fp8_kernel", "gemm_rs_fp8_persistent_kernel"):
        assert f"[applied] {kernel} / reduce_scatter" in result.output and "producer_tile_notify" in result.output
    # one wait guards a tile's rows and their scales: the pointer kernel's, and each loop's of the persistent one
    assert result.output.count("guards the reads of a_ptr, a_scale_ptr at") == 3, result.output
    assert result.output.count("consumer_tile_wait") == 3, result.output


def test_fp8_ops_are_ordered_and_their_fakes_follow_rank_world_and_out_dtype() -> None:
    from torch._higher_order_ops.effects import _get_effect
    from torch._library.effects import EffectType
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

    import tilelink.ops  # noqa: F401 - registers torch.ops.tilelink.*

    ops = torch.ops.tilelink
    for name in ("ag_gemm_fp8", "gemm_rs_fp8"):
        op = getattr(ops, name).default
        assert not any(arg.alias_info is not None for arg in op._schema.arguments), op._schema
        assert _get_effect(op) is EffectType.ORDERED, name
    f8 = torch.float8_e4m3fn
    with FakeTensorMode(shape_env=ShapeEnv()):
        one = torch.ones(())
        a, b, b_down = torch.empty(3, 16, dtype=f8), torch.empty(16, 24, dtype=f8), torch.empty(24, 16, dtype=f8)
        h = ops.ag_gemm_fp8(a, b, one, one, torch.bfloat16, 7, 1, 2, None)
        assert h.shape == (7, 24) and h.dtype == torch.bfloat16
        h = ops.ag_gemm_fp8(a, b, torch.ones(3), torch.ones(24), torch.float16, None, 1, 2, None)
        assert free_unbacked_symbols(h.shape[0]) and h.dtype == torch.float16
        y = ops.gemm_rs_fp8(torch.empty(7, 24, dtype=f8), b_down, one, one, torch.float32, 1, 2, None)
        assert y.shape == (3, 16) and y.dtype == torch.float32


def test_bad_fp8_inputs_raise_before_running() -> None:
    (messages,) = tilelink.spawn(fp8_bad_inputs, 1)
    assert "NO ERROR" not in messages, messages
    expected = ["float8_e5m2; FP8 operands must be torch.float8_e4m3fn", "need a_scale=, a float32 tensor",
                "a_scale has shape (3,); pass a scalar tensor (shape () or (1,)), or one per row of a_shard: shape "
                "(8,) or (8, 1)", "b_scale has shape (4, 1)", "a_scale is torch.float64; pass float32 scales",
                "b is torch.float32, but a scale was passed", "a_shard is torch.float32, but a scale was passed",
                "out_dtype=torch.int32 is not one of", "out_dtype=torch.bfloat16 is for FP8 operands",
                "gemm_rs: float8_e4m3fn operands need a_scale=", "ag_gemm: path='plain' has no FP8 form"]
    for want, got in zip(expected, messages, strict=True):
        assert want in got, (want, got)


@pytest.mark.slow
@pytest.mark.parametrize(("world", "N", "K", "scaling", "persistent", "out_dtype", "b_layout"), [
    (1, 24, 48, "rowwise", False, "float32", "nk"),  # the pointer kernels, a satisfied world
    (1, 24, 48, "tensor", True, "float32", "kn"),  # persistent; a row-major B copied K-major
    (2, 40, 48, "rowwise", True, "bfloat16", "nk"),  # AG: 6 tiles on 4 programs, the last two in column pieces
    (3, 40, 48, "tensor", True, "bfloat16", "nk"),  # each rank's own per-tensor scale, sent with its rows
    (3, 24, 48, "rowwise", False, "float32", "kn"),  # the SM pull and the SM reduce-scatter
    (3, 24, 40, "rowwise", True, "float32", "nk"),  # K 14, 14, 12: AG on the pointer kernel, RS pads K to 16
])
def test_fp8_ops_match_the_dequantised_reference(world: int, N: int, K: int, scaling: str, persistent: bool,
                                                 out_dtype: str, b_layout: str) -> None:
    tolerance = 1e-6 if out_dtype == "float32" else 1e-2  # fp32 accumulation; or the bf16 result's rounding
    for per_rank in tilelink.spawn(fp8_ops_match_reference, world, 37, N, K, scaling, persistent, out_dtype,
                                   b_layout):
        assert all(err < tolerance for err in per_rank.values()), per_rank


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 3])
def test_fp8_tp_mlp_matches_the_quantised_reference(world: int) -> None:
    for err in tilelink.spawn(fp8_mlp_matches_reference, world, 23, 16, 40):
        assert err < 1e-3


@pytest.mark.slow
def test_fp8_tp_mlp_compiles_whole_through_the_fp8_ops() -> None:
    for r, result in enumerate(tilelink.spawn(fp8_compiled_mlp_matches_eager, 2)):
        assert result["breaks"] == 0 and result["graphs"] == 1, (r, result)
        assert {"ag_gemm_fp8", "gemm_rs_fp8"} <= set(result["ops"]), (r, result)
        assert result["fake"] == result["real"], (r, result)
        assert result["err"] < 1e-5, (r, result)


#: the shared memory a Hopper block may allocate (bytes): a kernel asking more is refused at launch
HOPPER_SHARED = 227 * 1024


@pytest.mark.slow
def test_fp8_kernels_compile_for_hopper_with_e4m3_mma_and_fit_shared_memory() -> None:
    """Compiled for sm_90 here (no GPU), with the configurations the operators launch on one: every FP8 kernel,
    as written and rewritten, multiplies on e4m3 warpgroup MMAs and fits in shared memory (the AG kernel's four
    stages beside its half C tile); the persistent ones move A, B and C by TMA."""
    import ast
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_fp8.py")
    result = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    profiles = {}
    for line in result.stdout.splitlines():
        kernel, variant, rest = line.split(" ", 2)
        profiles[(kernel, variant)] = ast.literal_eval(rest)
    assert len(profiles) == 12, result.stdout  # 4 kernels as written and rewritten, the persistent ones for fp32 too
    for (kernel, variant), profile in profiles.items():
        assert profile["wgmma e4m3"] > 0 and profile["shared"] <= HOPPER_SHARED, (kernel, variant, profile)
        plain = profiles[(kernel, "plain_fp32" if variant.endswith("_fp32") else "plain")]
        assert profile["wgmma e4m3"] == plain["wgmma e4m3"], (kernel, variant, profile)
        if kernel.endswith("persistent"):
            assert profile["tma load"] > 0 and profile["tma store"] > 0, (kernel, variant, profile)
