"""Sessions belong to the principal (and tenant) that started them, on real servers.

Another principal's ``Stream``, ``GetStatus``, ``Interrupt`` or ``Continue`` gets
``NOT_FOUND`` with exactly the message of a session that does not exist (a ``Start``
on another's id creates one's own: see test_namespaces). Children started by a
parent service belong to the identity the parent presents: its own (substitute) or
its caller's (forward).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from helix_transport import AgentClient, AgentServer, ClientAuth, ServerConfig, create_server
from helix_transport._exceptions import SessionNotFound, Unauthenticated
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.registry import address_env_var
from helix_transport.server.auth import AuthConfig
from helix_transport.store import MemoryStore
from helix_transport.transport import set_bearer_token
from tests.agents import counter, delegator
from tests.security.conftest import AUDIENCE, JwtKeys, Tokens

INPUT = json.dumps({"steps": 1, "words": 1})


@asynccontextmanager
async def connect(address: str, token: str) -> AsyncIterator[AgentClient]:
    async with await AgentClient.connect(address, auth=ClientAuth(token=token)) as c:
        yield c


async def _not_found_message(
    stub: pb_grpc.AgentServiceAsyncStub, token: str, session_id: str
) -> dict[str, tuple[grpc.StatusCode, str]]:
    """Each RPC's status code and message for ``session_id``, called with ``token``."""
    metadata = (("authorization", f"Bearer {token}"),)
    answers: dict[str, tuple[grpc.StatusCode, str]] = {}
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "GetStatus": lambda: stub.GetStatus(
            pb.GetStatusRequest(session_id=session_id, include_children=True), metadata=metadata
        ),
        "Interrupt": lambda: stub.Interrupt(
            pb.InterruptRequest(session_id=session_id, reason="mine now"), metadata=metadata
        ),
        "Continue": lambda: stub.Continue(
            pb.ContinueRequest(session_id=session_id, message="more", turn=2), metadata=metadata
        ),
    }
    for name, call in calls.items():
        try:
            await call()
            answers[name] = (grpc.StatusCode.OK, "")
        except grpc.aio.AioRpcError as exc:
            answers[name] = (exc.code(), exc.details() or "")
    try:
        async for _ in stub.Stream(pb.StreamRequest(session_id=session_id), metadata=metadata):
            pass
        answers["Stream"] = (grpc.StatusCode.OK, "")
    except grpc.aio.AioRpcError as exc:
        answers["Stream"] = (exc.code(), exc.details() or "")
    return answers


def _as_missing(
    answers: dict[str, tuple[grpc.StatusCode, str]],
    session_id: str,
    missing_id: str,
    missing: dict[str, tuple[grpc.StatusCode, str]],
) -> None:
    """``answers`` (about ``session_id``) are exactly those about a session that does not exist."""
    for rpc, (code, message) in answers.items():
        missing_code, missing_message = missing[rpc]
        assert code == missing_code == grpc.StatusCode.NOT_FOUND, rpc
        assert message == missing_message.replace(missing_id, session_id), rpc


async def test_another_principal_or_tenant_sees_not_found(
    tokens: Tokens, jwt_keys: JwtKeys
) -> None:
    config = AuthConfig(
        tokens_file=str(tokens.path),
        jwt_key_file=str(jwt_keys.rsa_public_file),
        jwt_audience=AUDIENCE,
    )
    dave_acme = jwt_keys.token(sub="dave", tenant="acme")
    dave_globex = jwt_keys.token(sub="dave", tenant="globex")  # same name, other tenant
    async with await create_server(counter, MemoryStore(), auth=config) as server:
        session_id = f"s-{secrets.token_hex(4)}"
        async with connect(server.address, tokens.alice) as alice:
            await alice.start(INPUT, session_id=session_id)
            events = [e async for e in alice.stream(session_id)]
            assert events[-1].WhichOneof("payload") == "completed"
        async with connect(server.address, dave_acme) as dave:
            await dave.start(INPUT, session_id="dave-s")
            assert (await dave.get_status("dave-s")).session_id == "dave-s"
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            missing_id = f"s-{secrets.token_hex(4)}"  # same length: same message shape
            missing = await _not_found_message(stub, tokens.bob, missing_id)
            for token in (tokens.bob, tokens.carol, dave_acme):  # same tenant, other, JWT
                answers = await _not_found_message(stub, token, session_id)
                _as_missing(answers, session_id, missing_id, missing)
            _as_missing(
                await _not_found_message(stub, dave_globex, "dave-s"), "dave-s", missing_id, missing
            )
        async with connect(server.address, tokens.alice) as alice:  # the owner, unharmed
            status = await alice.get_status(session_id)
            assert status.status == pb.SESSION_STATUS_COMPLETED
            assert json.loads(status.output_json) == {"total": 1, "steps": 1}
            reply = await alice.continue_session(session_id, "again", turn=2)
            assert reply.created


@asynccontextmanager
async def two_services(
    tokens: Tokens, monkeypatch: pytest.MonkeyPatch, client_auth: ClientAuth
) -> AsyncIterator[tuple[AgentServer, AgentServer]]:
    auth = AuthConfig(tokens_file=str(tokens.path))
    child = await create_server(counter, MemoryStore(), auth=auth)
    parent = await create_server(
        delegator, MemoryStore(), ServerConfig(), auth=auth, client_auth=client_auth
    )
    async with child, parent:
        monkeypatch.setenv(address_env_var("counter"), child.address)
        yield parent, child


def _delegate() -> str:
    return json.dumps({"calls": [{"tool": "count", "args": {"steps": 1, "words": 1}}]})


async def _run_parent(parent: AgentServer, token: str) -> tuple[str, str]:
    """Alice's delegator session; the id of the child it started."""
    async with connect(parent.address, token) as c:
        started = await c.start(_delegate())
        events = [e async for e in c.stream(started.session_id)]
        assert events[-1].WhichOneof("payload") == "completed", events[-1]
        (child_id,) = {
            e.subagent_start.child_session_id for e in events if e.HasField("subagent_start")
        }
        total = await c.get_status(started.session_id, include_children=True)
        assert total.total_usage.total_tokens > total.usage.total_tokens  # the child's counted
        return started.session_id, child_id


async def test_substitute_children_belong_to_the_parent_service(
    tokens: Tokens, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parent presents its own identity: carol's token stands in for a service token.
    async with two_services(tokens, monkeypatch, ClientAuth(token=tokens.carol)) as (parent, child):
        _, child_id = await _run_parent(parent, tokens.alice)
        async with connect(child.address, tokens.alice) as alice:
            with pytest.raises(SessionNotFound):  # started by the parent, not by alice
                await alice.get_status(child_id)
        async with connect(child.address, tokens.carol) as service:
            assert (await service.get_status(child_id)).status == pb.SESSION_STATUS_COMPLETED


async def test_forward_children_belong_to_the_caller(
    tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with two_services(tokens, monkeypatch, ClientAuth(identity="forward")) as (parent, child):
        parent_id, child_id = await _run_parent(parent, tokens.alice)
        async with connect(child.address, tokens.alice) as alice:
            assert (await alice.get_status(child_id)).status == pb.SESSION_STATUS_COMPLETED
        async with connect(child.address, tokens.bob) as bob:
            with pytest.raises(SessionNotFound):
                await bob.get_status(child_id)
        async with connect(parent.address, tokens.bob) as bob:
            with pytest.raises(SessionNotFound):  # nor the parent session
                await bob.get_status(parent_id, include_children=True)


def test_forward_without_a_caller_token_fails_clearly() -> None:
    # A run resumed after a restart has no caller token (never stored).
    with pytest.raises(Unauthenticated, match="no caller credential to forward"):
        ClientAuth(identity="forward").metadata()
    assert ClientAuth(identity="forward", token="own-token-0123456789").metadata() == (
        ("authorization", "Bearer own-token-0123456789"),
    )


async def test_shared_streams_follow_each_caller_s_sessions_with_that_caller_s_token(
    tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A forwarding parent follows the children of many callers on shared Follow calls:
    # one call per token, so a follow never reads a session with another caller's
    # identity (bob, following alice's session id, finds nothing).
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    auth = AuthConfig(tokens_file=str(tokens.path))
    async with (
        await create_server(counter, MemoryStore(), auth=auth) as server,
        connect(server.address, tokens.alice) as alice,
        await AgentClient.connect(server.address, auth=ClientAuth(identity="forward")) as shared,
    ):
        await alice.start(json.dumps({"steps": 3, "words": 3}), session_id="mine")

        async def follow_as(token: str) -> list[pb.StreamEvent]:
            set_bearer_token(token)  # as the server's interceptor does for each caller
            return [e async for e in shared.stream("mine", shared=True)]

        events, refused = await asyncio.gather(
            follow_as(tokens.alice), follow_as(tokens.bob), return_exceptions=True
        )

    assert isinstance(events, list) and events[-1].WhichOneof("payload") == "completed"
    assert isinstance(refused, SessionNotFound)
