"""Flash attention over a batch of heads in the layout of Triton's fused-attention tutorial: Q, K, V and O are flat
(Z * H * N_CTX, D) matrices, row z * H * N_CTX + h * N_CTX + s; each program's descriptors are made over all of
them with `shape=[y_dim, HEAD_DIM]`, `y_dim = Z * H * N_CTX` a local of the kernel, and its key loop starts at the
head's first row. K and V are gathered along dim 0 of the flat matrices: each rank holds a run of their rows, so
the full size along the gathered rows is the local's value, which the launch reads from Z, H and N_CTX."""

import triton
import triton.language as tl

import tilelink


@triton.jit
def _descriptor_of(desc_or_ptr, shape, strides, block_shape):
    if isinstance(desc_or_ptr, tl.tensor_descriptor):
        return desc_or_ptr
    else:
        return tl.make_tensor_descriptor(desc_or_ptr, shape, strides, block_shape)


@triton.jit
def _keys_of_head(acc, l_i, m_i, q, desc_k, desc_v, offset_y, qk_scale, N_CTX, BLOCK_N: tl.constexpr,
                  offs_n: tl.constexpr):
    offsetk_y = offset_y
    offsetv_y = offset_y
    for start_n in tl.range(0, N_CTX, BLOCK_N):
        k = desc_k.load([offsetk_y, 0])
        qk = tl.dot(q, tl.trans(k))
        # the last block of a head runs into the next head's rows: those keys are masked out
        qk = tl.where((start_n + offs_n)[None, :] < N_CTX, qk * qk_scale, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        v = desc_v.load([offsetv_y, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_ij
        offsetk_y += BLOCK_N
        offsetv_y += BLOCK_N
    return acc, l_i, m_i


@tilelink.overlap(tilelink.all_gather(("desc_k", "desc_v"), dim=0))
@triton.jit
def attn_fwd_batched(sm_scale, Z, H, desc_q, desc_k, desc_v, desc_o, N_CTX, HEAD_DIM: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    y_dim = Z * H * N_CTX
    desc_q = _descriptor_of(desc_q, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = _descriptor_of(desc_k, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = _descriptor_of(desc_v, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM])
    desc_o = _descriptor_of(desc_o, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM])
    offset_y = off_z * (N_CTX * H) + off_h * N_CTX
    qo_offset_y = offset_y + start_m * BLOCK_M
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # 1/log(2)
    q = desc_q.load([qo_offset_y, 0])
    acc, l_i, m_i = _keys_of_head(acc, l_i, m_i, q, desc_k, desc_v, offset_y, qk_scale, N_CTX, BLOCK_N, offs_n)
    acc = acc / l_i[:, None]
    desc_o.store([qo_offset_y, 0], acc.to(q.dtype))
