"""An autotuned split-K write-back: the split count is a configuration's meta-parameter, which the grid reads
(`META.get("SPLIT_K", 1)`, as a kernel that also runs untuned writes it). The K splits are counted from the grid as
Triton evaluates it for the configuration it runs, never from the call's arguments alone (which would count one
split: the channels then complete after the first split's adds and are read before the others'); configurations
that split differently are refused before anything runs, since the choice is made at the launch."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
import triton

import tilelink
from tests.rules.cases import rows_of
from tilelink.errors import LaunchError
from tilelink.runtime import current_world

KERNEL = '''
import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.reduce_scatter("c_ptr"))
@triton.autotune(configs=[{configs}], key=["K"])
@triton.jit
def matmul_tuned_split_k(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT_K: tl.constexpr):
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    pid_k = tl.program_id(axis=2)
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak,
                    mask=(offs_am[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn,
                    mask=(offs_k[:, None] < K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.atomic_add(c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn, acc, mask=c_mask)
'''


def _load(path: str):
    spec = importlib.util.spec_from_file_location("tuned_split_k", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _multiply(path: str, name: str = "matmul_tuned_split_k", whole: bool = False, rows_from_output: bool = False,
              **meta) -> float:
    """The kernel ``name`` of ``path`` over this rank's slice of K, against torch: its rows of the product (an
    all-reduce's: ``whole``, all of them). ``meta``: further arguments of the call (``SPLIT_K=3``). With
    ``rows_from_output`` the grid counts the row tiles from the tensor the kernel writes (on a GPU, where Triton gives
    the grid function the tensors: the interpreter gives it their addresses)."""
    module = _load(path)
    rank, world = tilelink.rank(), tilelink.world_size()
    M, N, K = 40, 24, 64
    g = torch.Generator().manual_seed(31)
    # integers: every order of the adds gives the same sums (float16 on a GPU holds them exactly)
    a, b = torch.randint(-3, 4, (M, K), generator=g).float(), torch.randint(-3, 4, (K, N), generator=g).float()
    klo, khi = rows_of(rank, world, K)
    device = current_world().device
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    ar, br = (t.to(device=device, dtype=dtype) for t in (a[:, klo:khi].contiguous(), b[klo:khi].contiguous()))
    lo, hi = (0, M) if whole else rows_of(rank, world, M)
    err = 0.0
    for _ in range(2):
        out = torch.full((hi - lo, N), float("nan"), device=device)
        grid = lambda META: (triton.cdiv(META["c_ptr"].shape[0] if rows_from_output else M,  # noqa: E731
                                         META["BLOCK_M"]), triton.cdiv(N, META["BLOCK_N"]), META.get("SPLIT_K", 1))
        getattr(module, name)[grid](ar, br, out, M, N, khi - klo, ar.stride(0), ar.stride(1), br.stride(0),
                                    br.stride(1), N, 1, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, **meta)
        got = out.cpu() - (a @ b)[lo:hi]
        err = max(err, float("inf") if got.isnan().any() else got.abs().max().item())
    return err


def _written(tmp_path, configs: str) -> str:
    """The kernel with these configurations, in a file of its own (Triton reads a kernel's source from its file)."""
    path = tmp_path / "tuned_split_k.py"
    path.write_text(textwrap.dedent(KERNEL.format(configs=configs)))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_the_splits_of_an_autotuned_configuration_are_counted_on_the_race_exposing_schedule(world: int, tmp_path,
                                                                                           monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    errors = tilelink.spawn(_multiply, world, _written(tmp_path, 'triton.Config({"SPLIT_K": 2})'))
    assert all(e == 0.0 for e in errors), errors


@pytest.mark.slow
def test_configurations_that_split_differently_are_refused_before_the_launch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    path = _written(tmp_path, 'triton.Config({"SPLIT_K": 2}), triton.Config({"SPLIT_K": 4})')
    with pytest.raises(LaunchError) as info:
        tilelink.spawn(_multiply, 2, path)
    assert "K splits 2 (SPLIT_K=2), 4 (SPLIT_K=4)" in str(info.value), info.value
    assert "give every configuration the same split count" in str(info.value), info.value


@pytest.mark.slow
def test_a_split_count_left_to_its_default_is_counted_on_the_race_exposing_schedule(tmp_path, monkeypatch) -> None:
    # untuned, the split count a constexpr default the call leaves out: Triton's grid reads it at that default, so
    # `META.get("SPLIT_K", 1)` is two splits, not one (counted as one, the channels completed after the first's adds)
    monkeypatch.setenv("TILELINK_RACES", "1")
    errors = tilelink.spawn(_multiply, 2, written_with_a_default(tmp_path))
    assert all(e == 0.0 for e in errors), errors


def written_with_a_default(tmp_path) -> str:
    """The kernel untuned, its split count the default `SPLIT_K: tl.constexpr = 2`, in a file of its own."""
    path = tmp_path / "tuned_split_k.py"
    path.write_text(textwrap.dedent(KERNEL).replace('@triton.autotune(configs=[{configs}], key=["K"])\n', "").replace(
        "SPLIT_K: tl.constexpr)", "SPLIT_K: tl.constexpr = 2)"))
    return str(path)


def split_k_mutants(path: str) -> list[tuple[str, str]]:
    """The mutants of the autotuned split-K kernel (each inserted notify dropped in turn) on this rank."""
    import tests.rules.test_split_k_autotuned as here
    from tests.rules.mutations import _patcher, _run

    real, patch = _patcher(here, "_load")
    return _run(lambda: real(path), patch, lambda: here._multiply(path))


@pytest.mark.slow
def test_dropping_the_notify_of_the_autotuned_write_back_is_caught(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "2")
    path = _written(tmp_path, 'triton.Config({"SPLIT_K": 2})')
    results = tilelink.spawn(split_k_mutants, 2, path, timeout=600)
    assert results[0], "the rewrite inserted no notify"
    caught = {what for outcomes in results for what, outcome in outcomes if outcome.startswith("failed")}
    assert caught == {what for what, _ in results[0]}, results


def written_with_a_heuristic(tmp_path) -> str:
    """The kernel untuned, its split count a heuristic of the tensor it writes: two splits where that tensor holds
    all M rows, one where it holds fewer. The rewritten kernel is given the partial sums (all M rows), the caller
    passes its rows of the output: the split is decided on the former, as Triton's launch decides it."""
    path = tmp_path / "tuned_split_k.py"
    path.write_text(textwrap.dedent(KERNEL).replace(
        '@triton.autotune(configs=[{configs}], key=["K"])\n',
        '@triton.heuristics({"SPLIT_K": lambda args: 2 if args["c_ptr"].shape[0] == args["M"] else 1})\n'))
    return str(path)


@pytest.mark.slow
def test_a_split_count_a_heuristic_reads_from_the_reduced_tensor_is_counted_as_launched(tmp_path,
                                                                                       monkeypatch) -> None:
    # counted on the caller's rows of the output, the split would be one: the sums would not be started at zero
    # nor the channels lowered for the second split's adds, and each channel would complete early
    monkeypatch.setenv("TILELINK_RACES", "1")
    monkeypatch.setenv("TILELINK_WAIT_TIMEOUT", "20")
    errors = tilelink.spawn(_multiply, 2, written_with_a_heuristic(tmp_path))
    assert all(e == 0.0 for e in errors), errors
