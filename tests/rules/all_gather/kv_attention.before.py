"""Flash-attention forward (one head, non-causal) over a KV loop; K and V are all-gathered along
the sequence (dim 0) together on the copy engine, and each KV block waits only for the rank that
holds it."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather(("k_ptr", "v_ptr"), dim=0), via="copy_engine")
@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, SEQ_Q, SEQ_KV, stride_qm, stride_kn, stride_vn, stride_om,
                     sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < SEQ_Q, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, SEQ_KV, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + offs_n[:, None] * stride_kn + offs_d[None, :], mask=offs_n[:, None] < SEQ_KV, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        s = tl.where(offs_n[None, :] < SEQ_KV, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + offs_n[:, None] * stride_vn + offs_d[None, :], mask=offs_n[:, None] < SEQ_KV, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < SEQ_Q)
