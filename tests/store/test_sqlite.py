"""``SqliteStore`` against the conformance suite, plus what only a file can show."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    SequenceConflict,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import (
    Interrupt,
    SqliteStore,
    Store,
    SubSessionRef,
)
from helix_transport.store.sqlite import SCHEMA_VERSION, _log, _schema, _worker
from helix_transport.testing.store_suite import (
    DurableStoreConformance,
    Reopen,
    make_command,
    make_record,
)
from tests.helpers import assert_eventually
from tests.store.old_schemas import insert_sqlite


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
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert {
        "sessions",
        "events",
        "checkpoints",
        "interrupts",
        "subsession_refs",
        "child_commands",
    } <= tables


async def test_a_version_1_file_is_upgraded_and_its_sessions_are_anonymous(
    tmp_path: Path,
) -> None:
    """A file written before sessions had owners: opening it adds the columns, keeps
    every session, and those sessions belong to nobody but ``anonymous`` ('')."""
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        for statement in _schema._SCHEMA.split(";"):
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
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


async def test_a_version_2_file_gains_the_outbox(tmp_path: Path) -> None:
    """A file written before the outbox: opening it adds the table and keeps the rest."""
    path = tmp_path / "v2.db"
    with sqlite3.connect(path) as conn:
        for statement in [*_schema._SCHEMA.split(";"), *_schema._UPGRADES[2]]:
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version) VALUES (2)")
        record = make_record("before", principal="bob", tenant="acme")
        insert_sqlite(conn, record)
    command = make_command("before", "c-1")
    for _ in range(2):  # upgraded once, then opened as it is
        async with await SqliteStore.open(str(path)) as store:
            assert await store.get_session("before") == record
            await store.put_commands([command])
            assert await store.list_commands() == [command]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


async def test_a_version_5_file_gains_answers_and_aborts(tmp_path: Path) -> None:
    """A file written before people's input: its pending interrupt is a plain one."""
    path = tmp_path / "v5.db"
    upgrades = [statement for version in range(2, 6) for statement in _schema._UPGRADES[version]]
    with sqlite3.connect(path) as conn:
        for statement in [*_schema._SCHEMA.split(";"), *upgrades]:
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version) VALUES (5)")
        conn.execute("INSERT INTO interrupts (session_id, reason) VALUES ('s-1', 'stop')")
    async with await SqliteStore.open(str(path)) as store:
        assert await store.take_interrupt("s-1") == Interrupt("stop", abort=False)
        await store.set_interrupt("s-1", "abort", abort=True)
        assert await store.put_answer("s-1", "call-1", "{}") == ("{}", True)
    async with await SqliteStore.open(str(path)) as store:  # opened as it is now
        assert await store.take_interrupt("s-1") == Interrupt("abort", abort=True)
        assert await store.list_answers("s-1") == {"call-1": "{}"}
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


async def test_a_batch_of_commands_is_stored_whole_or_not_at_all(tmp_path: Path) -> None:
    path = str(tmp_path / "helix.db")
    async with await SqliteStore.open(path) as store:
        await store.put_commands([make_command("p", "before")])
    with sqlite3.connect(path) as conn:  # a command SQLite refuses, after others went in
        conn.execute(
            "CREATE TRIGGER poison BEFORE INSERT ON child_commands "
            "WHEN NEW.child_session_id = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
        )
    async with await SqliteStore.open(path) as store:
        batch = [make_command("p", "c-1"), make_command("p", "c-2"), make_command("p", "poison")]
        with pytest.raises(StoreError, match="poisoned"):
            await store.put_commands(batch)
        assert [c.child_session_id for c in await store.list_commands()] == ["before"]


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
    # _schema reads the version off the sqlite3 module itself
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 24, 0))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.24.0")
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


async def test_calls_queued_behind_a_busy_worker_come_back_in_one_wake_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SqliteStore.open(str(tmp_path / "batch.db"))
    deliveries: list[int] = []
    deliver = _worker._deliver

    def counting(batch: list[Any]) -> None:
        deliveries.append(len(batch))
        deliver(batch)

    monkeypatch.setattr(_worker, "_deliver", counting)
    release = threading.Event()
    blocker = asyncio.ensure_future(store._worker.run(release.wait))
    records = [make_record(f"s-{i}") for i in range(50)]
    created = asyncio.gather(*(store.create_session(r) for r in records))
    await asyncio.sleep(0.05)  # every create is queued behind the blocker
    release.set()
    assert await blocker is True
    assert [c for _, c in await created] == [True] * 50
    # One wake-up for the blocker's batch and at most one more for the 50 behind it.
    assert sum(deliveries) == 51 and len(deliveries) <= 2
    await store.aclose()


async def test_a_cancelled_caller_s_write_still_commits_whole(tmp_path: Path) -> None:
    store = await SqliteStore.open(str(tmp_path / "cancel.db"))
    release = threading.Event()
    blocker = asyncio.ensure_future(store._worker.run(release.wait))
    create = asyncio.ensure_future(store.create_session(make_record("s-cancelled")))
    await asyncio.sleep(0.01)
    create.cancel()
    release.set()
    await blocker
    with pytest.raises(asyncio.CancelledError):
        await create
    stored = await store.get_session("s-cancelled")
    assert stored is not None and stored.session_id == "s-cancelled"
    await store.aclose()


def test_a_store_never_closed_does_not_hold_up_interpreter_exit(tmp_path: Path) -> None:
    script = (
        "import asyncio\n"
        "from helix_transport.store import SqliteStore\n"
        "async def main():\n"
        f"    store = await SqliteStore.open({str(tmp_path / 'open.db')!r})\n"
        "    await store.get_session('x')\n"
        "asyncio.run(main())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], timeout=30, capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


async def test_a_long_queue_is_delivered_in_bounded_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SqliteStore.open(str(tmp_path / "bounded.db"))
    deliveries: list[int] = []
    deliver = _worker._deliver

    def counted(batch: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
        deliveries.append(len(batch))
        deliver(batch)

    monkeypatch.setattr(_worker, "_deliver", counted)
    release = threading.Event()
    blocker = asyncio.ensure_future(store._worker.run(release.wait))
    reads = asyncio.gather(*(store.get_session(f"s-{i}") for i in range(300)))
    await asyncio.sleep(0.05)
    release.set()
    await blocker
    assert await reads == [None] * 300
    assert sum(deliveries) == 301 and max(deliveries) <= _worker._BATCH_MAX
    await store.aclose()


@pytest.mark.parametrize("parameter_limit", [999, None])
async def test_a_large_append_is_split_to_fit_the_library_s_parameter_limit(
    tmp_path: Path, parameter_limit: int | None
) -> None:
    store = await SqliteStore.open(str(tmp_path / "limit.db"))
    if parameter_limit is not None:  # the limit of SQLite builds before 3.32
        limit = sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER
        await store._worker.run(lambda: store._conn.setlimit(limit, parameter_limit))
    await store.create_session(make_record("s-big"))
    events = [pb.StreamEvent(text_delta=pb.TextDelta(text=str(i))) for i in range(12_001)]
    assert await store.append("s-big", events, expected_sequence=0) == 12_001
    read: list[pb.StreamEvent] = []
    while len(read) < 12_001:
        batch = await store.read("s-big", from_sequence=len(read))
        assert batch
        read += batch
    assert [e.text_delta.text for e in read] == [str(i) for i in range(12_001)]
    assert [e.sequence for e in read] == list(range(1, 12_002))
    await store.aclose()


async def test_the_worker_is_starved_only_while_its_thread_is_not_running() -> None:
    """A call running in C without the GIL (SQLite's work on a large statement) is
    progress: the loop sleeps for the worker only when its thread used no CPU since
    the last check (without its clock, every check during a long call slept)."""
    worker = _worker.Worker()
    release = threading.Event()
    blocked = asyncio.ensure_future(worker.run(release.wait))  # waits: no CPU
    await asyncio.sleep(0.01)
    worker._starved()  # the clock's first reading
    await asyncio.sleep(0.01)
    assert worker._starved()
    release.set()
    await blocked
    data = b"x" * (4 << 20)  # hashed without the GIL, the thread busy all along

    def work() -> None:
        until = time.perf_counter() + 0.5
        while time.perf_counter() < until:
            hashlib.sha256(data)

    busy = asyncio.ensure_future(worker.run(work))
    checks = []
    while not busy.done():  # no call starts or ends: by that alone, starved throughout
        await asyncio.sleep(0.01)
        checks.append(worker._starved())
    # Without the clock, 16 of 17 such checks said starved; with it, none of 24.
    assert worker._clock is None or sum(checks[1:]) <= len(checks[1:]) // 2, checks
    worker.stop()


async def test_a_loop_that_never_idles_does_not_starve_the_worker(tmp_path: Path) -> None:
    # The loop polls between 2 ms slices of pure Python work and never sleeps: the
    # worker's every wait for the GIL starts over, and without the loop's hand-off
    # appends here took seconds, up to 40 s.
    store = await SqliteStore.open(str(tmp_path / "busy.db"))
    await store.create_session(make_record("s-busy"))
    busy = True

    async def hog() -> None:
        while busy:
            until = time.perf_counter() + 0.002
            while time.perf_counter() < until:
                pass
            await asyncio.sleep(0)

    hogging = asyncio.ensure_future(hog())
    try:
        for n in range(10):
            events = [pb.StreamEvent(text_delta=pb.TextDelta(text="x")) for _ in range(100)]
            append = store.append("s-busy", events, expected_sequence=100 * n)
            assert await asyncio.wait_for(append, timeout=2.0) == 100 * (n + 1)
    finally:
        busy = False
        await hogging
        await store.aclose()


async def test_appends_batched_together_fail_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker transaction takes many sessions' appends together; a stale fence, a
    missing session or a session appearing twice fails (or orders) only its own."""
    tried: list[int] = []  # rows sent through the view, per batch
    through_view = _log._insert_through_view

    def counted_through_view(conn: sqlite3.Connection, chunks: list[list[object]]) -> None:
        if chunks:
            tried.append(sum(len(c) // 3 for c in chunks))
        through_view(conn, chunks)

    monkeypatch.setattr(_log, "_insert_through_view", counted_through_view)
    one_by_one: list[str] = []
    append_rows = _log._append_rows

    def counted_append_rows(conn: sqlite3.Connection, sid: str, *rest: Any) -> int:
        one_by_one.append(sid)
        return append_rows(conn, sid, *rest)

    monkeypatch.setattr(_log, "_append_rows", counted_append_rows)
    store = await SqliteStore.open(str(tmp_path / "together.db"))
    for i in range(6):
        await store.create_session(make_record(f"s-{i}"))
    await store.append(
        "s-5", [pb.StreamEvent(text_delta=pb.TextDelta(text="first"))], expected_sequence=0
    )

    def event(text: str) -> pb.StreamEvent:
        return pb.StreamEvent(text_delta=pb.TextDelta(text=text))

    # All plain: in together, none one by one.
    one_by_one.clear()
    plain = [store.append(f"s-{i}", [event("0")], expected_sequence=0) for i in (1, 2, 3)]
    assert await asyncio.gather(*plain) == [1, 1, 1]
    assert tried[-1] == 3 and one_by_one == []
    for i in (1, 2, 3):
        assert (await store.get_session(f"s-{i}")).last_sequence == 1  # type: ignore[union-attr]
    # A larger append goes one by one (the view's trigger runs per row).
    many = [event(str(n)) for n in range(_log._VIEW_MAX_EVENTS + 1)]
    assert await store.append("s-1", many, expected_sequence=1) == len(many) + 1
    assert one_by_one == ["s-1"]

    ends = {0: 0, 1: 1 + len(many), 2: 1, 3: 1}
    release = threading.Event()
    blocker = asyncio.ensure_future(store._worker.run(release.wait))
    stale = event("stale")
    appends = asyncio.gather(
        *(store.append(f"s-{i}", [event(f"{i}a"), event(f"{i}b")], expected_sequence=ends[i])
          for i in range(4)),
        store.append("s-5", [stale], expected_sequence=0),  # its log is at 1
        store.append("nobody", [event("x")], expected_sequence=0),
        store.append("s-4", [event("4a")], expected_sequence=0),
        store.append("s-4", [event("4b")], expected_sequence=1),
        return_exceptions=True,
    )  # fmt: skip
    await asyncio.sleep(0.05)  # all queued behind the blocker: one batch
    tried.clear()
    one_by_one.clear()
    release.set()
    await blocker
    results = await appends
    # Tried together (the six that are their session's only one: 4 x 2 + 1 + 1 events),
    # then one by one.
    assert tried == [10] and sorted(one_by_one) == sorted(
        ["s-0", "s-1", "s-2", "s-3", "s-5", "nobody", "s-4", "s-4"]
    )
    assert results[:4] == [2, 3 + len(many), 3, 3] and results[6:] == [1, 2]
    assert isinstance(results[4], SequenceConflict) and stale.sequence == 0
    assert isinstance(results[5], SessionNotFound)
    for i in range(4):
        texts = [e.text_delta.text for e in await store.read(f"s-{i}")]
        before = ["0"] * int(i > 0) + [e.text_delta.text for e in many] * int(i == 1)
        assert texts == [*before, f"{i}a", f"{i}b"]
        assert (await store.get_session(f"s-{i}")).last_sequence == len(texts)  # type: ignore[union-attr]
    assert [e.text_delta.text for e in await store.read("s-4")] == ["4a", "4b"]
    assert [e.text_delta.text for e in await store.read("s-5")] == ["first"]
    await store.aclose()


async def test_the_log_is_checkpointed_off_the_write_path(tmp_path: Path) -> None:
    """The store's connection never checkpoints in a commit; its checkpointer thread
    copies the log into the database file, and stops when the store closes."""
    path = tmp_path / "wal.db"
    store = await SqliteStore.open(str(path))
    checkpointer = store._checkpointer
    assert checkpointer is not None
    autocheckpoint = await store._worker.run(
        lambda: store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    )
    assert autocheckpoint == 0
    await store.create_session(make_record("s-1"))
    before = path.stat().st_size
    for n in range(20):
        events = [pb.StreamEvent(text_delta=pb.TextDelta(text="x" * 500)) for _ in range(50)]
        await store.append("s-1", events, expected_sequence=50 * n)

    # The events are in the log; only a checkpoint writes their pages into the file
    # itself, and nothing but the checkpointer thread checkpoints here.
    async def copied_in() -> bool:
        return path.stat().st_size >= before + 400_000

    await assert_eventually(copied_in, timeout_s=5.0)
    await store.aclose()
    assert not checkpointer._thread.is_alive()


async def test_an_in_memory_database_has_no_checkpointer() -> None:
    store = await SqliteStore.open(":memory:")
    assert store._checkpointer is None
    await store.aclose()


async def test_a_ref_written_with_a_stream_cursor_reads_without_it(tmp_path: Path) -> None:
    # Refs of remote children once carried a cursor (remote_* columns) nothing read:
    # rows written then still read, the cursor ignored, and a rewrite leaves them be.
    path = str(tmp_path / "helix.db")
    ref = SubSessionRef(
        parent_session_id="p", child_session_id="c", agent_type="a", tool_call_id="t"
    )
    store = await SqliteStore.open(path)
    await store.put_subsession_ref(ref)
    await store.aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE subsession_refs SET remote_stream_id = 'c', remote_last_sequence = 9")
    store = await SqliteStore.open(path)
    try:
        assert await store.list_subsession_refs("p") == [ref]
        ended = dataclasses.replace(ref, status=SessionStatus.COMPLETED, output_json="{}")
        await store.put_subsession_ref(ended)
        assert await store.get_subsession_ref("p", "c") == ended
    finally:
        await store.aclose()
