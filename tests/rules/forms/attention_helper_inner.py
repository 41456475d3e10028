"""Flash attention in the layout of Triton's fused-attention tutorial: the descriptors come from a @triton.jit
helper that takes a pointer or a descriptor, and the key loop is a @triton.jit helper that reads K and V through
them, starting at `offsetk_y = offset_y + lo` and advancing it by `+=` on every block; the kernel calls it once for
the blocks left of the diagonal and once for the diagonal block (causal) or once for every block. K and V are
gathered along the sequence."""

import triton
import triton.language as tl

import tilelink


@triton.jit
def _maybe_make_tensor_desc(desc_or_ptr, shape, strides, block_shape):
    if isinstance(desc_or_ptr, tl.tensor_descriptor):
        return desc_or_ptr
    else:
        return tl.make_tensor_descriptor(desc_or_ptr, shape, strides, block_shape)


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, offset_y, dtype: tl.constexpr, start_m, qk_scale, N_CTX,
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr,
                    offs_m: tl.constexpr, offs_n: tl.constexpr):
    # the range of keys this stage visits
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
    else:
        lo, hi = 0, N_CTX
    offsetk_y = offset_y + lo
    offsetv_y = offset_y + lo
    for start_n in tl.range(lo, hi, BLOCK_N):
        k = desc_k.load([offsetk_y, 0])
        qk = tl.dot(q, tl.trans(k))
        keep = (start_n + offs_n)[None, :] < N_CTX
        if STAGE == 2:
            keep = keep & (offs_m[:, None] >= (start_n + offs_n[None, :]))
        qk = tl.where(keep, qk * qk_scale, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk -= m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([offsetv_y, 0])
        acc = tl.dot(p.to(dtype), v, acc)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
        offsetk_y += BLOCK_N
        offsetv_y += BLOCK_N
    return acc, l_i, m_i


@tilelink.overlap(tilelink.all_gather(("desc_k", "desc_v"), dim=0), via="copy_engine")
@triton.jit
def attn_fwd(sm_scale, desc_q, desc_k, desc_v, desc_o, N_CTX_Q, N_CTX, HEAD_DIM: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr):
    dtype = desc_o.dtype.element_ty
    desc_q = _maybe_make_tensor_desc(desc_q, shape=[N_CTX_Q, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = _maybe_make_tensor_desc(desc_k, shape=[N_CTX, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = _maybe_make_tensor_desc(desc_v, shape=[N_CTX, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_N, HEAD_DIM])
    desc_o = _maybe_make_tensor_desc(desc_o, shape=[N_CTX_Q, HEAD_DIM], strides=[HEAD_DIM, 1],
                                     block_shape=[BLOCK_M, HEAD_DIM])
    start_m = tl.program_id(0)
    offset_y = 0  # one sequence: its keys start at row 0
    qo_offset_y = start_m * BLOCK_M
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # 1/log(2)
    q = desc_q.load([qo_offset_y, 0])
    # stage 1: off-band (causal) or every key (non-causal)
    if STAGE & 1:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, offset_y, dtype, start_m, qk_scale,
                                        N_CTX, BLOCK_M, HEAD_DIM, BLOCK_N, 4 - STAGE, offs_m, offs_n)
    # stage 2: the diagonal block
    if STAGE & 2:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, offset_y, dtype, start_m, qk_scale,
                                        N_CTX, BLOCK_M, HEAD_DIM, BLOCK_N, 2, offs_m, offs_n)
    acc = acc / l_i[:, None]
    desc_o.store([qo_offset_y, 0], acc.to(dtype))
