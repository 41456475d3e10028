"""Two annotated kernels in one file: an AG GEMM feeding a GEMM whose output is reduce-scattered
(the two halves of a tensor-parallel MLP), sharing a @triton.jit helper."""

import triton
import triton.language as tl

import tilelink


@triton.jit
def tile_of(pid, N, BLOCK_N: tl.constexpr):
    num_pid_n = tl.cdiv(N, BLOCK_N)
    return pid // num_pid_n, pid % num_pid_n


@tilelink.overlap(tilelink.all_gather("x_ptr", dim=0), channels_per_rank=2)
@triton.jit
def up_kernel(x_ptr, w_ptr, h_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tile_of(tl.program_id(0), N, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * K + kk[None, :], mask=(offs_m[:, None] < M) & (kk[None, :] < K))
        w = tl.load(w_ptr + kk[:, None] * N + offs_n[None, :], mask=(kk[:, None] < K) & (offs_n[None, :] < N))
        acc = tl.dot(x, w, acc)
    tl.store(h_ptr + offs_m[:, None] * N + offs_n[None, :], tl.maximum(acc, 0.0),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@tilelink.overlap(tilelink.reduce_scatter("y_ptr", dim=0), order="mesh")
@triton.jit
def down_kernel(h_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tile_of(tl.program_id(0), N, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + offs_k
        h = tl.load(h_ptr + offs_m[:, None] * K + kk[None, :], mask=(offs_m[:, None] < M) & (kk[None, :] < K))
        w = tl.load(w_ptr + kk[:, None] * N + offs_n[None, :], mask=(kk[:, None] < K) & (offs_n[None, :] < N))
        acc = tl.dot(h, w, acc)
    y = acc
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], y, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
