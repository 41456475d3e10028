"""Settings read from the environment at each call (``tilelink.runtime.settings.setting``): a change made through
``os.environ`` is seen by the next read, as ``os.environ.get`` would see it."""

from __future__ import annotations

import os

from tilelink.runtime.settings import setting


def test_a_setting_follows_the_environment(monkeypatch) -> None:
    name = "TILELINK_SETTING_UNDER_TEST"
    monkeypatch.delenv(name, raising=False)
    assert setting(name) == "" and setting(name, "fallback") == "fallback"
    monkeypatch.setenv(name, "plain")
    assert setting(name) == "plain"
    os.environ[name] = "überlap"  # set and read again through the same cached name
    assert setting(name) == "überlap" == os.environ.get(name)
    del os.environ[name]
    assert setting(name, "gone") == "gone"
    assert setting("PATH") == os.environ.get("PATH", "")
