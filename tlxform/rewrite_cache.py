"""Rewrites kept on disk, so that a process importing annotated kernels does not rewrite them again.

Rewriting a kernel parses and analyses its whole file: a second or more per kernel, paid by every process that
imports it (each rank of a world, each run of a program; ``tilelink.ops`` holds a dozen). A rewrite is a function
of what it reads, so it is kept under a key made of all of it:

- the kernel file's text and the name it is shown by (errors and the generated header carry it);
- the request: the kernel, its specs and options;
- TileLink's own code (the files of its ``tilelink``, ``tilelink.rules`` and ``tilelink.runtime`` packages), the
  Python, libcst and Triton it runs on;
- the modules the file imports helpers from (``tilelink.helper_sources``): where a name's module was found, if at
  all, and that file's text. These are looked up again when the entry is read: the same import, resolved from the
  same kernel file, must find the same file with the same text, or the kernel is rewritten again.

A kernel the rewriter refuses is not kept: it is analysed again and says why. An entry that cannot be read (cut
short, or written by another version) counts as absent. ``$TILELINK_CACHE_DIR`` moves the cache (default
``~/.cache/tilelink``); ``TILELINK_REWRITE_CACHE=0`` turns the keeping off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import pickle
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from tilelink import helper_sources
from tilelink.codegen import GeneratedModule, Request, generate

#: bumped when an entry's layout changes
FORMAT = 1


def cache_dir() -> Path:
    """Where TileLink keeps what it generates: ``$TILELINK_CACHE_DIR`` or ``~/.cache/tilelink``."""
    return Path(os.environ.get("TILELINK_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tilelink"))


def generate_kept(source: str, file: str, requests: list[Request]) -> GeneratedModule:
    """``generate(source, file, requests)``, read from the cache when an entry for the same inputs is there,
    else generated and written there."""
    if os.environ.get("TILELINK_REWRITE_CACHE", "1") == "0":
        return generate(source, file, requests)
    path = cache_dir() / "rewrites" / f"{_key(source, file, requests)}.pickle"
    kept = _read(path, file)
    if kept is not None:
        return kept
    with helper_sources.recording() as lookups:
        generated = generate(source, file, requests)
    _write(path, {"format": FORMAT, "lookups": tuple(lookups), "generated": generated})
    return generated


def _key(source: str, file: str, requests: list[Request]) -> str:
    h = hashlib.sha256()
    for part in (str(FORMAT), _tilelink_fingerprint(), file, source, repr(list(requests))):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def _read(path: Path, file: str) -> GeneratedModule | None:
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception:  # cut short, or classes of another version: generated again and written over
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT \
            or not isinstance(entry.get("generated"), GeneratedModule):
        return None
    for lookup in entry["lookups"]:
        if helper_sources.look_up(*lookup[:3]) != lookup:
            return None
    return entry["generated"]


def _write(path: Path, entry: dict) -> None:
    """Written whole or not at all (ranks of one world write the same entry at once); a cache that cannot be
    written only costs the next process the rewrite."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def _tilelink_fingerprint() -> str:
    """The code that rewrites: every source file of TileLink's rewriting packages, and the versions of what it
    runs on."""
    h = hashlib.sha256()
    for dist in ("libcst", "triton"):
        try:
            h.update(f"{dist} {metadata.version(dist)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist} -\0".encode())
    h.update(f"{sys.implementation.cache_tag} {sys.version}\0".encode())
    for package, name, path in fingerprinted_files():
        h.update(f"{package}/{name}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def fingerprinted_files() -> list[tuple[str, str, Path]]:
    """``(package, file name under its folder, path)`` of every source file of TileLink's rewriting packages."""
    out = []
    for package in ("tilelink", "tilelink.rules", "tilelink.runtime"):
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
            root = Path(folder)
            out.extend((package, p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*"))
                       if p.suffix in (".py", ".json") and p.is_file())
    return out
