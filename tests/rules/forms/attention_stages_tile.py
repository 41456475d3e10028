"""Flash attention on pointers in the structure of Triton's fused-attention tutorial: the key loop is a @triton.jit
helper, called once for the blocks left of the diagonal and once for the diagonal block when causal (STAGE 1, then
2), or once for every block (STAGE 3). K and V, (H, S, D), are gathered along the sequence (dim 1) with `tile=`
naming the helper's own loop variable: each inlined copy of the helper waits for the rows of its own loop."""

import triton
import triton.language as tl

import tilelink


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, start_m, qk_scale, offs_m, offs_n,
                    offs_d, N_CTX, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr):
    if STAGE == 1:
        lo, hi = 0, tl.minimum(N_CTX, start_m * BLOCK_M)
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, tl.minimum(N_CTX, (start_m + 1) * BLOCK_M)
    else:
        lo, hi = 0, N_CTX
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < N_CTX, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        keep = cols[None, :] < hi
        if STAGE == 2:
            keep = keep & (offs_m[:, None] >= cols[None, :])
        qk = tl.where(keep, qk, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < N_CTX, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_ij
    return acc, l_i, m_i


@tilelink.overlap(tilelink.all_gather(("K", "V"), dim=1, tile=("start_n", "BLOCK_N"), size="N_CTX"))
@triton.jit
def attn_fwd(Q, K, V, Out, sm_scale, stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh,
             stride_om, N_CTX, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
             IS_CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_base = K + off_h.to(tl.int64) * stride_kh
    v_base = V + off_h.to(tl.int64) * stride_vh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < N_CTX,
                other=0.0)
    if IS_CAUSAL:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, start_m, qk_scale,
                                        offs_m, offs_n, offs_d, N_CTX, BLOCK_M, BLOCK_N, 1)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, start_m, qk_scale,
                                        offs_m, offs_n, offs_d, N_CTX, BLOCK_M, BLOCK_N, 2)
    else:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, start_m, qk_scale,
                                        offs_m, offs_n, offs_d, N_CTX, BLOCK_M, BLOCK_N, 3)
    acc = acc / l_i[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(Out.dtype.element_ty),
             mask=offs_m[:, None] < N_CTX)
