"""A persistent GEMM with tensor descriptors whose output is all-reduced, the algorithm chosen by size; its C
stores are asynchronous (bulk) stores in a tile loop."""

import triton
import triton.language as tl

import tilelink


@tilelink.overlap(tilelink.all_reduce("c_ptr"))
@triton.jit
def persistent_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tiles_n, NUM_PROGRAMS):
        pid_m = tile // tiles_n
        pid_n = tile % tiles_n
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            acc = tl.dot(a_desc.load([pid_m * BLOCK_M, k * BLOCK_K]), b_desc.load([k * BLOCK_K, pid_n * BLOCK_N]),
                         acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
