"""``tlxform run``: environment of the ranks, prefixed output, failure and timeout handling."""

from __future__ import annotations

import textwrap
import time

from click.testing import CliRunner

from tilelink.cli.main import main


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_run_sets_the_torchrun_environment(tmp_path):
    script = _script(tmp_path, """
        import os, sys
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "TRITON_INTERPRET", "TILELINK_BACKEND")
        print(" ".join(f"{k}={os.environ.get(k)}" for k in keys), sys.argv[1:])
    """)
    result = CliRunner().invoke(main, ["run", "-n", "3", "--emulate", script, "--flag", "x"])
    assert result.exit_code == 0, result.output
    for rank in range(3):
        assert (f"[rank {rank}] RANK={rank} WORLD_SIZE=3 LOCAL_RANK={rank} MASTER_ADDR=127.0.0.1 "
                f"TRITON_INTERPRET=1 TILELINK_BACKEND=emulated ['--flag', 'x']") in result.output


def test_run_stops_the_others_when_a_rank_fails(tmp_path):
    script = _script(tmp_path, """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
    """)
    start = time.monotonic()
    result = CliRunner().invoke(main, ["run", "-n", "2", script])
    assert time.monotonic() - start < 20
    assert result.exit_code == 3
    assert "rank 1 exited with code 3" in result.output


def test_run_timeout(tmp_path):
    script = _script(tmp_path, "import time\ntime.sleep(60)\n")
    result = CliRunner().invoke(main, ["run", "-n", "2", "--timeout", "1", script])
    assert result.exit_code == 124
    assert "timed out after 1 s" in result.output
