"""Plain single-GPU Triton kernels of the MLP: GEMM (three variants) and the SiLU·mul activation.

These are the kernels the overlapped operators are written from: ``tilelink.ops`` puts
``@tilelink.overlap(tilelink.all_gather("a_ptr", dim=0))`` (AG+GEMM) or
``@tilelink.overlap(tilelink.reduce_scatter("c_ptr", dim=0))`` (GEMM+RS) on top of
:func:`matmul_kernel`, and the rewriter inserts the waits and notifies. So :func:`matmul_kernel` keeps
to the shape the rewriter recognises:

- tile coordinates ``pid_m`` / ``pid_n`` from ``tl.program_id`` (grouped "super-tile" order);
- ``offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)`` and pointer arithmetic
  ``a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak``;
- one K loop ``for k in range(0, tl.cdiv(K, BLOCK_K))`` advancing the pointers by ``BLOCK_K``;
- masked loads and one masked ``tl.store`` of the C tile at ``offs_cm`` / ``offs_cn``.

The other two variants move tiles with tensor descriptors (Hopper's bulk tensor copy engine, TMA):
:func:`matmul_kernel_descriptor` (one program per C tile) and
:func:`matmul_kernel_descriptor_persistent` (one program per SM looping over C tiles). They need
``triton.set_allocator`` (the host wrapper in :mod:`tilelink.ops.gemm` does it), 16-byte aligned base
pointers and row strides, and a unit stride in the last dimension. They are not annotation targets.

Every kernel runs under ``TRITON_INTERPRET=1`` (CPU) and compiles for the GPU; the accumulator is
fp32 for fp16/bf16/fp32 inputs, and C is stored in C's element type.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr = "tf32",
):
    """C = A @ B, one program per (BLOCK_M x BLOCK_N) tile of C.

    Args:
        a_ptr: A, shape (M, K), any strides.
        b_ptr: B, shape (K, N), any strides.
        c_ptr: C, shape (M, N), written; its element type is the output type.
        M, N, K: problem size; none needs to be a multiple of a block size.
        stride_*: element strides of A, B and C.
        BLOCK_M, BLOCK_N, BLOCK_K: tile sizes.
        GROUP_M: how many tile rows share one sweep over the tile columns (L2 reuse of B).
        DOT_PRECISION: ``tl.dot`` input precision for fp32 inputs ("tf32" or "ieee").
    """
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M consecutive tile rows walk the tile columns together, so the B panel
    # they share stays in L2.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_am[:, None] < M) & (offs_k[None, :] < k_remaining), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_remaining) & (offs_bn[None, :] < N), other=0.0)
        accumulator = tl.dot(a, b, accumulator, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = accumulator.to(c_ptr.dtype.element_ty)

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


@triton.jit
def matmul_kernel_descriptor(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr = "tf32",
):
    """C = A @ B with tiles moved by tensor descriptors (TMA on Hopper); one program per C tile.

    Same arguments as :func:`matmul_kernel`, but ``stride_ak``, ``stride_bn`` and ``stride_cn`` must
    be 1 and the other strides multiples of 16 bytes. Out-of-range rows and columns read as zero and
    are not written (the descriptor clips them), so no masks are needed.
    """
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, stride_ak],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, stride_bn],
                                       block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, stride_cn],
                                       block_shape=[BLOCK_M, BLOCK_N])

    offs_am = pid_m * BLOCK_M
    offs_bn = pid_n * BLOCK_N
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([offs_am, k * BLOCK_K])
        b = b_desc.load([k * BLOCK_K, offs_bn])
        accumulator = tl.dot(a, b, accumulator, input_precision=DOT_PRECISION)
    c_desc.store([offs_am, offs_bn], accumulator.to(c_ptr.dtype.element_ty))


@triton.jit
def tile_coordinates(tile_id, num_pid_in_group, num_pid_m, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a tile id in the grouped ("super-tile") order of :func:`matmul_kernel`, for L2
    reuse. Both coordinates split the tile's place in its group, ``tile_id % num_pid_in_group``, so that TileLink
    reads them as a tile mapping's pair and may rotate the row tiles of the annotated GEMMs that import it."""
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def matmul_kernel_descriptor_persistent(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    DOT_PRECISION: tl.constexpr = "tf32",
    FLATTEN: tl.constexpr = True,
    WARP_SPECIALIZE: tl.constexpr = False,
):
    """C = A @ B, persistent: ``NUM_SMS`` programs stride over the C tiles, tiles moved by descriptors.

    Same layout requirements as :func:`matmul_kernel_descriptor`. Launch with
    ``grid = (min(NUM_SMS, number of C tiles),)``. ``FLATTEN`` lets the compiler pipeline the loads of
    the next tile under the epilogue of the current one; ``WARP_SPECIALIZE`` (with ``FLATTEN=False``)
    asks the compiler for producer/consumer warp groups.
    """
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n

    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, stride_ak],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, stride_bn],
                                       block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, stride_cn],
                                       block_shape=[BLOCK_M, BLOCK_N])

    # With a flattened loop the epilogue runs one iteration behind the loads: it recomputes the
    # coordinates of the tile it stores from its own counter.
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = tile_coordinates(tile_id, num_pid_in_group, num_pid_m, GROUP_M)
        offs_am = pid_m * BLOCK_M
        offs_bn = pid_n * BLOCK_N
        accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([offs_am, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, offs_bn])
            accumulator = tl.dot(a, b, accumulator, input_precision=DOT_PRECISION)
        tile_id_c += NUM_SMS
        pid_cm, pid_cn = tile_coordinates(tile_id_c, num_pid_in_group, num_pid_m, GROUP_M)
        c_desc.store([pid_cm * BLOCK_M, pid_cn * BLOCK_N], accumulator.to(c_ptr.dtype.element_ty))


@triton.jit
def silu_mul_kernel(
    x_ptr, out_ptr,
    M, N,
    stride_xm, stride_xn,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out = silu(x[:, :N]) * x[:, N:2N]: the MLP activation after the fused gate+up GEMM.

    Args:
        x_ptr: gate and up projections side by side, shape (M, 2N): columns ``[0, N)`` are the gate,
            ``[N, 2N)`` the up projection.
        out_ptr: shape (M, N), written in its own element type; the arithmetic is fp32.
    """
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    gate_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + N * stride_xn, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
