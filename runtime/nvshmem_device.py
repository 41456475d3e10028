"""NVSHMEM device functions for Triton kernels, and the module init every such kernel needs.

Two halves:

* :data:`DEVICE_FUNCTIONS`, the table of the ``libnvshmem_device.bc`` functions TileLink calls, each
  with its C signature, and one ``tl.extern``-style builtin per entry (``my_pe()``,
  ``putmem_signal_block(...)``, ...). Pointers travel as int64 addresses (``ptr.to(tl.int64)`` is
  done for you), ``size_t``/``uint64_t`` as 64-bit, ``int`` as int32: every argument is cast to the
  exact C width before the call, so a caller's int64 ``pe`` can never reach a 32-bit parameter.
  Functions returning ``void`` are declared as returning int32 (Triton has no void externs); the
  result means nothing.
* the module init: a kernel linked with the bitcode holds its own copy of NVSHMEM's device state
  (``nvshmemi_device_state_d``: PE, heap base, peer heap bases). Until ``nvshmem.core.module_init``
  fills it, ``nvshmem_my_pe()`` reads 0 and every put dereferences a NULL peer-base table. Triton
  compiles one module per *specialisation* (an int argument equal to 1, 16-divisibility of pointers
  and ints ...), so initialising the module of one launch is not enough: the hook installed by
  :func:`install_module_init_hook` initialises every module that links the bitcode, when it is
  compiled (so also when :func:`tilelink.runtime.preload.preload` warms it up, before anything spins).

Launch a kernel that calls these with ``kernel[grid](..., extern_libs=extern_libs())``.

Measured on an H200 with 4 PEs on the one GPU (tests/gpu/probe_putmem_signal.py): with module init
done on one specialisation only, the ranks whose launch Triton specialised differently (``pe == 1``
becomes a constant, ``pe == 0`` is 16-divisible) hit an illegal address in
``nvshmemx_putmem_signal_block`` and the others completed. Also: ``dest``
and ``sig_addr`` must be *symmetric* addresses (this PE's copy); passing a peer's mapped address (a
``peer_table`` entry) silently wrote the data to the wrong place. ``sig_op`` 0 is not SET here (SET is
9, ADD 10); it went through NVSHMEM's transport path instead of the NVLink store.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from dataclasses import dataclass

import triton.language as tl
from triton.language import core

from tilelink.errors import TileLinkError

LIBRARY_NAME = "libnvshmem_device"

# nvshmemx_signal_op_t and nvshmemx_cmp_type_t as the headers define them
# (include/device_host_transport/nvshmem_common_transport.h: NVSHMEM_SIGNAL_SET == 9, ADD == 10).
# Any other sig_op is handed to the remote-transport path, which a one-node job does not have.
SIGNAL_SET: tl.constexpr = tl.constexpr(9)
SIGNAL_ADD: tl.constexpr = tl.constexpr(10)
CMP_EQ: tl.constexpr = tl.constexpr(0)
CMP_NE: tl.constexpr = tl.constexpr(1)
CMP_GT: tl.constexpr = tl.constexpr(2)
CMP_LE: tl.constexpr = tl.constexpr(3)
CMP_LT: tl.constexpr = tl.constexpr(4)
CMP_GE: tl.constexpr = tl.constexpr(5)


@dataclass(frozen=True)
class DeviceFunction:
    """One function of ``libnvshmem_device.bc``: its C signature and the Triton types it is called with."""

    name: str
    c_signature: str
    args: tuple[str, ...]  # Triton dtype names, one per C parameter; pointers are "int64" addresses
    ret: str  # Triton dtype name of the result ("int32" stands in for void)


DEVICE_FUNCTIONS: dict[str, DeviceFunction] = {
    f.name: f
    for f in (
        DeviceFunction("nvshmem_my_pe", "int nvshmem_my_pe(void)", (), "int32"),
        DeviceFunction("nvshmem_n_pes", "int nvshmem_n_pes(void)", (), "int32"),
        DeviceFunction(
            "nvshmemx_putmem_signal_block",
            "void nvshmemx_putmem_signal_block(void *dest, const void *source, size_t nelems, "
            "uint64_t *sig_addr, uint64_t signal, int sig_op, int pe)",
            ("int64", "int64", "uint64", "int64", "uint64", "int32", "int32"), "int32"),
        DeviceFunction(
            "nvshmemx_putmem_block",
            "void nvshmemx_putmem_block(void *dest, const void *source, size_t nelems, int pe)",
            ("int64", "int64", "uint64", "int32"), "int32"),
        DeviceFunction(
            "nvshmemx_getmem_block",
            "void nvshmemx_getmem_block(void *dest, const void *source, size_t nelems, int pe)",
            ("int64", "int64", "uint64", "int32"), "int32"),
        DeviceFunction(
            "nvshmemx_signal_op",
            "void nvshmemx_signal_op(uint64_t *sig_addr, uint64_t signal, int sig_op, int pe)",
            ("int64", "uint64", "int32", "int32"), "int32"),
        DeviceFunction(
            "nvshmem_signal_wait_until",
            "uint64_t nvshmem_signal_wait_until(uint64_t *sig_addr, int cmp, uint64_t cmp_value)",
            ("int64", "int32", "uint64"), "uint64"),
        DeviceFunction("nvshmem_quiet", "void nvshmem_quiet(void)", (), "int32"),
        DeviceFunction("nvshmem_fence", "void nvshmem_fence(void)", (), "int32"),
        DeviceFunction("nvshmem_ptr", "void *nvshmem_ptr(const void *dest, int pe)",
                       ("int64", "int32"), "int64"),
    )
}


def _exact(value, dtype_name: str, function: str, position: int, semantic):
    """``value`` as a scalar of exactly the C parameter's width (pointers become int64 addresses)."""
    tensor = semantic.to_tensor(value)
    if tensor.type.is_block():
        raise TileLinkError(f"{function}: argument {position} must be a scalar, got a block "
                            f"{tensor.type}; NVSHMEM block-scope calls take one value per program")
    if tensor.dtype.is_ptr():
        tensor = semantic.cast(tensor, tl.int64)
    target = core.dtype(dtype_name)
    if tensor.dtype != target:
        tensor = semantic.cast(tensor, target)
    return tensor


def _extern(function: DeviceFunction):
    @core.extern
    def call(*args, _semantic=None):
        if len(args) != len(function.args):
            raise TileLinkError(f"{function.name} takes {len(function.args)} arguments "
                                f"({function.c_signature}), got {len(args)}")
        converted = [_exact(a, t, function.name, i, _semantic)
                     for i, (a, t) in enumerate(zip(args, function.args, strict=True))]
        key = tuple(core.dtype(t) for t in function.args)
        return core.extern_elementwise("", "", converted, {key: (function.name, core.dtype(function.ret))},
                                       is_pure=False, _semantic=_semantic)

    call.__name__ = call.__qualname__ = function.name
    call.__doc__ = f"``{function.c_signature}`` (NVSHMEM device library)."
    return call


my_pe = _extern(DEVICE_FUNCTIONS["nvshmem_my_pe"])
n_pes = _extern(DEVICE_FUNCTIONS["nvshmem_n_pes"])
putmem_signal_block = _extern(DEVICE_FUNCTIONS["nvshmemx_putmem_signal_block"])
putmem_block = _extern(DEVICE_FUNCTIONS["nvshmemx_putmem_block"])
getmem_block = _extern(DEVICE_FUNCTIONS["nvshmemx_getmem_block"])
signal_op = _extern(DEVICE_FUNCTIONS["nvshmemx_signal_op"])
signal_wait_until = _extern(DEVICE_FUNCTIONS["nvshmem_signal_wait_until"])
quiet = _extern(DEVICE_FUNCTIONS["nvshmem_quiet"])
fence = _extern(DEVICE_FUNCTIONS["nvshmem_fence"])
ptr = _extern(DEVICE_FUNCTIONS["nvshmem_ptr"])


# ------------------------------------------------------------------------------------------------
# the bitcode library

_bitcode: str | None = None


def bitcode_path() -> str:
    """Path of ``libnvshmem_device*.bc`` (``TILELINK_NVSHMEM_BITCODE`` overrides the search)."""
    global _bitcode
    if _bitcode is None:
        path = os.environ.get("TILELINK_NVSHMEM_BITCODE")
        if not path:
            try:
                import nvshmem.core as nvcore  # noqa: PLC0415 - optional GPU dependency
            except ImportError as exc:
                raise TileLinkError(f"NVSHMEM device functions need nvshmem4py: {exc}") from exc
            path = nvcore.find_device_bitcode_library()
        if not os.path.isfile(path):
            raise TileLinkError(f"NVSHMEM device bitcode {path!r} does not exist")
        _bitcode = str(path)
    return _bitcode


def extern_libs() -> dict[str, str]:
    """The ``extern_libs=`` launch option that links the NVSHMEM device library into a kernel."""
    return {LIBRARY_NAME: bitcode_path()}


def check_constants() -> None:
    """Compare :data:`SIGNAL_SET` & co with the values the installed NVSHMEM bindings were built with."""
    try:
        from nvshmem import bindings  # noqa: PLC0415
    except ImportError:
        return
    expected = {"SIGNAL_SET": bindings.Signal_op.SIGNAL_SET, "SIGNAL_ADD": bindings.Signal_op.SIGNAL_ADD,
                "CMP_GE": bindings.Cmp_type.CMP_GE, "CMP_EQ": bindings.Cmp_type.CMP_EQ}
    for name, value in expected.items():
        ours = globals()[name].value
        if int(value) != ours:
            raise TileLinkError(f"tilelink.runtime.nvshmem_device.{name} is {ours} but this NVSHMEM "
                                f"defines it as {int(value)}: update the constant")


# ------------------------------------------------------------------------------------------------
# module init

_world_up = False
_initialized: dict[int, str] = {}  # CUmodule handle -> kernel name, initialised for this world
_waiting: list = []  # CompiledKernels compiled before the world came up, or in an earlier world


def _links_nvshmem(extern_libs_option) -> bool:
    for entry in extern_libs_option or ():
        name, path = entry if isinstance(entry, (tuple, list)) else (entry, "")
        if name == LIBRARY_NAME or "libnvshmem_device" in os.path.basename(str(path)):
            return True
    return False


def _module_init(handle: int) -> None:
    import nvshmem.core as nvcore  # noqa: PLC0415

    # nvshmem4py prints the status of every module init; it raises NvshmemError on failure
    with contextlib.redirect_stdout(io.StringIO()):
        nvcore.module_init(nvcore.NvshmemKernelObject.from_handle(handle))


def init_module(kernel) -> None:
    """Load a compiled Triton kernel's module now and run NVSHMEM's module init on it (idempotent).

    The post-compile hook calls this for every JIT kernel linking the bitcode; call it yourself for
    a kernel compiled with ``triton.compile``."""
    if not _world_up:
        if all(k is not kernel for k in _waiting):
            _waiting.append(kernel)
        return
    kernel.run  # noqa: B018 - the property loads the module (CompiledKernel._init_handles)
    handle = int(kernel.module)
    if handle in _initialized:
        return
    _module_init(handle)
    _initialized[handle] = kernel.name
    if all(k is not kernel for k in _waiting):
        _waiting.append(kernel)  # re-initialised if a later world starts in this process


def _post_compile(*, key, fn, compile, **_ignored) -> None:
    if not _links_nvshmem(compile.get("extern_libs")):
        return
    jit_function = fn.jit_function
    kernel = jit_function.device_caches[compile["device"]][0].get(key)
    if kernel is None or not hasattr(kernel, "_init_handles"):
        warnings.warn(f"TileLink: Triton did not hand over the compiled kernel {fn.name}; NVSHMEM "
                      f"module init skipped (call tilelink.runtime.nvshmem_device.init_module)",
                      stacklevel=2)
        return
    init_module(kernel)


def install_module_init_hook() -> None:
    """Chain NVSHMEM module init onto ``triton.knobs.runtime.jit_post_compile_hook`` (idempotent;
    an existing hook keeps running first and its result is returned)."""
    from triton import knobs  # noqa: PLC0415

    previous = knobs.runtime.jit_post_compile_hook
    if getattr(previous, "_tilelink_nvshmem", False):
        return

    def hook(**kwargs):
        result = previous(**kwargs) if previous is not None else None
        _post_compile(**kwargs)
        return result

    hook._tilelink_nvshmem = True
    hook._tilelink_previous = previous
    knobs.runtime.jit_post_compile_hook = hook


def reinit_modules() -> None:
    """The NVSHMEM world is up: initialise every module compiled before it (or in an earlier world)."""
    global _world_up
    _world_up = True
    check_constants()
    for kernel in list(_waiting):
        init_module(kernel)


def forget_modules() -> None:
    """The NVSHMEM world is going down: modules must be initialised again in the next one."""
    global _world_up
    _world_up = False
    _initialized.clear()


def initialized_modules() -> dict[int, str]:
    """CUmodule handle -> kernel name of every module initialised in this world (tests, debugging)."""
    return dict(_initialized)
