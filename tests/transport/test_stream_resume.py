"""A broken stream resumes when its server is reachable again, not at its next backoff step."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta

import pytest

from helix_transport import AgentClient
from helix_transport._config import ClientConfig, RetryConfig
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.server import ServerConfig, create_server
from helix_transport.store.memory import MemoryStore
from tests.agents import counter
from tests.helpers import RestartableServer, free_port

# Every retry of ours waits 2-4 s (full jitter): a resume sooner than that came from
# grpc reaching the server again, not from our retry timer.
SLOW_RETRIES = ClientConfig(
    reconnect=RetryConfig(
        initial_backoff=timedelta(seconds=4),
        max_backoff=timedelta(seconds=4),
        deadline=timedelta(seconds=30),
    )
)


async def test_a_stream_resumes_as_soon_as_its_restarted_server_is_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "15")
    # A short lease: the shut-down server gives its run's lease up, and a restart leaves
    # a session that young (and without an owner) to the orphan scan, every lease TTL.
    config = ServerConfig(port=free_port(), replica_id="only", lease_ttl_s=0.5)
    restarted = False
    back_at = 0.0
    events: list[tuple[float, pb.StreamEvent]] = []
    async with (
        RestartableServer(counter, MemoryStore(), config) as server,
        await AgentClient.connect(server.address, config=SLOW_RETRIES) as client,
    ):
        await client.start(json.dumps({"steps": 4, "words": 4}), session_id="s")
        stream = client.stream("s")
        async for event in stream:
            events.append((time.monotonic(), event))
            if not restarted and event.WhichOneof("payload") == "step_started":
                await server.stop()
                await asyncio.sleep(0.3)  # down long enough for the stream to break
                await server.start()  # same replica id: it resumes the run at once
                restarted, back_at = True, time.monotonic()

    assert stream.reconnects >= 1
    assert events[-1][1].WhichOneof("payload") == "completed"
    assert [e.sequence for _, e in events] == list(range(1, len(events) + 1))
    resumed_after = next(at for at, _ in events if at > back_at) - back_at
    assert resumed_after < 1.5, f"the stream waited {resumed_after:.2f} s for its retry timer"


async def test_a_channel_that_stays_connected_waits_the_whole_backoff() -> None:
    # A stream a live server ended (a drain) must not be retried at once, or it could spin.
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.describe()  # connected
        started = time.monotonic()
        await client.reconnected(within_s=0.3)
        assert time.monotonic() - started >= 0.29


async def test_a_reconnect_never_retries_sooner_than_the_floor() -> None:
    # A channel that connects at once (here: never connected yet, its server up) still
    # waits a little, so a server that drops every connection cannot make a client spin.
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        started = time.monotonic()
        await client.reconnected(within_s=5)
        assert 0.045 <= time.monotonic() - started < 2
