"""Flash-attention forward, written as one plain Triton kernel plus one ``@tilelink.overlap`` line.

Layout as ``torch.nn.functional.scaled_dot_product_attention``: q, o are (batch, heads, q_rows, D),
k, v are (batch, kv_heads, kv_rows, D) with ``heads % kv_heads == 0`` (grouped-query attention:
query head ``h`` reads kv head ``h // (heads // kv_heads)``, as SDPA's ``enable_gqa``). The last dim
must be contiguous; every other stride is a parameter.

K and V are read through tensor descriptors the kernel makes (``tl.make_tensor_descriptor``: TMA
loads on Hopper): one pair over every key, made once, where ``EVEN_N`` (the chunks are whole numbers of
blocks), else one pair per chunk of keys. So K and V need a 16-byte aligned base and strides other
than the last that are multiples of 16 bytes (the host wrappers copy inputs that are not), and a
launch on a GPU needs ``triton.set_allocator`` for the descriptors' scratch memory (the wrappers in
:mod:`tilelink.ops.attention` install it).

The annotation (paper §5, Figure 6) gathers K and V along the sequence (dim 2) on the copy engine:
each rank passes its (B, Hkv, S_r, D) shards of K and V, every other argument is the full problem's
(``N_CTX`` is the full sequence length, the K/V strides those of the full contiguous (B, Hkv, S, D)
tensor). The KV loop visits the keys one rank's shard (``KV_CHUNK`` rows) at a time, starting with the
chunk at ``KV_FIRST`` (this rank's own), so the keys that need no communication are computed first;
the rewriter waits once per chunk (``tile=("kv_lo", "KV_CHUNK")``), only for the rank that holds it, before
the chunk's inner loop, which stays free of waits and is software-pipelined (``tlxform show
ops/attention_kernels.py::sp_attention_fwd_kernel``). Under ``EVEN_N`` a block of the loop starts a whole
number of blocks past its chunk's first row, so it ends inside the chunk: the rewriter proves it with
``KV_CHUNK % BLOCK_N == 0``, which each call that passes ``EVEN_N`` is checked for.

Query rows are this rank's: ``Q_OFFSET`` is the global position of the first one, so that causal
masking compares global positions (query at position p sees keys 0..p).

``attention_fwd_kernel`` is the same kernel without TileLink's code: pass ``KV_FIRST=0`` and
``KV_CHUNK=N_CTX`` (one chunk; any order gives the same result) and ``Q_OFFSET`` as usual.
"""

import triton
import triton.language as tl

import tilelink

LOG2E = 1.4426950408889634


@tilelink.overlap(tilelink.all_gather(("k_ptr", "v_ptr"), dim=2, tile=("kv_lo", "KV_CHUNK"), size="N_CTX"),
                  via="copy_engine")
@triton.jit
def sp_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale, Q_CTX, N_CTX, Q_OFFSET, KV_FIRST, KV_CHUNK, HEADS,
                            GROUP, stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn,
                            stride_vz, stride_vh, stride_vn, stride_oz, stride_oh, stride_om,
                            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            CAUSAL: tl.constexpr, EVEN_N: tl.constexpr):
    """O = softmax(Q K^T * sm_scale) V for BLOCK_M query rows of one (batch, head); grid
    (cdiv(Q_CTX, BLOCK_M), batch * HEADS). The keys are visited in chunks of ``KV_CHUNK`` rows (a
    rank's shard), starting with the chunk holding ``KV_FIRST``; ``EVEN_N``: ``N_CTX`` and ``KV_CHUNK``
    are multiples of ``BLOCK_N`` (no block runs past the end of its chunk: no key mask, and one pair of
    descriptors over every key). Otherwise a chunk's own descriptors read the rows past its end as zeros,
    which the mask must still drop, since a zero key scores 0, not -inf."""
    pid_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // HEADS).to(tl.int64)
    off_h = (off_hz % HEADS).to(tl.int64)
    off_hkv = off_h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = q_ptr + off_z * stride_qz + off_h * stride_qh
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < Q_CTX, other=0.0)
    k_base = k_ptr + off_z * stride_kz + off_hkv * stride_kh
    v_base = v_ptr + off_z * stride_vz + off_hkv * stride_vh
    qk_scale = sm_scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
    # a finite floor instead of -inf: a row whose keys are all masked so far stays NaN-free
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    q_pos = Q_OFFSET + offs_m
    kv_end = N_CTX
    if CAUSAL:  # keys after the block's last query row are masked for every row: skip them
        kv_end = tl.minimum(N_CTX, Q_OFFSET + (pid_m + 1) * BLOCK_M)
    if EVEN_N:
        # every chunk is a whole number of blocks: one pair of descriptors over all of K and V, made once. A block
        # starts a whole number of blocks past its chunk's first row, so it ends inside the chunk, whose rows its wait
        # covers (past kv_hi too); past N_CTX it reads zeros
        desc_k = tl.make_tensor_descriptor(k_base, shape=[N_CTX, HEAD_DIM], strides=[stride_kn, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        desc_v = tl.make_tensor_descriptor(v_base, shape=[N_CTX, HEAD_DIM], strides=[stride_vn, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
    num_chunks = tl.cdiv(kv_end, KV_CHUNK)
    first_chunk = (KV_FIRST // KV_CHUNK) % num_chunks
    for c in range(0, num_chunks):
        # this rank's own chunk first: it is local; every other chunk is one rank's shard. The inner
        # loop over its blocks stays free of waits, so the compiler can pipeline it.
        kv_lo = ((c + first_chunk) % num_chunks) * KV_CHUNK
        kv_hi = tl.minimum(kv_lo + KV_CHUNK, kv_end)
        if not EVEN_N:
            # the chunk's keys and values through tensor descriptors (TMA on Hopper) that end at kv_hi: the rows
            # of a block past it read as zeros, never the next chunk's rows, which may not have arrived yet (a
            # NaN there times a zero weight would still be NaN)
            chunk_k = tl.make_tensor_descriptor(k_base + kv_lo * stride_kn, shape=[kv_hi - kv_lo, HEAD_DIM],
                                                strides=[stride_kn, 1], block_shape=[BLOCK_N, HEAD_DIM])
            chunk_v = tl.make_tensor_descriptor(v_base + kv_lo * stride_vn, shape=[kv_hi - kv_lo, HEAD_DIM],
                                                strides=[stride_vn, 1], block_shape=[BLOCK_N, HEAD_DIM])
        for start_n in range(kv_lo, kv_hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            if EVEN_N:
                k = desc_k.load([start_n, 0])
                v = desc_v.load([start_n, 0])
            else:
                k = chunk_k.load([start_n - kv_lo, 0])
                v = chunk_v.load([start_n - kv_lo, 0])
            qk = tl.dot(q, tl.trans(k))
            if CAUSAL:
                qk = tl.where((q_pos[:, None] >= offs_n[None, :]) & (offs_n[None, :] < kv_hi), qk, float("-inf"))
            elif not EVEN_N:
                qk = tl.where(offs_n[None, :] < kv_hi, qk, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_ij
    acc = acc / l_i[:, None]
    o_base = o_ptr + off_z * stride_oz + off_h * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Q_CTX)


#: the flash-attention kernel as written, without TileLink's code (single GPU, full K and V)
attention_fwd_kernel = sp_attention_fwd_kernel.kernel
