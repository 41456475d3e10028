"""The tensor-parallel GEMMs of :mod:`tilelink.ops.tp` on FP8 (e4m3) operands with scales, annotated like
:mod:`tilelink.ops.tp_kernels`.

``C = (A @ B) * a_scale[row] * b_scale[col]``: A and B are ``float8_e4m3fn``, the dot accumulates into fp32
registers (on Hopper the FP8 MMAs add in their own precision within them, Triton's default there, as
``torch._scaled_mm(..., use_fast_accum=True)``), and the scales are applied to the accumulator in the epilogue,
before C is stored in its own dtype (bf16 by default). A's scales are one per row of A (a per-tensor scale is
handed in as that value for each of the rank's rows), B's one per column of C or one for the whole of B
(``B_SCALE_COLS`` False).

- AG+GEMM: A's row scales travel with A's rows, gathered by the same spec
  (``all_gather(("a_ptr", "a_scale_ptr"))``): a row's scale is read after the wait for that row's channel.
- GEMM+RS: each rank scales its own partial sums by its own scales before the store. That is linear in the
  partial sums (a product with values this rank loaded, per row and per column), so the reduce-scatter rule's
  epilogue check accepts it as written: the sum over ranks of ``s_a,r * s_b,r * (A_r @ B_r)`` is the full
  product of the dequantised operands.

The persistent kernels read B through a descriptor over its (N, K) storage, ``tl.dot(a, b.T)``: Hopper's FP8
MMA takes both operands K-major, as ``torch._scaled_mm`` does (its second operand column-major). Their tiles
are 128 x 256 x 128 (a 128-byte K row, the widest TMA swizzle); the AG kernel stores C in two 128-column halves
(epilogue subtiling), so that its staging buffer leaves room for four pipeline stages of A and B.
"""

import triton
import triton.language as tl

import tilelink
from tilelink.ops.gemm_kernels import tile_coordinates


@tilelink.overlap(tilelink.all_gather(("a_ptr", "a_scale_ptr"), dim=0))
@triton.jit
def ag_gemm_fp8_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                       stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, B_SCALE_COLS: tl.constexpr):
    """C (M, N) = (A (M, K) @ B (K, N)) * a_scale[:, None] * b_scale; A and its row scales are gathered from
    the ranks' row shards."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coordinates(tl.program_id(0), GROUP_M * num_pid_n, num_pid_m, GROUP_M)
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_am[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    a_scale = tl.load(a_scale_ptr + offs_am, mask=offs_am < M, other=0.0)
    if B_SCALE_COLS:
        b_scale = tl.load(b_scale_ptr + offs_bn, mask=offs_bn < N, other=0.0)[None, :]
    else:
        b_scale = tl.load(b_scale_ptr)
    acc = acc * a_scale[:, None] * b_scale
    c_ptrs = c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_am[:, None] < M) & (offs_bn[None, :] < N))


# One channel a rank (the copy engine's default): the kernel computes this rank's own rows first, and a peer's
# shard lands in a fraction of that time (under a fifth on the MLP shapes over NVLink), while each further
# channel costs the host a copy and a flag per call.
@tilelink.overlap(tilelink.all_gather(("a_ptr", "a_scale_ptr"), dim=0), via="copy_engine")
@triton.jit
def ag_gemm_fp8_persistent_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K, stride_am, stride_ak,
                                  stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                                  B_SCALE_COLS: tl.constexpr, NUM_SMS: tl.constexpr, TAIL_SPLIT: tl.constexpr = 1):
    """Persistent FP8 AG+GEMM: NUM_SMS programs stride over C tiles; A, B (by its (N, K) storage: ``stride_bk``
    is 1) and C moved by tensor descriptors. The last, partial wave runs in ``TAIL_SPLIT`` column pieces, as in
    ``ag_gemm_persistent_kernel``."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    tail = num_tiles % NUM_SMS if TAIL_SPLIT > 1 else 0  # one binding: each call's rotation check writes it out
    HALF: tl.constexpr = BLOCK_N // 2
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, stride_ak],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, stride_bk],
                                       block_shape=[BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, stride_cn],
                                       block_shape=[BLOCK_M, HALF])
    # the row scales by descriptor too, read after the K loop: the one wait before the loop, for the tile's
    # channels, then guards the rows and their scales
    s_desc = tl.make_tensor_descriptor(a_scale_ptr, shape=[M], strides=[1], block_shape=[BLOCK_M])
    for tile_id in tl.range(start_pid, num_tiles - tail, NUM_SMS):
        pid_m, pid_n = tile_coordinates(tile_id, GROUP_M * num_pid_n, num_pid_m, GROUP_M)
        offs_am = pid_m * BLOCK_M
        offs_bn = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([offs_am, ki * BLOCK_K])
            b = b_desc.load([offs_bn, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        a_scale = s_desc.load([offs_am])
        if B_SCALE_COLS:
            cols = offs_bn + tl.arange(0, BLOCK_N)
            b_scale = tl.load(b_scale_ptr + cols, mask=cols < N, other=0.0)[None, :]
        else:
            b_scale = tl.load(b_scale_ptr)
        acc = acc * a_scale[:, None] * b_scale
        # two 128-column halves: a quarter less shared memory than one staged 128 x 256 tile (a fourth stage)
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([offs_am, offs_bn], left.to(c_ptr.dtype.element_ty))
        c_desc.store([offs_am, offs_bn + HALF], right.to(c_ptr.dtype.element_ty))
    if TAIL_SPLIT > 1:  # the last wave's tiles, in TAIL_SPLIT column pieces of at most 128: each stored whole
        PIECE: tl.constexpr = BLOCK_N // TAIL_SPLIT
        b_piece = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, stride_bk],
                                            block_shape=[PIECE, BLOCK_K])
        c_piece = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, stride_cn],
                                            block_shape=[BLOCK_M, PIECE])
        for piece in tl.range(start_pid, tail * TAIL_SPLIT, NUM_SMS):
            pid_m, pid_n = tile_coordinates(num_tiles - tail + piece // TAIL_SPLIT, GROUP_M * num_pid_n, num_pid_m,
                                            GROUP_M)
            tail_am = pid_m * BLOCK_M
            tail_bn = pid_n * BLOCK_N + (piece % TAIL_SPLIT) * PIECE
            acc = tl.zeros((BLOCK_M, PIECE), dtype=tl.float32)
            for ki in range(0, tl.cdiv(K, BLOCK_K)):
                a = a_desc.load([tail_am, ki * BLOCK_K])
                b = b_piece.load([tail_bn, ki * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
            a_scale = s_desc.load([tail_am])
            if B_SCALE_COLS:
                cols = tail_bn + tl.arange(0, PIECE)
                b_scale = tl.load(b_scale_ptr + cols, mask=cols < N, other=0.0)[None, :]
            else:
                b_scale = tl.load(b_scale_ptr)
            acc = acc * a_scale[:, None] * b_scale
            c_piece.store([tail_am, tail_bn], acc.to(c_ptr.dtype.element_ty))


@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
@triton.jit
def gemm_rs_fp8_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                       stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, A_SCALE_ROWS: tl.constexpr,
                       B_SCALE_COLS: tl.constexpr):
    """C (M, N) = sum over ranks of (A_r (M, K_r) @ B_r (K_r, N)) * a_scale_r * b_scale_r; each rank keeps its
    rows of C. The scales are this rank's: per row of A or one (``A_SCALE_ROWS``), per column of C or one."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coordinates(tl.program_id(0), GROUP_M * num_pid_n, num_pid_m, GROUP_M)
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_am[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_bn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if A_SCALE_ROWS:
        a_scale = tl.load(a_scale_ptr + offs_am, mask=offs_am < M, other=0.0)[:, None]
    else:
        a_scale = tl.load(a_scale_ptr)
    if B_SCALE_COLS:
        b_scale = tl.load(b_scale_ptr + offs_bn, mask=offs_bn < N, other=0.0)[None, :]
    else:
        b_scale = tl.load(b_scale_ptr)
    acc = acc * a_scale * b_scale
    c_mask = (offs_am[:, None] < M) & (offs_bn[None, :] < N)
    tl.store(c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=c_mask)


@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0), via="copy_engine")
@triton.jit
def gemm_rs_fp8_persistent_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K, stride_am, stride_ak,
                                  stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                                  A_SCALE_ROWS: tl.constexpr, B_SCALE_COLS: tl.constexpr, NUM_SMS: tl.constexpr):
    """Persistent FP8 GEMM+RS: A, B (by its (N, K) storage: ``stride_bk`` is 1) and C moved by tensor
    descriptors, the tile loop flattened as in ``gemm_rs_persistent_kernel``."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, stride_ak],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, stride_bk],
                                       block_shape=[BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, stride_cn],
                                       block_shape=[BLOCK_M, BLOCK_N])
    for tile_id in tl.range(start_pid, num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coordinates(tile_id, GROUP_M * num_pid_n, num_pid_m, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        if A_SCALE_ROWS:
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            a_scale = tl.load(a_scale_ptr + rows, mask=rows < M, other=0.0)[:, None]
        else:
            a_scale = tl.load(a_scale_ptr)
        if B_SCALE_COLS:
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            b_scale = tl.load(b_scale_ptr + cols, mask=cols < N, other=0.0)[None, :]
        else:
            b_scale = tl.load(b_scale_ptr)
        acc = acc * a_scale * b_scale
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
