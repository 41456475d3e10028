"""Mutants of a rewritten kernel: the same generated module with ONE inserted wait or notify taken out, or its
program-start read of every channel (``channels_ready``) answering "all there" without reading.

On the race-exposing schedule (``TILELINK_RACES=1``) every mutant of every golden case must fail: a missing
wait reads poison, a missing notify leaves a channel short (its consumer's wait times out, or a channel
completed early hands the consumer rows stored after it), and a program that skips its waits on a read it did not
make reads poison. A mutant that still passes is a wait or notify the tests cannot see, or one that is not needed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import traceback

import libcst as cst
import libcst.matchers as m

from tilelink.codegen import GeneratedModule
from tilelink.overlapped import OverlappedKernel

#: the primitives the rewrite inserts into a user's kernel; a mutant drops one call of them
WAITS = ("consumer_tile_wait", "consumer_tile_wait_rows", "consumer_tile_wait_channels")
NOTIFIES = ("producer_tile_notify", "producer_tile_notify_rows", "producer_tile_notify_rows_grouped",
            "producer_tile_notify_channels", "producer_tile_notify_flush")
#: the read at a program's start that lets its waits pass; a mutant makes it say every channel is there
READS = ("channels_ready",)


def _primitive(node: cst.CSTNode) -> str | None:
    if m.matches(node, m.Call(func=m.Attribute(value=m.Name("tll")))):
        name = node.func.attr.value  # type: ignore[attr-defined]
        if name in WAITS + NOTIFIES + READS:
            return name
    return None


class _Drop(cst.CSTTransformer):
    """Replace the ``index``-th inserted primitive call of ``kernel`` by what leaves the kernel as if it had not
    been made: a wait's token by ``0``, a notify by nothing (a grouped notify returns its held adds as they
    were), the read of every channel by ``1`` (every wait then passes without polling)."""

    def __init__(self, kernel: str, index: int | None):
        self.kernel, self.index, self.seen, self.inside, self.dropped = kernel, index, 0, 0, None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == self.kernel:
            self.inside += 1

    def leave_FunctionDef(self, original, updated):
        if original.name.value == self.kernel:
            self.inside -= 1
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        name = _primitive(original) if self.inside else None
        if name is None:
            return updated
        self.seen += 1
        if self.seen - 1 != self.index:
            return updated
        self.dropped = name
        if name in WAITS:
            return cst.Integer("0")
        if name in READS:
            return cst.Integer("1")
        if name == "producer_tile_notify_rows_grouped":
            return original.args[1].value  # the held adds, unchanged
        return cst.parse_expression("None")


def mutation_points(generated: GeneratedModule, kernel: str) -> int:
    """How many inserted waits, notifies and reads of every channel the rewritten ``kernel`` has."""
    drop = _Drop(kernel, None)
    cst.parse_module(generated.text).visit(drop)
    return drop.seen


def mutant(generated: GeneratedModule, kernel: str, index: int) -> tuple[GeneratedModule, str]:
    """``generated`` without the ``index``-th inserted primitive call of ``kernel``, and that call's name."""
    drop = _Drop(kernel, index)
    text = cst.parse_module(generated.text).visit(drop).code
    assert drop.dropped is not None, (kernel, index)
    return _with_text(generated, text), drop.dropped


def _with_text(generated: GeneratedModule, text: str) -> GeneratedModule:
    """``generated`` with another module text (and the hash it is cached under)."""
    return dataclasses.replace(generated, text=text, source_hash=hashlib.sha256(text.encode()).hexdigest())


def _outcome(run) -> str:
    """``"failed: ..."`` when ``run()`` raises or returns an error above 1e-3 (NaN included), else ``"passed"``."""
    import tilelink

    try:
        err = run()
        return f"failed: max error {err}" if not err <= 1e-3 else "passed"
    except Exception as exc:  # noqa: BLE001 - the mutant was caught
        outcome = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if not isinstance(exc, (tilelink.WaitTimeout, tilelink.LaunchError)):
            outcome += "\n" + traceback.format_exc(limit=3)
        return outcome


def _patcher(module, attr: str):
    """``(the original loader, patch)``: ``patch(loader)`` makes ``module.attr`` that loader, ``patch(None)`` the
    original again."""
    real = getattr(module, attr)
    return real, lambda loader: setattr(module, attr, loader or real)


def _run(load, patch, run) -> list[tuple[str, str]]:
    """Every mutant of the overlapped kernels of the module ``load()`` returns, each run by ``run()`` while
    ``patch(loader)`` makes the code under test load the mutated module; the dropped call and the outcome of each:
    ``"failed: ..."`` when it was caught, ``"passed"`` when not."""
    module = load()
    overlapped = [v for v in vars(module).values() if isinstance(v, OverlappedKernel)]
    points = [(k.name, i) for k in overlapped for i in range(mutation_points(k.generated, k.name))]
    outcomes = []
    try:
        for name, index in points:
            fresh = load()
            kernel = next(k for k in vars(fresh).values() if isinstance(k, OverlappedKernel) and k.name == name)
            kernel.generated, dropped = mutant(kernel.generated, name, index)
            kernel._module = None
            patch(lambda *_a, _fresh=fresh: _fresh)
            outcomes.append((f"{name}#{index} ({dropped})", _outcome(run)))
    finally:
        patch(None)
    return outcomes


def run_mutants(case: str) -> list[tuple[str, str]]:
    """The mutants of golden ``case`` (``all_gather_pointer_gemm``) on this rank; every rank runs them in the same
    order."""
    import tests.rules.cases as cases
    import tilelink
    from tilelink.rules import RULES

    rule = next(kind for kind in RULES if case.startswith(f"{kind}_"))
    real, patch = _patcher(cases, "load_case")
    return _run(lambda: real(rule, case[len(rule) + 1:]), patch,
                lambda: cases.CASES[case](tilelink.rank(), tilelink.world_size()))


def run_form_mutants(name: str) -> list[tuple[str, str]]:
    """The mutants of the kernel form ``name`` (tests/rules/forms) on this rank."""
    import tests.rules.forms_cases as forms

    real, patch = _patcher(forms, "load_form")
    return _run(lambda: real(name), patch, lambda: forms.RUNS[name](calls=1))


class _StoreLast(cst.CSTTransformer):
    """Move the kernel's first ``tl.store`` statement to after the first inserted notify that follows it: the
    notify then publishes rows not yet stored."""

    def __init__(self, kernel: str):
        self.kernel, self.inside, self.moved = kernel, 0, False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.inside += node.name.value == self.kernel

    def leave_FunctionDef(self, original, updated):
        self.inside -= original.name.value == self.kernel
        return updated

    def leave_IndentedBlock(self, original, updated):
        if not self.inside or self.moved:
            return updated
        body = list(updated.body)
        text = [cst.Module(body=[]).code_for_node(s) for s in body]
        store = next((i for i, t in enumerate(text) if t.lstrip().startswith("tl.store(")), None)
        if store is None:
            return updated
        notify = next((j for j in range(store + 1, len(body)) if "tll.producer_tile_notify" in text[j]), None)
        if notify is None:
            return updated
        self.moved = True
        body = body[:store] + body[store + 1:notify + 1] + [body[store]] + body[notify + 1:]
        return updated.with_changes(body=body)


def run_store_after_notify(case: str) -> list[tuple[str, str]]:
    """Golden ``case`` with its first store moved after the notify that publishes it, on this rank."""
    import tests.rules.cases as cases
    import tilelink

    real, patch = _patcher(cases, "load_case")

    def load():
        module = real("reduce_scatter", case[len("reduce_scatter_"):])
        for k in vars(module).values():
            if isinstance(k, OverlappedKernel):
                moved = _StoreLast(k.name)
                text = cst.parse_module(k.generated.text).visit(moved).code
                assert moved.moved, k.name
                k.generated = _with_text(k.generated, text)
                k._module = None
        return module

    module = load()
    patch(lambda *_a: module)
    try:
        return [("store after its notify", _outcome(lambda: cases.CASES[case](tilelink.rank(), tilelink.world_size())))]
    finally:
        patch(None)


#: the read of every channel at a program's start, as the rewrite emits it, and a mutant that counts one fewer
START_READ = "tll.channels_ready(tlk_barriers, tlk_world * tlk_channels_per_rank, tlk_target)"
START_READ_SHORT = "tll.channels_ready(tlk_barriers, tlk_world * tlk_channels_per_rank - 1, tlk_target)"


def run_start_read(case: str) -> list[tuple[str, str]]:
    """Golden ``case`` as generated and with its programs' read at the start counting one channel fewer, on this
    rank (run with ``TILELINK_RACES_START_READ=1``: every program's read finds the channels it counts, delivered
    then, and its waits pass without polling)."""
    import tests.rules.cases as cases
    import tilelink
    from tilelink.rules import RULES

    rule = next(kind for kind in RULES if case.startswith(f"{kind}_"))
    real, patch = _patcher(cases, "load_case")
    outcomes = []
    try:
        for what, short in (("as generated", False), ("its read at the start one channel short", True)):
            module = real(rule, case[len(rule) + 1:])
            for k in vars(module).values():
                if isinstance(k, OverlappedKernel) and START_READ in k.generated.text:
                    if short:
                        k.generated = _with_text(k.generated, k.generated.text.replace(START_READ, START_READ_SHORT))
                        k._module = None
            patch(lambda *_a, _module=module: _module)
            outcomes.append((what, _outcome(lambda: cases.CASES[case](tilelink.rank(), tilelink.world_size()))))
    finally:
        patch(None)
    return outcomes
