"""An inlined helper keeps the names it had as a function of its own: a module-level name it reads stays the module's
(never a local of the kernel, or of another helper inlined around it), and its compile-time locals are still defined
once when the call sits in an unrolled `tl.static_range` loop."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
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

SHADOWED = '''
SCALE: tl.constexpr = 2.0


@triton.jit
def _scaled(x_ptrs, mask):
    return tl.load(x_ptrs, mask=mask, other=0.0) * SCALE


@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    SCALE = 3.0
    y = _scaled(x_ptr + offs, offs < N)
    tl.store(y_ptr + offs, y * SCALE, mask=offs < N)
'''

# the outer helper's local `SCALE` is not the module's `SCALE` the inner helper reads
NESTED = '''
SCALE: tl.constexpr = 2.0


@triton.jit
def _scaled(x_ptrs, mask):
    return tl.load(x_ptrs, mask=mask, other=0.0) * SCALE


@triton.jit
def _scaled_and_shifted(x_ptrs, mask, shift):
    SCALE = shift + 1.0
    y = _scaled(x_ptrs, mask)
    return y + SCALE


@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def kernel(x_ptr, y_ptr, N, shift, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    y = _scaled_and_shifted(x_ptr + offs, offs < N, shift)
    tl.store(y_ptr + offs, y, mask=offs < N)
'''

# a compile-time local of a helper called on each unrolled step: `HALF: tl.constexpr = ...` inlined into the loop
# would be defined again on the second step, which Triton's compiler refuses
UNROLLED = '''
@triton.jit
def _add_half(acc, x_ptrs, mask, W: tl.constexpr):
    HALF: tl.constexpr = W // 2
    QUARTER: tl.constexpr = HALF // 2
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    return acc + x * HALF + tl.sum(tl.arange(0, QUARTER * 2)).to(tl.float32)


@tilelink.overlap(tilelink.all_gather("x_ptr", size="N"))
@triton.jit
def kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in tl.static_range(1, 3):
        acc = _add_half(acc, x_ptr + offs, offs < N, 4 * i)
    tl.store(y_ptr + offs, acc, mask=offs < N)
'''


def _rewritten(source: str) -> str:
    text = HEAD + textwrap.dedent(source)
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).rewritten["kernel"]


def test_a_module_level_name_the_kernel_binds_too_is_refused_at_the_helpers_read() -> None:
    with pytest.raises(AnnotationError) as info:
        _rewritten(SHADOWED)
    err = info.value
    assert "reads the module-level `SCALE`, which kernel 'kernel' also binds" in str(err), err
    assert (err.line, err.column) == (11, 52), err  # `SCALE` in the helper's return
    assert "rename the kernel's `SCALE`" in err.hint, err.hint


def test_a_module_level_default_the_kernel_binds_too_is_refused_at_the_default() -> None:
    # a call that leaves `scale` out writes the default, `SCALE`, into the kernel, where it names the kernel's
    source = SHADOWED.replace("def _scaled(x_ptrs, mask):", "def _scaled(x_ptrs, mask, scale=SCALE):").replace(
        "other=0.0) * SCALE", "other=0.0) * scale")
    with pytest.raises(AnnotationError) as info:
        _rewritten(source)
    err = info.value
    assert "reads the module-level `SCALE`, which kernel 'kernel' also binds" in str(err), err
    assert (err.line, err.column) == (10, 33), err  # the default in the helper's parameters


def test_a_helpers_local_is_renamed_away_from_a_module_level_name_a_helper_inlined_inside_it_reads() -> None:
    body = _rewritten(NESTED)
    flat = " ".join(body.split())
    assert "* SCALE" in flat and "SCALE_2 = shift + 1.0" in flat and "y = y_2 + SCALE_2" in flat, body


def test_a_helpers_compile_time_locals_are_written_where_they_are_used() -> None:
    body = _rewritten(UNROLLED)
    assert "tl.constexpr =" not in body, body
    assert "x * ((4 * i) // 2)" in " ".join(body.split()), body
    assert "tl.arange(0, (((4 * i) // 2) // 2) * 2)" in " ".join(body.split()), body


def test_a_compile_time_local_whose_inputs_the_helper_binds_again_stays_where_it_is_defined() -> None:
    # written at its use, `HALF` would read `W` after `W = W * 4`: four times the helper's value
    source = UNROLLED.replace("    QUARTER: tl.constexpr = HALF // 2\n",
                              "    QUARTER: tl.constexpr = HALF // 2\n    W = W * 4\n")
    flat = " ".join(_rewritten(source).split())
    assert "HALF: tl.constexpr = W // 2" in flat and "x * HALF" in flat, flat
    assert flat.index("HALF: tl.constexpr = W // 2") < flat.index("W = W * 4"), flat


def _run(path: str, kernel_form: str) -> float:
    spec = importlib.util.spec_from_file_location(f"scopes_{kernel_form}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rank, world = tilelink.rank(), tilelink.world_size()
    N, block = 48, 16
    x = torch.randn(N, generator=torch.Generator().manual_seed(5))
    lo, hi = rows_of(rank, world, N)
    y = torch.full((N,), float("nan"))
    if kernel_form == "nested":
        module.kernel[(triton.cdiv(N, block),)](x[lo:hi].contiguous(), y, N, 0.5, BLOCK=block)
        ref = x * 2.0 + 1.5
    else:
        module.kernel[(triton.cdiv(N, block),)](x[lo:hi].contiguous(), y, N, BLOCK=block)
        ref = x * (2 + 4) + sum(range(2)) + sum(range(4))  # HALF 2 then 4; QUARTER * 2 = 2 then 4
    return float("nan") if y.isnan().any() else (y - ref).abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kernel_form", ["nested", "unrolled"])
def test_inlined_helpers_equal_torch_on_the_race_exposing_schedule(kernel_form: str, world: int, tmp_path,
                                                                   monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"scopes_{kernel_form}.py"
    path.write_text(HEAD + textwrap.dedent(NESTED if kernel_form == "nested" else UNROLLED))
    errors = tilelink.spawn(_run, world, str(path), kernel_form)
    assert all(e < 1e-5 for e in errors), errors


COMPILE = '''
import importlib.util, sys
from tests.rules.compile_rewritten import compile_asm
spec = importlib.util.spec_from_file_location("unrolled_helper", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
kernel = module.kernel
while not hasattr(kernel, "arg_names"):
    kernel = kernel.fn
types = {n: "*fp32" if n.endswith("_ptr") else "*i64" if n in ("tlk_barriers", "tlk_diag") else "i32"
         for n in kernel.arg_names}
compile_asm(kernel, types, {"BLOCK": 64})
print("compiled")
'''


@pytest.mark.slow
def test_the_unrolled_helper_compiles_for_sm90(tmp_path) -> None:
    text = HEAD + textwrap.dedent(UNROLLED)
    path = tmp_path / "unrolled_helper.py"
    path.write_text(generate(text, "user_kernels.py", requests_in(text, "user_kernels.py")).text)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([sys.executable, "-c", COMPILE, str(path)], env=env, capture_output=True, text=True,
                            cwd=root, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
