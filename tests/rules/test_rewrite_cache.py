"""Rewrites kept on disk: a process that decorates a kernel it (or another process) rewrote before reads the rewrite
back instead of analysing the file again, and only where everything the rewrite read is the same: the file's text and
name, the request, TileLink's code, and each module it read a helper from, found again at the same place with the same
text. A refused kernel is not kept; an unreadable entry is generated again."""

from __future__ import annotations

import importlib.util
import itertools
import pickle
import sys
from pathlib import Path

import pytest

from tests.rules.test_tile_mapping_pairs import _form, _imported
from tilelink import rewrite_cache
from tilelink.annotations import requests_in
from tilelink.errors import AnnotationError

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
    assert _order(_decorate(path)).startswith("[applied]")
    helper.write_text(whole)
    assert _order(_decorate(path)).startswith("[not applied]"), "a stale rewrite was read back"
    _decorate(path)
    assert generations == ["parity_kernel"] * 2  # the same helper again: read back
    helper.unlink()  # not found now (the module would not import: asked of the cache directly)
    entry = _order(rewrite_cache.generate_kept(kernel, str(path), requests_in(kernel, str(path))))
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


def test_the_key_covers_the_rewriters_own_code() -> None:
    files = {f"{package}/{name}" for package, name, _ in rewrite_cache.fingerprinted_files()}
    for needed in ("tilelink/codegen.py", "tilelink/analysis.py", "tilelink/helper_sources.py",
                   "tilelink.rules/all_gather/rewrite.py", "tilelink.rules/all_gather/kernels.py",
                   "tilelink.rules/reduce_scatter/rewrite.py", "tilelink.runtime/language.py"):
        assert needed in files, needed
