"""Backends with an EventNotifier wake a reader in another process (here: another store
instance on the same data) promptly, and time out quietly when nothing happens."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest

from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store import Store, open_store
from helix_transport.store._base import EventNotifier
from helix_transport.store.memory import MemoryStore
from helix_transport.testing.store_suite import make_event, make_record

_T = TypeVar("_T")


@pytest.fixture(params=["redis", "postgres"])
async def two_stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Store, Store]]:
    name = f"helix_test_{uuid.uuid4().hex[:16]}"
    if request.param == "redis":
        url = f"{request.getfixturevalue('redis_url')}?prefix={name}"
    else:
        url = f"{request.getfixturevalue('postgres_dsn')}?schema={name}"
    writer = await open_store(url)
    reader = await open_store(url)
    yield writer, reader
    await reader.aclose()
    await writer.aclose()


async def test_append_elsewhere_wakes_the_waiter(two_stores: tuple[Store, Store]) -> None:
    writer, reader = two_stores
    assert isinstance(reader, EventNotifier)
    await writer.create_session(make_record("s1"))
    await writer.append("s1", [make_event("x", session_id="s1")], expected_sequence=0)

    waiting = asyncio.create_task(reader.wait_for_events("s1", from_sequence=1, timeout_s=5))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    started = time.monotonic()
    await writer.append("s1", [make_event("x", session_id="s1")], expected_sequence=1)
    assert await waiting is True
    assert time.monotonic() - started < 1.0


async def test_no_append_times_out(two_stores: tuple[Store, Store]) -> None:
    writer, reader = two_stores
    assert isinstance(reader, EventNotifier)
    await writer.create_session(make_record("s1"))
    started = time.monotonic()
    assert await reader.wait_for_events("s1", from_sequence=0, timeout_s=0.3) is False
    assert 0.25 < time.monotonic() - started < 2


async def test_events_already_there_return_at_once(two_stores: tuple[Store, Store]) -> None:
    writer, reader = two_stores
    assert isinstance(reader, EventNotifier)
    await writer.create_session(make_record("s1"))
    await writer.append(
        "s1",
        [make_event("x", session_id="s1"), make_event("x", session_id="s1")],
        expected_sequence=0,
    )
    started = time.monotonic()
    assert await reader.wait_for_events("s1", from_sequence=1, timeout_s=5) is True
    assert time.monotonic() - started < 1.0


async def test_an_idle_follower_on_redis_keeps_its_connection(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The follow loop's wait used to time out together with the blocked XREAD and cancel
    # it, and redis-py drops a connection whose read is cancelled: each follower served
    # from the store opened a new connection every poll interval.
    from redis.asyncio.connection import Connection

    from helix_transport.log import EventHub, follow

    # Connections this process opens, not the server's count: other tests and
    # processes share the server (its total_connections_received counted theirs too).
    made = 0
    connect = Connection._connect

    async def counting(self: Connection) -> None:
        nonlocal made
        made += 1
        await connect(self)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(Connection, "_connect", counting)
    store = await open_store(f"{redis_url}?prefix=helix_test_{uuid.uuid4().hex[:16]}")

    async def read_all() -> None:
        async for _ in follow(store, EventHub(), "s1", from_sequence=0, poll_interval_s=0.1):
            pass

    try:
        await store.create_session(make_record("s1"))
        before = made
        readers = [asyncio.create_task(read_all()) for _ in range(4)]
        await asyncio.sleep(2)  # 20 polls each
        opened = made - before
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    finally:
        await store.aclose()
    assert 0 < opened <= 8, opened  # each reader's first, and some slack; it was 4 x 20


class _SwallowingStore(MemoryStore):
    """A store whose read drops a cancellation that lands while it runs, as redis-py's
    writes through ``asyncio.wait_for`` do on Python 3.11 when the write completes."""

    cancel_in_read = False

    async def read(self, session_id: str, **kwargs: Any) -> list[StreamEvent]:
        return await self._swallowing(super().read(session_id, **kwargs))

    async def read_encoded(self, session_id: str, **kwargs: Any) -> list[bytes]:
        return await self._swallowing(super().read_encoded(session_id, **kwargs))

    async def _swallowing(self, call: Coroutine[Any, Any, _T]) -> _T:
        inner = asyncio.ensure_future(call)
        if self.cancel_in_read:  # the caller's cancel arrives now
            self.cancel_in_read = False
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        # What wait_for does when its inner call is done: the result wins.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(inner)
        return await inner


async def test_a_follower_ends_on_a_cancellation_a_store_call_swallowed() -> None:
    # The cause of the idle-follower test's hangs: the cancelled follower went on
    # polling, as nothing but a cancellation ends an idle follow loop.
    from helix_transport.log import EventHub, follow

    store = _SwallowingStore()
    await store.create_session(make_record("s1"))

    async def read_all() -> None:
        async for _ in follow(store, EventHub(), "s1", from_sequence=0, poll_interval_s=0.01):
            pass

    reader = asyncio.create_task(read_all())
    await asyncio.sleep(0.1)  # idle polls
    store.cancel_in_read = True
    await asyncio.wait({reader}, timeout=5)  # (not asyncio.timeout: it would cancel it again)
    assert not store.cancel_in_read  # the cancel did land inside a read
    try:
        assert reader.done(), "the cancelled follower is still polling"
        assert reader.cancelled()
    finally:
        reader.cancel()
