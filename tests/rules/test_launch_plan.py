"""The launch plan a rule's rewrite makes and its launcher reads (``tilelink.plan.LaunchPlan``): typed, checked
when the kernel is rewritten, and written readable into the generated module, from which it reads back whole."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from tests.rules.test_golden import CASES, _generate
from tilelink.codegen import Request, generate
from tilelink.errors import PlanError
from tilelink.plan import LAUNCH_PLANS, AllGatherLaunch, AllReduceLaunch, LaunchPlan, ReduceScatterLaunch
from tilelink.rules import rule_of
from tilelink.spec import all_gather, make_options

all_gather_rewrite = rule_of("all_gather").rewrite_module()

COMMON = dict(tensors=("a_ptr",), dim=0, size_param="M", via="sm", mode="pull", order="local_first", comm_sms=16,
              comm_block=None, channels_per_rank=None)

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def scale_rows(x_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], x * 2, mask=mask)
'''


def _build():
    return generate(KERNEL, "scale_rows.py", [Request("scale_rows", (all_gather("x_ptr"),), make_options())])


def _written_plans(text: str) -> dict:
    """The generated module's ``TILELINK_PLAN``, read as data."""
    for node in ast.parse(text).body:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
        if names == ["TILELINK_PLAN"]:
            return ast.literal_eval(node.value)
    raise AssertionError("no TILELINK_PLAN in the generated module")


@pytest.mark.parametrize("before", CASES, ids=lambda p: f"{p.parent.name}/{p.name[:-len('.before.py')]}")
def test_the_generated_module_carries_each_plan_whole(before: Path) -> None:
    gen = _generate(before)
    written = _written_plans(gen.text)
    assert set(written) == {p.kernel for p in gen.plans}
    for plan in gen.plans:
        entry = dict(written[plan.kernel])
        assert entry.pop("extra_params") == list(plan.extra_params)
        assert entry.pop("partner_kernels") == list(plan.partner_kernels)
        assert type(plan.launch) is LAUNCH_PLANS[plan.rule]  # each rule makes its own plan
        back = LaunchPlan.from_dict(entry)
        assert type(back) is type(plan.launch) and back == plan.launch


def test_a_rewrite_that_misspells_or_leaves_out_a_field_fails_the_build(monkeypatch) -> None:
    """A plan made with a misspelt field name, or without a field, is refused when the kernel is rewritten (the
    build), naming the field, rather than when a launcher first reads it on a GPU."""
    assert _build().plans[0].launch.comm_sms == 16

    def misspelt(**fields):
        fields["comm_smz"] = fields.pop("comm_sms")
        return AllGatherLaunch(**fields)

    monkeypatch.setattr(all_gather_rewrite, "AllGatherLaunch", misspelt)
    with pytest.raises(TypeError, match="comm_smz"):
        _build()

    def short(**fields):
        del fields["index"]
        return AllGatherLaunch(**fields)

    monkeypatch.setattr(all_gather_rewrite, "AllGatherLaunch", short)
    with pytest.raises(TypeError, match="'index'"):
        _build()


def test_a_rewrite_that_returns_the_plan_as_a_dict_fails_the_build(monkeypatch) -> None:
    monkeypatch.setattr(all_gather_rewrite, "AllGatherLaunch", lambda **fields: {"rule": "all_gather", **fields})
    with pytest.raises(PlanError, match=r"scale_rows / all_gather: the rewrite's launch plan is a dict, not the "
                                        r"rule's AllGatherLaunch"):
        _build()


def test_a_written_plan_with_a_missing_or_unknown_field_is_refused_naming_them() -> None:
    entry = _build().plans[0].launch.as_dict()
    assert LaunchPlan.from_dict(entry) == AllGatherLaunch.from_dict(entry)
    broken = {**entry, "comm_smz": entry["comm_sms"]}
    del broken["comm_sms"], broken["index"]
    with pytest.raises(PlanError) as err:
        LaunchPlan.from_dict(broken)
    message = str(err.value)
    assert "missing field(s) 'comm_sms', 'index'" in message and "unknown field(s) 'comm_smz'" in message, message
    assert "rebuild the module with tlxform build" in message, message
    with pytest.raises(PlanError, match=r"rule='all_scatter' is not one of"):
        LaunchPlan.from_dict({**entry, "rule": "all_scatter"})
    with pytest.raises(PlanError, match=r"rule='all_gather' is not one of 'reduce_scatter', 'all_reduce'"):
        ReduceScatterLaunch.from_dict(entry)


@pytest.mark.parametrize(("cls", "fields", "said"), [
    (AllGatherLaunch, dict(COMMON, index=None, via="SM"), r"AllGatherLaunch.via='SM': expected one of"),
    (AllGatherLaunch, dict(COMMON, index=None, tensors=["a_ptr"]), r"tensors=\['a_ptr'\]: expected a non-empty tuple"),
    (AllGatherLaunch, dict(COMMON, index=None, comm_sms=0), r"comm_sms=0: expected a positive int"),
    (AllGatherLaunch, dict(COMMON, index="sorted ids"), r"index='sorted ids': expected None or a parameter name"),
    (ReduceScatterLaunch, dict(COMMON, index=None, topk=None, atomic_axes=[0]), r"atomic_axes=\[0\]: expected None"),
    (ReduceScatterLaunch, dict(COMMON, index=None, topk=None, atomic_axes=(1, 0)), r"atomic_axes=\(1, 0\)"),
    (AllReduceLaunch, dict(COMMON, via="copy_engine", algorithm=None), r"AllReduceLaunch.via='copy_engine'"),
    (AllReduceLaunch, dict(COMMON, algorithm="three_shot"), r"algorithm='three_shot': expected None or one of"),
    (LaunchPlan, COMMON, r"make the rule's own plan \(AllGatherLaunch, ReduceScatterLaunch, AllReduceLaunch\)"),
])
def test_a_value_of_the_wrong_kind_is_refused_when_the_plan_is_made(cls, fields, said) -> None:
    with pytest.raises(PlanError, match=said):
        cls(**fields)


def test_a_plan_is_frozen_and_the_all_reduce_has_no_dynamic_mapping() -> None:
    plan = AllReduceLaunch(**COMMON, algorithm=None)
    assert (plan.index, plan.topk, plan.atomic_axes) == (None, None, None)
    assert "topk" not in plan.as_dict() and plan.as_dict()["rule"] == "all_reduce"
    with pytest.raises(TypeError):
        AllReduceLaunch(**COMMON, algorithm=None, topk="top_k")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.comm_sms = 8  # type: ignore[misc]
    assert hash(plan) == hash(AllReduceLaunch(**COMMON, algorithm=None))
