"""A reduce-scatter over a GEMM whose activation sits under a compile-time test (Triton's matmul tutorial: `if
ACTIVATION == "leaky_relu":`): the kernel builds, the branch holds a static assert that refuses at compile time the
launches taking it, and the launches that do not take it reduce their partial sums."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

import tilelink
from tests.rules.activation_cases import linear_launches, refused_launch
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

ROOT = Path(__file__).resolve().parents[2]
FORM = Path(__file__).parent / "forms" / "gemm_rs_activation.py"
HEAD = "import triton\nimport triton.language as tl\nimport tilelink\n\n"


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def _generate(text: str):
    return generate(text, "user_kernels.py", requests_in(text, "user_kernels.py"))


def _error(source: str) -> AnnotationError:
    with pytest.raises(AnnotationError) as info:
        _generate(HEAD + textwrap.dedent(source))
    return info.value


def test_the_tutorial_form_builds_with_a_static_assert_at_the_top_of_its_activation_branch() -> None:
    text = FORM.read_text()
    rel = FORM.relative_to(ROOT).as_posix()
    gen = generate(text, rel, requests_in(text, rel))
    body = cst.parse_module(gen.rewritten["matmul_act"]).body[0]
    branch = next(s for s in body.body.body if isinstance(s, cst.If))
    first = cst.Module(body=[]).code_for_node(branch.body.body[0]).strip().splitlines()[-1]  # below its comment
    assert first.startswith("tl.static_assert(False, "), first
    epilogue, test = _line_of(text, "accumulator = leaky_relu(accumulator)"), _line_of(text, "if ACTIVATION ==")
    assert f"{rel}:{epilogue}: the value stored to \\'c_ptr\\' goes through the helper `leaky_relu`" in first, first
    assert "tll.producer_tile_notify" in gen.rewritten["matmul_act"]
    notes = [e for e in gen.report.entries if e.status == "note" and "static_assert" in e.message]
    assert len(notes) == 1 and notes[0].where.line == test, gen.report
    assert f'`if ACTIVATION == "leaky_relu":` at line {test}' in notes[0].message
    assert f"fail to compile, naming line {epilogue}" in notes[0].message, notes[0].message


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_the_launches_without_the_activation_equal_torch_on_the_race_exposing_schedule(world: int,
                                                                                        monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    errors = tilelink.spawn(linear_launches, world)
    assert all(err < 1e-3 for err in errors), errors


@pytest.mark.slow
def test_a_launch_with_the_activation_fails_saying_where_and_why_and_the_next_launch_equals_torch(monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    epilogue = _line_of(FORM.read_text(), "accumulator = leaky_relu(accumulator)")
    for rank, result in enumerate(tilelink.spawn(refused_launch, 2)):
        raised = result["raised"]
        assert raised is not None, f"rank {rank}: the launch with ACTIVATION='leaky_relu' ran"
        # refused on the host, before the call's channels move on: not the interpreter's assert mid-call
        assert raised.startswith("LaunchError: matmul_act: "), raised
        assert f"gemm_rs_activation.py:{epilogue}: the value stored to 'c_ptr' goes through the helper " \
               "`leaky_relu`" in raised and "that sum would not be the full problem's value" in raised, raised
        assert result["kept"], f"rank {rank}: the refused launch wrote its output shard"
        assert result["after"] < 1e-3, f"rank {rank}: a launch after the refused one is off by {result['after']}"


#: compiles the form's rewritten kernel for sm_90 with Triton's code generator (no GPU needed) under each ACTIVATION
COMPILE = """
from triton.compiler.errors import CompileTimeAssertionFailure
from tests.rules.compile_rewritten import compile_asm
from tests.rules.forms_cases import load_form

okernel = load_form("gemm_rs_activation").matmul_act
types = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "tlk_barriers": "*i64", "tlk_diag": "*i64",
         "tlk_budget": "i64"}
meta = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
for activation in ("", "leaky_relu"):
    try:
        ptx = compile_asm(getattr(okernel.module, okernel.name), types, {**meta, "ACTIVATION": activation})["ptx"]
        print(repr(activation), "compiled", "mma" in ptx)
    except CompileTimeAssertionFailure as exc:
        print(repr(activation), "refused", " ".join(str(exc).split()))
"""


@pytest.mark.slow
def test_the_code_generator_compiles_only_the_launches_without_the_activation() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, "-c", COMPILE], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    epilogue = _line_of(FORM.read_text(), "accumulator = leaky_relu(accumulator)")
    assert lines[0] == "'' compiled True", result.stdout  # the tensor-core GEMM, with the notifies
    assert lines[1].startswith("'leaky_relu' refused"), result.stdout
    assert f"gemm_rs_activation.py:{epilogue}: the value stored to 'c_ptr' goes through the helper `leaky_relu`" \
        in lines[1], lines[1]


RUNTIME = '''
@triton.jit
def leaky_relu(x):
    return tl.where(x >= 0, x, 0.01 * x)


@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.jit
def kernel(a_ptr, b_ptr, c_ptr, M, N, activation, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           ACTIVATION: tl.constexpr = ""):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    acc = tl.dot(tl.load(a_ptr + offs_m[:, None] * N + offs_n[None, :]), tl.load(b_ptr + offs_n[:, None] * N
                 + offs_n[None, :]))
    {epilogue}
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=offs_m[:, None] < M)
'''


def test_an_activation_under_a_run_time_test_is_refused_saying_the_test_can_be_made_compile_time() -> None:
    err = _error(RUNTIME.format(epilogue="if activation == 1:\n        acc = leaky_relu(acc)"))
    assert "goes through the helper `leaky_relu` applied to the partial sums, whose return goes through" \
        in str(err), err
    assert "at line 20, in the `if activation == 1:` at line 19, which is decided at run time" in str(err), err
    assert err.line == 21, err
    assert "the `if activation == 1:` at line 19 is decided at run time: make its test compile-time" in err.hint
    assert "linear_epilogue=True" in err.hint


@pytest.mark.parametrize(("epilogue", "says"), [
    ("if ACTIVATION == 'leaky_relu':\n        acc = leaky_relu(acc)\n    else:\n        acc = tl.sigmoid(acc)",
     "every side of the `if ACTIVATION == 'leaky_relu':` at line 19"),
    ("if ACTIVATION == 'a':\n        acc = leaky_relu(acc)\n    elif ACTIVATION == 'b':\n        acc = acc * acc\n"
     "    else:\n        acc = tl.exp(acc)", "every side of the `if ACTIVATION == 'a':` at line 19"),
    ("if ACTIVATION == 'leaky_relu':\n        acc = acc * 2.0\n    acc = tl.maximum(acc, 0.0)",
     "goes through `maximum` applied to the partial sums"),
    # the mix is neither side's doing: refusing the side that keeps the partial sums would be wrong
    ("if ACTIVATION == 'one':\n        out = 1.0\n    else:\n        out = acc\n    acc = out",
     "goes through a value that is the partial sums on one path and not on another"),
])
def test_an_activation_on_every_side_or_outside_the_compile_time_branch_is_refused(epilogue: str, says: str) -> None:
    err = _error(RUNTIME.format(epilogue=epilogue))
    assert says in str(err) and "that sum would not be the full problem's value" in str(err), err


@pytest.mark.parametrize("epilogue", [
    "if ACTIVATION == 'a':\n        acc = leaky_relu(acc)\n    elif ACTIVATION == 'b':\n        acc = acc * acc\n"
    "    else:\n        acc = acc * 0.5",
    "if ACTIVATION != '' and not BLOCK_N < 16:\n        acc = leaky_relu(acc)",
    "if ACTIVATION == '':\n        acc = acc * 0.5\n    else:\n        acc = leaky_relu(acc)",
])
def test_a_compile_time_branch_with_a_linear_side_builds_with_a_static_assert_in_each_other_side(epilogue) -> None:
    gen = _generate(HEAD + textwrap.dedent(RUNTIME.format(epilogue=epilogue)))
    body = gen.rewritten["kernel"]
    refused = epilogue.count("leaky_relu") + epilogue.count("acc * acc")
    assert body.count("tl.static_assert(False, ") == refused, body
    for line in body.splitlines():
        if "tl.static_assert" in line:
            assert "user_kernels.py:" in line and "reduce_scatter sums what every rank stores" in line, line
    assert len([e for e in gen.report.entries if "static_assert" in e.message]) == refused, gen.report


@pytest.mark.parametrize(("epilogue", "says"), [
    ("if activation == 1: acc = tl.sigmoid(acc)", "in the `if activation == 1:` at line 19, which is decided at run"),
    ("if M > 0: acc = acc * 2.0; acc = leaky_relu(acc)", "in the `if M > 0:` at line 19, which is decided at run"),
    ("acc = acc * 2.0; acc = tl.sigmoid(acc)", "goes through `sigmoid` applied to the partial sums"),
])
def test_an_activation_on_a_one_line_suite_or_line_is_refused(epilogue: str, says: str) -> None:
    err = _error(RUNTIME.format(epilogue=epilogue))
    assert says in str(err) and "that sum would not be the full problem's value" in str(err), err


@pytest.mark.parametrize("epilogue", [
    "if ACTIVATION == 'leaky_relu': acc = leaky_relu(acc)",
    "if ACTIVATION == 'leaky_relu': out = acc * 2.0; acc = leaky_relu(out)",
])
def test_a_one_line_compile_time_branch_gets_its_static_assert_on_a_line_of_its_own(epilogue: str) -> None:
    gen = _generate(HEAD + textwrap.dedent(RUNTIME.format(epilogue=epilogue)))
    body = cst.parse_module(gen.rewritten["kernel"]).body[0]
    branch = next(s for s in body.body.body if isinstance(s, cst.If))
    assert isinstance(branch.body, cst.IndentedBlock), gen.rewritten["kernel"]
    lines = [cst.Module(body=[]).code_for_node(s).strip().splitlines()[-1] for s in branch.body.body]
    assert lines[0].startswith("tl.static_assert(False, "), lines
    assert "user_kernels.py:19: the value stored to" in lines[0], lines
    assert lines[1:] == [s.strip() for s in epilogue.split(":", 1)[1].split(";")], lines
    assert len([e for e in gen.report.entries if "static_assert" in e.message]) == 1, gen.report


@pytest.mark.parametrize(("epilogue", "taken"), [
    ("if True:\n        acc = leaky_relu(acc)", "the `if True:` at line 19"),
    ("if 1: acc = tl.sigmoid(acc)", "the `if 1:` at line 19"),
    ("if False:\n        acc = acc * 2.0\n    else:\n        acc = leaky_relu(acc)", "the `else:` of the `if False:`"),
    ("MODE: tl.constexpr = 'gelu'\n    if MODE == 'gelu':\n        acc = leaky_relu(acc)",
     "the `if MODE == 'gelu':` at line 20"),
])
def test_an_activation_on_a_side_every_launch_takes_is_refused_at_build(epilogue: str, taken: str) -> None:
    # a static assert there would leave no launch that compiles, under a report saying the rewrite applied
    err = _error(RUNTIME.format(epilogue=epilogue))
    assert f"{taken}" in str(err) and "which every launch takes" in str(err), err
    assert "that sum would not be the full problem's value" in str(err), err


def test_an_activation_on_a_side_no_launch_takes_builds() -> None:
    gen = _generate(HEAD + textwrap.dedent(RUNTIME.format(
        epilogue="MODE: tl.constexpr = ''\n    if MODE == 'gelu':\n        acc = leaky_relu(acc)")))
    assert gen.rewritten["kernel"].count("tl.static_assert(False, ") == 1, gen.rewritten["kernel"]


def test_an_inner_compile_time_if_refused_on_every_side_refuses_the_side_around_it() -> None:
    # the default launch (ACTIVATION="") takes neither inner side: only the outer side is refused
    gen = _generate(HEAD + textwrap.dedent(RUNTIME.format(
        epilogue="if ACTIVATION != '':\n        if ACTIVATION == 'gelu':\n            acc = leaky_relu(acc)\n"
                 "        else:\n            acc = tl.sigmoid(acc)")))
    body = cst.parse_module(gen.rewritten["kernel"]).body[0]
    outer = next(s for s in body.body.body if isinstance(s, cst.If))
    first = cst.Module(body=[]).code_for_node(outer.body.body[0]).strip().splitlines()[-1].replace("\\'", "'")
    assert first.startswith("tl.static_assert(False, ") and "on one side of the `if ACTIVATION == 'gelu':` at line " \
        "20, and a non-linear function of them on each other side" in first, first
    assert gen.rewritten["kernel"].count("tl.static_assert(False, ") == 1, gen.rewritten["kernel"]
    notes = [e for e in gen.report.entries if "static_assert" in e.message]
    assert len(notes) == 1 and notes[0].message.startswith("in the `if ACTIVATION != '':` at line 19"), notes


def test_nested_compile_time_ifs_refused_on_every_side_up_to_the_kernel_body_are_refused_at_build() -> None:
    err = _error(RUNTIME.format(
        epilogue="if ACTIVATION != '':\n        if ACTIVATION == 'gelu':\n            acc = leaky_relu(acc)\n"
                 "        else:\n            acc = tl.sigmoid(acc)\n    else:\n        acc = tl.exp(acc)"))
    assert "every side of the `if ACTIVATION != '':` at line 19" in str(err), err
    assert "no launch of the kernel would store their sum" in str(err), err


@pytest.mark.parametrize(("epilogue", "test"), [
    ("if ACTIVATION == 'a':\n        acc = acc * 0.5\n    elif ACTIVATION == 'b':\n        acc = leaky_relu(acc)",
     "not (ACTIVATION == 'a') and (ACTIVATION == 'b')"),
    ("MODE: tl.constexpr = 'gelu'\n    if ACTIVATION == MODE:\n        acc = leaky_relu(acc)",
     "(ACTIVATION == ('gelu'))"),
    ("if M > 0:\n        if ACTIVATION != '': acc = tl.sigmoid(acc)", "(ACTIVATION != '')"),
])
def test_the_plan_carries_the_launch_test_of_each_refused_side(epilogue: str, test: str) -> None:
    # what the launcher evaluates on the call's constexpr arguments before it runs anything; a run-time `if`
    # around the side is compiled either way, so it is not part of the test
    gen = _generate(HEAD + textwrap.dedent(RUNTIME.format(epilogue=epilogue)))
    (refused,) = gen.plans[0].launch.refused
    assert refused[0] == test, refused
    assert refused[1].startswith("user_kernels.py:") and "reduce_scatter sums what every rank stores" in refused[1]
