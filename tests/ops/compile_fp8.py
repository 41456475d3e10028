"""Compile the FP8 kernels (as written and rewritten) for sm_90 on this CPU machine, with the configurations the
operators launch on a GPU, and print for each what it became: its shared memory, its e4m3 warpgroup MMAs, its
bulk-tensor (TMA) loads and stores. Run with ``TRITON_INTERPRET`` unset."""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import tilelink.language as tll

#: what Triton's launcher specialises at run time: 16-byte aligned pointers, strides and sizes, unit strides
ALIGNED = ("M", "N", "K")


def compile_kernel(kernel, types: dict[str, str], constexprs: dict, **options):
    sig = {n: ("constexpr" if n in constexprs else types.get(n, "i32")) for n in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
               if sig[n].startswith("*") or (n.startswith("stride") and sig[n] != "constexpr") or n in ALIGNED}
    return triton.compile(ASTSource(kernel, sig, constexprs, aligned), target=GPUTarget("cuda", 90, 32),
                          options=options)


def main() -> None:
    assert not tll.INTERPRETED, "run with TRITON_INTERPRET unset"
    from tilelink.ops import tp_fp8_kernels as k
    from tilelink.ops.tp_fp8 import fp8_config

    types = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "a_scale_ptr": "*fp32",
             "b_scale_ptr": "*fp32", "tlk_barriers": "*i64", "tlk_diag": "*i64", "tlk_epoch": "i64",
             "tlk_budget": "i64"}
    units = {"stride_ak": 1, "stride_cn": 1}
    for name, okernel, part, persistent, extra in (
            ("ag_gemm", k.ag_gemm_fp8_kernel, "ag_gemm", False, {}),
            ("ag_gemm_persistent", k.ag_gemm_fp8_persistent_kernel, "ag_gemm", True,
             {"NUM_SMS": 132, "TAIL_SPLIT": 2, "stride_bk": 1}),
            ("gemm_rs", k.gemm_rs_fp8_kernel, "gemm_rs", False, {"A_SCALE_ROWS": True}),
            ("gemm_rs_persistent", k.gemm_rs_fp8_persistent_kernel, "gemm_rs", True,
             {"NUM_SMS": 132, "A_SCALE_ROWS": True, "stride_bk": 1})):
        # the persistent kernels stage C in shared memory: an fp32 C too must fit
        for out, out_bytes in (("", 2), ("_fp32", 4)) if persistent else (("", 2),):
            config = fp8_config(persistent, part, out_bytes)
            meta = {key: v for key, v in config.items() if key not in ("num_warps", "num_stages")}
            meta.update(units, B_SCALE_COLS=True, **extra)
            for variant, fn in (("plain", okernel.kernel), ("rewritten", getattr(okernel.module, okernel.name))):
                compiled = compile_kernel(fn, {**types, "c_ptr": "*fp32" if out else "*bf16"}, meta,
                                          num_warps=config["num_warps"], num_stages=config["num_stages"])
                _report(name, variant + out, compiled)


def _report(name: str, variant: str, compiled) -> None:
    ptx = compiled.asm["ptx"]
    print(name, variant, {"shared": compiled.metadata.shared,
                          "wgmma e4m3": len(re.findall(r"wgmma\.mma_async[^\n]*e4m3\.e4m3", ptx)),
                          "tma load": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared", ptx)),
                          "tma store": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx))},
          flush=True)


if __name__ == "__main__":
    main()
