"""``grpc.health.v1`` on a real server on 127.0.0.1: ``Watch`` through the main port,
clients with client-side health checking, and no ERROR logged for any call a caller
without credentials can make."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import jwt
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helix_transport import AgentServer, ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.server.auth import AuthConfig
from helix_transport.store import MemoryStore
from tests.agents import counter

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_CHECKED = json.dumps(
    {"healthCheckConfig": {"serviceName": ""}, "loadBalancingConfig": [{"round_robin": {}}]}
)
"""A service config turning on client-side health checking (gRPC A17: ``Watch`` on
every subchannel; it applies under round_robin, not under the default pick_first)."""


@pytest.fixture
def token(tmp_path: Path) -> str:
    return secrets.token_urlsafe(24)


@pytest.fixture
def auth(tmp_path: Path, token: str) -> AuthConfig:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{token} alice acme\n")
    key = tmp_path / "jwt.key"
    key.write_text(secrets.token_hex(32))
    return AuthConfig(tokens_file=str(tokens), jwt_key_file=str(key), jwt_audience="helix-test")


@asynccontextmanager
async def served(auth: AuthConfig, **config: object) -> AsyncIterator[AgentServer]:
    server = await create_server(counter, MemoryStore(), ServerConfig(**config), auth=auth)  # type: ignore[arg-type]
    async with server:
        yield server


async def test_watch_answers_serving_then_not_serving_when_the_server_drains(
    auth: AuthConfig,
) -> None:
    async with served(auth) as server, grpc.aio.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "helix.agent.v1.AgentService"):
            watch = health.Watch(health_pb2.HealthCheckRequest(service=name), timeout=10)
            updates = aiter(watch)
            assert (await anext(updates)).status == SERVING
            watch.cancel()
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        updates = aiter(watch)
        assert (await anext(updates)).status == SERVING
        shutdown = asyncio.create_task(server.shutdown(grace_s=1))
        assert (await anext(updates)).status == NOT_SERVING
        await shutdown


async def test_a_client_with_client_side_health_checking_calls_the_service(
    auth: AuthConfig, token: str
) -> None:
    options = [("grpc.service_config", HEALTH_CHECKED), ("grpc.enable_retries", 0)]
    credentials = (("authorization", f"Bearer {token}"),)
    async with (
        served(auth) as server,
        grpc.aio.insecure_channel(server.address, options=options) as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)
        described = await stub.Describe(pb.DescribeRequest(), metadata=credentials, timeout=10)
        assert described.agent_type == "counter"
        request = pb.StartRequest(input_json=json.dumps({"steps": 1, "words": 1}))
        started = await stub.Start(request, metadata=credentials, timeout=10)
        assert started.session_id
        status = pb.GetStatusRequest(session_id=started.session_id)
        assert (await stub.GetStatus(status, metadata=credentials, timeout=10)).session_id


def _agent_methods() -> list[str]:
    service = pb.DESCRIPTOR.services_by_name["AgentService"]
    return [f"/{service.full_name}/{method.name}" for method in service.methods]


_UNARY = ["/grpc.health.v1.Health/Check", *(m for m in _agent_methods() if "Stream" not in m)]
_STREAMED = ["/grpc.health.v1.Health/Watch", "/helix.agent.v1.AgentService/Stream"]
_BIDI = ["/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"]
_BODIES = [b"", b"\xff\xff\xff\xff", b"\x0a\x05hello", b"\x12\x80\x80\x80\x80\x10"]
_HMAC = "x" * 40


def _raw(data: bytes) -> bytes:
    return data


def _authorizations() -> list[tuple[tuple[str, str], ...]]:
    forged = jwt.encode({"sub": "mallory", "aud": "helix-test", "exp": 2**33}, _HMAC)
    head, _, _ = forged.partition(".")
    return [
        (),
        (("authorization", "Bearer"),),
        (("authorization", "Basic dXNlcjpwYXNz"),),
        (("authorization", "Bearer " + "a" * 30),),
        (("authorization", f"Bearer {forged}"),),
        (("authorization", f"Bearer {head}.e30.AAAA"),),
        (("authorization", "Bearer a.b.c"),),
        (("authorization", "Bearer ..."),),
        (("authorization", "Bearer eyJhbGciOnt9fQ.e30.x"),),  # {"alg":{}}
        (("authorization", "Bearer eyJhbGciOiJIUzI1NiIsImtpZCI6W119.e30.x"),),  # kid: []
    ]


async def _call_everything(
    address: str, *, health_only: bool = False
) -> dict[grpc.StatusCode, str]:
    """Every method, with well-formed and garbage bodies, under every authorization;
    each one but health's is refused as UNAUTHENTICATED (on the health port, which
    serves health alone, UNIMPLEMENTED)."""
    codes: dict[grpc.StatusCode, str] = {}  # a call that ended so, for the failure message
    async with grpc.aio.insecure_channel(address) as channel:
        for metadata in _authorizations():
            for method in _UNARY:
                for body in _BODIES:
                    try:
                        await channel.unary_unary(method, _raw, _raw)(
                            body, metadata=metadata, timeout=5
                        )
                        codes.setdefault(grpc.StatusCode.OK, method)
                    except grpc.aio.AioRpcError as exc:
                        codes.setdefault(exc.code(), f"{method}: {exc.details()}")
            for method in _STREAMED:
                for body in _BODIES:
                    stream = channel.unary_stream(method, _raw, _raw)(
                        body, metadata=metadata, timeout=5
                    )
                    try:
                        async for _ in stream:
                            break  # a Watch answers, then waits: leave it
                    except grpc.aio.AioRpcError as exc:
                        codes.setdefault(exc.code(), f"{method}: {exc.details()}")
                    stream.cancel()
            for method in _BIDI:
                # One request: more, written after the refusal, fail in the client's core.
                bidi = channel.stream_stream(method, _raw, _raw)(
                    iter([b""]), metadata=metadata, timeout=5
                )
                try:
                    async for _ in bidi:
                        pass
                except grpc.aio.AioRpcError as exc:
                    codes.setdefault(exc.code(), f"{method}: {exc.details()}")
    # Health answers, knows no service named "hello" or says the body is not a
    # request; everything else is refused.
    expected = {grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT}
    expected.add(grpc.StatusCode.UNIMPLEMENTED if health_only else grpc.StatusCode.UNAUTHENTICATED)
    return {code: call for code, call in codes.items() if code not in expected}


@pytest.mark.parametrize("health_port", [None, 0])
async def test_calls_without_valid_credentials_log_nothing_at_error(
    auth: AuthConfig, caplog: pytest.LogCaptureFixture, health_port: int | None
) -> None:
    caplog.set_level(logging.INFO)
    async with served(auth, health_port=health_port) as server:
        unexpected = await _call_everything(server.address)
        if server.health_port is not None:
            unexpected |= await _call_everything(
                f"127.0.0.1:{server.health_port}", health_only=True
            )
        await asyncio.sleep(0.2)  # a cancelled Watch ends on the server after the client
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, "\n".join(f"{r.name}: {r.getMessage()}" for r in errors[:5])
    refused = [r for r in caplog.records if r.name == "helix.auth" and "refused" in r.getMessage()]
    assert refused  # the calls did reach the server and were refused there
    assert not unexpected
