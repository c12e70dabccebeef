"""``Follow``: many sessions of one service followed on one call, each exactly as its
``Stream`` would deliver it; errors end one follow, a broken call resumes them all."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from helix_transport import AgentClient
from helix_transport._config import Limits
from helix_transport._exceptions import InvalidArgument, SessionNotFound
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport._rich_status import read_details
from helix_transport.server import ServerConfig, create_server
from helix_transport.server import app as server_app
from helix_transport.server._servicer import AgentServicer
from helix_transport.store.memory import MemoryStore
from helix_transport.transport import _follows
from tests.agents import counter
from tests.helpers import RestartableServer, free_port


class _Streams(grpc.aio.UnaryStreamClientInterceptor):
    """Counts a client's ``Stream`` calls (grpc.aio takes one interceptor per kind)."""

    def __init__(self, made: Counter[str]) -> None:
        self.made = made

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        self.made[details.method.decode().rsplit("/", 1)[-1]] += 1
        return await continuation(details, request)


class _Follows(grpc.aio.StreamStreamClientInterceptor):
    """Counts a client's ``Follow`` calls."""

    def __init__(self, made: Counter[str]) -> None:
        self.made = made

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        self.made[details.method.decode().rsplit("/", 1)[-1]] += 1
        return await continuation(details, requests)


@asynccontextmanager
async def _counted_client(made: Counter[str]) -> AsyncIterator[AgentClient]:
    """A counter service on a free port, and a client counting its streaming calls."""
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(
            server.address, interceptors=[_Streams(made), _Follows(made)]
        ) as client,
    ):
        yield client


async def _log(client: AgentClient, session_id: str, *, shared: bool) -> list[bytes]:
    return [e.SerializeToString() async for e in client.stream(session_id, shared=shared)]


async def test_many_sessions_ride_one_call_each_event_once_as_stream_sends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "5")
    made: Counter[str] = Counter()
    async with _counted_client(made) as client:
        ids = [f"s{i}" for i in range(20)]
        for session_id in ids:
            await client.start(json.dumps({"steps": 3, "words": 5}), session_id=session_id)
        live = await asyncio.gather(*(_log(client, s, shared=True) for s in ids))
        assert made == {"Follow": 1}
        again = await asyncio.gather(*(_log(client, s, shared=False) for s in ids))
        # Replayed over Follow too, from a sequence in the middle.
        tail = [e async for e in client.stream(ids[0], from_sequence=4, shared=True)]

    assert live == again  # the very bytes Stream sends, live and replayed
    assert all(pb.StreamEvent.FromString(log[-1]).HasField("completed") for log in live)
    assert [e.sequence for e in tail] == list(range(5, len(live[0]) + 1))
    # The call closed with its last follow; the next shared stream opened another.
    assert made == {"Follow": 2, "Stream": 20}


async def test_a_follow_that_fails_ends_alone() -> None:
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 2, "words": 3}), session_id="real")

        async def missing() -> None:
            [e async for e in client.stream("missing", shared=True)]

        async def bad() -> None:
            [e async for e in client.stream("no spaces allowed", shared=True)]

        results = await asyncio.gather(
            missing(), bad(), _log(client, "real", shared=True), return_exceptions=True
        )

    assert isinstance(results[0], SessionNotFound)
    assert isinstance(results[1], InvalidArgument) and results[1].field == "session_id"
    assert isinstance(results[2], list) and results[2]
    assert pb.StreamEvent.FromString(results[2][-1]).HasField("completed")


async def test_every_follow_resumes_after_its_server_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    config = ServerConfig(port=free_port(), replica_id="only", lease_ttl_s=0.5)
    async with (
        RestartableServer(counter, MemoryStore(), config) as server,
        await AgentClient.connect(server.address) as client,
    ):
        ids = [f"r{i}" for i in range(8)]
        for session_id in ids:
            await client.start(json.dumps({"steps": 4, "words": 4}), session_id=session_id)
        streams = [client.stream(s, shared=True) for s in ids]
        seen = asyncio.Event()

        async def read(stream: AsyncIterator[pb.StreamEvent]) -> list[int]:
            sequences = []
            async for event in stream:
                sequences.append(event.sequence)
                seen.set()
            return sequences

        readers = [asyncio.create_task(read(aiter(s))) for s in streams]
        await seen.wait()
        await server.stop()
        await asyncio.sleep(0.3)
        await server.start()
        logs = await asyncio.gather(*readers)
        ends = [await client.get_status(s) for s in ids]

    assert sum(s.reconnects for s in streams) >= 1
    for log, status in zip(logs, ends, strict=True):
        assert log == list(range(1, status.last_sequence + 1))  # nothing lost, nothing twice
        assert status.status == pb.SESSION_STATUS_COMPLETED


async def _follow_call(
    address: str, requests: list[pb.FollowRequest], *, close: bool = True
) -> tuple[list[pb.FollowMessage], grpc.StatusCode, str]:
    """Send ``requests`` on one raw ``Follow`` call (then half-close, with ``close``);
    every message of its responses, and how the call ended."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.AgentServiceStub(channel)

        async def send() -> AsyncIterator[pb.FollowRequest]:
            for request in requests:
                yield request
            if not close:
                await asyncio.Event().wait()

        call = stub.Follow(send(), timeout=10)
        responses: list[pb.FollowMessage] = []
        with contextlib.suppress(grpc.aio.AioRpcError):  # its status is read below
            async for response in call:
                assert response.messages
                responses += response.messages
        return responses, await call.code(), await call.details() or ""


def _add(follow_id: int, session_id: str, from_sequence: int = 0) -> pb.FollowRequest:
    stream = pb.StreamRequest(session_id=session_id, from_sequence=from_sequence)
    return pb.FollowRequest(follow_id=follow_id, stream=stream)


async def test_a_stopped_follow_is_stopped_on_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "50")
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 50, "words": 10}), session_id="long")
        await client.start(json.dumps({"steps": 1, "words": 1}), session_id="short")
        stop = pb.FollowRequest(follow_id=1, stop=True)
        responses, code, _ = await _follow_call(server.address, [_add(1, "long"), stop])
        # The call ended once its one follow was stopped: the server is not still
        # following the long session (it runs for seconds more).
        assert code is grpc.StatusCode.OK
        assert not any(r.HasField("end") for r in responses)
        status = await client.get_status("long")
        assert status.status == pb.SESSION_STATUS_RUNNING

        responses, code, _ = await _follow_call(server.address, [_add(7, "short")])
    assert code is grpc.StatusCode.OK
    assert {r.follow_id for r in responses} == {7}
    assert responses[-1].HasField("end") and responses[-1].end.code == 0
    last = responses[-2].response.events[-1]
    assert last.HasField("completed")


@pytest.mark.parametrize(
    ("requests", "problem"),
    [
        ([_add(0, "s")], "follow_id: required (not 0)"),
        ([_add(3, "s"), _add(3, "s")], "follow_id: 3 is already open in this call"),
    ],
)
async def test_a_bad_follow_id_ends_the_call(
    requests: list[pb.FollowRequest], problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "50")
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 20, "words": 1}), session_id="s")
        _, code, details = await _follow_call(server.address, requests, close=False)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details == problem


async def test_each_follow_is_charged_to_the_rate_limit() -> None:
    # A burst of 3: the call takes one token, two follows the rest; the third follow
    # ends RESOURCE_EXHAUSTED with a retry hint, the others are served.
    limits = Limits(rate_per_s=1.0, rate_burst=3)
    config = ServerConfig(port=free_port(), limits=limits)
    async with (
        await create_server(counter, MemoryStore(), config, allow_unauthenticated=True) as server,
    ):
        async with await AgentClient.connect(server.address) as client:
            for name in ("a", "b"):
                await client.start(json.dumps({"steps": 1, "words": 1}), session_id=name)
        await asyncio.sleep(2.5)  # the two Starts' tokens back
        requests = [_add(1, "a"), _add(2, "b"), _add(3, "a")]
        responses, code, _ = await _follow_call(server.address, requests)

    assert code is grpc.StatusCode.OK
    ends = {r.follow_id: r.end for r in responses if r.HasField("end")}
    assert ends[1].code == ends[2].code == 0
    assert ends[3].code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    trailer = (("grpc-status-details-bin", ends[3].details),)
    rich = read_details(grpc.StatusCode.RESOURCE_EXHAUSTED, trailer)
    assert rich.reason == "rate_limit" and rich.retry_after_s is not None


async def test_a_paused_reader_holds_back_no_other_follow_and_resumes_past_its_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A parent may leave one child's stream unread while it reads another's to the end:
    # the shared call never waits for the paused one, which ends as a break once it
    # holds more than its buffer, and resumes from the last event its reader took.
    monkeypatch.setattr(_follows, "_MAX_BUFFERED_BYTES", 2_000)
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "2")
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        for name in ("paused", "read"):
            await client.start(json.dumps({"steps": 6, "words": 40}), session_id=name)
        paused = client.stream("paused", shared=True)
        events = aiter(paused)
        first = await anext(events)
        async with asyncio.timeout(20):
            read = await _log(client, "read", shared=True)
            await client.wait("paused")
        rest = [e async for e in events]

    assert pb.StreamEvent.FromString(read[-1]).HasField("completed")
    assert [first.sequence, *(e.sequence for e in rest)] == list(range(1, rest[-1].sequence + 1))
    assert rest[-1].HasField("completed")
    assert paused.reconnects >= 1  # it fell behind, and resumed


class _NoFollowListed(AgentServicer):
    """A service from before ``Follow``: its ``Describe`` does not list it."""

    CAPABILITIES = tuple(c for c in AgentServicer.CAPABILITIES if c != "follow")


class _FollowNotServed(AgentServicer):
    """Lists ``follow``, but this replica answers it UNIMPLEMENTED (not upgraded yet)."""

    async def Follow(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not on this replica")
        yield b""  # pragma: no cover  (an async generator, as grpc serves it)


@pytest.mark.parametrize("servicer", [_NoFollowListed, _FollowNotServed])
async def test_a_service_without_follow_is_streamed_with_stream(
    servicer: type[AgentServicer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_app, "AgentServicer", servicer)
    made: Counter[str] = Counter()
    async with _counted_client(made) as client:
        ids = [f"n{i}" for i in range(3)]
        for session_id in ids:
            await client.start(json.dumps({"steps": 2, "words": 3}), session_id=session_id)
        logs = await asyncio.gather(*(_log(client, s, shared=True) for s in ids))
        again = await _log(client, ids[0], shared=True)

    assert all(pb.StreamEvent.FromString(log[-1]).HasField("completed") for log in logs)
    assert again == logs[0]
    # Every stream was a Stream call: not listed, Follow was never tried; not served,
    # it was tried by the first streams (at once), never again once refused.
    assert made["Stream"] == 4
    if servicer is _NoFollowListed:
        assert made["Follow"] == 0
    else:
        assert 1 <= made["Follow"] <= 3
