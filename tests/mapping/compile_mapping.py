"""Compile the generated Triton forms for an sm_90 target without a GPU (ttir -> ptx -> cubin).

Run as a script with TRITON_INTERPRET unset (``test_mapping_triton.py`` starts it in a subprocess).
One kernel calls every ``tl_`` function the way a rewritten kernel does: int32 scalars from the
program id, channel loops over a span, reads of the lookup tables. Prints ``compiled <stages>``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from tilelink.mapping import (
    tl_channel_of_row,
    tl_channel_overlap,
    tl_channel_range,
    tl_channel_rank,
    tl_channel_rows,
    tl_channels_of_rows,
    tl_rank_range,
    tl_remap_tile,
    tl_table_rows,
    tl_table_wait_channel,
    tl_table_wait_range,
    tl_tile_range,
    tl_tile_shift,
)


@triton.jit
def every_mapping_function(out_ptr, wait_ptr, channels_ptr, low_ptr, high_ptr, M, rpr, rpc, C, tile,
                           num_tiles, rank):
    pid = tl.program_id(0)
    t = tl_remap_tile(pid, num_tiles, tl_tile_shift(rank, rpr, tile))
    lo, hi = tl_tile_range(t, tile, M)
    first, count = tl_channels_of_rows(lo, hi, M, rpr, rpc, C)
    acc = first + count + tl_channel_of_row(lo, rpr, rpc, C)
    for ch in range(first, first + count):
        c_lo, c_hi = tl_channel_range(ch, M, rpr, rpc, C)
        acc += tl_channel_overlap(ch, lo, hi, M, rpr, rpc, C) * tl_channel_rows(ch, M, rpr, rpc, C)
        acc += tl_channel_rank(ch, C) + c_lo + c_hi
    r_lo, r_hi = tl_rank_range(rank, M, rpr)
    start, end = tl_table_wait_range(wait_ptr, pid)
    low, high = tl_table_rows(low_ptr, high_ptr, pid)
    for i in range(start, end):
        acc += tl_table_wait_channel(channels_ptr, i)
    tl.store(out_ptr + pid, acc + r_lo + r_hi + low + high)


if __name__ == "__main__":
    pointers = {"out_ptr": "*i64", "wait_ptr": "*i32", "channels_ptr": "*i32", "low_ptr": "*i32",
                "high_ptr": "*i32"}
    signature = {**pointers, **dict.fromkeys(["M", "rpr", "rpc", "C", "tile", "num_tiles", "rank"], "i32")}
    source = triton.compiler.ASTSource(fn=every_mapping_function, signature=signature, constexprs={})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    print("compiled", " ".join(kernel.asm))
