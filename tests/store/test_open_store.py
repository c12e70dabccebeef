"""``open_store`` URL parsing and ``store_url_from_env``."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
import redis.asyncio as aioredis

from helix_transport._exceptions import StoreUnavailable, UsageError
from helix_transport.store import (
    MemoryStore,
    PostgresStore,
    RedisStore,
    SqliteStore,
    open_store,
    store_url_from_env,
)
from helix_transport.testing.processes import free_port
from helix_transport.testing.store_suite import make_record


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


@pytest.mark.parametrize("scheme", ["redis", "postgresql"])
async def test_unreachable_network_store_fails_at_open(scheme: str) -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await open_store(f"{scheme}://127.0.0.1:{port}/0")
    assert time.monotonic() - started < 10


async def test_redis_url_prefix_namespaces_keys(redis_url: str) -> None:
    prefix = f"helix-test-{uuid.uuid4().hex}"
    store = await open_store(f"{redis_url}?prefix={prefix}")
    try:
        assert isinstance(store, RedisStore)
        await store.create_session(make_record("s1"))
        client = aioredis.Redis.from_url(redis_url)
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        for key in keys:
            await client.delete(key)
        await client.aclose()
        assert keys
    finally:
        await store.aclose()


async def test_postgres_url_schema_is_used(postgres_dsn: str) -> None:
    schema = f"helix_test_{uuid.uuid4().hex[:16]}"
    store = await open_store(f"{postgres_dsn}?schema={schema}")
    conn = await asyncpg.connect(postgres_dsn)
    try:
        assert isinstance(store, PostgresStore)
        await store.create_session(make_record("s1"))
        count = await conn.fetchval(f'SELECT count(*) FROM "{schema}".sessions')
        assert count == 1
    finally:
        await store.aclose()
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


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


@pytest.mark.parametrize(
    ("query", "message"),
    [("prefx=a", "does not accept"), ("socket_timeout=abc", "socket_timeout")],
)
async def test_a_redis_url_option_redis_cannot_use_is_a_usage_error(
    redis_url: str, query: str, message: str
) -> None:
    # A typo in an option went to redis-py as a keyword: a TypeError traceback at start.
    with pytest.raises(UsageError, match=message):
        await open_store(f"{redis_url}?{query}")


async def test_a_redis_error_never_shows_the_password() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(StoreUnavailable) as error:
        await open_store(f"redis://helix:s3cret@127.0.0.1:{port}/0")
    assert "s3cret" not in str(error.value)
    assert f"redis://helix:***@127.0.0.1:{port}/0" in str(error.value)
