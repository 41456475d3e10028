"""What one GPU can tell about the overlapped GEMMs: their compute against cuBLAS, and the cost of
the waits and notifies TileLink inserted.

For each per-rank shape of the paper's MLP-1..6 at world size W, side by side in one process:

- ``torch``: ``torch.matmul`` (cuBLAS);
- ``plain``: the operator's kernel as written (``OverlappedKernel.kernel``, no TileLink code), all SMs,
  with the operator's launch parameters (AG+GEMM cuts its last wave's tiles in ``TAIL_SPLIT`` pieces);
- ``rewritten``: the generated kernel with every channel already satisfied (waits pass at once: an
  AG+GEMM program that finds every channel there at its start polls at none; notifies land in a scratch
  array), on the programs the operator gives it (all SMs but ``comm_sms``);
- ``rewritten_all``: the generated kernel on all SMs, so ``rewritten_all / plain`` is the cost of
  the inserted code alone (the ``rewritten`` time itself when the operator gives it all SMs);

The GEMM+RS kernel stores C by descriptor (TMA); the rewrite counts a tile's stored elements from the
descriptor's box, so there is no per-element count to compare with any more.

Run on a GPU::

    python -m tilelink.benchmarks.overlap_cost --world 8 --rounds 3 --out results/

``--configs`` also times the rewritten kernel (on the operator's programs) with each candidate of
``tilelink.ops.gemm.HOPPER_CONFIGS`` that fits, to choose the operators' per-shape configs.

``--small`` runs tiny shapes (also under ``TRITON_INTERPRET=1``, to check the script itself).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from tilelink.benchmarks.common import select_shapes
from tilelink.ops.contract import interpreter_dtype, interpreting


def _bench(fn) -> float:
    if interpreting():
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _candidates(kind: str, dtype: torch.dtype) -> list[dict]:
    """The autotuning candidates that fit this kernel's shared memory, as launch keyword arguments."""
    from tilelink.ops.gemm import HOPPER_CONFIGS, _config, _prune_configs

    extra = [_config(128, 256, 64, 3, 8, group_m=4), _config(128, 256, 64, 3, 8, group_m=16),
             _config(128, 128, 64, 6, 8), _config(64, 256, 64, 4, 4)]
    probe = {"a_ptr": torch.empty(0, dtype=dtype), "c_ptr": torch.empty(0, dtype=dtype)}
    fits = _prune_configs(HOPPER_CONFIGS + extra, probe, epilogue_in_smem=kind == "ag_gemm")
    return [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in fits]


def config_name(meta: dict) -> str:
    return (f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} w{meta['num_warps']} s{meta['num_stages']}"
            f" g{meta['GROUP_M']}")


def measure(kind: str, M: int, N: int, K: int, world: int, dtype: torch.dtype, device, configs: bool = False) -> dict:
    import triton

    from tilelink.ops import tp, tp_kernels
    from tilelink.ops.contract import persistent_grid

    okernel = tp_kernels.ag_gemm_persistent_kernel if kind == "ag_gemm" else tp_kernels.gemm_rs_persistent_kernel
    plain = okernel.kernel
    rewritten = getattr(okernel.module, okernel.name)
    a = torch.randn(M, K, dtype=dtype, device=device)
    b = torch.randn(K, N, dtype=dtype, device=device)
    c = torch.empty(M, N, dtype=dtype, device=device)
    meta = tp._config(dtype)
    if device.type == "cuda":
        from tilelink.ops.gemm import _install_allocator

        _install_allocator()
        all_sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        all_sms = 4
    some_sms = tp._compute_sms(device, okernel) if device.type == "cuda" else all_sms
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    chan = okernel.launcher.satisfied_args(M, world, device)  # the operator's own channels

    def launch(m: dict, sms: int) -> tuple[tuple[int], dict]:
        # the grid and tile meta the operator launches with: AG+GEMM splits its last wave's tiles
        tiles = triton.cdiv(M, m["BLOCK_M"]) * triton.cdiv(N, m["BLOCK_N"])
        return persistent_grid(tiles, sms, m, tail=kind == "ag_gemm")

    def run_plain():
        grid, m = launch(meta, all_sms)
        plain[grid](*args, **m)

    def run_rewritten(sms: int, m: dict = meta):
        grid, m = launch(m, sms)
        rewritten[grid](*args, **m, **chan)

    ref = a.float() @ b.float()
    checks = {}
    for name, fn in (("plain", run_plain), ("rewritten", lambda: run_rewritten(some_sms))):
        c.fill_(float("nan"))
        fn()
        checks[name] = ((c.float() - ref).norm() / ref.norm()).item()
    times = {"torch": _bench(lambda: torch.matmul(a, b, out=c)), "plain": _bench(run_plain),
             "rewritten": _bench(lambda: run_rewritten(some_sms))}
    # with the communication on the copy engine the operator already gives the kernel every SM: the
    # same launch, timed once
    times["rewritten_all"] = times["rewritten"] if some_sms == all_sms else _bench(lambda: run_rewritten(all_sms))
    config_ms = {}
    if configs and device.type == "cuda":
        import triton.runtime.errors

        for m in _candidates(kind, dtype):
            try:
                config_ms[config_name(m)] = _bench(lambda m=m: run_rewritten(some_sms, m))
            except triton.runtime.errors.OutOfResources as e:
                config_ms[config_name(m)] = f"out of resources: {e}"
    flops = 2 * M * N * K
    return {"kind": kind, "M": M, "N": N, "K": K, "ms": times, "rel_err": checks, "config_ms": config_ms,
            "config": config_name({"num_warps": 4, "num_stages": 3, **meta}),
            "tflops": {k: flops / v / 1e9 for k, v in times.items()}, "sms": {"all": all_sms, "rewritten": some_sms}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="results")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--configs", action="store_true", help="also time every candidate config (rewritten kernel)")
    parser.add_argument("--shapes", default="all", help="comma list of MLP shape numbers such as 1,2 or 'all'")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
    dtype = interpreter_dtype(getattr(torch, args.dtype))  # the interpreter's bf16 dot is wrong
    shapes = ({"tiny": (64, 64, 256)} if args.small
              else {s.name: (s.S, s.H, s.I) for s in select_shapes(args.shapes)})
    rows = []
    for name, (S, H, I) in shapes.items():
        per_rank_i = I // args.world
        for kind, (M, N, K) in (("ag_gemm", (S, 2 * per_rank_i, H)), ("gemm_rs", (S, H, per_rank_i))):
            rounds = [measure(kind, M, N, K, args.world, dtype, device, args.configs) for _ in range(args.rounds)]
            row = {"shape": name, **{k: rounds[0][k] for k in ("kind", "M", "N", "K", "rel_err", "sms")},
                   "rounds": rounds}
            for num, den in (("plain", "torch"), ("rewritten", "torch"), ("rewritten_all", "plain")):
                if num in rounds[0]["ms"]:
                    row[f"{num}/{den}"] = statistics.median(r["ms"][den] / r["ms"][num] for r in rounds)
            timed = [c for c in rounds[0]["config_ms"]  # configs that ran in every round
                     if all(not isinstance(r["config_ms"].get(c), (str, type(None))) for r in rounds)]
            if timed:
                row["config_ratio"] = {  # torch / rewritten with that config, median over rounds
                    c: statistics.median(r["ms"]["torch"] / r["config_ms"][c] for r in rounds) for c in timed}
                best = max(row["config_ratio"], key=row["config_ratio"].get)
                print("    configs (torch / rewritten): " + ", ".join(
                    f"{c} {r:.3f}" for c, r in sorted(row["config_ratio"].items(), key=lambda kv: -kv[1]))
                    + f"  best {best}", flush=True)
            rows.append(row)
            print(f"{name:6} {kind:8} M={M:5} N={N:5} K={K:5}  torch {rounds[-1]['ms']['torch']:.3f} ms  "
                  f"plain/torch {row['plain/torch']:.3f}  rewritten/torch {row['rewritten/torch']:.3f}  "
                  f"inserted code: rewritten_all/plain {row['rewritten_all/plain']:.3f}  err {row['rel_err']}",
                  flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "overlap_cost.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   "torch": torch.__version__, "world": args.world, "dtype": str(dtype), "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
