"""``tlxform build`` / ``show`` / ``check``: what they print and the exit codes scripts rely on."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tilelink.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
AG = str(ROOT / "examples" / "ag_gemm.py")
VECTOR = str(ROOT / "tests" / "rules" / "all_gather" / "vector_1d.before.py")


def test_build_writes_the_module_and_prints_the_report(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["build", AG, "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = tmp_path / "ag_gemm_tilelink.py"
    assert written.exists() and "tll.consumer_tile_wait(" in written.read_text()
    assert "[applied] matmul_kernel / all_gather" in result.output


def test_build_strict_exits_3_when_a_rewrite_was_not_applied(tmp_path: Path) -> None:
    plain = CliRunner().invoke(main, ["build", VECTOR, "-o", str(tmp_path)])
    strict = CliRunner().invoke(main, ["build", "--strict", VECTOR, "-o", str(tmp_path)])
    assert plain.exit_code == 0 and "[not applied]" in plain.output
    assert strict.exit_code == 3


def test_build_reports_bad_files_and_goes_on(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import triton\n\n@triton.jit\ndef k(x):\n    pass\n")
    result = CliRunner().invoke(main, ["build", str(bad), AG, "-o", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "no @tilelink.overlap kernels" in result.output and (tmp_path / "out" / "ag_gemm_tilelink.py").exists()


def test_show_prints_a_unified_diff() -> None:
    result = CliRunner().invoke(main, ["show", f"{AG}::matmul_kernel"])
    assert result.exit_code == 0
    assert result.output.startswith("---") and "\n+    tlk_token = tll.consumer_tile_wait(" in result.output
    assert "\n-@tilelink.overlap(" in result.output


def test_show_names_the_annotated_kernels_when_asked_for_another() -> None:
    result = CliRunner().invoke(main, ["show", f"{AG}::nope"])
    assert result.exit_code == 1 and "annotated: matmul_kernel" in result.output


def test_show_wants_file_and_kernel() -> None:
    result = CliRunner().invoke(main, ["show", AG])
    assert result.exit_code == 2 and "FILE::KERNEL" in result.output


def test_check_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["check", AG])
    assert result.exit_code == 0 and f"{AG}: ok" in result.output
    assert not any(tmp_path.iterdir())


def test_importing_the_decorator_module_keeps_tilelink_overlap_the_decorator() -> None:
    """`tilelink.overlap` is the decorator whatever was imported first (a submodule of the same name
    would replace it on the package)."""
    import subprocess
    import sys

    code = ("import tilelink.overlapped, tilelink.cli.build_cmd, tilelink; "
            f"from tilelink.cli.build_cmd import _generate; _generate({AG!r}); "
            "assert callable(tilelink.overlap) and tilelink.overlap.__name__ == 'overlap'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
