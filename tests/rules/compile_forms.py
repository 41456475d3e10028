"""Compile each kernel form of ``tests/rules/forms/`` for sm_90, plain and rewritten, and print their memory
instructions (run without ``TRITON_INTERPRET``; ``test_forms.py`` compares them): the rewrite must keep the loads
the plain kernel compiles to (16-byte asynchronous copies, bulk tensor copies)."""

from __future__ import annotations

import re

import triton.language as tl

from tests.rules.compile_rewritten import compile_ptx
from tests.rules.forms_cases import load_form

PTR, I64 = "*fp16", "i64"
CHANNELS = {"tlk_barriers": "*i64", "tlk_diag": "*i64", "tlk_budget": I64}
PERSISTENT = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8, "NUM_SMS": 132,
              "stride_ak": 1, "stride_bn": 1, "stride_cn": 1}
FORMS = {
    "attention_descriptor_advance": ("attn_fwd", {"q_ptr": PTR, "desc_k": PTR, "desc_v": PTR, "o_ptr": PTR,
                                                  "sm_scale": "fp32"},
                                     {"HEAD_DIM": 64, "BLOCK_M": 128, "BLOCK_N": 64}),
    "gemm_row_wrap": ("matmul_wrap", {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": PTR},
                      {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "stride_ak": 1, "stride_bn": 1,
                       "stride_cn": 1}),
    "gemm_row_wrap_hints": ("matmul_wrap_hints", {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": PTR},
                            {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "stride_ak": 1,
                             "stride_bn": 1, "stride_cn": 1}),
    "gemm_row_clamp": ("matmul_clamp", {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": PTR},
                       {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "stride_ak": 1, "stride_bn": 1,
                        "stride_cn": 1}),
    "gemm_rs_epilogue_branch": ("matmul_branch", {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": PTR},
                                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_EPILOGUE": True,
                                 "stride_ak": 1, "stride_bn": 1, "stride_cn": 1}),
    # STAGE=3: both inlined copies of the key loop (left of the diagonal, then the diagonal block)
    "attention_helper_inner": ("attn_fwd", {"sm_scale": "fp32", "desc_q": PTR, "desc_k": PTR, "desc_v": PTR,
                                            "desc_o": PTR},
                               {"HEAD_DIM": 64, "BLOCK_M": 128, "BLOCK_N": 64, "STAGE": 3}),
    "attention_flat_heads": ("attn_fwd_flat", {"q_ptr": PTR, "k_ptr": PTR, "v_ptr": PTR, "o_ptr": PTR,
                                               "sm_scale": "fp32"},
                             {"HEAD_DIM": 64, "BLOCK_M": 128, "BLOCK_N": 64, "stride_qm": 64, "stride_kn": 64,
                              "stride_vn": 64, "stride_om": 64}),
    "attention_batched_rows": ("attn_fwd_batched", {"sm_scale": "fp32", "desc_q": PTR, "desc_k": PTR, "desc_v": PTR,
                                                    "desc_o": PTR},
                               {"HEAD_DIM": 64, "BLOCK_M": 128, "BLOCK_N": 64}),
    "moe_rs_expert_zeros": ("fused_moe_kernel", {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": PTR, "topk_weights_ptr": PTR,
                                                 "sorted_token_ids_ptr": "*i32", "expert_ids_ptr": "*i32"},
                            {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "stride_ak": 1,
                             "stride_bn": 1, "stride_cn": 1, "compute_type": tl.float16}),
    "gemm_rs_split_k": ("matmul_split_k", {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": "*fp32"},
                        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 4, "GROUP_M": 8, "stride_ak": 1,
                         "stride_bn": 1, "stride_cn": 1}),
    "gemm_ar_split_k": ("_kernel", {"A": PTR, "B": PTR, "C": "*fp32"},
                        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 4, "GROUP_M": 8, "stride_ak": 1,
                         "stride_bn": 1, "stride_cn": 1}),
    # descriptors made on the host: their type carries the block shape
    "gemm_host_descriptor_ag": ("matmul_descriptor_persistent",
                                {"a_desc": "tensordesc<fp16[128, 64]>", "b_desc": "tensordesc<fp16[128, 64]>",
                                 "c_desc": "tensordesc<fp16[128, 128]>"},
                                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "NUM_SMS": 132}),
    "gemm_host_descriptor_rs": ("matmul_descriptor_persistent_rs",
                                {"a_desc": "tensordesc<fp16[128, 64]>", "b_desc": "tensordesc<fp16[128, 64]>",
                                 "c_desc": "tensordesc<fp16[128, 64]>"},
                                {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "EPILOGUE_SUBTILE": True,
                                 "NUM_SMS": 132}),
    # the persistent matmuls of the tutorials' form: a `tl.range(..., flatten=True)` tile loop, reduce-scattered
    "gemm_columns_beside": ("scaled_mm_kernel", {"a_ptr": PTR, "b_ptr": PTR, "scale_a_ptr": "*fp32", "c_ptr": PTR},
                            {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "stride_ak": 1, "stride_bn": 1,
                             "stride_cn": 1}),
    "gemm_rs_persistent_grouped": ("persistent_mm", {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": "*fp32"}, PERSISTENT),
    "gemm_persistent_counter": ("matmul_kernel_persistent", {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": PTR}, PERSISTENT),
}


def profile(ptx: str) -> dict[str, int]:
    return {"cp.async 16B": len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^\n]*, 0x10", ptx)),
            "cp.async <16B": len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^\n]*, 0x(?:8|4|2);", ptx)),
            "tma 2d": len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared", ptx)),
            "ld.global.b16": len(re.findall(r"ld\.global\.b16", ptx))}


def main() -> None:
    for name, (kernel, types, meta) in FORMS.items():
        overlapped = getattr(load_form(name), kernel)
        for variant, fn in (("plain", overlapped.kernel), ("rewritten", getattr(overlapped.module, kernel))):
            print(name, variant, profile(compile_ptx(fn, {**types, **CHANNELS}, meta)))


if __name__ == "__main__":
    main()
