"""``PostgresStore`` against the conformance suite, plus what only a server can show.

The server comes from ``HELIX_TEST_POSTGRES_DSN``; unset, the tests try
``postgresql://postgres@127.0.0.1:5432/test`` and then the same as ``root`` (the
local cluster ``make services-up`` starts trusts both). Each test gets its own
random schema, dropped afterwards. When no server answers, the tests skip, except
under ``CI=true``, where they fail: CI must never go green without running them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg  # type: ignore[import-untyped]
import pytest

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    SequenceConflict,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from helix_transport.store import (
    Checkpoint,
    Interrupt,
    SessionUpdate,
    Store,
)
from helix_transport.store.postgres import SCHEMA_VERSION, PostgresStore
from helix_transport.store.postgres import _schema as _postgres_schema
from helix_transport.testing.store_suite import (
    DurableStoreConformance,
    Reopen,
    make_command,
    make_event,
    make_record,
)
from tests.store.old_schemas import insert_postgres


@pytest.fixture
async def schema(postgres_dsn: str) -> AsyncIterator[str]:
    """A fresh schema name; the schema is dropped after the test."""
    name = f"helix_test_{uuid.uuid4().hex[:16]}"
    yield name
    conn = await asyncpg.connect(postgres_dsn, timeout=5)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def admin(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection for looking behind the store's back."""
    conn = await asyncpg.connect(postgres_dsn, timeout=5)
    yield conn
    await conn.close()


class TestPostgresStore(DurableStoreConformance):
    @pytest.fixture
    async def store(self, postgres_dsn: str, schema: str) -> AsyncIterator[Store]:
        store = await PostgresStore.open(postgres_dsn, schema=schema)
        yield store
        await store.aclose()

    @pytest.fixture
    def reopen(self, postgres_dsn: str, schema: str) -> Reopen:
        return lambda: PostgresStore.open(postgres_dsn, schema=schema)


async def _versions(admin: asyncpg.Connection, schema: str) -> list[int]:
    rows = await admin.fetch(f'SELECT version FROM "{schema}".schema_migrations ORDER BY 1')
    return [row["version"] for row in rows]


async def test_satisfies_the_protocol(postgres_dsn: str, schema: str) -> None:
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        assert isinstance(store, Store)
        assert store.channel == f"{schema}_events"


async def test_migrations_are_idempotent(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    async with await PostgresStore.open(postgres_dsn, schema=schema) as first:
        created, _ = await first.create_session(make_record())
    async with await PostgresStore.open(postgres_dsn, schema=schema) as second:
        await second.migrate()
        assert await second.get_session("s-1") == created
    assert await _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))
    tables = await admin.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
    )
    assert {row["table_name"] for row in tables} == {
        "schema_migrations",
        "sessions",
        "events",
        "checkpoints",
        "interrupts",
        "subsession_refs",
        "child_commands",
        "tombstones",
        "answers",
    }


async def test_concurrent_open_of_a_fresh_schema_migrates_once(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    # Without the advisory lock, racing CREATE SCHEMA / CREATE TABLE fail on
    # Postgres's catalog unique indexes and migrations would be recorded twice.
    results = await asyncio.gather(
        *(PostgresStore.open(postgres_dsn, schema=schema, max_size=2) for _ in range(5)),
        return_exceptions=True,
    )
    stores = [r for r in results if isinstance(r, PostgresStore)]
    try:
        assert stores == results, [r for r in results if not isinstance(r, PostgresStore)]
        await stores[0].create_session(make_record())
        assert all([await s.get_session("s-1") is not None for s in stores])
    finally:
        for store in stores:
            await store.aclose()
    assert await _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))


async def test_newer_schema_is_refused(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    await (await PostgresStore.open(postgres_dsn, schema=schema)).aclose()
    await admin.execute(f'INSERT INTO "{schema}".schema_migrations (version) VALUES (99)')
    with pytest.raises(StoreError, match="schema version 99"):
        await PostgresStore.open(postgres_dsn, schema=schema)


async def test_a_schema_at_version_2_gains_the_outbox(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A schema migrated by the helix-mesh before the outbox, then opened by this one.
    with monkeypatch.context() as before:
        before.setattr(_postgres_schema, "_MIGRATIONS", _postgres_schema._MIGRATIONS[:2])
        before.setattr(_postgres_schema, "SCHEMA_VERSION", 2)
        async with await PostgresStore.open(postgres_dsn, schema=schema):
            pass
    created = make_record()
    await insert_postgres(admin, schema, created)
    assert await _versions(admin, schema) == [1, 2]
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        assert await store.get_session("s-1") == created
        command = make_command("s-1", "c-1")
        await store.put_commands([command])
        assert await store.list_commands() == [command]
    assert await _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))


async def test_a_schema_at_version_5_gains_answers_and_aborts(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A schema migrated by the helix-mesh before people's input, with an interrupt
    # pending: it is a plain one.
    with monkeypatch.context() as before:
        before.setattr(_postgres_schema, "_MIGRATIONS", _postgres_schema._MIGRATIONS[:5])
        before.setattr(_postgres_schema, "SCHEMA_VERSION", 5)
        async with await PostgresStore.open(postgres_dsn, schema=schema):
            pass
    assert await _versions(admin, schema) == [1, 2, 3, 4, 5]
    await admin.execute(f'INSERT INTO "{schema}".interrupts VALUES ($1, $2)', "s-1", "stop")
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        assert await store.take_interrupt("s-1") == Interrupt("stop", abort=False)
        await store.set_interrupt("s-1", "abort", abort=True)
        assert await store.put_answer("s-1", "call-1", "{}") == ("{}", True)
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        assert await store.take_interrupt("s-1") == Interrupt("abort", abort=True)
        assert await store.list_answers("s-1") == {"call-1": "{}"}
    assert await _versions(admin, schema) == list(range(1, SCHEMA_VERSION + 1))


async def test_a_batch_of_commands_is_stored_whole_or_not_at_all(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        await store.put_commands([make_command("p", "before")])
        # A command the database refuses, after others in the batch went in.
        await admin.execute(
            f"""CREATE FUNCTION "{schema}".poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.child_session_id = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER poison BEFORE INSERT ON "{schema}".child_commands
            FOR EACH ROW EXECUTE FUNCTION "{schema}".poison();"""
        )
        batch = [make_command("p", "c-1"), make_command("p", "c-2"), make_command("p", "poison")]
        with pytest.raises(StoreError, match="poisoned"):
            await store.put_commands(batch)
        assert [c.child_session_id for c in await store.list_commands()] == ["before"]


def _refused_port() -> int:
    # Bound but never listening: connecting is refused at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_refused_dsn_raises_unavailable_quickly() -> None:
    port = _refused_port()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as error:
        await PostgresStore.open(f"postgresql://postgres@127.0.0.1:{port}/test")
    assert time.monotonic() - started < 5
    assert f"127.0.0.1:{port}" in str(error.value)
    assert error.value.retryable is True


@contextlib.asynccontextmanager
async def _silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts connections and never answers; yields its port."""
    writers: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_silent_server_times_out_as_unavailable() -> None:
    async with _silent_server() as port:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}.*timed out"):
            await PostgresStore.open(
                f"postgresql://postgres@127.0.0.1:{port}/test", connect_timeout_s=0.5
            )
        assert time.monotonic() - started < 3


async def test_wrong_database_raises_unavailable(postgres_dsn: str) -> None:
    dsn = postgres_dsn.rsplit("/", 1)[0] + "/helix_no_such_database"
    with pytest.raises(StoreUnavailable, match="helix_no_such_database"):
        await PostgresStore.open(dsn)


@pytest.mark.parametrize("dsn", ["http://127.0.0.1/test", "postgresql://127.0.0.1:abc/test"])
async def test_malformed_dsn_is_a_usage_error(dsn: str) -> None:
    with pytest.raises(UsageError, match="invalid PostgreSQL DSN"):
        await PostgresStore.open(dsn)


@pytest.mark.parametrize("name", ["Helix", "1abc", "a-b", 'x"; DROP', "a" * 57])
async def test_bad_schema_name_is_a_usage_error(name: str) -> None:
    # Refused before connecting: this DSN would not answer.
    with pytest.raises(UsageError, match="lowercase identifier"):
        await PostgresStore.open(f"postgresql://127.0.0.1:{_refused_port()}/x", schema=name)


async def test_injected_pool_is_not_closed(postgres_dsn: str, schema: str) -> None:
    pool = await asyncpg.create_pool(postgres_dsn, min_size=1, max_size=2)
    try:
        store = PostgresStore(pool, schema=schema)
        await store.migrate()
        await store.create_session(make_record())
        await store.aclose()
        await store.aclose()
        assert not pool.is_closing()
        assert await pool.fetchval(f'SELECT count(*) FROM "{schema}".sessions') == 1
        with pytest.raises(UsageError, match="closed"):
            await store.get_session("s-1")
        async with PostgresStore(pool, schema=schema) as again:
            assert await again.get_session("s-1") is not None
        assert not pool.is_closing()
    finally:
        await pool.close()


async def test_owned_pool_is_closed(postgres_dsn: str, schema: str) -> None:
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        pool = store._pool
    assert pool.is_closing()
    with pytest.raises(UsageError, match="closed"):
        await store.get_session("s-1")


async def test_exhausted_pool_raises_unavailable(postgres_dsn: str, schema: str) -> None:
    pool = await asyncpg.create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        store = PostgresStore(pool, schema=schema, acquire_timeout_s=0.2)
        await store.migrate()
        async with pool.acquire():
            with pytest.raises(StoreUnavailable, match=r"became free within 0\.2s"):
                await store.get_session("s-1")
        assert await store.get_session("s-1") is None
    finally:
        await pool.close()


async def test_lost_connection_raises_unavailable_then_recovers(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    async with await PostgresStore.open(
        postgres_dsn, schema=schema, min_size=1, max_size=1
    ) as store:
        await store.create_session(make_record())
        pid = await store._pool.fetchval("SELECT pg_backend_pid()")

        async def kill_soon() -> None:
            await asyncio.sleep(0.3)
            await admin.execute("SELECT pg_terminate_backend($1)", pid)

        # Hold the session's row lock from outside so the append is mid-flight when
        # its backend dies.
        async with admin.transaction():
            await admin.execute(
                f'SELECT 1 FROM "{schema}".sessions WHERE session_id = $1 FOR UPDATE', "s-1"
            )
            killer = asyncio.create_task(kill_soon())
            event = make_event("lost")
            with pytest.raises(StoreUnavailable) as error:
                await store.append("s-1", [event], expected_sequence=0)
            await killer
        assert isinstance(error.value.__cause__, asyncpg.PostgresConnectionError)
        assert event.sequence == 0
        assert await store.append("s-1", [make_event("after")], expected_sequence=0) == 1


async def test_cancelled_append_stores_nothing_and_returns_its_connection(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    async with await PostgresStore.open(
        postgres_dsn, schema=schema, min_size=1, max_size=1
    ) as store:
        await store.create_session(make_record())
        event = make_event("cancelled")
        async with admin.transaction():
            # The append blocks on the row lock held here, and is cancelled mid-flight.
            await admin.execute(
                f'SELECT 1 FROM "{schema}".sessions WHERE session_id = $1 FOR UPDATE', "s-1"
            )
            task = asyncio.create_task(store.append("s-1", [event], expected_sequence=0))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert event.sequence == 0
        # With max_size=1 this only works if the cancelled call gave its connection back.
        async with asyncio.timeout(5):
            assert await store.append("s-1", [make_event("next")], expected_sequence=0) == 1
        assert [e.text_delta.text for e in await store.read("s-1")] == ["next"]


async def test_checkpoint_round_trips_nul_escapes_and_exact_numbers(
    postgres_dsn: str, schema: str
) -> None:
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        checkpoint = Checkpoint(
            session_id="s-1",
            step=1,
            messages=[{"role": "tool", "content": "nul \x00 byte", "n": 1.0000000000000002}],
            state={"big": 2**70, "float": 1e-300},
        )
        await store.save_checkpoint(checkpoint)
        assert await store.load_checkpoint("s-1") == checkpoint


async def test_update_session_matches_session_update_apply(postgres_dsn: str, schema: str) -> None:
    # update_session restates SessionUpdate.apply in SQL; this keeps the two in step.
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        before, _ = await store.create_session(make_record(finished_at=5.0))
        update = SessionUpdate(status=SessionStatus.FAILED, error="x", step_count=4)
        after = await store.update_session("s-1", update)
        assert after is not None
        assert after == update.apply(before, now=after.updated_at)
        assert after.finished_at == after.updated_at  # this end, not an earlier turn's


async def test_lease_expiry_uses_the_database_clock(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        await store.create_session(make_record())
        db_before = await admin.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
        assert await store.acquire_lease("s-1", "A", ttl_s=60)
        db_after = await admin.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
        held = await store.get_session("s-1")
        assert held is not None
        assert db_before + 60 <= held.lease_expires_at <= db_after + 60
        with pytest.raises(SessionNotFound):
            await store.acquire_lease("s-nope", "A", ttl_s=1)
        await store.release_lease("s-nope", "A")  # a no-op


async def test_append_notifies_after_commit(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    received: asyncio.Queue[str] = asyncio.Queue()
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        await admin.add_listener(store.channel, lambda *args: received.put_nowait(args[3]))
        await store.create_session(make_record())
        await store.append("s-1", [make_event("a"), make_event("b")], expected_sequence=0)
        async with asyncio.timeout(5):
            assert await received.get() == "s-1"
        with pytest.raises(SequenceConflict):  # rolled back, so no NOTIFY
            await store.append("s-1", [make_event("c")], expected_sequence=0)
        await store.append("s-1", [], expected_sequence=2)  # nothing appended, nothing to announce
        await asyncio.sleep(0.2)
        assert received.empty()


async def test_schemas_are_isolated(postgres_dsn: str, schema: str) -> None:
    other = f"{schema}_b"
    try:
        async with (
            await PostgresStore.open(postgres_dsn, schema=schema) as a,
            await PostgresStore.open(postgres_dsn, schema=other) as b,
        ):
            await a.create_session(make_record())
            assert await b.get_session("s-1") is None
            await b.create_session(make_record())
            await a.append("s-1", [make_event("a")], expected_sequence=0)
            assert await b.read("s-1") == []
            await a.put_commands([make_command("s-1", "c-1")])
            assert await b.list_commands() == []
    finally:
        conn = await asyncpg.connect(postgres_dsn, timeout=5)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{other}" CASCADE')
        finally:
            await conn.close()


async def test_a_lost_listen_connection_is_replaced(
    postgres_dsn: str, schema: str, admin: asyncpg.Connection
) -> None:
    # The server ends the LISTEN connection (a restart, a failover, an idle cutoff).
    # Before, every later wait raised asyncpg's InterfaceError until the process
    # restarted, and each follower of another replica's session spun on the store.
    async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
        await store.create_session(make_record())
        assert not await store.wait_for_events("s-1", from_sequence=0, timeout_s=0.1)
        pid = await store._notifier._listener.fetchval("SELECT pg_backend_pid()")
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        await asyncio.sleep(0.3)
        assert not await store.wait_for_events("s-1", from_sequence=0, timeout_s=0.1)
        waiting = asyncio.ensure_future(store.wait_for_events("s-1", from_sequence=0, timeout_s=10))
        await asyncio.sleep(0.2)  # listening again
        started = time.monotonic()
        async with await PostgresStore.open(postgres_dsn, schema=schema) as other:
            await other.append("s-1", [make_event("a")], expected_sequence=0)
        assert await waiting
        assert time.monotonic() - started < 5  # woken by the notice, not the timeout
