"""Flash attention whose keys and values are read through descriptors the kernel makes from its own
parameters (`desc_k = tl.make_tensor_descriptor(desc_k, ...)`), with the key offset advanced by `+=` at the end
of each key block: K and V are gathered along the sequence."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_gather(("desc_k", "desc_v"), dim=0), via="copy_engine")
@triton.jit
def attn_fwd(q_ptr, desc_k, desc_v, o_ptr, SEQ_Q, SEQ_KV, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr):
    desc_k = tl.make_tensor_descriptor(desc_k, shape=[SEQ_KV, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(desc_v, shape=[SEQ_KV, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < SEQ_Q, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    offsetk_y = 0
    offsetv_y = 0
    for start_n in tl.range(0, SEQ_KV, BLOCK_N):
        k = desc_k.load([offsetk_y, 0])
        qk = tl.dot(q, tl.trans(k)) * sm_scale
        qk = tl.where((start_n + tl.arange(0, BLOCK_N))[None, :] < SEQ_KV, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_ij[:, None])
        alpha = tl.exp(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([offsetv_y, 0])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_ij
        offsetk_y += BLOCK_N
        offsetv_y += BLOCK_N
    acc = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < SEQ_Q)
