"""One definition, two forms: the Triton source generated from the Python model agrees with it.

* The Python forms use only the shared subset (checked on their AST), so the generated text is the
  same arithmetic.
* ``compile_mapping.py`` compiles them for sm_90 (no GPU needed; ~2 s).
* ``interpret_mapping.py`` runs the generated ``tl_`` functions under ``TRITON_INTERPRET=1`` in a
  subprocess (another test module may have imported triton in this process already) on a fixed
  sample: 25 random shardings (seed 0), 256 inputs each through every static function, up to 64
  int32 programs per sharding, and the table readers on a random gather index (~8 s on 2 cores).
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tilelink.mapping as mp

ALLOWED = (ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Assign, ast.Name, ast.Load, ast.Store,
           ast.Return, ast.Tuple, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Call,
           ast.Constant, ast.Expr)


@pytest.mark.parametrize("name", list(mp.PYTHON_FORMS))
def test_python_form_uses_only_the_shared_subset(name: str) -> None:
    fn = mp.PYTHON_FORMS[name]
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    callable_names = {"_min", "_max", *(f.__name__ for f in mp.PYTHON_FORMS.values())}
    for node in ast.walk(tree):
        assert isinstance(node, ALLOWED), f"{name}: {type(node).__name__} is outside the shared subset"
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name) and node.func.id in callable_names, ast.unparse(node)
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int | str), ast.unparse(node)
        if isinstance(node, ast.Expr):  # only the docstring
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    fdef = tree.body[0]
    assert not any(a.annotation for a in fdef.args.args), "annotations are dropped; keep the forms plain"


@pytest.mark.parametrize("name", mp.TRITON_NAMES)
def test_emitted_source_is_one_jit_function(name: str) -> None:
    text = mp.emit_source(name)
    tree = ast.parse(text)
    (fdef,) = tree.body
    assert fdef.name == name and ast.unparse(fdef.decorator_list[0]) == "triton.jit"
    assert "_min(" not in text and "_max(" not in text
    if name in mp.PYTHON_FORMS:
        params = list(inspect.signature(mp.PYTHON_FORMS[name]).parameters)
        assert [a.arg for a in fdef.args.args] == params


def test_module_source_defines_callees_first() -> None:
    text = mp.emit_module_source(["tl_channel_overlap"])
    assert text.startswith("# Tile-centric mapping") and "import triton.language as tl" in text
    names = [n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
    assert names == ["tl_channel_range", "tl_channel_overlap"]
    full = [n.name for n in ast.parse(mp.emit_module_source()).body if isinstance(n, ast.FunctionDef)]
    assert full == list(mp.TRITON_NAMES)
    with pytest.raises(ValueError, match="no mapping function named 'tl_nope'; pass one of: tl_channel_of"):
        mp.emit_source("tl_nope")


def test_generated_triton_forms_agree_with_python_model_under_interpreter() -> None:
    script = Path(__file__).with_name("interpret_mapping.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(script), "25", "0"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok ")


def test_generated_triton_forms_compile_for_sm90() -> None:
    """Compiled mode (no interpreter): every tl_ function inside one kernel lowers to PTX and cubin."""
    script = Path(__file__).with_name("compile_mapping.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ptx" in proc.stdout.split()
