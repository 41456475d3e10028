"""Rewrites kept on disk, so that a process importing annotated kernels does not rewrite them again.

Rewriting a kernel parses and analyses its whole file: a second or more per kernel, paid by every process that
imports it (each rank of a world, each run of a program; ``tilelink.ops`` holds a dozen). A rewrite is a function
of what it reads, so it is kept under a key made of all of it:

- the kernel file's text and the name it is shown by (errors and the generated header carry it);
- the request: the kernel, its specs and options;
- the code that rewrites: the files of TileLink's ``tilelink``, ``tilelink.rules`` and ``tilelink.runtime``
  packages as this process loaded them, the Triton source the rewrite reads (``triton/language/standard.py``: the
  helpers a kernel may call, ``tl.swizzle2d``) and the Python and libcst it runs on;
- the modules the file imports helpers from (``tilelink.helper_sources``): where a name's module was found, if at
  all, and that file's text. These are looked up again when the entry is read: the same import, resolved from the
  same kernel file, must find the same file with the same text, or the kernel is rewritten again.

The code's part is read when this module is imported, with the rewriter's; a file of it that changes afterwards (an
edit while a notebook or a test session runs) may not be the code that runs, so from then on this process rewrites
without the cache, neither reading nor writing it. A kernel the rewriter refuses is not kept: it is analysed again
and says why. An entry that cannot be read (cut short, written by another version, or not the user's own) counts as
absent. ``$TILELINK_CACHE_DIR`` moves the cache (default ``~/.cache/tilelink``); ``TILELINK_REWRITE_CACHE=0`` turns
the keeping off.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import os
import pickle
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import tilelink
from tilelink import helper_sources
from tilelink.codegen import GeneratedModule, Request, generate

#: bumped when an entry's layout changes
FORMAT = 1

#: the packages whose files make the rewriting code
PACKAGES = ("tilelink", "tilelink.rules", "tilelink.runtime")


def cache_dir() -> Path:
    """Where TileLink keeps what it generates: ``$TILELINK_CACHE_DIR`` or ``~/.cache/tilelink``."""
    return Path(os.environ.get("TILELINK_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tilelink"))


def generate_kept(source: str, file: str, requests: list[Request]) -> GeneratedModule:
    """``generate(source, file, requests)``, read from the cache when an entry for the same inputs is there,
    else generated and written there."""
    code = CODE.current() if os.environ.get("TILELINK_REWRITE_CACHE", "1") != "0" else None
    if code is None:
        return generate(source, file, requests)
    path = cache_dir() / "rewrites" / f"{_key(code, source, file, requests)}.pickle"
    kept = _read(path)
    if kept is not None:
        return kept
    # the ranks of a world import the same file at once: the first rewrites it while the others wait for its entry
    # (seconds of each rank's CPU saved, and ranks sharing few cores start together)
    with _first_or_waited(path):
        kept = _read(path)  # written by a holder that let go between the read above and the lock
        if kept is not None:
            return kept
        with helper_sources.recording() as lookups:
            generated = generate(source, file, requests)
        _write(path, {"format": FORMAT, "lookups": tuple(lookups), "generated": generated})
    return generated


#: how long a process waits for another's rewrite of the same file before rewriting it itself
LOCK_WAIT_S = 300.0

#: the entries this process is rewriting now (a rewrite that decorated the same file again would wait on itself)
_HELD: set[Path] = set()


@contextlib.contextmanager
def _first_or_waited(path: Path):
    """Yields ``True`` holding ``path``'s lock where no other process holds it (this one rewrites, the others wait),
    else ``False`` once the holder let go (its entry is then there to read; where it is not, a refused kernel or an
    entry that could not be written, each waiting process rewrites on its own, at once, not one after another). A
    holder stopped or gone without a word is waited for at most ``LOCK_WAIT_S`` seconds. Without ``fcntl``, with a
    lock file that cannot be made or is not the user's own, or for an entry this process is already rewriting, yields
    ``True`` unlocked: processes then rewrite the same file each, as without the cache."""
    fd = None
    try:
        import fcntl

        if path not in _HELD:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            if hasattr(os, "getuid") and os.fstat(fd).st_uid != os.getuid():
                raise PermissionError("the lock file is not the user's own")
    except (ImportError, OSError):
        if fd is not None:
            os.close(fd)
        fd = None
    if fd is None:
        yield True
        return
    try:
        held = _try_lock(fcntl, fd)
        if held is None:  # a file system without locks (Lustre without flock, NFS without lockd): unlocked
            yield True
            return
        if not held:
            deadline = time.monotonic() + LOCK_WAIT_S
            while time.monotonic() < deadline:
                time.sleep(0.05)
                if _try_lock(fcntl, fd) is False:
                    continue
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)  # the holder is done: read its entry, no need to hold the lock
                break
            yield False
            return
        _HELD.add(path)
        try:
            yield True
        finally:
            _HELD.discard(path)
    finally:
        os.close(fd)  # closing releases the lock


def _try_lock(fcntl, fd: int) -> bool | None:
    """Takes ``fd``'s exclusive lock without waiting: ``True`` taken, ``False`` held by another process, ``None``
    where the file system takes no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return False if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES) else None
    return True


class CodeState:
    """The fingerprint of the rewriting code, read from ``files`` once, and what each file was (modification time
    and size) then."""

    def __init__(self, files: list[tuple[str, Path]], loaded_ns: int) -> None:
        self.files = files
        self.fingerprint: str | None = None
        self.stats: tuple | None = None
        try:
            stats = self._stats()
            # one changed since the rewriter was imported: what runs may be the file before
            if files and all(mtime < loaded_ns for mtime, _ in stats):
                self.fingerprint, self.stats = fingerprint(files), stats
        except OSError:
            pass

    def _stats(self) -> tuple:
        return tuple((st.st_mtime_ns, st.st_size) for st in (os.stat(path) for _, path in self.files))

    def current(self) -> str | None:
        """The fingerprint, while every file is as it was read; ``None`` once one changed (or could not be read)."""
        if self.fingerprint is None:
            return None
        try:
            same = self._stats() == self.stats
        except OSError:
            same = False
        if not same:
            self.fingerprint = None
        return self.fingerprint


def fingerprint(files: list[tuple[str, Path]]) -> str:
    """The hash of the files' names and bytes and of the Python and libcst versions."""
    h = hashlib.sha256()
    try:
        libcst = metadata.version("libcst")
    except metadata.PackageNotFoundError:
        libcst = "-"
    _add(h, f"libcst {libcst}", f"{sys.implementation.cache_tag} {sys.version}")
    for name, path in files:
        _add(h, name, path.read_bytes())
    return h.hexdigest()


def code_files() -> list[tuple[str, Path]]:
    """``(name, path)`` of every file of the rewriting code: each source file of TileLink's rewriting packages
    (``tilelink/codegen.py``, ``tilelink.rules/all_gather/rewrite.py``, ...), and Triton's helpers the rewrite
    reads. Empty where a package's files are not found (a zipped install): the cache is not used then."""
    out: list[tuple[str, Path]] = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        found = [(f"{package}/{p.relative_to(Path(folder)).as_posix()}", p)
                 for folder in ((spec.submodule_search_locations or ()) if spec is not None else ())
                 for p in sorted(Path(folder).rglob("*")) if p.suffix in (".py", ".json") and p.is_file()]
        if not found:
            return []
        out.extend(found)
    triton = importlib.util.find_spec("triton")
    for folder in (triton.submodule_search_locations or ()) if triton is not None else ():
        standard = Path(folder) / "language" / "standard.py"
        if standard.is_file():
            out.append(("triton/language/standard.py", standard))
    return out


def _add(h, *parts: str | bytes) -> None:
    for part in parts:
        data = part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)


def _key(code: str, source: str, file: str, requests: list[Request]) -> str:
    h = hashlib.sha256()
    _add(h, str(FORMAT), code, file, source, repr(list(requests)))
    return h.hexdigest()


def _read(path: Path) -> GeneratedModule | None:
    try:
        with open(path, "rb") as f:
            if hasattr(os, "getuid") and os.fstat(f.fileno()).st_uid != os.getuid():
                return None  # unpickling runs code: only the user's own entries
            entry = pickle.load(f)
    except Exception:  # absent, cut short, or classes of another version: generated again and written over
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT \
            or not isinstance(entry.get("generated"), GeneratedModule):
        return None
    for lookup in entry.get("lookups", ()):
        if helper_sources.look_up(*lookup[:3]) != lookup:
            return None
    return entry["generated"]


def _write(path: Path, entry: dict) -> None:
    """Written whole or not at all (ranks of one world write the same entry at once); a cache that cannot be
    written only costs the next process the rewrite."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except Exception:
        pass


#: the code this process rewrites with, read as the rewriter is imported
CODE = CodeState(code_files(), tilelink._IMPORTED_NS)
