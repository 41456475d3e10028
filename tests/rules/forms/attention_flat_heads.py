"""Flash attention over a batch of heads stored flat: Q, K, V and O are (Z * H * S, D) matrices whose row
z * H * S + h * S + s is position s of head h of sequence z, one program per (query block, z * H + h). K and V are
gathered along S inside each (z, h) block: each rank holds rows [lo, hi) of S of every head, so the annotation
gathers dim 1 of the (Z * H, S, D) view that the launch passes (the same memory as the flat matrix) and names the
key block's rows along S with tile=."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather(("k_ptr", "v_ptr"), dim=1, tile=("start_n", "BLOCK_N"), size="N_CTX"),
                  via="copy_engine")
@triton.jit
def attn_fwd_flat(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale, Q_CTX, N_CTX, stride_qm, stride_kn, stride_vn, stride_om,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    q_offset = off_hz * Q_CTX  # the first row of this head's queries
    kv_offset = off_hz * N_CTX  # and of its keys and values
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (q_offset + offs_m)[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < Q_CTX,
                other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_ptr + (kv_offset + cols)[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < N_CTX,
                    other=0.0)
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        qk = tl.where(cols[None, :] < N_CTX, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_ij[:, None])
        alpha = tl.exp(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + (kv_offset + cols)[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < N_CTX,
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(o_ptr + (q_offset + offs_m)[:, None] * stride_om + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Q_CTX)
