"""vLLM's scaled matmul (`scaled_mm_kernel`) under all_gather: the offsets grid held in a local of its own
(`offsets_a`, added to the pointer), the K offsets advanced beside the pointer (`offsets_k += BLOCK_K`) and masked by
`offsets_k < K` on each step, the masks made of locals in the loop, 64-bit offsets, a per-row scale after the loop."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
@triton.jit
def scaled_mm_kernel(a_ptr, b_ptr, scale_a_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offsets_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    masks_am = offsets_am < M
    offsets_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    masks_bn = offsets_bn < N
    offsets_k = tl.arange(0, BLOCK_K).to(tl.int64)
    offsets_a = (stride_am * offsets_am[:, None] +
                 stride_ak * offsets_k[None, :])
    offsets_b = (stride_bk * offsets_k[:, None] +
                 stride_bn * offsets_bn[None, :])
    a_ptrs = a_ptr + offsets_a
    b_ptrs = b_ptr + offsets_b
    for k in range(0, tl.cdiv(K, BLOCK_K)):  # noqa: B007 - as vLLM writes it
        masks_k = offsets_k < K
        masks_a = masks_am[:, None] & masks_k[None, :]
        a = tl.load(a_ptrs, mask=masks_a)
        masks_b = masks_k[:, None] & masks_bn[None, :]
        b = tl.load(b_ptrs, mask=masks_b)
        accumulator = tl.dot(a, b, accumulator)
        offsets_k += BLOCK_K
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    scale_a = tl.load(scale_a_ptr + offsets_am, mask=masks_am)
    accumulator = scale_a[:, None] * accumulator
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, accumulator, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
