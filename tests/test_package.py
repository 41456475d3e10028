"""The package's shape: what a bare ``import tilelink`` offers, and what it leaves unloaded.

Each check runs in a fresh interpreter (this process has long since imported torch and the operators).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _python(cwd, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd`` (outside the checkout: only what is installed can be imported)."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_bare_import_reaches_ops_and_nn_lazily(tmp_path):
    result = _python(tmp_path, "-c", textwrap.dedent("""
        import sys

        import tilelink

        heavy = [m for m in ("torch", "triton", "libcst", "tilelink.ops", "tilelink.nn", "tilelink.runtime")
                 if m in sys.modules]
        assert not heavy, f"import tilelink loaded {heavy}"
        assert callable(tilelink.ops.ag_gemm) and callable(tilelink.ops.gemm_rs)
        assert "tilelink.ops" in sys.modules
        assert isinstance(tilelink.nn.TPMLP, type) and isinstance(tilelink.nn.TPMoE, type)
        assert callable(tilelink.runtime.current_world)
        assert "consumer_tile_wait" in dir(tilelink.language)
        try:
            tilelink.no_such_thing
        except AttributeError as exc:
            assert "no_such_thing" in str(exc)
        else:
            raise AssertionError("tilelink.no_such_thing did not raise AttributeError")
        print("ok")
    """))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("name", ["mlp", "moe", "attention", "e2e", "host", "model", "decode"])
def test_benchmarks_ship_in_the_package(tmp_path, name):
    """``python -m tilelink.benchmarks.<name>`` from any directory: the benchmarks are part of the package, not
    a folder of the checkout that must be on ``sys.path``, and each module runs as its ``tlxform bench`` command."""
    result = _python(tmp_path, "-m", f"tilelink.benchmarks.{name}", "--help")
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout.lower() and "--help" in result.stdout, result.stdout
