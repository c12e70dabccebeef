"""Bounds on a delegation tree.

Every child's ``Start`` carries the agent types above it (``delegation_path``). A
service refuses, with FAILED_PRECONDITION naming the path, a ``Start`` whose path is
already its maximum depth long, or holds its own type when its agent is not
``recursive``: an agent that delegates to itself, directly or through others, no
longer recurses without end. The refusal reaches the parent's model as an error
result, so every level above it still finishes. A parent starts at most
``Agent.max_live_children`` children at once, and tool names the library keeps for
its own tools are refused in an agent's definition.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from helix_transport import Agent, AgentClient, ServerConfig, create_server
from helix_transport._events import SessionStatus
from helix_transport._exceptions import SessionNotFound, UsageError
from helix_transport._metadata import (
    DELEGATION_PATH_KEY,
    INHERITED_CONTEXT_KEY,
    VIRTUAL_TOOLS_KEY,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.tools import Tool, ToolContext, child_scope
from helix_transport.delegation.remote import child_session_id
from helix_transport.registry import address_env_var
from helix_transport.server.limits import Limits
from helix_transport.store import MemoryStore
from tests.agents.trees import Down, capped, companion_caller, echo, ping, pong, selfish
from tests.helpers import ROOT, ServiceProcess, free_port


async def run_to_end(client: AgentClient, session_id: str, input_json: str = "{}") -> Any:
    await client.start(input_json, session_id=session_id)
    events = [e async for e in client.stream(session_id)]
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    return json.loads(events[-1].completed.output_json)


def levels(output: Any) -> tuple[int, str]:
    """How many ``answer`` levels wrap the innermost error, and that error."""
    depth = 0
    while isinstance(output, dict) and "answer" in output:
        output, depth = output["answer"], depth + 1
    assert isinstance(output, dict) and "error" in output, output
    return depth, str(output["error"])


async def test_a_recursive_agent_stops_at_the_depth_limit_and_every_level_finishes(
    tmp_path: Path,
) -> None:
    port = free_port()
    service = ServiceProcess(
        "tests.agents.trees:selfish",
        port=port,
        store_url=f"sqlite:///{tmp_path / 'selfish.db'}",
        log_path=tmp_path / "selfish.log",
        env={address_env_var("selfish"): f"127.0.0.1:{port}"},
        extra_args=["--max-delegation-depth", "3"],
        cwd=ROOT,
    )
    await service.start()
    try:
        async with await AgentClient.connect(service.address) as client:
            output = await run_to_end(client, "root")
            scope = child_scope("selfish", "")
            ids = ["root"]
            for _ in range(3):
                ids.append(child_session_id(ids[-1], "call_1_0", scope))
            statuses = [await client.get_status(i) for i in ids[:3]]
            with pytest.raises(SessionNotFound):
                await client.get_status(ids[3])  # refused: never created
    finally:
        await service.stop()
    # root > child > grandchild ran; the grandchild's child was refused, and the refusal
    # came back up as an error result through every level.
    depth, error = levels(output)
    assert depth == 3
    assert "selfish > selfish > selfish > selfish is 4 levels deep" in error, error
    assert "maximum of 3" in error
    assert [s.status for s in statuses] == [pb.SESSION_STATUS_COMPLETED] * 3


@asynccontextmanager
async def services(
    *agents: Agent, monkeypatch: pytest.MonkeyPatch, limits: Limits = Limits.default
) -> AsyncIterator[dict[str, MemoryStore]]:
    """Each agent's service on 127.0.0.1, in the registry; their stores by agent type."""
    stores = {a.name: MemoryStore() for a in agents}
    servers = []
    try:
        for agent in agents:
            server = await create_server(
                agent,
                stores[agent.name],
                ServerConfig(limits=limits),
                allow_unauthenticated=True,
            )
            await server.start()
            servers.append(server)
            monkeypatch.setenv(address_env_var(agent.name), server.address)
        yield stores
    finally:
        for server in reversed(servers):
            await server.shutdown(grace_s=1)


def address(agent: Agent) -> str:
    return os.environ[address_env_var(agent.name)]


async def test_a_cycle_through_another_type_is_refused_naming_the_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with (
        services(ping, pong, monkeypatch=monkeypatch) as stores,
        await AgentClient.connect(address(ping)) as client,
    ):
        output = await run_to_end(client, "root")
    depth, error = levels(output)
    assert depth == 2  # ping's answer holds pong's, which holds the refusal
    assert "ping > pong > ping" in error and "does not allow recursion" in error, error
    assert [
        s.session_id for s in await stores["ping"].list_sessions(status=SessionStatus.COMPLETED)
    ] == ["root"]
    (child,) = await stores["pong"].list_sessions(status=SessionStatus.COMPLETED)
    # Stored with the session: a resumed pong sends its children the same path.
    assert json.loads(child.metadata[DELEGATION_PATH_KEY]) == ["ping"]


async def test_start_checks_the_path_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    async with (
        services(ping, monkeypatch=monkeypatch, limits=Limits(max_delegation_depth=2)) as stores,
        grpc.aio.insecure_channel(address(ping)) as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)

        async def start(session_id: str, *path: str, **metadata: str) -> None:
            await stub.Start(
                pb.StartRequest(
                    session_id=session_id,
                    input_json="{}",
                    delegation_path=path,
                    metadata=metadata,
                ),
                timeout=10,
            )

        for path, expected in [
            (("pong", "ping"), "pong > ping > ping"),  # its own type, not recursive
            (("a", "b"), "a > b > ping is 3 levels deep, more than this service's maximum of 2"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await start("refused", *path)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert expected in (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await start("invalid", "pong", "Not An Agent")
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (invalid.value.details() or "").startswith("delegation_path[1]")
        # A caller's metadata cannot stand in for the field.
        await start("ok", "pong", **{DELEGATION_PATH_KEY: '["forged"]'})
        await start("root", **{DELEGATION_PATH_KEY: '["forged"]'})
        records = {
            r.session_id: r
            for r in await stores["ping"].list_sessions(status=SessionStatus.RUNNING)
        }
        records |= {
            r.session_id: r
            for r in await stores["ping"].list_sessions(status=SessionStatus.COMPLETED)
        }
        records |= {
            r.session_id: r for r in await stores["ping"].list_sessions(status=SessionStatus.FAILED)
        }
    assert sorted(records) == ["ok", "root"]
    assert json.loads(records["ok"].metadata[DELEGATION_PATH_KEY]) == ["pong"]
    assert DELEGATION_PATH_KEY not in records["root"].metadata


async def test_start_checks_a_subagent_s_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """``StartRequest.subagent``: a virtual child may return to its parent's type once
    (not when the type is further up), picks among the agent's tools, and its inherited
    context is a JSON array of messages; each refusal names the field."""
    async with (
        services(ping, monkeypatch=monkeypatch) as stores,
        grpc.aio.insecure_channel(address(ping)) as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)

        async def start(session_id: str, path: tuple[str, ...], **options: Any) -> None:
            await stub.Start(
                pb.StartRequest(
                    session_id=session_id,
                    input_json="{}",
                    delegation_path=path,
                    subagent=pb.SubagentOptions(**options),
                    metadata={VIRTUAL_TOOLS_KEY: '["forged"]'},
                ),
                timeout=10,
            )

        await start("virtual", ("pong", "ping"), virtual=True)
        await start("context", ("pong",), context_json='[{"role": "user", "content": "hi"}]')
        cases: list[tuple[str, tuple[str, ...], dict[str, Any], str]] = [
            ("v1", ("pong",), {"virtual": True}, "subagent.virtual"),
            ("v2", ("ping",), {"virtual": True, "tools": ["nope"]}, "subagent.tools[0]"),
            ("v3", ("pong",), {"tools": ["nope"]}, "subagent.tools"),
            ("c1", ("pong",), {"context_json": '{"role": "user"}'}, "subagent.context_json"),
            ("c2", ("pong",), {"context_json": "[{"}, "subagent.context_json"),
        ]
        for session_id, path, options, field in cases:
            with pytest.raises(grpc.aio.AioRpcError) as invalid:
                await start(session_id, path, **options)
            assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT, session_id
            assert (invalid.value.details() or "").startswith(field), invalid.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as cycle:  # ping is further up: a cycle
            await start("v4", ("ping", "pong", "ping"), virtual=True)
        assert cycle.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        virtual = await stores["ping"].get_session("virtual")
        context = await stores["ping"].get_session("context")
    assert virtual is not None and context is not None
    assert json.loads(virtual.metadata[VIRTUAL_TOOLS_KEY]) == []  # the field's, not forged
    assert VIRTUAL_TOOLS_KEY not in context.metadata
    assert json.loads(context.metadata[INHERITED_CONTEXT_KEY])[0]["content"] == "hi"


async def test_a_parent_starts_no_more_than_its_live_children_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "150")  # children still run when the third asks
    async with (
        services(echo, capped, monkeypatch=monkeypatch) as stores,
        await AgentClient.connect(address(capped)) as client,
    ):
        output = await run_to_end(client, "root", json.dumps({"text": "x"}))
        children = await stores["echo"].list_sessions(status=SessionStatus.COMPLETED)
    answers = output["answer"]
    echoes = sorted(a["echo"] for a in answers if "echo" in a)
    errors = [a["error"] for a in answers if "error" in a]
    assert len(echoes) == 2 and len(errors) == 1, answers
    assert "has 2 running and may have at most 2 at once" in errors[0]
    assert len(children) == 2


async def _noop(ctx: ToolContext, args: Any) -> dict[str, str]:
    return {}


@pytest.mark.parametrize("name", ["companion__spawn_agent", "companion__mine", "__helper__", "__x"])
def test_reserved_tool_names_are_refused_naming_the_tool(name: str) -> None:
    tool = Tool(name=name, description="mine", args_model=Down, fn=_noop)
    with pytest.raises(UsageError, match=re.escape(repr(name))):
        dataclasses.replace(selfish, tools=[*selfish.tools, tool])


def test_the_library_s_own_companion_tools_pass_but_not_a_copy() -> None:
    library = [t for t in companion_caller.tools if t.name.startswith("companion__")]
    assert library  # they were attached: with_companions built the agent
    assert dataclasses.replace(companion_caller, name="again").tools == companion_caller.tools
    with pytest.raises(UsageError, match="companion__spawn_agent"):
        dataclasses.replace(selfish, tools=[dataclasses.replace(library[0])])
