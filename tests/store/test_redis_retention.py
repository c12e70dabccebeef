"""Retention in Redis, behind the store's back: every key of an expired session goes at
once, and sessions that ended before the index existed are swept too."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from helix_transport._events import SessionStatus
from helix_transport.store import Checkpoint, SessionUpdate, SubSessionRef, sweep
from helix_transport.store.redis import RedisStore
from helix_transport.testing.store_suite import make_command, make_event, make_record


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, socket_timeout=5)
    yield client
    await client.aclose()


@pytest.fixture
async def prefix(client: aioredis.Redis) -> AsyncIterator[str]:
    prefix = f"helix-test-{uuid.uuid4().hex}"
    yield prefix
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
    if keys:
        await client.delete(*keys)


@pytest.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[RedisStore]:
    store = await RedisStore.from_url(redis_url, prefix=prefix)
    yield store
    await store.aclose()


async def _keys(client: aioredis.Redis, prefix: str) -> set[str]:
    return {key.decode() async for key in client.scan_iter(match=f"{prefix}:*", count=500)}


async def test_every_key_of_an_expired_session_goes(
    store: RedisStore, client: aioredis.Redis, prefix: str
) -> None:
    await store.create_session(make_record("p"))
    await store.append("p", [make_event("a", session_id="p")], expected_sequence=0)
    await store.save_checkpoint(Checkpoint(session_id="p", step=1, messages=[], last_sequence=1))
    await store.set_interrupt("p", "stop", abort=True)
    await store.put_answer("p", "call-1", '{"approved": true, "reason": ""}')
    await store.put_subsession_ref(
        SubSessionRef(parent_session_id="p", child_session_id="c", agent_type="a", tool_call_id="t")
    )
    await store.put_commands([make_command("p", "c")])
    await store.update_session("p", SessionUpdate(status=SessionStatus.COMPLETED))
    before = await _keys(client, prefix)
    assert f"{prefix}:events:p" in before and f"{prefix}:refs-order:p" in before
    assert {f"{prefix}:answers:p", f"{prefix}:interrupt-abort:p"} <= before

    report = await sweep(store, retention=timedelta(seconds=1), now=time.time() + 2)

    assert report.expired == ["p"]
    # What is left: the tombstone (which Redis expires) and nothing of the session.
    assert await _keys(client, prefix) == {
        f"{prefix}:expired:p",
        f"{prefix}:status:finished-at:indexed",
    }
    ttl_ms = await client.pttl(f"{prefix}:expired:p")
    assert 0 < ttl_ms <= 1000


async def test_sessions_that_ended_before_the_index_are_swept(
    store: RedisStore, client: aioredis.Redis, prefix: str
) -> None:
    for session_id in ("before", "running"):
        await store.create_session(make_record(session_id))
    await store.update_session("before", SessionUpdate(status=SessionStatus.FAILED))
    await client.delete(f"{prefix}:status:finished-at")  # as a store written before retention

    report = await sweep(store, retention=timedelta(seconds=1), now=time.time() + 2)

    assert report.expired == ["before"]
    assert await store.get_session("running") is not None
