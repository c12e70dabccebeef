"""``SqliteStore`` against the conformance suite, plus what only a file can show."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from helix_transport._exceptions import StoreError, StoreUnavailable, UsageError
from helix_transport._status import SessionStatus
from helix_transport.store import (
    Checkpoint,
    RemoteCursor,
    SessionUpdate,
    SqliteStore,
    Store,
    SubSessionRef,
)
from helix_transport.testing.store_suite import StoreConformance, make_event, make_record


class TestSqliteStore(StoreConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = await SqliteStore.open(str(tmp_path / "helix.db"))
        yield store
        await store.aclose()


async def test_data_survives_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "durable.db")
    record = make_record(metadata={"k": "v"})
    checkpoint = Checkpoint(session_id="s-1", step=1, messages=[{"role": "user"}], last_sequence=2)
    ref = SubSessionRef(
        parent_session_id="s-1",
        child_session_id="c-1",
        agent_type="critic",
        tool_call_id="call-1",
        remote=RemoteCursor(stream_id="r-1", last_sequence=4),
    )
    first = await SqliteStore.open(path)
    await first.create_session(record)
    await first.append(
        "s-1",
        [make_event("a"), make_event("b")],
        update=SessionUpdate(status=SessionStatus.COMPLETED),
    )
    await first.save_checkpoint(checkpoint)
    await first.set_interrupt("s-1", "stop")
    await first.put_subsession_ref(ref)
    assert await first.acquire_lease("s-1", "A", ttl_s=60)
    stored = await first.get_session("s-1")
    await first.aclose()

    second = await SqliteStore.open(path)
    try:
        assert await second.get_session("s-1") == stored
        assert stored is not None and stored.status is SessionStatus.COMPLETED
        log = await second.read("s-1")
        assert [(e.sequence, e.text_delta.text) for e in log] == [(1, "a"), (2, "b")]
        assert await second.load_checkpoint("s-1") == checkpoint
        assert await second.take_interrupt("s-1") == "stop"
        assert await second.list_subsession_refs("s-1") == [ref]
        assert await second.acquire_lease("s-1", "B", ttl_s=60) is False
        assert await second.append("s-1", [make_event("c")]) == 3
    finally:
        await second.aclose()


async def test_two_stores_on_one_file_share_one_log(tmp_path: Path) -> None:
    # Two instances stand in for two processes: separate connections and threads.
    path = str(tmp_path / "shared.db")
    stores = [await SqliteStore.open(path), await SqliteStore.open(path)]
    try:
        await stores[0].create_session(make_record())

        async def writer(store: SqliteStore, name: str) -> None:
            for i in range(25):
                await store.append("s-1", [make_event(f"{name}-{i}")])

        await asyncio.gather(writer(stores[0], "x"), writer(stores[1], "y"))
        log = await stores[1].read("s-1")
        assert [e.sequence for e in log] == list(range(1, 51))
        assert len({e.text_delta.text for e in log}) == 50
    finally:
        for store in stores:
            await store.aclose()


async def test_open_creates_parent_dirs_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "helix.db"
    store = await SqliteStore.open(str(path))
    await store.aclose()
    assert path.exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {"sessions", "events", "checkpoints", "interrupts", "subsession_refs"} <= tables


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "future.db")
    await (await SqliteStore.open(path)).aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        await SqliteStore.open(path)


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
