"""The NVSHMEM backend's driver calls on the operators' host path (a copy, a flag's write, a stream's wait): through
the driver's entry points called with plain integers where ``cuGetProcAddress`` gives all three, else through the
bindings; a failed call raises with the call's name and the driver's result. The driver here is a stand-in whose
entry points are ctypes callbacks, so what reaches the driver is checked on a machine without one."""

from __future__ import annotations

import ctypes
import enum

import pytest

import tilelink.runtime.nvshmem as nvshmem
from tilelink.errors import TileLinkError


class _Result(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1


class _Driver:
    """Entry points that record their arguments and return ``self.result``; ``missing``: symbols it does not give."""

    CUresult = _Result

    def __init__(self, missing: tuple[str, ...] = (), width: str = "64") -> None:
        self.calls: list[tuple] = []
        self.result = 0
        self.missing = missing
        self.asked: list[tuple] = []
        u64, value = ctypes.c_uint64, ctypes.c_uint32 if width == "32" else ctypes.c_uint64
        signatures = {"cuMemcpyAsync": (u64, u64, ctypes.c_size_t, ctypes.c_void_p),
                      f"cuStreamWriteValue{width}": (ctypes.c_void_p, u64, value, ctypes.c_uint),
                      f"cuStreamWaitValue{width}": (ctypes.c_void_p, u64, value, ctypes.c_uint)}
        self._callbacks = {}
        for name, argtypes in signatures.items():
            def entry(*args, name=name):
                self.calls.append((name, *((a or 0) for a in args)))
                return self.result
            self._callbacks[name] = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(entry)

    def cuGetProcAddress(self, symbol: bytes, version: int, flags: int):
        self.asked.append((symbol, version, flags))
        name = symbol.decode()
        if name in self.missing or name not in self._callbacks:
            return _Result.CUDA_ERROR_INVALID_VALUE, 0, 0
        return _Result.CUDA_SUCCESS, ctypes.cast(self._callbacks[name], ctypes.c_void_p).value, 0

    # the bindings' path: objects of the arguments, a (CUresult,) tuple back
    def CUdeviceptr(self, address: int):
        return ("ptr", address)

    def CUstream(self, handle: int):
        return ("stream", handle)

    def cuMemcpyAsync(self, dst, src, nbytes, stream):
        self.calls.append(("bound cuMemcpyAsync", dst, src, nbytes, stream))
        return (_Result(self.result),)

    def cuStreamWriteValue64(self, stream, address, value, flags):
        self.calls.append(("bound cuStreamWriteValue64", stream, address, value, flags))
        return (_Result(self.result),)

    def cuStreamWaitValue64(self, stream, address, value, flags):
        self.calls.append(("bound cuStreamWaitValue64", stream, address, value, flags))
        return (_Result(self.result),)

    cuStreamWriteValue32, cuStreamWaitValue32 = cuStreamWriteValue64, cuStreamWaitValue64


class _OldBindings(_Driver):
    cuGetProcAddress = None  # bindings without it


def test_the_entry_points_get_plain_integers() -> None:
    driver = _Driver()
    ops = nvshmem._StreamOps(driver, write_flags=0, wait_flags=3, use_32bit=False)
    assert ops.direct
    assert all(version == 12000 and flags == 0 for _, version, flags in driver.asked)
    big = (1 << 63) + 5  # an epoch's target near the top of the word passes whole
    ops.copy(0x7F0000001000, 0x7F0000002000, 1 << 33, 0x55)
    ops.write(0x55, 0x7F0000003000, big)
    ops.wait(0, 0x7F0000003008, 7)  # stream 0: the legacy default stream, a null handle
    assert driver.calls == [("cuMemcpyAsync", 0x7F0000001000, 0x7F0000002000, 1 << 33, 0x55),
                            ("cuStreamWriteValue64", 0x55, 0x7F0000003000, big, 0),
                            ("cuStreamWaitValue64", 0, 0x7F0000003008, 7, 3)]
    driver.result = 1
    with pytest.raises(TileLinkError, match=r"cuMemcpyAsync failed: .*CUDA_ERROR_INVALID_VALUE"):
        ops.copy(1, 2, 3, 4)
    with pytest.raises(TileLinkError, match=r"cuStreamWaitValue failed: .*CUDA_ERROR_INVALID_VALUE"):
        ops.wait(1, 2, 3)
    driver.result = 999  # a code the bindings do not know
    with pytest.raises(TileLinkError, match=r"cuStreamWriteValue failed: CUresult 999"):
        ops.write(1, 2, 3)


def test_without_every_entry_point_the_bindings_serve() -> None:
    driver = _Driver(missing=("cuStreamWaitValue64",))
    ops = nvshmem._StreamOps(driver, write_flags=0, wait_flags=3, use_32bit=False)
    assert not ops.direct  # one path for all three
    ops.copy(0x1000, 0x2000, 64, 0x55)
    ops.wait(0x55, 0x3000, 9)
    ops.write(0x55, 0x3000, 10)
    assert driver.calls == [("bound cuMemcpyAsync", ("ptr", 0x1000), ("ptr", 0x2000), 64, ("stream", 0x55)),
                            ("bound cuStreamWaitValue64", ("stream", 0x55), ("ptr", 0x3000), 9, 3),
                            ("bound cuStreamWriteValue64", ("stream", 0x55), ("ptr", 0x3000), 10, 0)]
    assert ops._pointer(0x3000) is ops._pointer(0x3000)  # made once per address
    driver.result = 1
    with pytest.raises(TileLinkError, match=r"cuStreamWriteValue failed: .*CUDA_ERROR_INVALID_VALUE"):
        ops.write(0x55, 0x3000, 11)
    assert not nvshmem._StreamOps(_OldBindings(), 0, 3, False).direct


def test_32_bit_flags_take_their_own_entry_points() -> None:
    driver = _Driver(width="32")
    ops = nvshmem._StreamOps(driver, write_flags=0, wait_flags=3, use_32bit=True)
    assert ops.direct and {s for s, _, _ in driver.asked} == {b"cuMemcpyAsync", b"cuStreamWriteValue32",
                                                              b"cuStreamWaitValue32"}
    ops.write(0x55, 0x3000, 12)
    assert driver.calls == [("cuStreamWriteValue32", 0x55, 0x3000, 12, 0)]
    # a value past the word would reach the driver wrapped (a wait for 2**32 + 5 passing at 5): refused, as the
    # bindings refuse it
    with pytest.raises(TileLinkError, match=r"cuStreamWaitValue: 4294967301 does not fit the flag's 32 bits"):
        ops.wait(0x55, 0x3000, (1 << 32) + 5)
    with pytest.raises(TileLinkError, match=r"cuStreamWriteValue: -1 does not fit the flag's 64 bits"):
        nvshmem._StreamOps(_Driver(), 0, 3, False).write(0x55, 0x3000, -1)
    assert driver.calls == [("cuStreamWriteValue32", 0x55, 0x3000, 12, 0)]
