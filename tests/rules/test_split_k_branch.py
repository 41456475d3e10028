"""A kernel that stores its tiles on some launches and adds them on others, as triton.ops.matmul writes its
write-back (`if SPLIT_K == 1: tl.store(...)` / `else: tl.atomic_add(...)`, a compile-time test): each launch writes
one way, which the launcher tells from the test, starting the partial sums for the adds only where the launch takes
them. Under both reductions it equals torch with one split and with three, on the race-exposing schedule. Sides the
other way round (three splits storing into one tile) are refused at the call; a test decided at run time, at the
build; autotuning configurations that write the two ways, before the launch."""

from __future__ import annotations

import textwrap

import pytest

import tilelink
from tests.rules.test_split_k_autotuned import KERNEL, _multiply
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError, LaunchError

ADD = "    tl.atomic_add(c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn, acc, mask=c_mask)\n"
BRANCH = ("    if SPLIT_K == 1:\n"
          "        tl.store(c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn, acc, mask=c_mask)\n"
          "    else:\n    " + ADD)


def _source(rule: str = "reduce_scatter", branch: str = BRANCH, configs: str | None = None) -> str:
    source = textwrap.dedent(KERNEL).replace(ADD, branch).replace('reduce_scatter("c_ptr")', f'{rule}("c_ptr")')
    if configs is None:
        return source.replace("@triton.autotune(configs=[{configs}], key=[\"K\"])\n", "")
    return source.replace("{configs}", configs)


def _written(tmp_path, source: str) -> str:
    path = tmp_path / "split_k_branch.py"
    path.write_text(source)
    return str(path)


@pytest.mark.parametrize("rule", ["reduce_scatter", "all_reduce"])
def test_a_write_back_chosen_by_the_split_count_equals_torch(rule: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    source = _source(rule)
    assert "tl.store(" in source and "tl.atomic_add(" in source and "autotune" not in source
    path = _written(tmp_path, source)
    for split in (1, 3):
        errors = tilelink.spawn(_multiply, 2, path, "matmul_tuned_split_k", rule == "all_reduce", SPLIT_K=split)
        assert all(e == 0.0 for e in errors), (split, errors)


def test_three_splits_storing_into_one_tile_are_refused_at_the_call(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path, _source(branch=BRANCH.replace("SPLIT_K == 1", "SPLIT_K > 1")))
    with pytest.raises(LaunchError, match=r"program \(0, 0, 0\) at line \d+ and program \(0, 0, 1\) at line \d+ "
                                          r"both store rows"):
        tilelink.spawn(_multiply, 2, path, "matmul_tuned_split_k", False, SPLIT_K=3)


def test_a_write_back_chosen_at_run_time_is_refused() -> None:
    source = _source(branch=BRANCH.replace("SPLIT_K == 1", "K < 64"))
    with pytest.raises(AnnotationError, match="stores to 'c_ptr' here and adds to it with tl.atomic_add") as info:
        generate(source, "split_k_branch.py", requests_in(source, "split_k_branch.py"))
    assert "compile-time test" in info.value.hint, info.value.hint


def test_configurations_that_write_two_ways_are_refused_before_the_launch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path, _source(configs='triton.Config({"SPLIT_K": 1}), triton.Config({"SPLIT_K": 2})'))
    with pytest.raises(LaunchError, match=r"SPLIT_K=2 add their tiles with tl.atomic_add and SPLIT_K=1 store them"):
        tilelink.spawn(_multiply, 2, path)


def test_the_report_does_not_warn_of_tiles_left_unstored() -> None:
    """Every launch takes a storing side of the compile-time `if`: no tile goes unnotified. One side alone does."""
    for branch, warned in ((BRANCH, False), (BRANCH.replace("    else:\n    " + ADD, ""), True)):
        source = _source(branch=branch).replace("tl.atomic_add(", "tl.store(")
        notes = [e.message for e in generate(source, "split_k_branch.py",
                                             requests_in(source, "split_k_branch.py")).report.entries]
        assert any("takes no storing branch" in n for n in notes) == warned, notes


@pytest.mark.parametrize("branch", [
    "    if SPLIT_K > 1:\n    " + ADD,  # no side stores: a launch with one split writes nothing
    BRANCH.replace("    else:\n    " + ADD, "    else:\n        if BLOCK_K > 8:\n        " + ADD),  # under a further if
])
def test_adds_a_launch_may_skip_are_refused(branch: str) -> None:
    source = _source(branch=branch)
    with pytest.raises(AnnotationError, match="is in a loop or a branch") as info:
        generate(source, "split_k_branch.py", requests_in(source, "split_k_branch.py"))
    assert "`if SPLIT_K == 1: tl.store(...)`" in info.value.hint, info.value.hint
