"""The listing index of each durable backend: used by the query, added to stores made
before it (SQLite and PostgreSQL migrations, Redis's first listing), and robust to a
session removed behind its back (Redis)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
import redis.asyncio as aioredis

from helix_transport.store import SessionQuery, SqliteStore
from helix_transport.store.postgres import PostgresStore
from helix_transport.store.postgres import _listing as _postgres_listing
from helix_transport.store.postgres import _schema as _postgres_schema
from helix_transport.store.redis import RedisStore
from helix_transport.store.sqlite import SCHEMA_VERSION, _listing
from helix_transport.testing.store_suite import make_record
from tests.store.old_schemas import insert_postgres

ALICE = SessionQuery(principal="alice", tenant="acme")


async def _ids(store: SqliteStore | PostgresStore | RedisStore) -> list[str]:
    return [r.session_id for r in (await store.query_sessions(ALICE, limit=100)).records]


async def _fill(store: SqliteStore | PostgresStore | RedisStore) -> None:
    for n in range(4):
        record = make_record(f"s-{n}", principal="alice", tenant="acme", created_at=float(n))
        await store.create_session(record)


async def test_sqlite_walks_the_index_and_a_version_4_file_gains_it(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    async with await SqliteStore.open(str(path)) as store:
        await _fill(store)
    with sqlite3.connect(path) as conn:  # as the helix-mesh before the index left it
        conn.execute("DROP INDEX sessions_by_owner")
        conn.execute("DROP TABLE answers")  # and what came after the index
        conn.execute("ALTER TABLE interrupts DROP COLUMN abort")
        for column in ("deadline", "budget_tokens", "budget_usd", "limit_exceeded"):
            conn.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
        conn.execute("UPDATE schema_version SET version = 4")
    async with await SqliteStore.open(str(path)) as store:
        assert await _ids(store) == ["s-3", "s-2", "s-1", "s-0"]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        plan = conn.execute(
            f"EXPLAIN QUERY PLAN SELECT * FROM sessions WHERE tenant = 'acme' AND "
            f"{_listing._OWNER} = 'alice' AND (created_at, session_id) < (9.0, 'x') "
            "ORDER BY created_at DESC, session_id DESC LIMIT 3"
        ).fetchall()
    detail = " ".join(str(row[-1]) for row in plan)
    assert "sessions_by_owner" in detail and "TEMP B-TREE" not in detail, detail


async def test_postgres_walks_the_index_and_a_version_4_schema_gains_it(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = f"helix_test_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(postgres_dsn, timeout=5)
    try:
        with monkeypatch.context() as before:
            before.setattr(_postgres_schema, "_MIGRATIONS", _postgres_schema._MIGRATIONS[:4])
            before.setattr(_postgres_schema, "SCHEMA_VERSION", 4)
            async with await PostgresStore.open(postgres_dsn, schema=schema):
                pass
        for n in range(4):  # as the helix-mesh of that version wrote them
            record = make_record(f"s-{n}", principal="alice", tenant="acme", created_at=float(n))
            await insert_postgres(admin, schema, record)
        async with await PostgresStore.open(postgres_dsn, schema=schema) as store:
            assert await _ids(store) == ["s-3", "s-2", "s-1", "s-0"]
        sql, args = _postgres_listing.query_sql(
            SessionQuery(principal="alice", tenant="acme", after=(9.0, "x")), 3
        )
        async with admin.transaction():
            await admin.execute("SET LOCAL enable_seqscan = off")  # four rows: it would scan
            plan = await admin.fetch("EXPLAIN " + sql.replace("{s}", f'"{schema}"'), *args)
        text = "\n".join(row[0] for row in plan)
        assert "sessions_by_owner" in text and "Sort" not in text, text
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


@pytest.fixture
async def redis_prefix(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    client = aioredis.Redis.from_url(redis_url)
    prefix = f"helix-test-{uuid.uuid4().hex}"
    yield client, prefix
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_redis_indexes_a_store_from_before_the_index_once(
    redis_url: str, redis_prefix: tuple[aioredis.Redis, str]
) -> None:
    client, prefix = redis_prefix
    async with await RedisStore.from_url(redis_url, prefix=prefix) as store:
        await _fill(store)
    # What a store written before the index holds: the sessions, no owner sets.
    owned = [key async for key in client.scan_iter(match=f"{prefix}:owned*")]
    assert owned
    await client.delete(*owned)
    async with await RedisStore.from_url(redis_url, prefix=prefix) as store:
        assert await _ids(store) == ["s-3", "s-2", "s-1", "s-0"]
    assert await client.exists(f"{prefix}:owned-indexed")


async def test_redis_skips_and_forgets_a_session_removed_behind_its_back(
    redis_url: str, redis_prefix: tuple[aioredis.Redis, str]
) -> None:
    client, prefix = redis_prefix
    async with await RedisStore.from_url(redis_url, prefix=prefix) as store:
        await _fill(store)
        await client.delete(f"{prefix}:session:s-2")  # as an expiry would
        assert await _ids(store) == ["s-3", "s-1", "s-0"]
        (owned,) = [key async for key in client.scan_iter(match=f"{prefix}:owned:*")]
        assert await client.zcard(owned) == 3
