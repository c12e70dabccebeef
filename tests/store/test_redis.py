"""``RedisStore`` against the conformance suite, plus what only a shared server can show.

These tests need a Redis server (``make services-up`` starts one). Its URL comes from
``HELIX_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). Every test uses its
own random key prefix and deletes that prefix's keys afterwards. When the server is
unreachable the tests skip locally, but under ``CI=true`` they fail: CI must never
pass by silently not testing Redis.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import cast
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from helix_transport._events import SessionStatus
from helix_transport._exceptions import StoreError, StoreUnavailable, UsageError
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store import (
    Checkpoint,
    SessionUpdate,
    Store,
    SubSessionRef,
)
from helix_transport.store.redis import RedisStore
from helix_transport.store.redis._stamped import stamped
from helix_transport.testing.store_suite import (
    DurableStoreConformance,
    Reopen,
    make_command,
    make_event,
    make_record,
)
from tests.conftest import REDIS_URL
from tests.helpers import TcpProxy, assert_eventually, free_port


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A raw client to the test server (``redis_url`` fails under CI when unreachable)."""
    client = aioredis.Redis.from_url(
        redis_url, socket_connect_timeout=2, socket_timeout=5, retry=Retry(NoBackoff(), 0)
    )
    yield client
    await client.aclose()


@pytest.fixture
async def prefix(redis_client: aioredis.Redis) -> AsyncIterator[str]:
    """A key prefix no other test uses; its keys are deleted afterwards."""
    prefix = f"helix-test-{uuid.uuid4().hex}"
    yield prefix
    keys = [key async for key in redis_client.scan_iter(match=f"{prefix}:*", count=500)]
    if keys:
        await redis_client.delete(*keys)


class TestRedisStore(DurableStoreConformance):
    @pytest.fixture
    async def store(self, prefix: str) -> AsyncIterator[Store]:
        store = await RedisStore.from_url(REDIS_URL, prefix=prefix)
        yield store
        await store.aclose()

    @pytest.fixture
    def reopen(self, prefix: str) -> Reopen:
        return lambda: RedisStore.from_url(REDIS_URL, prefix=prefix)


@pytest.fixture
async def store(prefix: str) -> AsyncIterator[RedisStore]:
    store = await RedisStore.from_url(REDIS_URL, prefix=prefix)
    yield store
    await store.aclose()


def test_redis_store_satisfies_the_protocol() -> None:
    store = RedisStore(aioredis.Redis(), prefix="unused")
    assert isinstance(store, Store)


async def test_from_url_to_unreachable_server_fails_fast() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as error:
        await RedisStore.from_url(url, timeout_s=2)
    assert time.monotonic() - started < 2
    assert url in str(error.value)
    assert error.value.retryable is True
    assert isinstance(error.value.__cause__, StoreUnavailable)


async def test_lost_server_is_unavailable_and_bad_data_is_a_store_error(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    dead = aioredis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    with pytest.raises(StoreUnavailable):
        await RedisStore(dead, prefix=prefix).get_session("s-1")
    await dead.aclose()
    # A key of the wrong type is a bug or foreign data, not an outage.
    await redis_client.set(f"{prefix}:session:s-1", "not a hash")
    with pytest.raises(StoreError) as error:
        await RedisStore(redis_client, prefix=prefix).get_session("s-1")
    assert not isinstance(error.value, StoreUnavailable)


async def test_injected_client_is_not_closed(redis_client: aioredis.Redis, prefix: str) -> None:
    async with RedisStore(redis_client, prefix=prefix) as store:
        await store.create_session(make_record())
    await store.aclose()
    assert await redis_client.ping() is True
    with pytest.raises(UsageError, match="closed"):
        await store.get_session("s-1")


async def test_owned_client_is_closed(redis_client: aioredis.Redis, prefix: str) -> None:
    name = f"{prefix}-owned"
    store = await RedisStore.from_url(f"{REDIS_URL}?client_name={name}", prefix=prefix)
    await store.get_session("s-1")

    async def connected() -> bool:
        clients = await redis_client.client_list()
        return any(c.get("name") == name for c in clients)

    assert await connected()
    await store.aclose()

    async def disconnected() -> bool:
        return not await connected()

    # The server notices the closed socket on its own schedule.
    await assert_eventually(disconnected, timeout_s=5)


async def test_lost_connection_is_unavailable_then_recovers(prefix: str) -> None:
    url = urlsplit(REDIS_URL)
    if url.hostname not in ("127.0.0.1", "localhost"):
        pytest.skip("the proxy forwards to 127.0.0.1 only")
    proxy = TcpProxy(port=free_port(), target_port=url.port or 6379)
    await proxy.restore()
    netloc = url.netloc.rpartition("@")[0] + ("@" if "@" in url.netloc else "")
    proxied = url._replace(netloc=f"{netloc}127.0.0.1:{proxy.port}").geturl()
    store = await RedisStore.from_url(proxied, prefix=prefix)
    try:
        await store.create_session(make_record())
        await proxy.drop()
        event = make_event("lost")
        with pytest.raises(StoreUnavailable) as error:
            await store.append("s-1", [event], expected_sequence=0)
        assert isinstance(error.value.__cause__, redis.exceptions.ConnectionError)
        assert event.sequence == 0
        await proxy.restore()
        assert await store.append("s-1", [make_event("after")], expected_sequence=0) == 1
    finally:
        await store.aclose()
        await proxy.drop()


async def test_decoding_client_is_refused() -> None:
    client = aioredis.Redis(decode_responses=True)
    with pytest.raises(UsageError, match="decode_responses"):
        RedisStore(client)
    await client.aclose()


async def test_sequences_are_stream_entry_ids(
    store: RedisStore, redis_client: aioredis.Redis, prefix: str
) -> None:
    await store.create_session(make_record())
    await store.append("s-1", [make_event("a"), make_event("b")], expected_sequence=0)
    await store.append("s-1", [make_event("c")], expected_sequence=2)
    entries = await redis_client.xrange(f"{prefix}:events:s-1")
    assert [entry_id for entry_id, _ in entries] == [b"0-1", b"0-2", b"0-3"]
    # Stored without a sequence; the entry id is the only source of it.
    stored = [StreamEvent.FromString(fields[b"event"]) for _, fields in entries]
    assert [(e.sequence, e.text_delta.text) for e in stored] == [(0, "a"), (0, "b"), (0, "c")]
    assert [e.sequence for e in await store.read("s-1")] == [1, 2, 3]


async def test_a_resent_append_is_applied_once(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A resend after a lost reply carries the same token as the attempt that landed.
    await store.create_session(make_record())
    token = uuid.uuid4()
    monkeypatch.setattr(uuid, "uuid4", lambda: token)
    first = [make_event("a"), make_event("b")]
    assert await store.append("s-1", first, expected_sequence=0) == 2
    resent = [make_event("a"), make_event("b")]
    assert await store.append("s-1", resent, expected_sequence=0) == 2
    assert [e.sequence for e in resent] == [1, 2]
    assert [e.text_delta.text for e in await store.read("s-1")] == ["a", "b"]


async def test_status_index_follows_updates(
    store: RedisStore, redis_client: aioredis.Redis, prefix: str
) -> None:
    for session_id in ("a", "b", "c"):
        await store.create_session(make_record(session_id))
    await store.update_session("a", SessionUpdate(status=SessionStatus.COMPLETED))
    await store.append(
        "b",
        [make_event("x")],
        expected_sequence=0,
        update=SessionUpdate(status=SessionStatus.FAILED),
    )
    await store.update_session("c", SessionUpdate(step_count=2))  # status unchanged

    async def index(status: SessionStatus) -> set[bytes]:
        key = f"{prefix}:status:{status.value}"
        return await cast("Awaitable[set[bytes]]", redis_client.smembers(key))

    assert await index(SessionStatus.RUNNING) == {b"c"}
    assert await index(SessionStatus.COMPLETED) == {b"a"}
    assert await index(SessionStatus.FAILED) == {b"b"}
    running = await store.list_sessions(status=SessionStatus.RUNNING)
    assert [r.session_id for r in running] == ["c"]
    assert [r.session_id for r in await store.list_sessions(status=SessionStatus.FAILED)] == ["b"]


async def test_lease_expiry_uses_the_server_clock(
    store: RedisStore, redis_client: aioredis.Redis
) -> None:
    await store.create_session(make_record())
    seconds, micros = await redis_client.time()
    assert await store.acquire_lease("s-1", "A", ttl_s=100)
    record = await store.get_session("s-1")
    assert record is not None
    server_now = seconds + micros / 1_000_000
    assert server_now + 100 <= record.lease_expires_at < server_now + 101


async def test_prefixes_are_isolated(prefix: str) -> None:
    async with (
        await RedisStore.from_url(REDIS_URL, prefix=prefix) as mine,
        await RedisStore.from_url(REDIS_URL, prefix=f"{prefix}:other") as theirs,
    ):
        await mine.create_session(make_record())
        await mine.append("s-1", [make_event("a")], expected_sequence=0)
        assert await theirs.get_session("s-1") is None
        assert await theirs.read("s-1") == []
        assert await theirs.list_sessions(status=SessionStatus.RUNNING) == []
        await mine.put_commands([make_command("s-1", "c-1")])
        assert await theirs.list_commands() == []


async def test_the_outbox_keys_are_under_the_prefix(
    store: RedisStore, redis_client: aioredis.Redis, prefix: str
) -> None:
    # Other tests share the server: only this prefix's keys can be told apart.
    await store.put_commands([make_command("s-1", "c-1"), make_command("s:2", "c:2")])
    keys = {key async for key in redis_client.scan_iter(match=f"{prefix}:*")}
    assert keys == {
        f"{prefix}:commands".encode(),
        f"{prefix}:command:s-1\x00c-1\x00interrupt".encode(),
        f"{prefix}:command:s:2\x00c:2\x00interrupt".encode(),
    }


async def test_a_batch_of_commands_is_stored_whole_or_not_at_all(
    store: RedisStore, redis_client: aioredis.Redis, prefix: str
) -> None:
    # Foreign data where a command's hash goes: a script would keep the writes made
    # before the error, so the batch is refused before any.
    await store.put_commands([make_command("p", "before")])
    await redis_client.set(f"{prefix}:command:p\x00poison\x00interrupt", "not a hash")
    batch = [make_command("p", "c-1"), make_command("p", "c-2"), make_command("p", "poison")]
    with pytest.raises(StoreError, match="WRONGTYPE"):
        await store.put_commands(batch)
    assert [c.child_session_id for c in await store.list_commands()] == ["before"]


async def test_a_checkpoint_rides_in_its_appends_atomic_write(store: RedisStore) -> None:
    # Before, it was a second round trip after the append: a connection lost between
    # the two left the events and a terminal status stored without the checkpoint the
    # next turn starts from, and the append raised although its events had landed.
    await store.create_session(make_record())

    async def lost(*args: object, **kwargs: object) -> None:
        raise redis.exceptions.ConnectionError("lost between the two writes")

    store._checkpoints._save = lost  # type: ignore[assignment]
    checkpoint = Checkpoint(session_id="s-1", step=1, messages=[], last_sequence=1)
    update = SessionUpdate(status=SessionStatus.COMPLETED)
    assert (
        await store.append(
            "s-1", [make_event("a")], expected_sequence=0, update=update, checkpoint=checkpoint
        )
        == 1
    )
    assert await store.load_checkpoint("s-1") == checkpoint
    record = await store.get_session("s-1")
    assert record is not None and record.status is SessionStatus.COMPLETED


async def test_a_ref_written_with_a_stream_cursor_reads_without_it(
    store: RedisStore, redis_client: aioredis.Redis, prefix: str
) -> None:
    # Refs of remote children once carried a cursor ("remote") nothing read.
    ref = SubSessionRef(
        parent_session_id="p", child_session_id="c", agent_type="a", tool_call_id="t"
    )
    await store.put_subsession_ref(ref)
    key = f"{prefix}:refs:p"
    stored = json.loads(await cast(Awaitable[bytes], redis_client.hget(key, "c")))
    await cast(
        Awaitable[int],
        redis_client.hset(
            key, "c", json.dumps({**stored, "remote": {"stream_id": "c", "last_sequence": 9}})
        ),
    )
    assert await store.list_subsession_refs("p") == [ref]
    assert await store.get_subsession_ref("p", "c") == ref


async def test_an_encoded_page_takes_its_sequences_from_the_entry_ids(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    # Entries as no append writes them: bytes holding another sequence are restamped
    # (as ``read`` does), a hole in the ids is refused rather than numbered wrong.
    store = RedisStore(redis_client, prefix=prefix)
    stream = f"{prefix}:events:s-1"
    wrong = make_event("a")
    wrong.sequence = 7
    await redis_client.xadd(stream, {"event": wrong.SerializeToString()}, id="0-1")
    await redis_client.xadd(stream, {"event": make_event("b").SerializeToString()}, id="0-2")
    page = [StreamEvent.FromString(data) for data in await store.read_encoded("s-1")]
    assert [(e.sequence, e.text_delta.text) for e in page] == [(1, "a"), (2, "b")]
    assert await store.read_encoded("s-1", from_sequence=1) == [
        e.SerializeToString() for e in await store.read("s-1", from_sequence=1)
    ]
    await redis_client.xadd(stream, {"event": make_event("d").SerializeToString()}, id="0-4")
    with pytest.raises(StoreError, match="not gapless after sequence 2"):
        await store.read_encoded("s-1", from_sequence=2)


@pytest.mark.parametrize(("first", "count"), [(1, 1000), (100, 300), (16_300, 200), (2**21 - 3, 6)])
def test_a_page_of_bytes_gets_its_sequences_checked_across_key_lengths(
    first: int, count: int
) -> None:
    # A page spanning a varint's growth (at 2^7, 2^14, 2^21) is checked in runs of one
    # key length: bytes holding their sequence pass as they are, bytes holding none get
    # it put in front, and one holding another sequence sends the page to ``read``.
    events = [make_event(str(n)) for n in range(count)]
    for sequence, event in enumerate(events, start=first):
        event.sequence = sequence
    stored = [event.SerializeToString() for event in events]
    assert stamped(first - 1, list(stored)) == stored
    bare = [make_event(str(n)).SerializeToString() for n in range(count)]
    assert stamped(first - 1, bare) == stored
    for at in (0, count // 2, count - 1):
        wrong = list(stored)
        wrong[at] = stored[(at + 1) % count]
        assert stamped(first - 1, wrong) is None
