"""Golden before/after files of every rule and case, regenerated only on purpose.

An ``.after.py`` file is the generated module without the partner kernels' source (the rules' own kernels,
the same in every module that uses them: they run in the end-to-end tests and are compiled in
test_compiled_rewrite.py); it keeps the rewritten kernels, the header and the launch plan.

To regenerate after an intended change of the generated code::

    TILELINK_REGEN_GOLDEN=1 pytest tests/rules/test_golden.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tilelink.annotations import requests_in
from tilelink.codegen import generate

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted(Path(__file__).parent.glob("*/*.before.py"))


_PARTNERS = re.compile(r"(# -+\n# partner kernels of the rules\n).*?(?=\nTILELINK_PLAN = )", re.S)


def golden_text(gen) -> str:
    """The generated module with each partner kernel's source left out (its name stays, in the plan)."""
    names = sorted({n for p in gen.plans for n in p.partner_kernels})
    return _PARTNERS.sub(lambda mt: mt.group(1) + f"# (left out of the golden file: {', '.join(names)})\n\n",
                         gen.text)


def _generate(before: Path):
    rel = before.relative_to(ROOT).as_posix()
    text = before.read_text()
    return generate(text, rel, requests_in(text, rel))


@pytest.mark.parametrize("before", CASES, ids=lambda p: f"{p.parent.name}/{p.name[:-len('.before.py')]}")
def test_golden(before: Path) -> None:
    after = before.with_name(before.name.replace(".before.py", ".after.py"))
    gen = _generate(before)
    if os.environ.get("TILELINK_REGEN_GOLDEN") == "1":
        after.write_text(golden_text(gen))
    assert after.exists(), f"missing {after}; run with TILELINK_REGEN_GOLDEN=1 to create it"
    assert golden_text(gen) == after.read_text(), f"{before.name}: generated code changed (see tlxform show)"
    _check_report(before, gen)


#: what the rewritten body calls for each rule's insertion, and how its report entry names it
_INSERTED = {"all_gather": (r"tll\.consumer_tile_wait\w*\(", "consumer_tile_wait before line"),
             "reduce_scatter": (r"tll\.producer_tile_notify\w*\(", "notif"),
             "all_reduce": (r"tll\.producer_tile_notify\w*\(", "notif")}


def _check_report(before: Path, gen) -> None:
    """Every annotated kernel's rule reports an applied entry for what it inserted, located in the source,
    and the rewritten kernel holds that insertion (a wait per reported wait); every rewrite not applied names
    its reason and where."""
    text = before.read_text()
    lines = len(text.splitlines())
    for request in requests_in(text, before.relative_to(ROOT).as_posix()):
        body = gen.rewritten[request.kernel]
        for spec in request.specs:
            what = f"{before.name}: {request.kernel} / {spec.kind}"
            entries = [e for e in gen.report.entries if e.kernel == request.kernel and e.rule == spec.kind]
            call, named = _INSERTED[spec.kind]
            inserted = [e for e in entries if e.status == "applied" and named in e.message]
            assert inserted, f"{what}: no applied insertion in the report:\n{gen.report}"
            assert all(e.where is not None and 1 <= e.where.line <= lines for e in inserted), what
            calls = len(re.findall(call, body))
            assert calls >= 1, f"{what}: the report says applied but the kernel has no {call}"
            if spec.kind == "all_gather":
                assert calls == len(inserted), f"{what}: {calls} waits in the kernel, {len(inserted)} reported"
            for entry in entries:
                if entry.status == "not applied":
                    assert entry.where is not None, f"{what}: {entry} says nowhere"
                    assert re.search(r"not applied: \S.{10,}", entry.message), f"{what}: {entry} gives no reason"


def test_cases_cover_the_issue() -> None:
    """Pointer, descriptor, persistent, helpers, KV loop with a tuple, several kernels, both rules,
    dynamic (index) mappings for the MoE gather and scatter + top-k reduce."""
    names = {f"{p.parent.name}/{p.name[:-len('.before.py')]}" for p in CASES}
    assert {"all_gather/pointer_gemm", "all_gather/descriptor_gemm", "all_gather/persistent_gemm",
            "all_gather/helper_functions", "all_gather/kv_attention", "all_gather/moe_gather",
            "reduce_scatter/pointer_gemm", "reduce_scatter/two_kernels", "reduce_scatter/moe_scatter_topk",
            "reduce_scatter/vector_partial_sums", "reduce_scatter/hybrid_gemm", "reduce_scatter/ring_gemm",
            "all_gather/inner_dim_copy_engine", "reduce_scatter/descriptor_gemm"} <= names


def test_generation_is_deterministic() -> None:
    before = CASES[0]
    assert _generate(before).text == _generate(before).text


def test_header_names_source_spec_and_hash() -> None:
    gen = _generate(Path(__file__).parent / "all_gather" / "pointer_gemm.before.py")
    head = gen.text.splitlines()[:5]
    assert head[0].startswith("# Generated by TileLink") and "tests/rules/all_gather/pointer_gemm.before.py" in head[0]
    assert any(line.startswith("# source sha256: ") and gen.source_hash in line for line in head)
    assert any("all_gather('a_ptr', dim=0)" in line for line in head)


def test_helpers_are_carried_and_unrelated_ones_left_out() -> None:
    gen = _generate(Path(__file__).parent / "all_gather" / "helper_functions.before.py")
    assert "def swizzle(" in gen.text and "def relu(" in gen.text and "GROUP = 4" in gen.text
    assert "unrelated_helper" not in gen.text


def test_wait_dominates_every_guarded_load() -> None:
    """The inserted wait comes before the loads it guards and the guarded pointer takes its token."""
    gen = _generate(Path(__file__).parent / "all_gather" / "kv_attention.before.py")
    body = gen.rewritten["attention_kernel"]
    wait = body.index("tll.consumer_tile_wait(")
    assert wait < body.index("tl.load(k_ptr") and wait < body.index("tl.load(v_ptr")
    assert "k_ptr = k_ptr + tlk_token" in body and "v_ptr = v_ptr + tlk_token" in body
    assert body.count("consumer_tile_wait(") == 1  # K and V of one block share one wait


def test_descriptor_store_in_a_tile_loop_is_notified_in_groups_without_a_loop() -> None:
    """A descriptor store in a flattened tile loop: the notify after it counts the box's columns inside C
    and goes out once per four tiles (the grouped primitive waits for the asynchronous stores itself);
    nothing is held before the loop and what the last group holds is flushed after it; no loop is added,
    so the flattened tile loop stays flattened."""
    gen = _generate(Path(__file__).parent / "reduce_scatter" / "descriptor_gemm.before.py")
    body = gen.rewritten["matmul_kernel"]
    init = body.index("tlk_pending = tll.no_pending_tiles()")
    loop = body.index("for tile_id in tl.range(")
    store = body.index("c_desc.store(")
    grouped = body.index("tlk_pending = tll.producer_tile_notify_rows_grouped(")
    flush = body.index("tll.producer_tile_notify_flush(tlk_barriers, tlk_pending)")
    assert init < loop < store < grouped < flush
    # the flush is after the loop: at the loop's indentation, not inside it
    assert body[:flush].rsplit("\n", 1)[1] == body[:loop].rsplit("\n", 1)[1]
    # the box's columns inside C: [o, o + BLOCK_N) clipped to [0, N)
    assert "tlk_cols = tl.maximum(tl.minimum(pid_n * BLOCK_N + BLOCK_N, N) - tl.maximum(pid_n * BLOCK_N, 0), 0)" in body
    assert "for tlk_i" not in body and "flatten=True" in body
    assert "notifies four tiles at a time" in str(gen.report)


def test_notify_follows_the_store() -> None:
    gen = _generate(Path(__file__).parent / "reduce_scatter" / "pointer_gemm.before.py")
    body = gen.rewritten["matmul_kernel"]
    assert body.index("tl.store(c_ptrs") < body.index("tll.producer_tile_notify")


@pytest.mark.parametrize("case", ["pointer_gemm", "descriptor_gemm", "persistent_gemm", "helper_functions"])
def test_all_gather_gemms_visit_the_local_shard_first(case: str) -> None:
    gen = _generate(Path(__file__).parent / "all_gather" / f"{case}.before.py")
    (body,) = gen.rewritten.values()
    remap = re.search(r"pid_m = tlm\.tl_remap_tile\(\s+pid_m, ", body).start()
    assert remap < body.index("tll.consumer_tile_wait(")
    assert "tile order local_first" in str(gen.report)
