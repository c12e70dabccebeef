"""``SqliteStore`` against the conformance suite, plus what only a file can show."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from helix_transport._exceptions import StoreError, StoreUnavailable, UsageError
from helix_transport.store import (
    SqliteStore,
    Store,
)
from helix_transport.store import sqlite as sqlite_module
from helix_transport.testing.store_suite import (
    DurableStoreConformance,
    Reopen,
    make_record,
)


class TestSqliteStore(DurableStoreConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = await SqliteStore.open(str(tmp_path / "helix.db"))
        yield store
        await store.aclose()

    @pytest.fixture
    def reopen(self, tmp_path: Path) -> Reopen:
        return lambda: SqliteStore.open(str(tmp_path / "helix.db"))


async def test_open_creates_parent_dirs_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "helix.db"
    store = await SqliteStore.open(str(path))
    await store.aclose()
    assert path.exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(2,)]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {"sessions", "events", "checkpoints", "interrupts", "subsession_refs"} <= tables


async def test_a_version_1_file_is_upgraded_and_its_sessions_are_anonymous(
    tmp_path: Path,
) -> None:
    """A file written before sessions had owners: opening it adds the columns, keeps
    every session, and those sessions belong to nobody but ``anonymous`` ('')."""
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        for statement in sqlite_module._SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version) VALUES (1)")
        conn.execute(
            "INSERT INTO sessions VALUES ('old', 'counter', '{}', 'h', 'completed', '', '{}', "
            "'{\"total\": 1}', '', '', 1, '{}', 3, 1.0, 2.0, 2.0, '', 0.0)"
        )
    store = await SqliteStore.open(str(path))
    try:
        old = await store.get_session("old")
        assert old is not None and old.output_json == '{"total": 1}'
        assert (old.principal, old.tenant) == ("", "")
        new, _ = await store.create_session(make_record("new", principal="bob", tenant="acme"))
        assert await store.get_session("new") == new
    finally:
        await store.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(2,)]


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "future.db")
    await (await SqliteStore.open(path)).aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        await SqliteStore.open(path)


async def test_an_sqlite_library_older_than_3_25_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module.sqlite3, "sqlite_version_info", (3, 24, 0))
    monkeypatch.setattr(sqlite_module.sqlite3, "sqlite_version", "3.24.0")
    with pytest.raises(StoreError, match=r"SQLite 3\.24\.0 is too old; helix needs 3\.25"):
        await SqliteStore.open(str(tmp_path / "old.db"))
    assert not (tmp_path / "old.db").exists()


async def test_unopenable_path_is_unavailable(tmp_path: Path) -> None:
    # A directory cannot be opened as a database file.
    with pytest.raises(StoreUnavailable) as error:
        await SqliteStore.open(str(tmp_path))
    assert error.value.retryable is True
    assert isinstance(error.value.__cause__, sqlite3.Error)


async def test_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(StoreError) as error:
        await SqliteStore.open(str(path))
    assert not isinstance(error.value, StoreUnavailable)


async def test_closed_store_refuses_calls(tmp_path: Path) -> None:
    store = await SqliteStore.open(str(tmp_path / "closed.db"))
    await store.aclose()
    with pytest.raises(UsageError, match="closed"):
        await store.get_session("s-1")


async def test_async_with_closes(tmp_path: Path) -> None:
    async with await SqliteStore.open(str(tmp_path / "ctx.db")) as store:
        await store.create_session(make_record())
    with pytest.raises(UsageError):
        await store.get_session("s-1")
