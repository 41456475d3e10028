"""Rank functions of the GEMM + AllReduce tests (run in spawned emulated worlds; imported by name)."""

from __future__ import annotations

import hashlib

import torch

import tilelink
import tilelink.runtime


def bounds(size: int, rank: int, world: int) -> tuple[int, int]:
    per = -(-size // world)
    return min(size, rank * per), min(size, (rank + 1) * per)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def gemm_ar_matches_torch(shapes: list[tuple[int, int, int]], modes: list[str | None],
                          dtype_name: str = "float32", calls: int = 2) -> dict[str, tuple[float, str]]:
    """``gemm_ar`` of this rank's K slice on each (M, N, K) and mode, ``calls`` times with new inputs (the
    context's later calls run at later epochs): per case the largest error relative to the reference's largest
    element, and a digest of the last result (every rank must hold the same bits)."""
    from tilelink.ops import gemm_ar

    dtype = getattr(torch, dtype_name)
    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    g = torch.Generator().manual_seed(11)
    out: dict[str, tuple[float, str]] = {}
    for M, N, K in shapes:
        klo, khi = bounds(K, r, R)
        for mode in modes:
            err = 0.0
            for _ in range(calls):
                a = torch.randn(M, K, generator=g).to(dtype)
                b = torch.randn(K, N, generator=g).to(dtype)
                c = gemm_ar(a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device), mode=mode)
                assert c.dtype == dtype and c.shape == (M, N) and c.device.type == device.type, (c.dtype, c.shape)
                ref = a.double() @ b.double()
                scale = max(ref.abs().max().item(), 1.0)
                e = ((c.cpu().double() - ref).abs().max().item() / scale) if c.numel() else 0.0
                err = e if e != e or err != err else max(err, e)  # NaN stays
            out[f"M={M} N={N} K={K} mode={mode}"] = (err, _digest(c))
    return out


def empty_and_bad_inputs() -> dict[str, str]:
    """M = 0 returns at once; each wrong argument (and a TPMLP output that does not exist) is refused before
    anything runs: the message of each."""
    from tilelink.nn import TPMLP
    from tilelink.ops import TPContext, gemm_ar

    out: dict[str, str] = {}
    empty = gemm_ar(torch.zeros(0, 3), torch.zeros(3, 5))
    out["empty"] = f"{tuple(empty.shape)}"
    cases = {
        "mode": lambda: gemm_ar(torch.zeros(2, 3), torch.zeros(3, 4), mode="three_shot"),
        "inner": lambda: gemm_ar(torch.zeros(2, 3), torch.zeros(4, 4)),
        "dtype": lambda: gemm_ar(torch.zeros(2, 3), torch.zeros(3, 4, dtype=torch.float16)),
        "ctx": lambda: gemm_ar(torch.zeros(2, 3), torch.zeros(3, 4), TPContext(M=5)),
        "dims": lambda: gemm_ar(torch.zeros(2, 3, 1), torch.zeros(3, 4)),
        "mlp_output": lambda: TPMLP(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(2, 4), output="all_gather"),
    }
    for name, call in cases.items():
        try:
            call()
            out[name] = "NO ERROR"
        except tilelink.LaunchError as exc:
            out[name] = str(exc)
    return out


def mlp_all_reduce_matches_torch(S: int, H: int, I: int, calls: int = 2) -> float:
    """``TPMLP(..., output="all_reduce")``: every rank passes all S rows and gets the whole (S, H) output."""
    from tilelink.nn import TPMLP

    g = torch.Generator().manual_seed(13)
    gate, up, down = torch.randn(I, H, generator=g), torch.randn(I, H, generator=g), torch.randn(H, I, generator=g)
    mlp = TPMLP(gate, up, down, output="all_reduce")
    device = tilelink.runtime.current_world().device
    err = 0.0
    for _ in range(calls):
        x = torch.randn(S, H, generator=g)
        y = mlp(x.to(device)).cpu().float()
        ref = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
        assert y.shape == (S, H), y.shape
        err = max(err, ((y - ref).abs().max() / ref.abs().max().clamp(min=1.0)).item())
    return err


def gemm_ar_mutants() -> dict:
    """:func:`tilelink.ops.gemm_ar` with each algorithm, and with ONE inserted notify of its kernel taken out at a
    time (``tests.rules.mutations.mutant``): per algorithm, the inserted calls' count, the unmutated call's outcome
    and each mutant's (``tests.ops.operator_mutants``'s outcomes: ``"passed"``, ``"failed: ..."``, ...)."""
    from tests.ops.operator_mutants import _outcome, _rel
    from tests.rules.mutations import mutant, mutation_points
    from tilelink.ops import gemm_ar, tp_ar_kernels

    r, R = tilelink.rank(), tilelink.world_size()
    device = tilelink.runtime.current_world().device
    # one decode token: one channel holds a row (rank 1's is empty), so a dropped notify times out the fewest waits
    M, N, K = 1, 20, 11
    g = torch.Generator().manual_seed(14)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    klo, khi = bounds(K, r, R)
    ref = a.double() @ b.double()
    a_dev, b_dev = a[:, klo:khi].contiguous().to(device), b[klo:khi].contiguous().to(device)
    result: dict = {}
    for mode, okernel in tp_ar_kernels.FORCED.items():
        points = mutation_points(okernel.generated, okernel.name)
        entry = {"points": points, "baseline": _outcome(lambda m=mode: _rel(gemm_ar(a_dev, b_dev, mode=m), ref),
                                                        okernel), "mutants": []}
        original = (okernel.generated, okernel._module, okernel._launcher)
        for index in range(points):
            okernel.generated, dropped = mutant(original[0], okernel.name, index)
            okernel._module = None
            okernel._launcher = None  # a new launcher: new contexts, no timed-out wait of an earlier mutant
            try:
                entry["mutants"].append((f"#{index} ({dropped})", _outcome(
                    lambda m=mode: _rel(gemm_ar(a_dev, b_dev, mode=m), ref), okernel)))
            finally:
                okernel.generated, okernel._module, okernel._launcher = original
        result[mode] = entry
    return result
