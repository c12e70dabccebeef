"""``AgentClient.wait``: a session's end, by long poll, across a restart of its service."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta

import pytest

from helix_transport import AgentClient, ConnectError, SessionNotFound
from helix_transport._config import ClientConfig, RetryConfig
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.server import ServerConfig, create_server
from helix_transport.server._servicer import AgentServicer
from helix_transport.store.memory import MemoryStore
from tests.agents import counter
from tests.helpers import RestartableServer, free_port

INPUT = json.dumps({"steps": 3, "words": 3})


class _Asks:
    """Counts the ``GetStatus`` calls a servicer answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waits: list[bool] = []
        answer = AgentServicer.GetStatus

        async def counted(
            servicer: AgentServicer, request: pb.GetStatusRequest, context: object
        ) -> pb.GetStatusResponse:
            self.waits.append(request.HasField("wait"))
            return await answer(servicer, request, context)  # type: ignore[arg-type]

        monkeypatch.setattr(AgentServicer, "GetStatus", counted)


async def test_wait_answers_as_the_session_ends_in_one_long_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    asks = _Asks(monkeypatch)
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(INPUT, session_id="w1")
        status = await client.wait("w1")
        log = [event async for event in client.stream("w1")]

    assert status.status == pb.SESSION_STATUS_COMPLETED
    assert json.loads(status.output_json) == json.loads(log[-1].completed.output_json)
    assert status.last_sequence == log[-1].sequence
    # A run of ~0.5 s: one long poll, not an ask every pace.
    assert asks.waits == [True]


async def test_wait_after_a_sequence_waits_for_the_next_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(INPUT, session_id="w2")
        first = await client.wait("w2")
        # Waiting past the first turn's end: that end does not count.
        waiting = asyncio.create_task(client.wait("w2", from_sequence=first.last_sequence))
        await asyncio.sleep(0.6)
        assert not waiting.done()
        reply = await client.continue_session("w2", "once more", turn=2)
        second = await asyncio.wait_for(waiting, timeout=30)

    assert reply.from_sequence == first.last_sequence
    assert second.status == pb.SESSION_STATUS_COMPLETED
    assert second.last_sequence > first.last_sequence


async def test_wait_outlasts_a_restart_of_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "15")
    config = ServerConfig(port=free_port(), replica_id="only", lease_ttl_s=0.5)
    async with (
        RestartableServer(counter, MemoryStore(), config) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 6, "words": 4}), session_id="w3")
        waiting = asyncio.create_task(client.wait("w3"))
        await asyncio.sleep(0.3)  # the long poll is in flight
        await server.stop()
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await server.start()  # same replica id: it resumes the run
        status = await asyncio.wait_for(waiting, timeout=60)
        log = [event async for event in client.stream("w3")]

    assert status.status == pb.SESSION_STATUS_COMPLETED
    assert status.last_sequence == log[-1].sequence
    assert json.loads(status.output_json) == {"total": 6, "steps": 6}


async def test_wait_gives_up_on_an_unreachable_service_at_the_reconnect_deadline() -> None:
    config = ClientConfig(
        reconnect=RetryConfig(
            initial_backoff=timedelta(milliseconds=50),
            max_backoff=timedelta(milliseconds=200),
            deadline=timedelta(seconds=1),
        ),
        rpc_timeout=timedelta(seconds=1),
    )
    async with await AgentClient.connect(f"127.0.0.1:{free_port()}", config=config) as client:
        started = time.monotonic()
        with pytest.raises(ConnectError):
            await client.wait("nobody")
        spent = time.monotonic() - started
    # At least the deadline, and not a long poll's worth past it.
    assert 1.0 <= spent < 10, spent


async def test_wait_for_an_unknown_session_fails_at_once() -> None:
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        with pytest.raises(SessionNotFound):
            await asyncio.wait_for(client.wait("missing"), timeout=5)
