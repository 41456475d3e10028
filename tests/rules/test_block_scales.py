"""Block-quantised operands (tests/rules/forms/gemm_block_scales.py, the FP8 form of vLLM's and SGLang's block-scaled
GEMM): A's scales are gathered with A, and the K loop loads column `k * BLOCK_K // group_k` of the tile's scale rows.
That column is a term along the rows that the loop moves through a local and `//`: each call bounds it over every
step of the loop, and refuses a call whose steps would read a scale of the next row, which the wait does not
cover. The form's run against torch at worlds 1-4 is in tests/rules/test_forms.py."""

from __future__ import annotations

import pytest
import torch

import tilelink
from tests.rules.forms_cases import FORMS, block_scaled
from tests.rules.test_carried_accumulator import _generate

SOURCE = (FORMS / "gemm_block_scales.py").read_text()


def test_the_scales_are_waited_for_with_the_rows_and_their_column_is_bounded_at_each_call() -> None:
    generated = _generate(SOURCE)
    (plan,) = generated.plans
    load = next(i for i, line in enumerate(SOURCE.splitlines(), 1) if "a_s = tl.load(" in line)
    waits = [str(e) for e in generated.report.entries if "consumer_tile_wait" in str(e)]
    assert len(waits) == 1 and f"reads of A, As at line(s) {load - 4}, {load}" in waits[0], waits
    ((tensor, ((subtracted, (term,)),), line),) = plan.launch.row_shifts
    assert (tensor, subtracted, line) == ("As", False, load), plan.launch.row_shifts
    assert term == "(((tl.range(0, tl.cdiv(K, BLOCK_K), 1, loop=" + str(load - 5) + ") * BLOCK_K) // group_k) * " \
                   "stride_as_k)", term


def _short_scales() -> str:
    call, _, ad = block_scaled(tilelink.rank(), tilelink.world_size(), scale_columns=3)
    try:
        call(torch.full((45, 32), float("nan"), dtype=ad.dtype, device=ad.device))
    except tilelink.LaunchError as refused:
        return str(refused)
    return "ran"


@pytest.mark.slow
def test_scale_rows_shorter_than_the_loop_reads_are_refused_at_the_call(monkeypatch) -> None:
    # K = 64 in groups of 16 reads four scales a row; rows of three put the fourth in the next row
    monkeypatch.setenv("TILELINK_RACES", "1")
    said = tilelink.spawn(_short_scales, 2)
    assert all("gemm_block_scales.py:" in s and "adds `((tl.range(0, tl.cdiv(K, BLOCK_K), 1, loop=" in s
               and "to the rows of 'As', from 0 to 3 elements over the steps of its loop" in s
               and "are 3 elements long" in s for s in said), said


STORE = '''import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr", size="M"))
@triton.jit
def strip_store(x_ptr, c_ptr, M, NSTEP, stride_cm, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    for j in range(0, tl.cdiv(NSTEP, 1)):
        v = tl.load(x_ptr + offs_m[:, None] * BLOCK_D + cols[None, :], mask=offs_m[:, None] < M, other=0.0)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + cols[None, :] + (j // 2) * BLOCK_D, v,
                 mask=offs_m[:, None] < M)
'''


def test_a_store_a_loop_moves_through_a_division_is_still_refused() -> None:
    # steps 0 and 1 store the same elements: each notify counts its step's, so a channel would complete early
    from tilelink.errors import AnnotationError

    with pytest.raises(AnnotationError, match=r"adds `\(j // 2\) \* BLOCK_D` along the rows of 'c_ptr', which changes "
                                              r"from one step of a loop to the next"):
        _generate(STORE)


REBOUND = '''import triton
import triton.language as tl
import tilelink


@tilelink.overlap(tilelink.all_gather(("A", "As"), dim=0, size="M"))
@triton.jit
def scale_sums(A, As, C, M, K, group_k, stride_as_m, stride_as_k, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        ks = k * BLOCK_K // group_k
        p = As + offs_am * stride_as_m + ks * stride_as_k
        ks = ks // 1000
        acc += tl.load(p, mask=offs_am < M, other=0.0)
    tl.store(C + offs_am, acc, mask=offs_am < M)
'''


def test_a_term_read_through_a_local_bound_again_after_the_pointer_is_bounded_as_the_pointer_took_it() -> None:
    # the pointer took `ks` before its second binding; written out at the load, `ks` would be the second value, a
    # thousandth of the column the load reads, and the call's bound would pass columns past the row
    (plan,) = _generate(REBOUND).plans
    ((tensor, ((_, (term,)),), _),) = plan.launch.row_shifts
    assert tensor == "As" and "// 1000" not in term, term
    assert term == "((tl.range(0, tl.cdiv(K, BLOCK_K), 1, loop=12) * BLOCK_K // group_k) * stride_as_k)", term
