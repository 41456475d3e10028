"""The tensor-parallel GEMMs of TileLink's operators, written as plain annotated Triton kernels.

The library eats its own cooking: each kernel below is an ordinary single-GPU GEMM plus one
``@tilelink.overlap`` line; the rewriter inserts the waits / notifies (see ``tlxform build
ops/tp_kernels.py``). Two styles of each:

- pointer arithmetic (any shape, any layout; the one the emulated world runs);
- persistent with tensor descriptors (TMA loads on Hopper; row strides must be 16-byte multiples).
  Both communicate on the copy engine as in the paper (§7.2): the all-gather, and the reduce-scatter's
  scatter (the hybrid: the copy engine moves each finished channel to its owner, a small SM kernel
  sums what arrived), so the GEMM keeps every SM. The GEMM+RS variant stores C by descriptor too:
  the rewrite waits for the asynchronous bulk store to reach memory before each tile's notify.
"""

import triton
import triton.language as tl

import tilelink
from tilelink.ops.gemm_kernels import tile_coordinates


@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))
@triton.jit
def ag_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C (M, N) = A (M, K) @ B (K, N); A is gathered from the ranks' row shards."""
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
    c_ptrs = c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_am[:, None] < M) & (offs_bn[None, :] < N))


# One channel a rank (the copy engine's default): the kernel computes this rank's own rows first, and a peer's
# shard lands in a fraction of that time (under a fifth on the MLP shapes over NVLink), while each further
# channel costs the host a copy and a flag per call.
@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0), via="copy_engine")
@triton.jit
def ag_gemm_persistent_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                              stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, TAIL_SPLIT: tl.constexpr = 1):
    """Persistent AG+GEMM: NUM_SMS programs stride over C tiles; A, B, C moved by tensor descriptors.

    With ``TAIL_SPLIT`` > 1 the tiles of the last, partial wave (``tiles % NUM_SMS`` of them) are cut
    into ``TAIL_SPLIT`` column pieces that run on every program at once (:func:`tail_split` picks it):
    the wave that would keep a few SMs busy for a whole tile takes a fraction of one."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    tail = num_tiles % NUM_SMS if TAIL_SPLIT > 1 else 0  # one binding: each call's rotation check writes it out
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, stride_ak],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, stride_bn],
                                       block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, stride_cn],
                                       block_shape=[BLOCK_M, BLOCK_N])
    for tile_id in tl.range(start_pid, num_tiles - tail, NUM_SMS):
        pid_m, pid_n = tile_coordinates(tile_id, GROUP_M * num_pid_n, num_pid_m, GROUP_M)
        offs_am = pid_m * BLOCK_M
        offs_bn = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([offs_am, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, offs_bn])
            acc = tl.dot(a, b, acc)
        c_desc.store([offs_am, offs_bn], acc.to(c_ptr.dtype.element_ty))
    # the last wave's tiles, in TAIL_SPLIT column pieces
    PIECE: tl.constexpr = BLOCK_N // TAIL_SPLIT
    b_piece = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, stride_bn],
                                        block_shape=[BLOCK_K, PIECE])
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
            b = b_piece.load([ki * BLOCK_K, tail_bn])
            acc = tl.dot(a, b, acc)
        c_piece.store([tail_am, tail_bn], acc.to(c_ptr.dtype.element_ty))


@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))
@triton.jit
def gemm_rs_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C (M, N) = sum over ranks of A_r (M, K_r) @ B_r (K_r, N); each rank keeps its rows of C."""
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
    c_mask = (offs_am[:, None] < M) & (offs_bn[None, :] < N)
    tl.store(c_ptr + offs_am[:, None] * stride_cm + offs_bn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=c_mask)


@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0), via="copy_engine")
@triton.jit
def gemm_rs_persistent_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                              stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    """Persistent GEMM+RS: A, B and C moved by tensor descriptors, the tile loop flattened (one software
    pipeline over every tile of the program, so a tile's epilogue overlaps the next tile's loads)."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, stride_ak],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, stride_bn],
                                       block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, stride_cn],
                                       block_shape=[BLOCK_M, BLOCK_N])
    for tile_id in tl.range(start_pid, num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coordinates(tile_id, GROUP_M * num_pid_n, num_pid_m, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
