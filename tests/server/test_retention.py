"""Retention on a served agent, against every store: the background sweep removes a
finished session, never a running one, and every RPC on the expired session answers
``NOT_FOUND`` saying it expired."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import grpc
import pytest
from pydantic import BaseModel

from helix_transport import (
    Agent,
    ServerConfig,
    SessionExpired,
    SessionNotFound,
    ToolContext,
    UsageError,
    create_server,
    tool,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    tool_results,
    user_input,
)
from helix_transport.store import RetentionStore, Store
from tests.agents import counter
from tests.conftest import Serve
from tests.helpers import assert_eventually

_RELEASE: dict[str, asyncio.Event] = {}


class Gate(BaseModel):
    gate: str


class Done(BaseModel):
    done: bool


@tool
async def wait_for(ctx: ToolContext, args: Gate) -> dict[str, bool]:
    """Wait until the test opens the gate."""
    await _RELEASE[args.gate].wait()
    return {"opened": True}


def _waits(messages: list[dict[str, object]]) -> ScriptedTurn:
    if not tool_results(messages):
        gate = Gate.model_validate(user_input(messages)).gate
        return ScriptedTurn(tool_calls=(call("wait_for", gate=gate),))
    return finish(done=True)


waiter = Agent(
    name="waiter",
    description="Runs until its gate opens.",
    input_model=Gate,
    output_model=Done,
    tools=[wait_for],
    model=register_script(f"waiter-{uuid.uuid4().hex}", _waits),
)


async def _code_and_details(rpc: object) -> tuple[grpc.StatusCode, str]:
    try:
        await rpc  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    raise AssertionError("the call succeeded")


async def test_an_expired_session_is_not_found_saying_so(serve: Serve, store: Store) -> None:
    async with serve(counter, retention_s=1.0) as (server, client):
        await client.start(json.dumps({"steps": 1}), session_id="old")
        assert (await client.wait("old")).status == pb.SESSION_STATUS_COMPLETED

        async def expired() -> bool:
            return await store.get_session("old") is None

        await assert_eventually(expired, timeout_s=60)
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            calls = {
                "GetStatus": stub.GetStatus(pb.GetStatusRequest(session_id="old")),
                "Interrupt": stub.Interrupt(pb.InterruptRequest(session_id="old")),
                "Continue": stub.Continue(
                    pb.ContinueRequest(session_id="old", turn=2, message="again")
                ),
            }
            for name, rpc in calls.items():
                code, details = await _code_and_details(rpc)
                assert code is grpc.StatusCode.NOT_FOUND, name
                assert "'old' expired" in details, (name, details)
            stream = stub.Stream(pb.StreamRequest(session_id="old"))
            code, details = await _code_and_details(_drain(stream))
            assert code is grpc.StatusCode.NOT_FOUND and "'old' expired" in details
            # The client tells it from an id that never existed.
            with pytest.raises(SessionExpired, match="'old' expired"):
                await client.get_status("old")
            with pytest.raises(SessionNotFound) as never:
                await client.get_status("never")
            assert not isinstance(never.value, SessionExpired)
            # An id that never existed is plainly not found.
            code, details = await _code_and_details(
                stub.GetStatus(pb.GetStatusRequest(session_id="never"))
            )
            assert code is grpc.StatusCode.NOT_FOUND and "expired" not in details


async def _drain(stream: grpc.aio.UnaryStreamCall[pb.StreamRequest, pb.StreamResponse]) -> None:
    async for _ in stream:
        pass


async def test_a_running_session_outlives_the_retention(serve: Serve, store: Store) -> None:
    gate, opened = uuid.uuid4().hex, uuid.uuid4().hex
    _RELEASE[gate] = asyncio.Event()
    _RELEASE[opened] = asyncio.Event()
    _RELEASE[opened].set()
    async with serve(waiter, retention_s=1.0) as (_, client):
        await client.start(json.dumps({"gate": gate}), session_id="long")
        # "short" passes a gate open from the start: it ends while "long" runs.
        await client.start(json.dumps({"gate": opened}), session_id="short")
        assert (await client.wait("short")).status == pb.SESSION_STATUS_COMPLETED

        async def short_expired() -> bool:
            return await store.get_session("short") is None

        # A sweep past "short"'s end ran; "long" started before it and is still running.
        await assert_eventually(short_expired, timeout_s=60)
        status = await client.get_status("long")
        assert status.status == pb.SESSION_STATUS_RUNNING
        _RELEASE[gate].set()
        assert (await client.wait("long")).status == pb.SESSION_STATUS_COMPLETED

        async def long_expired() -> bool:
            return await store.get_session("long") is None

        await assert_eventually(long_expired, timeout_s=60)


async def test_a_store_without_the_role_is_refused(store: Store) -> None:
    class Hidden:  # a wrapper that forwards the Store methods only
        def __getattr__(self, name: str) -> object:
            if name in ("finished_sessions", "expire_sessions", "get_tombstone", "drop_tombstones"):
                raise AttributeError(name)
            return getattr(store, name)

    assert isinstance(store, RetentionStore) and not isinstance(Hidden(), RetentionStore)
    hidden: Any = Hidden()
    config = ServerConfig(retention_s=60.0)
    with pytest.raises(UsageError, match="cannot expire sessions"):
        await create_server(counter, hidden, config, allow_unauthenticated=True)
    # Without a retention, the role is not needed.
    async with await create_server(counter, hidden, allow_unauthenticated=True):
        pass
