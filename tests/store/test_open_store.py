"""``open_store`` URL parsing and ``store_url_from_env``."""

from __future__ import annotations

from pathlib import Path

import pytest

from helix_transport._exceptions import UsageError
from helix_transport.store import (
    MemoryStore,
    SqliteStore,
    open_store,
    store_url_from_env,
)


async def test_memory_url() -> None:
    store = await open_store("memory://")
    assert isinstance(store, MemoryStore)
    await store.aclose()


async def test_sqlite_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = await open_store("sqlite:///data/helix.db")
    assert isinstance(store, SqliteStore)
    await store.aclose()
    assert (tmp_path / "data" / "helix.db").exists()


async def test_sqlite_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "abs" / "helix.db"
    assert str(path).startswith("/")
    store = await open_store(f"sqlite:///{path}")  # i.e. sqlite:////tmp/...
    assert isinstance(store, SqliteStore)
    await store.aclose()
    assert path.exists()


async def test_sqlite_in_memory() -> None:
    store = await open_store("sqlite:///:memory:")
    assert isinstance(store, SqliteStore)
    await store.aclose()


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "postgresql://db/helix"])
async def test_planned_backends_are_not_supported_yet(url: str) -> None:
    with pytest.raises(UsageError, match="not supported yet"):
        await open_store(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://db/helix", "unsupported store URL"),
        ("helix.db", "unsupported store URL"),
        ("", "unsupported store URL"),
        ("sqlite:///", "has no path"),
        ("sqlite://host/helix.db", "malformed"),
        ("memory://named", "unsupported store URL"),
    ],
)
async def test_bad_urls_raise_usage_error(url: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as error:
        await open_store(url)
    assert "sqlite:///" in str(error.value)


def test_store_url_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HELIX_STORE_URL", raising=False)
    assert store_url_from_env("memory://") == "memory://"
    monkeypatch.setenv("HELIX_STORE_URL", "")
    assert store_url_from_env("memory://") == "memory://"
    monkeypatch.setenv("HELIX_STORE_URL", "sqlite:///x.db")
    assert store_url_from_env("memory://") == "sqlite:///x.db"
