"""Rewrites kept on disk: a process that decorates a kernel it (or another process) rewrote before reads the rewrite
back instead of analysing the file again, and only where everything the rewrite read is the same: the file's text and
name, the request, TileLink's code, and each module it read a helper from, found again at the same place with the same
text. A refused kernel is not kept; an unreadable entry is generated again."""

from __future__ import annotations

import importlib.util
import itertools
import pickle
import sys
import time
from pathlib import Path

import pytest

from tests.rules.test_tile_mapping_pairs import _form, _imported
from tilelink import rewrite_cache
from tilelink.codegen import Request
from tilelink.errors import AnnotationError
from tilelink.overlapped import _display_path, build
from tilelink.spec import make_options

_names = itertools.count()
HELPERS = "tile_helpers_kept"


@pytest.fixture
def generations(tmp_path, monkeypatch) -> list[str]:
    """The cache in a folder of its own; each rewrite actually generated (not read back) appended by kernel."""
    monkeypatch.setenv("TILELINK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILELINK_REWRITE_CACHE", raising=False)
    made: list[str] = []
    real = rewrite_cache.generate

    def counted(source, file, requests):
        made.extend(r.kernel for r in requests)
        return real(source, file, requests)

    monkeypatch.setattr(rewrite_cache, "generate", counted)
    return made


def _decorate(path: Path):
    """Imports the kernel file as a new module (as a new process would) and returns its kernel."""
    sys.modules.pop(HELPERS, None)
    importlib.invalidate_caches()
    spec = importlib.util.spec_from_file_location(f"kept_{path.stem}_{next(_names)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parity_kernel


def _order(kernel) -> str:
    """The report's entry on the tile order of a decorated kernel or a generated module."""
    (entry,) = [str(e) for e in kernel.report.entries if "order" in e.message]
    return entry


def _request(kernel) -> list[Request]:
    """The request the decorator made for ``kernel``."""
    return [Request(kernel.name, kernel.specs, kernel.options)]


def _entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "rewrites").glob("*.pickle"))


def test_a_kernel_decorated_again_is_read_back_with_the_same_rewrite(tmp_path, generations) -> None:
    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair"))
    first = _decorate(path)
    second = _decorate(path)
    assert generations == ["parity_kernel"]  # the second decoration read the first's rewrite
    assert len(_entries(tmp_path)) == 1
    assert second.source == first.source and second.plan == first.plan and second.report == first.report
    assert _order(second).startswith("[applied]")


def test_a_changed_file_is_rewritten(tmp_path, generations) -> None:
    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair"))
    assert _order(_decorate(path)).startswith("[applied]")
    path.write_text(_form("helper_whole"))  # the helper's first value now holds the parity: the kernel's order
    assert _order(_decorate(path)).startswith("[not applied]")
    assert generations == ["parity_kernel"] * 2 and len(_entries(tmp_path)) == 2


def test_a_changed_helper_module_is_read_again(tmp_path, generations, monkeypatch) -> None:
    """The rewrite reads the pair a helper imported from another module returns: the module's text, and which file
    the import finds, are part of the entry."""
    monkeypatch.syspath_prepend(str(tmp_path))
    kernel, pair = _imported("helper_pair", HELPERS)
    _, whole = _imported("helper_whole", HELPERS)
    path = tmp_path / "parity.py"
    path.write_text(kernel)
    helper = tmp_path / f"{HELPERS}.py"  # beside the kernel: its folder is not a package
    helper.write_text(pair)
    decorated = _decorate(path)
    assert _order(decorated).startswith("[applied]")
    helper.write_text(whole)
    assert _order(_decorate(path)).startswith("[not applied]"), "a stale rewrite was read back"
    _decorate(path)
    assert generations == ["parity_kernel"] * 2  # the same helper again: read back
    helper.unlink()  # not found now (the module would not import: asked of the cache as the decorator asks it)
    entry = _order(rewrite_cache.generate_kept(kernel, _display_path(str(path)), _request(decorated)))
    assert entry.startswith("[not applied]") and "which TileLink cannot read" in entry, entry
    helper.write_text(pair)  # found again where it was not
    assert _order(_decorate(path)).startswith("[applied]")
    assert generations == ["parity_kernel"] * 4


def test_an_unreadable_entry_is_generated_again(tmp_path, generations) -> None:
    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair"))
    first = _decorate(path)
    (entry,) = _entries(tmp_path)
    entry.write_bytes(entry.read_bytes()[:100])  # cut short
    assert _decorate(path).source == first.source
    entry.write_bytes(pickle.dumps({"format": -1}))  # another layout
    assert _decorate(path).source == first.source
    assert generations == ["parity_kernel"] * 3
    assert _decorate(path).source == first.source and len(generations) == 3  # written whole again


def test_a_refused_kernel_is_not_kept_and_says_why_each_time(tmp_path, generations) -> None:
    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair").replace('all_gather("x_ptr"', 'all_gather("z_ptr"'))
    for _ in range(2):
        with pytest.raises(AnnotationError, match="z_ptr"):
            _decorate(path)
    assert generations == ["parity_kernel"] * 2 and _entries(tmp_path) == []


def test_keeping_can_be_turned_off(tmp_path, generations, monkeypatch) -> None:
    monkeypatch.setenv("TILELINK_REWRITE_CACHE", "0")
    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair"))
    _decorate(path)
    _decorate(path)
    assert generations == ["parity_kernel"] * 2 and _entries(tmp_path) == []


def test_another_request_of_the_same_file_is_another_entry(tmp_path, generations) -> None:
    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair"))
    kernel = _decorate(path)
    (request,) = _request(kernel)
    ring = [Request(request.kernel, request.specs, make_options(None, None, "ring", None, None, None))]
    assert "order='ring'" in rewrite_cache.generate_kept(path.read_text(), _display_path(str(path)), ring).text
    rewrite_cache.generate_kept(path.read_text(), str(path), [request])  # shown by another name
    assert generations == ["parity_kernel"] * 3 and len(_entries(tmp_path)) == 3


def test_tlxform_build_always_rewrites(tmp_path, generations) -> None:
    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair"))
    assert "parity_kernel" in build(path).text
    assert _entries(tmp_path) == []


def test_the_key_covers_the_rewriters_own_code(tmp_path) -> None:
    files = {name for name, _ in rewrite_cache.code_files()}
    for needed in ("tilelink/codegen.py", "tilelink/analysis.py", "tilelink/helper_sources.py",
                   "tilelink.rules/all_gather/rewrite.py", "tilelink.rules/all_gather/kernels.py",
                   "tilelink.rules/reduce_scatter/rewrite.py", "tilelink.runtime/language.py",
                   "triton/language/standard.py"):
        assert needed in files, needed
    code = tmp_path / "rewrite.py"
    code.write_text("x = 1\n")
    before = rewrite_cache.fingerprint([("tilelink/rewrite.py", code)])
    code.write_text("x = 2\n")
    assert rewrite_cache.fingerprint([("tilelink/rewrite.py", code)]) != before


def test_code_changed_while_the_process_runs_turns_the_cache_off(tmp_path, generations, monkeypatch) -> None:
    """The rewriter's files are read as it is imported; one changed since may not be the code that runs (an edit
    while a session goes on), so the process neither reads nor writes entries from then on."""
    code = tmp_path / "rewrite.py"
    code.write_text("x = 1\n")
    state = rewrite_cache.CodeState([("tilelink/rewrite.py", code)], loaded_ns=time.time_ns() + 10**12)
    assert state.current() is not None
    monkeypatch.setattr(rewrite_cache, "CODE", state)
    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair"))
    _decorate(path)
    _decorate(path)
    assert generations == ["parity_kernel"] and len(_entries(tmp_path)) == 1
    code.write_text("x = 22\n")
    assert state.current() is None
    _decorate(path)
    code.write_text("x = 1\n")  # as it was: still not known to be the code that was loaded
    _decorate(path)
    assert generations == ["parity_kernel"] * 3 and len(_entries(tmp_path)) == 1
    # changed after the rewriter was imported, before it was read: never used
    assert rewrite_cache.CodeState([("tilelink/rewrite.py", code)], loaded_ns=0).current() is None


def _decorate_after(barrier, path: Path, results) -> None:
    barrier.wait()
    try:
        results.put(_decorate(path).source)
    except AnnotationError as exc:
        results.put(f"refused: {exc}")


def _at_once(tmp_path, monkeypatch, form: str) -> tuple[list[str], list[str]]:
    """Three processes decorating one file together, each rewrite taking a second: (what each got, the log of the
    rewrites' starts and ends by process)."""
    import multiprocessing
    import os

    monkeypatch.setenv("TILELINK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILELINK_REWRITE_CACHE", raising=False)
    log = tmp_path / "generated.txt"
    real = rewrite_cache.generate

    def slow(source, file, requests):
        with open(log, "a") as f:
            f.write(f"start {os.getpid()}\n")
        time.sleep(1.0)  # long enough for every process to find no entry yet
        try:
            return real(source, file, requests)
        finally:
            with open(log, "a") as f:
                f.write(f"end {os.getpid()}\n")

    monkeypatch.setattr(rewrite_cache, "generate", slow)
    path = tmp_path / "parity.py"
    path.write_text(form)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    processes = [ctx.Process(target=_decorate_after, args=(barrier, path, results)) for _ in range(3)]
    for p in processes:
        p.start()
    got = [results.get(timeout=120) for _ in processes]
    for p in processes:
        p.join(timeout=30)
    return got, log.read_text().split()[::2]


def test_processes_decorating_one_file_at_once_rewrite_it_once(tmp_path, monkeypatch) -> None:
    """The ranks of a world import the same file together: one rewrites it, the others wait and read its entry."""
    sources, log = _at_once(tmp_path, monkeypatch, _form("helper_pair"))
    assert log == ["start", "end"], "each process rewrote the file itself"
    assert len(set(sources)) == 1 and "parity_kernel" in sources[0]


def test_processes_waiting_on_a_refused_kernel_rewrite_it_together_not_in_turn(tmp_path, monkeypatch) -> None:
    """A refused kernel leaves no entry: the processes that waited for the first each analyse it, at once (the
    second's start before the first of them ends), and each says why."""
    refused = _form("helper_pair").replace('all_gather("x_ptr"', 'all_gather("z_ptr"')
    said, log = _at_once(tmp_path, monkeypatch, refused)
    assert all(s.startswith("refused: ") and "z_ptr" in s for s in said), said
    assert log[:2] == ["start", "end"] and log[2:4] == ["start", "start"], log


def test_a_rewrite_waits_for_a_held_entry_only_so_long(tmp_path, generations, monkeypatch) -> None:
    """A holder that never lets go (stopped, or its lock inherited by a child) is waited for ``LOCK_WAIT_S``; the
    process then rewrites the file itself."""
    import fcntl

    path = tmp_path / "parity.py"
    path.write_text(_form("helper_pair"))
    kernel = _decorate(path)
    (entry,) = _entries(tmp_path)
    entry.unlink()
    monkeypatch.setattr(rewrite_cache, "LOCK_WAIT_S", 0.3)
    with open(entry.with_suffix(".lock"), "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        again = rewrite_cache.generate_kept(_form("helper_pair"), _display_path(str(path)), _request(kernel))
    assert _order(again) == _order(kernel) and generations == ["parity_kernel"] * 2


def test_a_rewrite_inside_one_of_the_same_entry_does_not_wait_on_itself(tmp_path) -> None:
    entry = tmp_path / "cache" / "rewrites" / "key.pickle"
    with rewrite_cache._first_or_waited(entry) as first, rewrite_cache._first_or_waited(entry) as again:
        assert first and again


def test_a_file_system_without_locks_rewrites_unlocked_without_waiting(tmp_path, monkeypatch) -> None:
    """Lustre without flock, NFS without lockd: the lock's error is not another process holding it."""
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    monkeypatch.setattr(rewrite_cache, "LOCK_WAIT_S", 5.0)  # were it taken for held: False after 5 s
    with rewrite_cache._first_or_waited(tmp_path / "cache" / "rewrites" / "key.pickle") as first:
        assert first
