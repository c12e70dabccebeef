"""Per-replica limits over real gRPC on 127.0.0.1: RESOURCE_EXHAUSTED with a retry hint.

A caller over its rate, or a Start beyond the replica's running sessions, gets
RESOURCE_EXHAUSTED carrying google.rpc ``RetryInfo``; the client raises a retryable
``ResourceExhausted`` with ``retry_after_s``, and the call succeeds after that wait.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import pickle
from datetime import timedelta

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helix_transport import (
    AgentClient,
    ClientConfig,
    Limits,
    ResourceExhausted,
    RetryConfig,
    ServerConfig,
    UsageError,
    create_server,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.cli import _parser
from helix_transport.config import Environment
from helix_transport.registry import address_env_var
from helix_transport.server._identity import Principal, set_principal
from helix_transport.server.auth import AuthConfig
from helix_transport.server.limits import LimitsInterceptor, RateLimiter
from helix_transport.store import MemoryStore
from helix_transport.transport._auth import ClientAuth
from tests.agents import counter, delegator
from tests.security.conftest import Tokens
from tests.security.servers import ServeSqlite, details


async def test_rate_limit_refuses_with_a_retry_hint_then_lets_the_call_through(
    serve_sqlite: ServeSqlite,
) -> None:
    limits = Limits(rate_per_s=4, rate_burst=3)
    async with serve_sqlite(counter, limits=limits) as server:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            for _ in range(3):
                await stub.Describe(pb.DescribeRequest(), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as raw:
                await stub.Describe(pb.DescribeRequest(), timeout=5)
            # Health checks are not AgentService calls: never rate limited.
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(5):
                await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        async with await AgentClient.connect(server.address) as client:
            with pytest.raises(ResourceExhausted) as refused:
                await client.describe()
            await asyncio.sleep(refused.value.retry_after_s or 0)
            described = await client.describe()
    assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit of 4 calls/s for 'anonymous' exceeded" in (raw.value.details() or "")
    hint = details(raw.value)
    assert hint.reason == "rate_limit" and hint.retry_after_s is not None
    assert 0 < hint.retry_after_s <= 0.25 + 0.01  # one token at 4/s
    error = refused.value
    assert error.retryable and error.limit == "rate_limit"
    assert error.retry_after_s is not None and 0 < error.retry_after_s <= 0.26
    assert pickle.loads(pickle.dumps(error)).retry_after_s == error.retry_after_s
    assert described.agent_type == "counter"


async def test_running_sessions_per_replica_are_bounded(
    serve_sqlite: ServeSqlite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    limits = Limits(max_running_sessions=2)
    # A client that gives up at once sees the refusal; the default one waits it out.
    impatient = ClientConfig(reconnect=RetryConfig(deadline=timedelta(0)))
    async with (
        serve_sqlite(counter, limits=limits) as server,
        await AgentClient.connect(server.address, config=impatient) as client,
        await AgentClient.connect(server.address) as patient,
    ):
        slow = json.dumps({"steps": 3, "words": 3})
        await asyncio.gather(*(client.start(slow, session_id=f"s{i}") for i in range(2)))
        with pytest.raises(ResourceExhausted) as full:
            await client.start(slow, session_id="s2")
        replay = await client.start(slow, session_id="s0")  # an existing session: still served
        assert await server.store.get_session("s2") is None
        # Start is idempotent: the default client retries after the hinted second, until
        # a session ends and frees a slot (within its reconnect deadline).
        later = await patient.start(slow, session_id="s2")
        assert server.runner.running <= 2
        for i in range(3):
            events = [e async for e in client.stream(f"s{i}")]
            assert events[-1].WhichOneof("payload") == "completed"
    assert full.value.limit == "running_sessions" and full.value.retryable
    assert full.value.retry_after_s == pytest.approx(1.0)
    assert "maximum of 2 sessions" in str(full.value)
    assert not replay.created and later.created


async def test_a_full_replica_answers_a_retried_continue_but_starts_no_new_turn(
    serve_sqlite: ServeSqlite, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retried Continue (a lost reply, a resumed parent) starts nothing, so capacity
    # must not refuse it, as it does not refuse a replayed Start; a new turn is a run.
    impatient = ClientConfig(reconnect=RetryConfig(deadline=timedelta(0)))
    async with (
        serve_sqlite(counter, limits=Limits(max_running_sessions=1)) as server,
        await AgentClient.connect(server.address, config=impatient) as client,
    ):
        await client.start('{"steps": 1}', session_id="done")
        await client.wait("done")
        turn2 = await client.continue_session("done", "again", turn=2)
        await client.wait("done", from_sequence=turn2.from_sequence)
        monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "2000")  # holds the only slot
        await client.start('{"steps": 1}', session_id="busy")
        assert server.runner.running == 1
        retried = await client.continue_session("done", "again", turn=2)
        with pytest.raises(ResourceExhausted) as full:
            await client.continue_session("done", "once more", turn=3)
        status = await client.get_status("done")
        await client.interrupt("busy")
    assert turn2.created and not retried.created
    assert retried.from_sequence == turn2.from_sequence
    assert full.value.limit == "running_sessions"
    assert status.status == pb.SESSION_STATUS_COMPLETED  # turn 3 did not start
    assert status.last_sequence > turn2.from_sequence


async def test_concurrent_starts_never_exceed_the_running_limit(
    serve_sqlite: ServeSqlite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    impatient = ClientConfig(reconnect=RetryConfig(deadline=timedelta(0)))
    peak = 0
    async with (
        serve_sqlite(counter, limits=Limits(max_running_sessions=5)) as server,
        await AgentClient.connect(server.address, config=impatient) as client,
        await AgentClient.connect(server.address) as patient,
    ):

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, server.runner.running)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(
            *(client.start('{"steps": 2}', session_id=f"c{i}") for i in range(30)),
            return_exceptions=True,
        )
        # The default client retries on the hint: every one of these starts, five at a time.
        waited = await asyncio.gather(
            *(patient.start('{"steps": 1}', session_id=f"p{i}") for i in range(12))
        )
        for i in range(12):
            assert [e async for e in patient.stream(f"p{i}")][-1].WhichOneof(
                "payload"
            ) == "completed"
        watcher.cancel()
    started = [r for r in results if isinstance(r, pb.StartResponse)]
    refused = [r for r in results if isinstance(r, ResourceExhausted)]
    assert len(started) == 5 and len(refused) == 25
    assert all(r.created for r in waited) and peak <= 5


def test_rate_limiter_keeps_one_bucket_per_principal() -> None:
    now = [0.0]
    limiter = RateLimiter(2.0, 2, max_keys=2, clock=lambda: now[0])
    assert limiter.acquire("a") is None and limiter.acquire("a") is None
    assert limiter.acquire("a") == pytest.approx(0.5)
    assert limiter.acquire("b") is None  # another principal has its own burst
    now[0] = 0.5
    assert limiter.acquire("a") is None  # refilled one token
    assert limiter.acquire("a") == pytest.approx(0.5)
    limiter.acquire("c")  # a third key evicts the least recently used one ("b")
    assert set(limiter._buckets) == {"a", "c"}
    assert RateLimiter(0, 0).acquire("x") is None  # off


def test_the_interceptor_charges_the_current_principal() -> None:
    interceptor = LimitsInterceptor(Limits(rate_per_s=1, rate_burst=1))

    def charge_as(name: str) -> None:
        set_principal(Principal(name=name, tenant="t1"))  # as the auth interceptor does
        interceptor.charge()

    contextvars.copy_context().run(charge_as, "alice")
    with pytest.raises(ResourceExhausted) as refused:
        contextvars.copy_context().run(charge_as, "alice")
    contextvars.copy_context().run(charge_as, "bob")  # untouched by alice's calls
    assert "'alice'" in str(refused.value)
    assert set(interceptor.limiter._buckets) == {
        Principal(name="alice", tenant="t1").key,
        Principal(name="bob", tenant="t1").key,
    }


def test_limits_come_from_flags_then_environment_then_defaults() -> None:
    env = {"HELIX_RATE_LIMIT": "7.5", "HELIX_MAX_RUNNING_SESSIONS": "9"}
    limits = Environment(env).limits(max_running_sessions=3, rate_burst=None)
    assert limits.rate_per_s == 7.5 and limits.max_running_sessions == 3
    assert limits.rate_burst == Limits.default.rate_burst
    with pytest.raises(UsageError, match="HELIX_RATE_BURST"):
        Environment({"HELIX_RATE_BURST": "lots"}).limits()
    with pytest.raises(UsageError):
        Limits(max_input_bytes=8 << 20)  # larger than a message can carry
    args = _parser().parse_args(["serve", "m:a", "--rate-limit", "2", "--max-input-bytes", "10"])
    assert (args.rate_limit, args.max_input_bytes, args.rate_burst) == (2.0, 10, None)


def test_serve_help_states_the_real_defaults() -> None:
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    text = serve.format_help().replace("\n", " ")
    default = Limits.default
    assert f"({default.max_message_bytes >> 20} MiB)" in text
    assert f"({default.max_input_bytes >> 20} MiB)" in text
    for value in (default.max_json_depth, default.max_running_sessions, default.rate_burst):
        assert f"({value})" in text
    assert f"({default.rate_per_s:g})" in text


async def test_each_authenticated_principal_has_its_own_rate(tokens: Tokens) -> None:
    server = await create_server(
        counter,
        MemoryStore(),
        ServerConfig(limits=Limits(rate_per_s=1, rate_burst=2)),
        auth=AuthConfig(tokens_file=str(tokens.path)),
    )
    async with server:
        connect = AgentClient.connect
        async with (
            await connect(server.address, auth=ClientAuth(token=tokens.alice)) as alice,
            await connect(server.address, auth=ClientAuth(token=tokens.bob)) as bob,
        ):
            await alice.describe()
            await alice.describe()
            with pytest.raises(ResourceExhausted) as refused:
                await alice.describe()
            assert (await bob.describe()).agent_type == "counter"  # bob's bucket is his own
    assert "'alice'" in str(refused.value) and refused.value.limit == "rate_limit"


async def test_a_parent_delegating_to_a_full_child_service_waits_for_a_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing is lost under load: three concurrent delegations to a child service that
    runs one session at a time all complete (each Start waits out the hint)."""
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "5")
    child = await create_server(
        counter,
        MemoryStore(),
        ServerConfig(limits=Limits(max_running_sessions=1)),
        allow_unauthenticated=True,
    )
    parent = await create_server(delegator, MemoryStore(), allow_unauthenticated=True)
    peak = 0
    async with child, parent, await AgentClient.connect(parent.address) as client:
        monkeypatch.setenv(address_env_var("counter"), child.address)

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, child.runner.running)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        three = [{"tool": "count", "args": {"steps": 1, "words": 2}}] * 3
        await client.start(json.dumps({"calls": three}), session_id="root")
        events = [e async for e in client.stream("root")]
        watcher.cancel()
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    assert json.loads(events[-1].completed.output_json)["results"] == [{"total": 1, "steps": 1}] * 3
    assert peak == 1


def test_servers_accept_the_keepalive_pings_helix_clients_send() -> None:
    # gRPC's server default (a ping per 5 min, none without calls) answers a helix
    # client's 20 s keepalive on an idle connection with GOAWAY too_many_pings (seen
    # once in a 7-minute benchmark run; three strikes take a minute, too long to wait
    # for here), so the server's policy must admit the client's default interval.
    options = dict(Limits().grpc_options())
    assert options["grpc.keepalive_permit_without_calls"] == 1
    interval_ms = options["grpc.http2.min_ping_interval_without_data_ms"]
    assert interval_ms < ClientConfig.default.keepalive_time.total_seconds() * 1000
