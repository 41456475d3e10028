"""A kernel that binds its pointer parameters again at the top of its body (``A = A + (ram[:, None] * stride_am +
...)``, as ``triton.ops.matmul`` writes them) and makes its row vector again after the K loop (``rm = ...``, to save
registers): the parameter is read under a name of its own from that binding on (``A_ptrs``), the row vector from
the binding that reaches each use, and the kernel is rewritten and equals torch on the race-exposing schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import module_at, rows_of, worst
from tilelink.annotations import requests_in
from tilelink.codegen import generate
from tilelink.errors import AnnotationError

#: triton.ops.matmul's kernel (tests/rules/forms/gemm_ar_split_k.py), its `EVEN_K` heuristic aside (its unmasked side
#: is tests/rules/test_whole_blocks.py's)
OPS_MATMUL = (Path(__file__).parent / "forms" / "gemm_ar_split_k.py").read_text()
ANNOTATION = '@tilelink.overlap(tilelink.all_reduce("C"))'
RULES = {"all_gather": 'all_gather("A", dim=0)', "reduce_scatter": 'reduce_scatter("C", dim=0)'}
BRANCH = """    if SPLIT_K == 1:
        tl.store(C, acc, mask=mask)
    else:
        tl.atomic_add(C, acc, mask=mask)
"""
ADD = "    tl.atomic_add(C, acc, mask=mask)\n"


def _source(rule: str, branch: bool = False) -> str:
    """The kernel under ``rule``; ``branch``: the store of a split of one on its own side of the branch, as
    triton.ops.matmul writes it (a reduction stores or adds as the launch's split count says)."""
    assert ANNOTATION in OPS_MATMUL and ADD in OPS_MATMUL
    text = OPS_MATMUL.replace(ANNOTATION, f"@tilelink.overlap(tilelink.{RULES[rule]})")
    return text.replace(ADD, BRANCH) if branch else text


def _run(path: str, rule: str, split: int) -> float:
    kernel = module_at(path)._kernel
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 50, 24, 72
    g = torch.Generator().manual_seed(11)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    lo, hi = rows_of(rank, world, M)
    if rule == "all_gather":
        args, rows = (a[lo:hi].contiguous(), b), (M, K)
        out, ref = lambda: torch.zeros(M, N), a @ b  # zeros: the split's programs add into C
    else:
        klo, khi = rows_of(rank, world, K)
        args, rows = (a[:, klo:khi].contiguous(), b[klo:khi].contiguous()), (M, khi - klo)
        out, ref = lambda: torch.zeros(hi - lo, N), (a @ b)[lo:hi]
    err = 0.0
    for _ in range(2):  # a context is reused: the second call runs at epoch 2
        c = out()
        x, y = args
        kernel[(triton.cdiv(M, 16) * triton.cdiv(N, 16), split)](
            x, y, c, rows[0], N, rows[1], x.stride(0), x.stride(1), y.stride(0), y.stride(1), c.stride(0),
            c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT_K=split)
        err = worst(err, (c - ref).abs().max().item())
    return err


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_rebound_parameter_is_read_under_a_name_of_its_own(rule: str) -> None:
    text = _source(rule)
    body = generate(text, "ops_matmul.py", requests_in(text, "ops_matmul.py")).rewritten["_kernel"]
    if rule == "all_gather":  # the annotated parameter only: the others stay as written
        assert "A_ptrs = A + (ram[:, None] * stride_am + rk[None, :] * stride_ak)" in body, body
        assert "A_ptrs += BLOCK_K * SPLIT_K * stride_ak" in body and "tl.atomic_add(C, acc" in body, body
    else:
        assert "C_ptrs = C + (rm[:, None] * stride_cm + rn[None, :] * stride_cn)" in body, body
        assert "A += BLOCK_K * SPLIT_K * stride_ak" in body and "tl.atomic_add(C_ptrs, acc" in body, body
    assert "tll.consumer_tile_wait" in body if rule == "all_gather" else "tll.producer_tile_notify" in body, body


@pytest.mark.parametrize("rule, split, branch", [("all_gather", 1, False), ("all_gather", 3, False),
                                                 ("reduce_scatter", 1, False), ("reduce_scatter", 2, False),
                                                 ("reduce_scatter", 1, True), ("reduce_scatter", 2, True)])
def test_the_triton_ops_matmul_form_equals_torch_on_the_race_exposing_schedule(rule: str, split: int, branch: bool,
                                                                               tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = tmp_path / f"ops_matmul_{rule}.py"
    path.write_text(_source(rule, branch))
    errors = tilelink.spawn(_run, 2, str(path), rule, split)
    assert all(e < 1e-4 for e in errors), errors


def test_a_parameter_bound_again_in_a_branch_is_not_taken_for_its_alias() -> None:
    """Only a binding that runs once, before every later statement, is read as the alias: one in a branch leaves the
    later `A` either the parameter or the alias, so the kernel is refused as written."""
    text = _source("all_gather", branch=True).replace(
        "    A = A + (ram[:, None] * stride_am + rk[None, :] * stride_ak)\n",
        "    if SPLIT_K > 0:\n        A = A + (ram[:, None] * stride_am + rk[None, :] * stride_ak)\n")
    assert "if SPLIT_K > 0:" in text
    with pytest.raises(AnnotationError) as err:
        generate(text, "ops_matmul.py", requests_in(text, "ops_matmul.py"))
    assert "A_ptrs" not in str(err.value)


def test_a_row_vector_made_again_is_read_from_the_binding_that_reaches_its_use() -> None:
    """`rm` made again after the K loop from another start is not the rows `ram` was made from: the wait covers
    the rows of the binding before `ram` (`pid_m * BLOCK_M`), which a later binding does not change."""
    text = _source("all_gather", branch=True).replace(
        "registers\n    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\n",
        "registers\n    rm = (pid_m + 1) * BLOCK_M + tl.arange(0, BLOCK_M)\n")
    assert "(pid_m + 1) * BLOCK_M" in text
    body = generate(text, "ops_matmul.py", requests_in(text, "ops_matmul.py")).rewritten["_kernel"]
    assert "tile rows pid_m * BLOCK_M" in "".join(body.splitlines()) or "pid_m * BLOCK_M" in body
    wait = next(line for line in body.splitlines() if "tlk_first" in line and "=" in line)
    assert "(pid_m + 1)" not in wait, wait


def test_a_refusal_that_names_the_parameter_s_own_name_says_what_it_is() -> None:
    """A load that adds a column to the walked pointer (`tl.load(A + 1, ...)`, reading the next row's first column
    on the last step) through the renamed parameter: the message names `A_ptrs` and says it is `A` as bound again,
    at that line of the user's file."""
    text = _source("all_gather").replace("a = tl.load(A, mask=rk[None, :] < k_remaining, other=0.0)",
                                         "a = tl.load(A + 1, mask=rk[None, :] < k_remaining, other=0.0)")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.strip().startswith("A = A + ("))
    with pytest.raises(AnnotationError) as err:
        generate(text, "ops_matmul.py", requests_in(text, "ops_matmul.py"))
    assert f"(`A_ptrs` is `A` as bound again at line {line})" in str(err.value), err.value
