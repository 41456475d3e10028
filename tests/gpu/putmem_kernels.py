"""Triton kernels calling NVSHMEM device functions, shared by the device tests and the putmem probe."""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from tilelink.runtime import nvshmem_device as nvd


@triton.jit
def pe_kernel(out_ptr):
    tl.store(out_ptr, nvd.my_pe())
    tl.store(out_ptr + 1, nvd.n_pes())


@triton.jit
def put_signal_kernel(dst_ptr, src_ptr, nbytes, sig_ptr, sig_value, pe, sig_op):
    # dst_ptr and sig_ptr are *symmetric* addresses: this PE's copy; NVSHMEM finds pe's copy
    nvd.putmem_signal_block(dst_ptr, src_ptr, nbytes, sig_ptr, sig_value, sig_op, pe)


@triton.jit
def signal_wait_kernel(sig_ptr, value, out_ptr):
    seen = nvd.signal_wait_until(sig_ptr, nvd.CMP_GE, value)
    tl.store(out_ptr, seen.to(tl.int64))


@triton.jit
def fence_quiet_kernel(out_ptr):
    nvd.fence()
    nvd.quiet()
    tl.store(out_ptr, 1)


SLOT = 1024  # bytes a rank puts


def ring_put_signal(backend, rounds=((9, 3), (10, 5)), dest_mode="symmetric", hook=True, wait_s=20.0):
    """Every rank puts SLOT bytes + a signal into the next rank (pe=(r+1)%n, so rank 0 calls with
    pe == 1, a value Triton specialises into its own module). Returns what each rank saw.

    dest_mode "peer_pointer" passes the peer's mapped address (what peer_table holds) as dest
    instead of the symmetric address; hook=False compiles with NVSHMEM module init initialised only
    on a pe=2 variant (a module of another specialisation then never gets its module init)."""
    from triton import knobs

    torch.cuda.set_device(backend.device)
    r, n = backend.rank, backend.world_size
    nxt, prv = (r + 1) % n, (r - 1) % n
    data, data_views = backend.allocate(SLOT * n)
    sig, sig_views = backend.allocate(8 * n)
    data.zero_()
    sig.view(torch.int64).zero_()
    src = torch.full((SLOT,), r + 1, dtype=torch.uint8, device=backend.device)
    pe_out = torch.zeros(2, dtype=torch.int32, device=backend.device)
    seen_out = torch.zeros(1, dtype=torch.int64, device=backend.device)
    ones = torch.zeros(1, dtype=torch.int32, device=backend.device)
    libs = nvd.extern_libs()
    dst = data[SLOT * r:]
    if dest_mode == "peer_pointer":
        dst = data_views[nxt][SLOT * r:]
    sig_word = sig.view(torch.int64)[r:]

    saved = knobs.runtime.jit_post_compile_hook
    if not hook:
        knobs.runtime.jit_post_compile_hook = None

    def warm():
        pe_kernel.warmup(pe_out, grid=(1,), extern_libs=libs)
        for op, value in rounds:
            put_signal_kernel.warmup(dst, src, SLOT, sig_word, value, nxt, op, grid=(1,),
                                     extern_libs=libs)
        signal_wait_kernel.warmup(sig.view(torch.int64)[prv:], 1, seen_out, grid=(1,), extern_libs=libs)
        fence_quiet_kernel.warmup(ones, grid=(1,), extern_libs=libs)

    if r == 0:
        warm()  # one rank fills the Triton cache, the others load from it
    dist.barrier()
    if r != 0:
        warm()
    if not hook:
        # initialise only the modules of a pe=2 variant, as a hand-written module_init would
        knobs.runtime.jit_post_compile_hook = saved
        for op, value in rounds:
            compiled = put_signal_kernel.warmup(dst, src, SLOT, sig_word, value, 2, op, grid=(1,),
                                                extern_libs=libs)
            nvd.init_module(compiled)
        for compiled in (pe_kernel.warmup(pe_out, grid=(1,), extern_libs=libs),
                         signal_wait_kernel.warmup(sig.view(torch.int64)[prv:], 1, seen_out, grid=(1,),
                                                   extern_libs=libs),
                         fence_quiet_kernel.warmup(ones, grid=(1,), extern_libs=libs)):
            nvd.init_module(compiled)
        knobs.runtime.jit_post_compile_hook = None
    backend.barrier()

    out = {"rank": r, "modules": len(nvd.initialized_modules())}
    pe_kernel[(1,)](pe_out, extern_libs=libs)
    torch.cuda.synchronize()
    out["pe"] = pe_out.tolist()
    stream = torch.cuda.current_stream()
    expected = 0
    for op, value in rounds:
        put_signal_kernel[(1,)](dst, src, SLOT, sig_word, value, nxt, op, extern_libs=libs)
        expected = value if op == 9 else expected + value
        backend.wait_value(sig.view(torch.int64)[prv:prv + 1], expected, stream, timeout_s=wait_s)
    torch.cuda.synchronize()
    out["signal_from_prev"] = int(sig.view(torch.int64)[prv].item())
    block = data[SLOT * prv:SLOT * (prv + 1)]
    out["data_ok"] = bool((block == prv + 1).all().item())
    signal_wait_kernel[(1,)](sig.view(torch.int64)[prv:], expected, seen_out, extern_libs=libs)
    fence_quiet_kernel[(1,)](ones, extern_libs=libs)
    torch.cuda.synchronize()
    out["device_wait_seen"] = int(seen_out.item())
    out["fence_quiet"] = int(ones.item())
    out["modules_after"] = len(nvd.initialized_modules())
    knobs.runtime.jit_post_compile_hook = saved
    backend.barrier()
    backend.release(sig)
    backend.release(data)
    return out
