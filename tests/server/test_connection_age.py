"""Connection balancing: two replicas behind one ``dns:///`` name, a maximum connection age.

Two real server processes share one Redis store and one port, on 127.0.0.1 and
127.0.0.2; a DNS server of the test's own (``LoopbackDns``, named in the target's
authority: ``dns://127.0.0.1:PORT/replicas.test:PORT``) resolves ``replicas.test`` to the
first alone, then to both, as a headless Service does when an autoscaler adds a pod. A
client channel opened before the second replica existed reaches it once the first one's
connection ages out (GOAWAY, re-resolution); a stream open across the age is not cut
while the grace lasts, and one that outlives age and grace resumes on a new connection
with every event once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from helix_transport import AgentClient, ConnectionAge, EventStream, UsageError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.config import Environment
from helix_transport.testing.dns import LoopbackDns
from tests.helpers import ROOT, ServiceProcess, free_port

AGENT = "tests.agents.balancing:whoami"
NAME = "replicas.test"
LONG_RUN = {"ticks": 30}
"""About 5 streamed chunks a step at 50 ms each: a run of 8 s or more."""


class Replica(ServiceProcess):
    """A replica listening on ``host`` (the base class assumes 127.0.0.1)."""

    def __init__(self, host: str, port: int, store_url: str, workdir: Path, age: str) -> None:
        max_age, grace = age.split("+")
        args = [
            "--host", host, "--replica-id", f"{host}:{port}", "--drain-timeout", "0.5",
            "--max-connection-age", max_age, "--max-connection-age-grace", grace,
        ]  # fmt: skip
        super().__init__(
            AGENT,
            port=port,
            store_url=store_url,
            log_path=workdir / f"{host}.log",
            env={"HELIX_SCRIPTED_DELAY_MS": "50", "HELIX_ALLOW_VOLATILE_STORE": "1"},
            extra_args=args,
            cwd=ROOT,
        )
        self.host = host

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@pytest.fixture
async def store_url(redis_url: str) -> AsyncIterator[str]:
    prefix = f"helix_test_{uuid.uuid4().hex[:16]}"
    yield f"{redis_url}?prefix={prefix}"
    client = aioredis.Redis.from_url(redis_url)
    async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        await client.delete(key)
    await client.aclose()


@asynccontextmanager
async def two_replicas(
    store_url: str, workdir: Path, *, age: str
) -> AsyncIterator[tuple[Replica, Replica]]:
    """Replica A (started) and B (not yet) on one port; ``age`` is ``"MAX_AGE+GRACE"``."""
    port = free_port()
    a = Replica("127.0.0.1", port, store_url, workdir, age)
    b = Replica("127.0.0.2", port, store_url, workdir, age)
    await a.start()
    try:
        yield a, b
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def pid_of_a_run(client: AgentClient) -> int:
    """Start a short session and return the pid of the replica that ran it."""
    started = await client.start(json.dumps({"ticks": 1}))
    status = await client.wait(started.session_id)
    assert status.status == pb.SESSION_STATUS_COMPLETED, status
    return int(json.loads(status.output_json)["pid"])


async def collect(stream: EventStream) -> list[pb.StreamEvent]:
    return [event async for event in stream]


def assert_sound(events: list[pb.StreamEvent]) -> None:
    """Every sequence once, in order, from 1 to the terminal event."""
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert events[-1].WhichOneof("payload") == "completed"


async def test_a_channel_opened_before_a_replica_came_up_reaches_it(
    store_url: str, tmp_path: Path
) -> None:
    max_age, grace = 2.0, 30.0
    async with (
        LoopbackDns(["127.0.0.1"]) as dns,
        two_replicas(store_url, tmp_path, age=f"{max_age}+{grace}") as (a, b),
        await AgentClient.connect(dns.target(NAME, a.port)) as client,
    ):
        assert await pid_of_a_run(client) == a.pid
        long_run = await client.start(json.dumps(LONG_RUN))
        stream = client.stream(long_run.session_id)
        streamed = asyncio.create_task(collect(stream))
        opened = time.monotonic()

        await b.start()
        dns.addresses = ["127.0.0.1", "127.0.0.2"]
        b_up, queries = time.monotonic(), dns.a_queries
        ran_on: list[int] = []
        while b.pid not in ran_on:
            # GOAWAY comes at the age (+-10% jitter); new calls then go to new
            # connections at once. The grace is for the calls in flight.
            waited = time.monotonic() - b_up
            assert waited < max_age + grace, f"B not reached in {waited:.1f} s: {ran_on}"
            ran_on.append(await pid_of_a_run(client))
        reached_after = time.monotonic() - b_up
        events = await streamed
        stream_lasted = time.monotonic() - opened

    assert dns.a_queries > queries, "the client never re-resolved"
    assert reached_after < max_age + grace
    # The long stream outlived its connection's age but not the grace: never cut.
    assert_sound(events)
    assert stream_lasted > max_age * 1.1, stream_lasted
    assert stream.reconnects == 0


async def test_a_stream_longer_than_age_and_grace_resumes_with_every_event_once(
    store_url: str, tmp_path: Path
) -> None:
    async with (
        LoopbackDns(["127.0.0.1", "127.0.0.2"]) as dns,
        two_replicas(store_url, tmp_path, age="1+1") as (a, b),
        await AgentClient.connect(dns.target(NAME, a.port)) as client,
    ):
        await b.start()
        long_run = await client.start(json.dumps(LONG_RUN))
        stream = client.stream(long_run.session_id)
        events = await collect(stream)
        # A fresh reader of the same log, for what the resumed stream must equal.
        replayed = await collect(client.stream(long_run.session_id))

    assert_sound(events)
    assert stream.reconnects >= 1, "the stream outlived age + grace without being cut"
    assert [e.SerializeToString() for e in events] == [e.SerializeToString() for e in replayed]


def serve_config(argv: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> ConnectionAge:
    """The ``ConnectionAge`` that ``helix-mesh serve ARGV`` would run with, under ``env``."""
    from helix_transport import cli
    from helix_transport.cli import serve

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = cli._parser().parse_args(["serve", AGENT, *argv])
    return serve._server_config(args, Environment()).connection_age


def test_the_age_comes_from_flags_then_the_environment_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HELIX_MAX_CONNECTION_AGE_S", "HELIX_MAX_CONNECTION_AGE_GRACE_S"):
        monkeypatch.delenv(name, raising=False)
    assert serve_config([], monkeypatch) == ConnectionAge.default
    assert ConnectionAge.default.grpc_options() == [
        ("grpc.max_connection_age_ms", 300_000),
        ("grpc.max_connection_age_grace_ms", 600_000),
    ]
    from_env = serve_config(
        [],
        monkeypatch,
        HELIX_MAX_CONNECTION_AGE_S="60",
        HELIX_MAX_CONNECTION_AGE_GRACE_S="3600",
    )
    assert from_env == ConnectionAge(max_age_s=60, grace_s=3600)
    flags = ["--max-connection-age", "30", "--max-connection-age-grace", "0.5"]
    assert serve_config(flags, monkeypatch) == ConnectionAge(max_age_s=30, grace_s=0.5)
    # 0: no age at all, grpc's own default (no option set).
    assert serve_config(["--max-connection-age", "0"], monkeypatch).grpc_options() == []


def test_a_bad_age_is_a_usage_error_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="HELIX_MAX_CONNECTION_AGE_S='soon'"):
        serve_config([], monkeypatch, HELIX_MAX_CONNECTION_AGE_S="soon")
    with pytest.raises(UsageError, match="max_age_s must be 0 to"):
        ConnectionAge(max_age_s=10**7)
    with pytest.raises(SystemExit):  # argparse: "'-1': give a number of seconds, 0 or more"
        serve_config(["--max-connection-age-grace", "-1"], monkeypatch)
