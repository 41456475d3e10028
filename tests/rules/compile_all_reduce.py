"""Compile the all-reduce's kernels for sm_90 (no GPU needed) and print how each issues its global accesses: the
rewritten GEMM of ``tilelink.ops.gemm_ar`` keeps the plain one's 16-byte copies, and the partner kernels move a
peer's rows as 16-byte vectors. Run with ``TRITON_INTERPRET`` unset."""

from __future__ import annotations

import sys

from tests.rules.compile_rewritten import PARTNER_DIVISIBLE, compile_ptx, load_widths
from tilelink.rules.launch import Launcher


def main() -> int:
    import tilelink.language as tll

    assert not tll.INTERPRETED, "run with TRITON_INTERPRET unset"
    from tilelink.ops import tp_ar_kernels

    ptr, i64 = "*bf16", "i64"
    ok = tp_ar_kernels.gemm_ar_kernel
    types = {"a_ptr": ptr, "b_ptr": ptr, "c_ptr": ptr, "tlk_barriers": "*i64", "tlk_diag": "*i64", "tlk_budget": i64}
    meta = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "stride_ak": 1, "stride_bn": 1,
            "stride_cn": 1}
    print(f"gemm plain {load_widths(ok.kernel, types, meta)}")
    print(f"gemm rewritten {load_widths(getattr(ok.module, ok.name), types, meta)}")
    module = tp_ar_kernels.FORCED["two_shot"].module
    gpu = dict(Launcher.PULL_CONSUMER_GPU)  # what a GPU launches
    block = gpu.pop("BLOCK")
    reduce_types = {"partial_ptr": ptr, "peer_table": "*i64", "out_ptr": ptr, "share_ptr": ptr, "share_flags": "*i64",
                    "tlk_barriers": "*i64", "barrier_table": "*i64", "tlk_diag": "*i64", "tlk_budget": i64}
    for share in (False, True):
        widths = load_widths(module.ar_pull_reduce, reduce_types, {"SHARE": share, "BLOCK": 1024}, PARTNER_DIVISIBLE)
        compile_ptx(module.ar_pull_reduce, reduce_types, {"SHARE": share, "BLOCK": block}, PARTNER_DIVISIBLE, **gpu)
        print(f"ar_pull_reduce share={share} {widths}")
    gather_types = {"share_ptr": ptr, "share_table": "*i64", "out_ptr": ptr, "share_flags": "*i64",
                    "flag_table": "*i64", "tlk_diag": "*i64", "tlk_budget": i64}
    widths = load_widths(module.ar_gather_rows, gather_types, {"BLOCK": 1024}, PARTNER_DIVISIBLE)
    compile_ptx(module.ar_gather_rows, gather_types, {"BLOCK": block}, PARTNER_DIVISIBLE, **gpu)
    print(f"ar_gather_rows - {widths}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
