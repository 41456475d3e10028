"""Compile a plain kernel and its TileLink rewrite for sm_90 (no GPU needed) and print, for each, how
its global loads are issued: the rewrite must keep the plain kernel's wide (16-byte) loads, which an
opaque offset on the guarded pointers would lose. Run with ``TRITON_INTERPRET`` unset."""

from __future__ import annotations

import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import tilelink.language as tll


def _signature(kernel, types: dict[str, str], constexprs: dict) -> dict[str, str]:
    return {n: ("constexpr" if n in constexprs else types.get(n, "i32")) for n in kernel.arg_names}


#: what bulk_store_wait() compiles to: the program's bulk stores have written memory, then a proxy fence
#: (predicated in the grouped notify of a tile loop)
STORE_WAIT = r"(@%\w+ )?cp\.async\.bulk\.wait_group 0; (@%\w+ )?fence\.proxy\.async\.global;"


def compile_ptx(kernel, types: dict[str, str], constexprs: dict, divisible: tuple[str, ...] = (), **options) -> str:
    return compile_asm(kernel, types, constexprs, divisible, **options)["ptx"]


#: the partner kernels' integer arguments that Triton's launcher specialises as multiples of 16 at run time
#: for the benchmarks' shapes (the partners are plain ``triton.jit``; the rewritten kernels do not
#: specialise their ``tlk_*`` arguments)
PARTNER_DIVISIBLE = ("row_elems", "tlk_rows", "tlk_rows_per_rank", "tlk_rows_per_channel", "outer_stride")


def compile_asm(kernel, types: dict[str, str], constexprs: dict, divisible: tuple[str, ...] = (), **options) -> dict:
    """Every stage's text of ``kernel`` compiled for sm_90 (``ttgir``, ``ptx``, ...)."""
    sig = _signature(kernel, types, constexprs)
    # what Triton's launcher specialises at run time for 16-aligned pointers and strides
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
               if sig[n].startswith("*") or (n.startswith("stride") and sig[n] != "constexpr")
               or n in ("N", "K", "M", "N_CTX") or n in divisible}
    compiled = triton.compile(ASTSource(kernel, sig, constexprs, aligned), target=GPUTarget("cuda", 90, 32),
                              options=options)
    return compiled.asm


def load_widths(kernel, types: dict[str, str], constexprs: dict, divisible: tuple[str, ...] = ()) -> dict[str, int]:
    ptx = compile_ptx(kernel, types, constexprs, divisible=divisible)
    return {"cp.async 16B": len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^\n]*, 0x10", ptx)),
            "cp.async <16B": len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^\n]*, 0x(?:8|4|2);", ptx)),
            "ld.global.v4": ptx.count("ld.global.v4"), "ld.global scalar": len(re.findall(r"ld\.global\.b16", ptx)),
            "st.global.v4": len(re.findall(r"st\.global[^\n]*\.v4", ptx)),
            "st.global scalar": len(re.findall(r"st\.global[^\n]*\.b16 ", ptx))}


def main() -> int:
    assert not tll.INTERPRETED, "run with TRITON_INTERPRET unset"
    from tilelink.ops import attention_kernels, tp_kernels
    from tilelink.rules.launch import Launcher

    ptr, i64 = "*bf16", "i64"
    cases = []
    ok = tp_kernels.ag_gemm_kernel
    gemm_types = {"a_ptr": ptr, "b_ptr": ptr, "c_ptr": ptr, "tlk_barriers": "*i64", "tlk_diag": "*i64",
                  "tlk_budget": i64}
    # unit strides are specialised to the constant 1 at run time, which is what makes loads contiguous
    gemm_meta = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "stride_ak": 1, "stride_bn": 1,
                 "stride_cn": 1}
    cases.append(("gemm", ok, gemm_types, gemm_meta))
    # the MoE grouped GEMMs: dynamic-mapping waits (AG) and notifies (RS)
    from tilelink.ops import moe_kernels

    routing = {"sorted_slot_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "tlk_barriers": "*i64", "tlk_diag": "*i64",
               "tlk_budget": i64}
    moe_meta = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "stride_wn": 1, "stride_on": 1}
    cases.append(("moe_ag", moe_kernels.ag_group_gemm_kernel,
                  {"x_ptr": ptr, "w_ptr": ptr, "out_ptr": ptr, **routing}, {**moe_meta, "stride_xk": 1}))
    cases.append(("moe_rs", moe_kernels.group_gemm_rs_kernel,
                  {"h_ptr": ptr, "w_ptr": ptr, "out_ptr": ptr, "topk_weights_ptr": "*fp32", **routing},
                  {**moe_meta, "stride_hk": 1}))
    # the partner kernels of the rules compile for the GPU too (both reduce-scatter variants)
    module = tp_kernels.gemm_rs_kernel.module
    partner_types = {"partial_ptr": ptr, "peer_table": "*i64", "out_ptr": ptr, "tlk_barriers": "*i64",
                     "barrier_table": "*i64", "tlk_diag": "*i64", "tlk_budget": i64}
    # the partners are not specialised on the epoch (do_not_specialize); the constant form compiles too
    epoch_one = {"tlk_epoch": 1}
    for topk in (1, 2):
        # a peer's rows load as 16-byte vectors (the pointer from the peer table is declared aligned)
        widths = load_widths(module.rs_pull_consumer, partner_types, {"TOPK": topk, "BLOCK": 1024}, PARTNER_DIVISIBLE)
        load_widths(module.rs_pull_consumer, partner_types, {"TOPK": topk, "BLOCK": 1024, **epoch_one})
        gpu = dict(Launcher.PULL_CONSUMER_GPU)  # what a GPU launches
        compile_ptx(module.rs_pull_consumer, partner_types, {"TOPK": topk, "BLOCK": gpu.pop("BLOCK")},
                    PARTNER_DIVISIBLE, **gpu)
        print(f"rs_pull_consumer TOPK={topk} {widths}")
    from tilelink.rules.all_gather import kernels as all_gather

    ag_types = {"full_ptr": ptr, "peer_table": "*i64", "tlk_barriers": "*i64"}
    widths = load_widths(all_gather.ag_pull_producer, ag_types, {"BLOCK": 1024}, PARTNER_DIVISIBLE)
    load_widths(all_gather.ag_pull_producer, ag_types, {"BLOCK": 1024, **epoch_one})
    gpu = dict(Launcher.PULL_PRODUCER_GPU)
    compile_ptx(all_gather.ag_pull_producer, ag_types, {"BLOCK": gpu.pop("BLOCK")}, PARTNER_DIVISIBLE, **gpu)
    print(f"ag_pull_producer compiled {widths}")
    ring_types = {"partial_ptr": ptr, "out_ptr": ptr, "recv_ptr": ptr, "recv_table": "*i64", "tlk_barriers": "*i64",
                  "recv_flags": "*i64", "flag_table": "*i64", "tlk_diag": "*i64", "tlk_budget": i64}
    from tilelink.rules.reduce_scatter import kernels as reduce_scatter
    from tilelink.rules.reduce_scatter.launcher import ReduceScatterLauncher

    widths = load_widths(reduce_scatter.rs_ring_consumer, ring_types, {"BLOCK": 1024}, PARTNER_DIVISIBLE)
    load_widths(reduce_scatter.rs_ring_consumer, ring_types, {"BLOCK": 1024, **epoch_one})
    print(f"rs_ring_consumer compiled {widths}")
    push_types = {"full_ptr": ptr, "peer_table": "*i64", "tlk_barriers": "*i64", "barrier_table": "*i64"}
    widths = load_widths(all_gather.ag_push_producer, push_types, {"BLOCK": 1024}, PARTNER_DIVISIBLE)
    load_widths(all_gather.ag_push_producer, push_types, {"BLOCK": 1024, **epoch_one})
    print(f"ag_push_producer compiled {widths}")
    received_types = {"recv_ptr": ptr, "partial_ptr": ptr, "out_ptr": ptr, "recv_barriers": "*i64",
                      "tlk_barriers": "*i64", "tlk_diag": "*i64", "tlk_budget": i64}
    widths = load_widths(reduce_scatter.rs_reduce_received, received_types, {"BLOCK": 1024}, PARTNER_DIVISIBLE)
    load_widths(reduce_scatter.rs_reduce_received, received_types, {"BLOCK": 1024, **epoch_one})
    print(f"rs_reduce_received compiled {widths}")
    topk_types = {"partial_ptr": ptr, "reduced_ptr": ptr, "reduced_barriers": "*i64"}
    for topk in (2, 5):  # the MoE hybrid sums each token's top-k slots before the copy engine
        widths = load_widths(reduce_scatter.rs_topk_reduce, topk_types, {"TOPK": topk, "BLOCK": 1024},
                             PARTNER_DIVISIBLE)
        gpu = {k: v for k, v in ReduceScatterLauncher.TOPK_REDUCE_GPU.items() if k != "per_sm"}
        compile_ptx(reduce_scatter.rs_topk_reduce, topk_types, {"TOPK": topk, "BLOCK": gpu.pop("BLOCK")},
                    PARTNER_DIVISIBLE, **gpu)  # the GPU's launch compiles too
        print(f"rs_topk_reduce TOPK={topk} {widths}")
    # the MoE routing kernels (ids of either integer width)
    from tilelink.ops import moe_routing

    for ids in ("*i64", "*i32"):
        stats_types = {"ids_ptr": ids, "stats_ptr": "*i64", "range_ptr": "*i64", "clamped_ptr": "*i32"}
        stats = compile_ptx(moe_routing.routing_stats_kernel, stats_types,
                            {"CHUNK": moe_routing.CHUNK, "FIXED": False}, num_warps=moe_routing.WARPS)
        fixed = compile_ptx(moe_routing.routing_stats_kernel, stats_types,  # a captured call's (clamps, records)
                            {"CHUNK": moe_routing.CHUNK, "FIXED": True}, num_warps=moe_routing.WARPS)
        align = compile_ptx(moe_routing.align_kernel, {"ids_ptr": ids, "counts_ptr": "*i64", "sorted_ptr": "*i32",
                                                       "expert_ids_ptr": "*i32"},
                            {"E_POW2": 64, "CHUNK": moe_routing.CHUNK}, num_warps=moe_routing.WARPS)
        print(f"moe_routing {ids[1:]} {{'stats ptx': {len(stats) > 0}, 'fixed stats ptx': {len(fixed) > 0}, "
              f"'align ptx': {len(align) > 0}}}")
    for name, okernel, types, meta in cases:
        plain = load_widths(okernel.kernel, types, meta)
        rewritten = load_widths(getattr(okernel.module, okernel.name), types, meta)
        print(f"{name} plain {plain}")
        print(f"{name} rewritten {rewritten}")
    # flash attention reads K and V by descriptors the kernel makes (bulk-tensor loads: once over every key where the
    # chunks are whole numbers of blocks, EVEN_N, else per chunk) and Q by 16-byte vector loads; the operator's bf16
    # D=128 configuration
    attn = attention_kernels.sp_attention_fwd_kernel
    attn_types = {"q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "o_ptr": ptr, "sm_scale": "fp32", "tlk_barriers": "*i64",
                  "tlk_diag": "*i64", "tlk_budget": i64}
    for name, even in (("attention", True), ("attention_chunks", False)):
        attn_meta = {"HEAD_DIM": 128, "BLOCK_M": 128, "BLOCK_N": 128, "CAUSAL": False, "EVEN_N": even}
        for variant, fn in (("plain", attn.kernel), ("rewritten", getattr(attn.module, attn.name))):
            ptx = compile_asm(fn, attn_types, attn_meta, num_warps=8, num_stages=3)["ptx"]
            print(name, variant, {"tma 2d": len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared", ptx)),
                                  "ld.global.v4": ptx.count("ld.global.v4"),
                                  "ld.global scalar": len(re.findall(r"ld\.global\.b16", ptx))})
    # the persistent tensor-descriptor kernels the operators take on a GPU: their bulk-tensor loads
    persistent = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "NUM_SMS": 132}
    for name, okernel, types, meta in (
            ("persistent_ag_gemm", tp_kernels.ag_gemm_persistent_kernel, gemm_types,
             {**gemm_meta, **persistent, "TAIL_SPLIT": 2}),
            ("persistent_gemm_rs", tp_kernels.gemm_rs_persistent_kernel, gemm_types,
             {**gemm_meta, **persistent}),
            ("persistent_moe_ag", moe_kernels.ag_group_gemm_persistent_kernel,
             {"x_ptr": ptr, "w_ptr": ptr, "out_ptr": ptr, **routing},
             {**moe_meta, **persistent, "stride_xk": 1, "TAIL_SPLIT": 4, "TAIL_STAGES": 6})):
        for variant, fn in (("plain", okernel.kernel), ("rewritten", getattr(okernel.module, okernel.name))):
            asm = compile_asm(fn, types, meta, num_warps=8, num_stages=3)
            ptx = asm["ptx"]
            print(name, variant, {"tma 2d": len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared", ptx)),
                                  "tma 3d": len(re.findall(r"cp\.async\.bulk\.tensor\.3d\.shared", ptx)),
                                  "tma store": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
                                  "store wait": len(re.findall(STORE_WAIT, ptx)),
                                  # a releasing add, or a release fence followed by relaxed adds
                                  "sys release": ptx.count("red.release.sys") + ptx.count("fence.acq_rel.sys"),
                                  "loops": asm["ttgir"].count("scf.for ")})
    # moe_rs's column sweep: w by a 3-D descriptor in both forms (rows gathered once, or per K step), and its
    # rewrite (the hybrid with top-k) adds no notify
    from tilelink.ops.moe import sweep_config
    for K in (256, 1024):  # the operator's configs: rows gathered once, or per K step
        config = sweep_config(K)
        one_k = config["ONE_K"]
        sweep = {**{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "ONE_K")}, "stride_hk": 1,
                 "stride_wn": 1, "stride_on": 1}
        okernel = moe_kernels.group_gemm_rs_sweep_kernel
        for variant, fn in (("plain", okernel.kernel), ("rewritten", getattr(okernel.module, okernel.name))):
            ptx = compile_asm(fn, {"h_ptr": ptr, "w_ptr": ptr, "out_ptr": ptr, "topk_weights_ptr": "*fp32",
                                   **routing}, sweep, num_warps=config["num_warps"],
                            num_stages=config["num_stages"])["ptx"]
            print(f"sweep_moe_rs_k{'1' if one_k else 'n'}", variant,
                  {"tma 3d": len(re.findall(r"cp\.async\.bulk\.tensor\.3d\.shared", ptx)),
                   "sys release": len(re.findall(r"\b(?:atom|red)\.[\w.]*\b(?:sys\.release|release\.sys)\b", ptx))
                   + ptx.count("fence.acq_rel.sys")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
