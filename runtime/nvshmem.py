"""The NVSHMEM backend: one rank per process, symmetric heap and flags through ``nvshmem4py``.

Bootstrap: ``torch.distributed`` (gloo) is already up; rank 0 takes an NVSHMEM unique id, the
world's store (:class:`~tilelink.runtime.control.Control`) hands it to the world's other ranks (only a
group's, for ``tilelink.init(group=...)``: each group is an NVSHMEM world of its own), and every rank
calls ``nvshmem.core.init(..., initializer_method="uid")`` on
``cuda:local_rank``, or ``cuda:0`` for every rank when a host has more ranks than GPUs
(``rank_device_index``). Several ranks may share one GPU (one process each): that is how multi-rank
correctness runs on a single GPU.

Host-side flags use CUDA stream memory operations (``cuStreamWriteValue64`` / ``cuStreamWaitValue64``
from ``cuda.bindings.driver``) on the caller's torch stream. NVLink multicast is never used:
``NVSHMEM_DISABLE_NVLS=1`` is forced before NVSHMEM starts.

How a host wait that never completes is diagnosed (``wait_value``):

1. ``cuStreamWaitValue64(stream, word, value, GEQ)`` is enqueued, then an event is recorded behind it;
2. the host polls that event until ``timeout_s`` has passed (the budget covers the work queued on
   the stream before the wait too);
3. if the event is still pending, the host reads the word on a private non-blocking stream (the
   ``seen`` value), *releases* the stuck stream by writing ``value`` into the word from that private
   stream (otherwise any later synchronisation of the process would hang instead of failing), and
   raises :class:`tilelink.WaitTimeout`. After a timeout the data behind that flag is not valid;
   the error says which value was expected and which was seen.

``wait_value(..., block=False)`` (what the operators' copy-engine halves use, so that the host keeps
enqueueing while the GPU works) returns after step 1 and leaves steps 2-3 to a watcher thread; the
WaitTimeout of a wait it released is printed at once and raised by the next ``check_waits()`` (every
launch's finish) or by ``finalize()``; its budget starts when the stream reaches the wait. Not for CUDA graph
capture (the watcher queries events while the host runs on): a captured call's waits are kernels
(:mod:`tilelink.runtime.graphs`); the watcher's thread runs in the relaxed capture mode, so that its queries of
earlier, uncaptured waits do not break a capture on another thread.
A blocking host poll would make each hybrid reduce-scatter call wait on the host for its channels (on two
H200s gemm_rs took 3.0 ms that way, against 0.74 ms for cuBLAS + NCCL).

``nvshmem`` and ``cuda.bindings`` are imported when the backend is constructed, so CPU installs never
need them.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import io
import logging
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from tilelink.errors import NotInitializedError, SymmetricHeapError, TileLinkError, WaitTimeout

# cuStreamWaitValue64 flag: wait until (int64) *addr >= value (cuda.h, CU_STREAM_WAIT_VALUE_GEQ)
_WAIT_GEQ_FALLBACK = 0x0
# cuStreamWriteValue64 flag: the write is preceded by a system-wide fence (release order)
_WRITE_DEFAULT_FALLBACK = 0x0
# cuStreamCreate flag: no implicit synchronisation with the legacy default stream
_STREAM_NON_BLOCKING_FALLBACK = 0x1

log = logging.getLogger("tilelink.nvshmem")

_POLL_FIRST_S = 20e-6
_POLL_MAX_S = 2e-3
#: nvshmem.core.init still running after this long is reported (it has no timeout of its own)
INIT_WARN_S = 60.0


@contextlib.contextmanager
def warn_if_slow(seconds: float, message: str):
    """Print ``message`` to stderr if the body is still running after ``seconds`` (it is not stopped):
    a collective start-up that never returns says what it is waiting for."""
    timer = threading.Timer(seconds, lambda: sys.stderr.write(f"tilelink: {message}\n"))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _import_nvshmem():
    try:
        import nvshmem.core as core  # noqa: PLC0415 - optional GPU dependency, imported on use
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TileLinkError(
            "the nvshmem backend needs nvshmem4py: pip install 'tilelink[gpu]' "
            f"(nvshmem4py-cu13==0.4.1, cuda-bindings>=13); import failed: {exc}"
        ) from exc
    return core


def _import_driver():
    try:
        from cuda.bindings import driver  # noqa: PLC0415
    except ImportError:  # cuda-python < 12.6 spelled it cuda.cuda
        try:
            from cuda import cuda as driver  # type: ignore[no-redef]  # noqa: PLC0415
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise TileLinkError(
                f"the nvshmem backend needs cuda-bindings (pip install 'cuda-bindings>=13'): {exc}"
            ) from exc
    return driver


def _check(result, what: str):
    """Unpack a ``cuda.bindings`` call's ``(CUresult, *values)`` and raise on an error."""
    if isinstance(result, tuple):
        err, *values = result
    else:
        err, values = result, []
    if int(err) != 0:
        raise TileLinkError(f"{what} failed: {err!r}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _entry_point(driver, name: str, argtypes: tuple):
    """The driver's entry point ``name`` as a ctypes function of plain integers returning its ``CUresult`` as an
    int, or ``None`` where the driver does not give it (``cuGetProcAddress``). A ``CFUNCTYPE``: the call releases
    the GIL, as the bindings' calls do (a driver call blocked on a full queue must let the wait watcher run)."""
    get = getattr(driver, "cuGetProcAddress", None)
    if get is None:
        return None
    try:
        # the ABI of these entry points as of CUDA 12 (cuStreamWriteValue64 and cuStreamWaitValue64 are its _v2)
        result = get(name.encode(), 12000, 0)
        err, pfn = result[0], result[1]
        if int(err) != 0 or not int(pfn):
            return None
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(int(pfn))
    except Exception:  # noqa: BLE001 - the bindings' path serves where the entry point cannot be had
        return None


class _StreamOps:
    """The driver calls on the operators' host path, a few per call and peer: a copy between two addresses, a word's
    write (release order after the stream's earlier work) and a stream's wait for a word (``>=``), on a stream given
    by its handle (an int, ``torch.cuda.Stream.cuda_stream``).

    They go through the driver's entry points called with plain integers where the driver gives them: the
    bindings' wrappers made a pointer and a stream object of the arguments and an enum of the result for each call,
    and the operators make up to three such calls per peer and channel. Otherwise, and for the 32-bit flags of an
    older driver, through ``cuda.bindings`` (the pointers and streams made once per address)."""

    def __init__(self, driver, write_flags: int, wait_flags: int, use_32bit: bool) -> None:
        self._driver = driver
        self._write_flags, self._wait_flags = int(write_flags), int(wait_flags)
        width = "32" if use_32bit else "64"
        self._write_bound = getattr(driver, f"cuStreamWriteValue{width}")
        self._wait_bound = getattr(driver, f"cuStreamWaitValue{width}")
        self._streams: dict[int, object] = {}
        self._pointers: dict[int, object] = {}
        u64, value = ctypes.c_uint64, ctypes.c_uint32 if use_32bit else ctypes.c_uint64
        entries = (_entry_point(driver, "cuMemcpyAsync", (u64, u64, ctypes.c_size_t, ctypes.c_void_p)),
                   _entry_point(driver, f"cuStreamWriteValue{width}", (ctypes.c_void_p, u64, value, ctypes.c_uint)),
                   _entry_point(driver, f"cuStreamWaitValue{width}", (ctypes.c_void_p, u64, value, ctypes.c_uint)))
        # all three or none: one path for every call
        self.direct = all(e is not None for e in entries)
        self._copy, self._write, self._wait = entries if self.direct else (None, None, None)
        if not self.direct:
            log.debug("the driver's stream operations go through cuda.bindings (cuGetProcAddress gave no entry "
                      "point for all of cuMemcpyAsync, cuStreamWriteValue%s, cuStreamWaitValue%s)", width, width)
        # ctypes would wrap a value out of the word's range silently (a wait for 2**32 + 5 on a 32-bit word passing
        # at 5): the bindings refused it, so do these
        self._limit = 1 << (32 if use_32bit else 64)

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        if self._copy is not None:
            err = self._copy(dst, src, nbytes, stream)
            if err:
                raise self._failed("cuMemcpyAsync", err)
            return
        _check(self._driver.cuMemcpyAsync(self._pointer(dst), self._pointer(src), nbytes, self._stream(stream)),
               "cuMemcpyAsync")

    def _out_of_range(self, what: str, value: int) -> TileLinkError:
        return TileLinkError(f"{what}: {value} does not fit the flag's {self._limit.bit_length() - 1} bits")

    def write(self, stream: int, address: int, value: int) -> None:
        self._flag_op(self._write, self._write_bound, self._write_flags, "cuStreamWriteValue", stream, address, value)

    def wait(self, stream: int, address: int, value: int) -> None:
        self._flag_op(self._wait, self._wait_bound, self._wait_flags, "cuStreamWaitValue", stream, address, value)

    def _flag_op(self, direct, bound, flags: int, what: str, stream: int, address: int, value: int) -> None:
        """A word's write or a stream's wait for it: the entry point ``direct`` with plain integers, else the
        bindings' ``bound``."""
        if not 0 <= value < self._limit:
            raise self._out_of_range(what, value)
        if direct is not None:
            err = direct(stream, address, value, flags)
            if err:
                raise self._failed(what, err)
            return
        _check(bound(self._stream(stream), self._pointer(address), int(value), flags), what)

    def _failed(self, what: str, err: int) -> TileLinkError:
        try:
            name = repr(self._driver.CUresult(err))
        except Exception:  # noqa: BLE001 - a code the bindings do not know is still reported
            name = f"CUresult {err}"
        return TileLinkError(f"{what} failed: {name}")

    def _stream(self, handle: int):
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = self._driver.CUstream(handle)
        return stream

    def _pointer(self, address: int):
        """The bindings' ``CUdeviceptr`` of ``address``, made once: the operators notify, wait on and copy between
        the same few words and buffers every call."""
        pointer = self._pointers.get(address)
        if pointer is None:
            if len(self._pointers) > 4096:  # addresses of buffers long freed
                self._pointers.clear()
            pointer = self._pointers[address] = self._driver.CUdeviceptr(address)
        return pointer


def _base_address(t: torch.Tensor) -> int:
    """The address a buffer is known by; an empty tensor's ``data_ptr()`` is 0, its storage's is not."""
    return t.data_ptr() if t.numel() else t.untyped_storage().data_ptr()


class _WaitWatcher:
    """The host side of non-blocking stream waits: a daemon thread polls each watched wait; one whose
    stream has reached it (``reached``) but not passed it (``passed``) within its budget is diagnosed and
    released as a blocking wait would be (its word read, the stream released), and its WaitTimeout kept
    for :meth:`raise_timeout`. The budget starts when the stream reaches the wait, not when the host
    enqueued it: the host may run far ahead of a busy stream."""

    def __init__(self, backend: NvshmemBackend, thread: bool = True) -> None:
        """``thread=False``: no thread; the owner calls :meth:`poll`."""
        self._backend = backend
        # per stream, its watched waits in the order they were enqueued: [reached (None: chained), passed,
        # address, value, budget, index, deadline (None until reached)]. A stream runs in order, so only the first
        # wait of each can be reached and not passed: the thread looks at that one alone (one query a poll,
        # whatever the host queued; looking at every pending wait took the launching thread's time, the GIL, as
        # the host ran ahead)
        self._queues: dict[int, collections.deque] = {}
        self._lock = threading.Lock()
        self._error: Exception | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tilelink-wait-watch-{backend.rank}", daemon=True)
        if thread:
            self._thread.start()

    def watch(self, stream: int, reached: torch.cuda.Event, passed: torch.cuda.Event, address: int, value: int,
              timeout_s: float, index: int) -> None:
        """Watch a wait enqueued on ``stream`` (its handle) after every wait watched on it before."""
        with self._lock:
            self._queues.setdefault(stream, collections.deque()).append(
                [reached, passed, address, value, timeout_s, index, None])

    def _pending(self) -> list[list]:
        with self._lock:
            return [item for queue in self._queues.values() for item in queue]

    def raise_timeout(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _keep(self, error: Exception) -> None:
        with self._lock:
            self._error = self._error or error  # the first: what went wrong first

    def _run(self) -> None:
        try:
            torch.cuda.set_device(self._backend.device)  # the driver calls of a release need the context here
            # this thread's event queries are allowed while another thread captures a CUDA graph (the default,
            # global mode, would refuse them and invalidate that capture): they concern uncaptured streams only
            driver = self._backend._driver
            mode = getattr(getattr(driver, "CUstreamCaptureMode", None), "CU_STREAM_CAPTURE_MODE_RELAXED", None)
            if mode is not None:
                _check(driver.cuThreadExchangeStreamCaptureMode(mode), "cuThreadExchangeStreamCaptureMode")
        except Exception as exc:  # noqa: BLE001 - kept and raised by the next check
            self._keep(TileLinkError(f"the host-wait watcher could not start on {self._backend.device}: {exc}"))
        while not self._stopping.is_set():
            self._stopping.wait(_POLL_MAX_S if self.poll() else 10 * _POLL_MAX_S)

    def poll(self) -> bool:
        """One look at each stream's first pending wait, and at the next while they are over; whether any wait is
        still pending."""
        with self._lock:
            heads = [(stream, queue[0]) for stream, queue in self._queues.items() if queue]
        for stream, item in heads:
            while item is not None:
                try:
                    done = self._check(item)
                except Exception as exc:  # noqa: BLE001 - a watcher that died would leave stuck waits stuck
                    self._keep(TileLinkError(f"the host-wait watcher failed on a rank_wait: {exc}"))
                    self._release(item)
                    done = True
                if not done:
                    break
                with self._lock:
                    queue = self._queues.get(stream)
                    if queue and queue[0] is item:  # drain() may have taken it
                        queue.popleft()
                    item = queue[0] if queue else None
        with self._lock:
            for stream in [stream for stream, queue in self._queues.items() if not queue]:
                del self._queues[stream]
            return bool(self._queues)

    def _release(self, item: list) -> None:
        """Best effort: let the stream past a wait the watcher could not judge (no stuck stream)."""
        with contextlib.suppress(Exception):
            self._backend._release_wait(item[2], item[3])

    def drain(self) -> None:
        """Until every watched wait is over: passed, or released after its budget (and its timeout kept).
        Bounded: past the longest budget plus a second, what is left is released."""
        longest = max((item[4] for item in self._pending()), default=0.0)
        deadline = time.monotonic() + longest + 1.0
        while time.monotonic() < deadline:
            if not self._pending():
                return
            time.sleep(_POLL_MAX_S)
        with self._lock:
            left = [item for queue in self._queues.values() for item in queue]
            self._queues = {}
        for item in left:
            self._release(item)
        if left:
            self._keep(TileLinkError(f"{len(left)} host wait(s) still pending at finalize were released"))

    def _check(self, item: list) -> bool:
        """One look at a watched wait; whether it is over (passed, or released)."""
        reached, passed, address, value, budget, index, deadline = item
        if passed.query():
            # complete: reused by later waits
            self._backend._spare_events.extend((passed,) if reached is None else (reached, passed))
            return True
        now = time.monotonic()
        if deadline is None:
            # a chained wait (no `reached`) is looked at once the wait before it on its stream is over: the stream
            # is past that one, and only copies and flags stand between
            if reached is None or reached.query():
                item[6] = now + budget
            return False
        if now < deadline:
            return False
        timeout = self._backend._expire(address, value, budget, index)
        if timeout is None:
            return False  # it arrived: the stream is about to pass
        # said at once (the data behind the flag is not valid); raised by the next check
        sys.stderr.write(f"tilelink: {timeout} (released; raised at the next launch)\n")
        self._keep(timeout)
        return True


def rank_device_index(local_rank: int, local_world: int, gpus: int) -> int:
    """The GPU of a host's ``local_rank``-th rank: its own while there are GPUs enough, else GPU 0 for
    every rank. NVSHMEM (without CUDA MPS) hung in ``init`` when ranks shared GPUs unevenly over a
    multi-GPU host (3 ranks on 2 H200s, every rank stuck); every rank on one GPU is the sharing that
    works (2-8 ranks on one H200)."""
    if gpus < 1:
        raise TileLinkError("the nvshmem backend needs a CUDA GPU; use backend='emulated' without one")
    return local_rank if local_world <= gpus else 0


class NvshmemBackend:
    """One rank's connection to an NVSHMEM world (implements :class:`tilelink.runtime.backend.Backend`)."""

    name = "nvshmem"

    def __init__(self, control=None) -> None:
        """``control``: the world's :class:`~tilelink.runtime.control.Control` (``tilelink.init`` passes it): its
        ranks are the PEs (a group's, for ``init(group=...)``) and the unique id goes through its store; without
        it, the job's ranks and a gloo broadcast."""
        if not dist.is_initialized():
            raise NotInitializedError(
                "NvshmemBackend needs torch.distributed (gloo) to broadcast the NVSHMEM unique id: "
                "use tilelink.init(backend='nvshmem') under torchrun / tilelink.spawn"
            )
        if not torch.cuda.is_available():
            raise TileLinkError("the nvshmem backend needs a CUDA GPU; use backend='emulated' without one")
        # never NVLink multicast: it can take a shared host's GPUs out of service
        os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

        self.rank = control.rank if control is not None else dist.get_rank()
        self.world_size = control.world_size if control is not None else dist.get_world_size()
        # the GPU follows the process's place on its host, whatever group it is in
        self.local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        gpus = torch.cuda.device_count()
        index = rank_device_index(self.local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())),
                                  gpus)
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)

        self._core = _import_nvshmem()
        self._driver = _import_driver()
        from cuda.core import Device  # noqa: PLC0415 - comes with nvshmem4py

        self._cuda_device = Device(index)
        self._cuda_device.set_current()

        core = self._core
        uid = core.get_unique_id(empty=self.rank != 0)
        raw = uid._data.view("uint8")  # the nvshmemx_uniqueid_v1 struct, as bytes
        box = [raw.tobytes() if self.rank == 0 else None]
        if control is not None:  # through the store: bounded, and only this world's ranks take part
            box = control.exchange(box[0], "tilelink.init (NVSHMEM unique id)")[:1]
        else:
            dist.broadcast_object_list(box, src=0)
        if self.rank != 0:
            import numpy as np  # noqa: PLC0415

            raw[:] = np.frombuffer(box[0], dtype=np.uint8)
        with warn_if_slow(INIT_WARN_S, f"rank {self.rank} of {self.world_size}: nvshmem.core.init has not returned "
                          f"after {INIT_WARN_S:g} s (on GPU {index} of {gpus}). It returns once every rank "
                          f"has called it: check that all {self.world_size} ranks started and reached "
                          f"tilelink.init, and that ranks sharing GPUs all share one (NVSHMEM without CUDA "
                          f"MPS hung with ranks spread unevenly over several GPUs)"):
            core.init(device=self._cuda_device, uid=uid, rank=self.rank, nranks=self.world_size,
                      initializer_method="uid")
        self._finalized = False
        pe, npes = core.my_pe(), core.n_pes()
        if (pe, npes) != (self.rank, self.world_size):
            raise TileLinkError(f"NVSHMEM started as PE {pe} of {npes}, but this process is rank "
                                f"{self.rank} of {self.world_size}")

        self._live: dict[int, tuple[torch.Tensor, int]] = {}  # base address -> (nvshmem tensor, nbytes)
        self._released: set[int] = set()
        self._watch: _WaitWatcher | None = None  # started by the first non-blocking wait
        self._enqueue_order = threading.Lock()
        self._side_stream = _check(
            self._driver.cuStreamCreate(self._flag("CUstream_flags", "CU_STREAM_NON_BLOCKING",
                                                   _STREAM_NON_BLOCKING_FALLBACK)),
            "cuStreamCreate")
        # computed once: each enqueue of a copy, flag or wait is on the operators' host path
        self._write_flags = self._flag("CUstreamWriteValue_flags", "CU_STREAM_WRITE_VALUE_DEFAULT",
                                       _WRITE_DEFAULT_FALLBACK)
        self._wait_flags = self._flag("CUstreamWaitValue_flags", "CU_STREAM_WAIT_VALUE_GEQ", _WAIT_GEQ_FALLBACK)
        self._spare_events: list[torch.cuda.Event] = []  # see _event (appended to by the watcher thread too)
        # only the low word of each int64 flag is compared with 32-bit flags; values must then stay below 2**32
        self.uses_32bit_flags = not (hasattr(self._driver, "cuStreamWriteValue64")
                                     and hasattr(self._driver, "cuStreamWaitValue64"))
        self._ops = _StreamOps(self._driver, self._write_flags, self._wait_flags, self.uses_32bit_flags)

        from tilelink.runtime import nvshmem_device  # noqa: PLC0415

        nvshmem_device.install_module_init_hook()
        nvshmem_device.reinit_modules()

    # ------------------------------------------------------------------ helpers

    def _flag(self, enum_name: str, member: str, fallback: int):
        enum = getattr(self._driver, enum_name, None)
        return getattr(enum, member, fallback) if enum is not None else fallback

    def _stream(self, stream: torch.cuda.Stream | None) -> torch.cuda.Stream:
        self._require_live()
        return torch.cuda.current_stream(self.device) if stream is None else stream

    def _require_live(self) -> None:
        if self._finalized:
            raise NotInitializedError("the NVSHMEM world was finalized; call tilelink.init() again")

    def _word(self, word: torch.Tensor, what: str) -> int:
        if not isinstance(word, torch.Tensor) or word.dtype != torch.int64 or word.numel() != 1:
            raise TileLinkError(f"{what}: expected a one-element int64 tensor (a barrier word), got "
                                f"{word!r:.80}")
        if word.device.type != "cuda":
            raise TileLinkError(f"{what}: the barrier word must be on the GPU, got {word.device}")
        return word.data_ptr()

    # ------------------------------------------------------------------ Backend

    def allocate(self, nbytes: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Collective ``nvshmem_malloc`` of ``nbytes``; the local uint8 tensor and every rank's view."""
        self._require_live()
        if nbytes < 0:
            raise SymmetricHeapError(f"cannot allocate {nbytes} bytes")
        core = self._core
        # nvshmem_malloc(0) returns NULL: a zero-byte buffer still takes one byte of the heap
        buffer = core.tensor((max(int(nbytes), 1),), dtype=torch.uint8)
        base = buffer.data_ptr()
        local = buffer[:nbytes]
        peers: list[torch.Tensor] = []
        for pe in range(self.world_size):
            if pe == self.rank:
                # get_peer_tensor on the own PE would take a second reference on the buffer
                peers.append(local)
            else:
                peers.append(core.get_peer_tensor(buffer, pe)[:nbytes])
        self._live[base] = (buffer, nbytes)
        self._released.discard(base)
        return local, peers

    def release(self, local: torch.Tensor) -> None:
        """Collective ``nvshmem_free`` of a buffer :meth:`allocate` returned; a second release of the
        same buffer raises :class:`SymmetricHeapError` instead of freeing twice."""
        self._require_live()
        base = _base_address(local)
        entry = self._live.pop(base, None)
        if entry is None:
            if base in self._released:
                raise SymmetricHeapError("this symmetric buffer was already released")
            raise SymmetricHeapError("this tensor was not allocated by the NVSHMEM backend")
        self._released.add(base)
        torch.cuda.synchronize(self.device)  # no kernel of this rank still uses it
        self._core.free_tensor(entry[0])

    def barrier(self) -> None:
        """Every rank's work issued before (all streams) is complete when this returns."""
        self._require_live()
        torch.cuda.synchronize(self.device)
        stream = torch.cuda.current_stream(self.device)
        self._core.barrier_all(self._core.NvshmemStream(stream))
        stream.synchronize()

    def stream_barrier(self, stream: torch.cuda.Stream | None) -> None:
        """``nvshmemx_barrier_all_on_stream``: work after it on ``stream`` starts once every rank's
        work before it on its stream is done."""
        stream = self._stream(stream)
        self._core.barrier_all(self._core.NvshmemStream(stream))

    def write_value(self, word: torch.Tensor, value: int, stream: torch.cuda.Stream | None) -> None:
        """``cuStreamWriteValue64`` (fenced: release order after the stream's earlier work)."""
        self.write_value_at(self._word(word, "write_value"), value, stream)

    def write_value_at(self, address: int, value: int, stream: torch.cuda.Stream | None) -> None:
        """:meth:`write_value` on the word at ``address`` (checked by the caller: a barrier word's, of this
        rank's or a peer's copy)."""
        self._ops.write(self._stream(stream).cuda_stream, address, value)

    def wait_value(self, word: torch.Tensor, value: int, stream: torch.cuda.Stream | None,
                   timeout_s: float, block: bool = True, index: int = -1) -> None:
        """``cuStreamWaitValue64(GEQ)`` on ``stream``, then a host check bounded by ``timeout_s``:
        raises :class:`tilelink.WaitTimeout` (and releases the stream) if the word never got there.
        ``block=False``: the check runs on the watcher thread (see the module's docstring)."""
        self.wait_value_at(self._word(word, "wait_value"), value, stream, timeout_s, block, index)

    def wait_value_at(self, address: int, value: int, stream: torch.cuda.Stream | None, timeout_s: float,
                      block: bool = True, index: int = -1, chained: bool = False) -> None:
        """:meth:`wait_value` on the word at ``address`` (checked by the caller: a local barrier word's)."""
        stream = self._stream(stream)
        if not block:
            # the watcher takes a stream's waits in the order they are watched: that of the stream, also when
            # several threads enqueue on it
            with self._enqueue_order:
                reached = None
                if not chained:  # the watcher's budget starts when the stream gets here
                    reached = self._event()
                    reached.record(stream)
                passed = self._enqueue_wait(stream, address, value)
                self._watcher().watch(stream.cuda_stream, reached, passed, address, int(value), float(timeout_s),
                                      index)
            return
        passed = self._enqueue_wait(stream, address, value)
        deadline = time.monotonic() + float(timeout_s)
        pause = _POLL_FIRST_S
        while not passed.query():
            if time.monotonic() >= deadline:
                timeout = self._expire(address, int(value), float(timeout_s), index)
                if timeout is None:  # it arrived in the last instant
                    break
                raise timeout
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)
        else:
            self._spare_events.append(passed)

    def _enqueue_wait(self, stream: torch.cuda.Stream, address: int, value: int) -> torch.cuda.Event:
        """``cuStreamWaitValue64(GEQ)`` on ``stream``, and an event past it (complete once the stream passed)."""
        self._ops.wait(stream.cuda_stream, address, value)
        passed = self._event()
        passed.record(stream)
        return passed

    def _event(self) -> torch.cuda.Event:
        """An event for a wait: a spare one (its earlier record complete: the watcher returns the events of
        waits that passed), else a new one. Creating two events per wait cost the launch path about 10 us."""
        spare = self._spare_events
        return spare.pop() if spare else torch.cuda.Event()

    def check_waits(self) -> None:
        if self._watch is not None:
            self._watch.raise_timeout()

    def _watcher(self) -> _WaitWatcher:
        if self._watch is None:
            self._watch = _WaitWatcher(self)
        return self._watch

    def _expire(self, address: int, value: int, budget_s: float, index: int) -> WaitTimeout | None:
        """A wait whose budget is spent: ``None`` if its word got there after all; otherwise release the
        stuck stream and return the :class:`tilelink.WaitTimeout` saying what was seen."""
        seen = self._read_word(address)
        if seen >= value:
            return None
        self._release_wait(address, value)
        return WaitTimeout(rank=self.rank, primitive="rank_wait", index=index, expected=value, seen=seen,
                           budget_s=budget_s)

    def _read_word(self, address: int) -> int:
        """The int64 at ``address``, read on the private stream (never behind a stuck one)."""
        host = torch.empty(1, dtype=torch.int64).pin_memory()
        _check(self._driver.cuMemcpyDtoHAsync(host.data_ptr(), self._driver.CUdeviceptr(address), 8,
                                              self._side_stream), "cuMemcpyDtoHAsync")
        _check(self._driver.cuStreamSynchronize(self._side_stream), "cuStreamSynchronize")
        return int(host.item())

    def _release_wait(self, address: int, value: int) -> None:
        self._ops.write(int(self._side_stream), address, value)
        _check(self._driver.cuStreamSynchronize(self._side_stream), "cuStreamSynchronize")

    def copy(self, src: torch.Tensor, dst: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
        """``cuMemcpyAsync`` of the bytes of ``src`` into ``dst`` on ``stream`` (the copy engine; either
        may be a peer's copy mapped into this process). A driver call on the two addresses: a torch
        ``copy_`` under a stream context cost the host about 35 us each, the operators' copies being
        on the host's critical path (a 2-GPU gemm_rs enqueued slower than its GPU work ran)."""
        stream = self._stream(stream)
        nbytes = src.numel() * src.element_size()
        if nbytes != dst.numel() * dst.element_size():
            raise TileLinkError(f"copy: {nbytes} bytes into {dst.numel() * dst.element_size()}")
        if not (src.is_contiguous() and dst.is_contiguous()):
            raise TileLinkError("copy: the copy engine moves contiguous bytes; pass contiguous views")
        if nbytes:
            self._ops.copy(dst.data_ptr(), src.data_ptr(), nbytes, stream.cuda_stream)

    def copy_at(self, dst: int, src: int, nbytes: int, stream: torch.cuda.Stream | None) -> None:
        """:meth:`copy` between two addresses (contiguous views of symmetric buffers, read once per context by the
        caller): the copy engine's channels move the same rows every call."""
        if nbytes:
            self._ops.copy(dst, src, nbytes, self._stream(stream).cuda_stream)

    def finalize(self) -> None:
        """Free what the heap left, ``nvshmem.core.finalize``. Idempotent."""
        if self._finalized:
            return
        watch, self._watch = self._watch, None
        if watch is not None:  # every watched wait passed or released first: the sync below cannot hang on one
            watch.drain()
            watch.stop()
        torch.cuda.synchronize(self.device)
        for base in sorted(self._live):
            buffer, _ = self._live.pop(base)
            self._core.free_tensor(buffer)
            self._released.add(base)
        from tilelink.runtime import nvshmem_device  # noqa: PLC0415

        nvshmem_device.forget_modules()
        with contextlib.redirect_stdout(io.StringIO()):
            self._core.finalize()
        _check(self._driver.cuStreamDestroy(self._side_stream), "cuStreamDestroy")
        self._finalized = True
        if watch is not None:
            watch.raise_timeout()  # a watched wait that timed out after the last launch: not lost

    def __repr__(self) -> str:
        return f"NvshmemBackend(rank={self.rank}, world_size={self.world_size}, device={self.device})"
