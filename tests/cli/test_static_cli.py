"""``tlxform build`` / ``check`` / ``show`` are static: they load neither torch, Triton nor the runtime, and
write the same module as the path that imports the rules' partner kernels."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from tilelink.overlapped import build
from tilelink.rules import RULES, Rule

ROOT = Path(__file__).resolve().parents[2]
# together, every partner kernel of both rules: pull, push and ring, the hybrid and the top-k reduce
FILES = [str(ROOT / p) for p in ("ops/moe_kernels.py", "tests/rules/all_gather/push_gemm.before.py",
                                 "tests/rules/reduce_scatter/ring_gemm.before.py")]
HEAVY = ("torch", "triton", "tilelink.runtime", "tilelink.language")

# runs the `tlxform` command in a fresh interpreter, then names the heavy modules it loaded on its last line
_WRAPPER = """
import sys
from tilelink.cli.main import main
try:
    main(sys.argv[1:], prog_name="tlxform")
finally:
    print("loaded:", ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def _tlxform(*args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    result = subprocess.run([sys.executable, "-c", _WRAPPER.format(heavy=HEAVY), *args], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    last = result.stdout.rstrip("\n").rsplit("\n", 1)[-1]
    assert last.startswith("loaded:"), result.stdout + result.stderr
    return result, [m for m in last.removeprefix("loaded:").strip().split(",") if m]


@pytest.mark.parametrize("command", ["build", "check", "show"])
def test_static_commands_load_no_torch(command: str, tmp_path: Path) -> None:
    args = {"build": ["build", *FILES, "-o", str(tmp_path)], "check": ["check", *FILES],
            "show": ["show", f"{FILES[0]}::group_gemm_rs_kernel"]}[command]
    result, loaded = _tlxform(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert loaded == [], f"tlxform {command} loaded {loaded}"
    if command == "show":
        assert result.stdout.startswith("---") and "\n+    tll.producer_tile_notify_channels(" in result.stdout


def _imported_source(rule: Rule, name: str) -> str:
    """The partner kernel's source as the imported module gives it (what codegen copied before)."""
    return inspect.getsource(getattr(rule.kernels_module(), name).fn).strip("\n")


def test_partner_kernel_sources_read_from_the_file_are_the_imported_kernels() -> None:
    for rule in RULES.values():
        module = rule.kernels_module()
        # every @triton.jit kernel the module defines (a JITFunction, or an InterpretedFunction in the interpreter)
        names = [n for n, v in vars(module).items()
                 if inspect.isfunction(getattr(v, "fn", None)) and v.fn.__module__ == module.__name__]
        assert names, f"{rule.kind}: no partner kernels found"
        for name in names:
            assert rule.kernel_source(name) == _imported_source(rule, name), f"{rule.kind}.{name}"
    with pytest.raises(LookupError, match="no partner kernel 'nope'.*ag_pull_producer"):
        RULES["all_gather"].kernel_source("nope")


def test_build_writes_the_module_the_import_based_path_wrote(tmp_path: Path, monkeypatch) -> None:
    result, _ = _tlxform("build", "-q", *FILES, "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    monkeypatch.setattr(Rule, "kernel_source", _imported_source)
    for path in FILES:
        written = (tmp_path / f"{Path(path).stem}_tilelink.py").read_text()
        assert "# partner kernels of the rules" in written
        assert written == build(path).text, path
