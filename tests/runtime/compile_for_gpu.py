"""Compile the compiled-path (GPU) primitives for an H100/H200 target, without a GPU.

Run as ``python -m tests.runtime.compile_for_gpu`` from the checkout with ``TRITON_INTERPRET`` unset
(``tilelink.language`` picks its implementation at import): compiles the test kernels of ``runtime_worlds``
and the hand-written AG+GEMM example to cubin for ``sm_90`` with Triton's bundled ptxas, and prints one
line per kernel with the PTX features the primitives must produce.
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import tilelink.language as tll
from examples import handwritten_ag_gemm as example
from tests.runtime import runtime_worlds as worlds

P64, I32, I64, F32 = "*i64", "i32", "i64", "*fp32"


def signature(kernel, types: dict[str, str], constexprs: dict[str, object]) -> dict[str, str]:
    return {name: ("constexpr" if name in constexprs else types.get(name, I32)) for name in kernel.arg_names}


CASES = [
    (worlds.produce_kernel, {"data_ptr": P64, "data_table": P64, "barrier_ptr": P64, "barrier_table": P64},
     {"MODE": 2, "PUSH": 2, "BLOCK": 8}),
    (worlds.produce_kernel, {"data_ptr": P64, "data_table": P64, "barrier_ptr": P64, "barrier_table": P64},
     {"MODE": 1, "PUSH": 1, "BLOCK": 8}),
    (worlds.consume_kernel, {"data_ptr": P64, "out_ptr": P64, "barrier_ptr": P64, "diag_ptr": P64,
                             "budget": I64}, {"BLOCK": 8}),
    (worlds.pull_kernel, {"data_ptr": P64, "data_table": P64, "gathered_ptr": P64, "barrier_ptr": P64,
                          "barrier_table": P64}, {"BROADCAST": True, "BLOCK": 8}),
    (worlds.ring_kernel, {"data_ptr": P64, "data_table": P64, "barrier_ptr": P64, "barrier_table": P64,
                          "diag_ptr": P64, "budget": I64, "out_ptr": P64}, {}),
    (worlds.flag_kernel, {"flag_ptr": P64, "diag_ptr": P64, "budget": I64, "out_ptr": P64}, {}),
    (worlds.wait_rows_kernel, {"barrier_ptr": P64, "diag_ptr": P64, "budget": I64}, {}),
    (example.ag_producer_kernel, {"shard_ptr": F32, "shard_table": P64, "gathered_ptr": F32,
                                  "barrier_ptr": P64, "barrier_table": P64}, {"BLOCK_M": 16, "BLOCK_K": 16}),
    (example.gemm_consumer_kernel, {"a_ptr": F32, "b_ptr": F32, "c_ptr": F32, "barrier_ptr": P64,
                                    "diag_ptr": P64, "budget": I64}, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}),
]


def main() -> int:
    assert not tll.INTERPRETED, "run with TRITON_INTERPRET unset"
    target = GPUTarget("cuda", 90, 32)
    for kernel, types, constexprs in CASES:
        source = ASTSource(kernel, signature(kernel, types, constexprs), constexprs)
        compiled = triton.compile(source, target=target)
        ptx = compiled.asm["ptx"]
        features = {"globaltimer": "%globaltimer" in ptx, "acquire": ".acquire" in ptx,
                    "release": ".release" in ptx, "cubin": len(compiled.asm["cubin"]) > 0,
                    # a notify is one releasing reduction by thread 0, not an atomic whose result is awaited
                    "red_by_thread0": "red.release.sys.global.add.u64" in ptx and "setp.eq.u32 %tlk_first" in ptx,
                    "atom_release": "atom.global.sys.release" in ptx or "atom.release.sys" in ptx,
                    # its barrier is the named one the compiler does not see (a flattened loop stays pipelined)
                    "named_barrier": "bar.sync 15;" in ptx}
        print(kernel.__name__, " ".join(f"{k}={int(v)}" for k, v in features.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
