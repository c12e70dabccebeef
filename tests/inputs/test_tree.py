"""Requests for input that cross services (in-process servers on 127.0.0.1, one store
each): a request deep in a tree reaches the root's stream; the answer, sent to the
root, travels down; parents suspend only when nothing else runs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from helix_transport import AgentClient, AgentServer, ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    finish,
    register_script,
    steps_taken,
)
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore
from tests.agents.approvals import dispatcher, fanout, mailer, middle, picker, root


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


def innermost(event: pb.StreamEvent) -> pb.StreamEvent:
    while kind(event) == "child_event":
        event = event.child_event.event
    return event


@dataclass
class Tree:
    client: AgentClient
    servers: dict[str, AgentServer]


@pytest.fixture
async def tree(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Tree]:
    servers: dict[str, AgentServer] = {}
    for agent in (mailer, middle, root, fanout):
        server = await create_server(
            agent, MemoryStore(), ServerConfig(lease_ttl_s=1.0), allow_unauthenticated=True
        )
        await server.start()
        servers[agent.name] = server
        monkeypatch.setenv(address_env_var(agent.name), server.address)
    client = await AgentClient.connect(servers["hitl-root"].address)
    yield Tree(client=client, servers=servers)
    await client.aclose()
    for server in servers.values():
        await server.shutdown(grace_s=1)


async def requests_until_suspended(
    client: AgentClient, session_id: str, *, count: int = 1
) -> tuple[list[pb.InputRequired], int]:
    """The requests the root's stream shows, once the root itself has suspended with
    ``count`` of them; and the sequence to go on from."""
    requests: list[pb.InputRequired] = []
    async with asyncio.timeout(30):
        async for event in client.stream(session_id):
            inner = innermost(event)
            if kind(inner) == "input_required":
                requests.append(inner.input_required)
            if kind(event) == "suspended" and len(requests) >= count:
                return requests, event.sequence
    raise AssertionError("the root never suspended")


async def test_an_approval_three_levels_down_is_answered_at_the_root(tree: Tree) -> None:
    client = tree.client
    await client.start('{"to": "deep@example.com"}', session_id="r1")
    (request,), sequence = await requests_until_suspended(client, "r1")
    assert request.path[0] == "r1" and len(request.path) == 3
    for name in ("hitl-root", "hitl-middle", "hitl-mailer"):
        assert tree.servers[name].runner.running == 0, name  # every level is a row
    assert (await client.get_status("r1")).status == pb.SESSION_STATUS_SUSPENDED

    reply = await client.submit_input("r1", request.request_id, path=request.path, approved=True)
    assert reply.applied
    status = await client.get_status("r1", wait=timedelta(seconds=30))
    assert status.status == pb.SESSION_STATUS_COMPLETED, status
    assert json.loads(status.output_json)["result"] == [
        {"result": [{"result": [{"sent_to": "deep@example.com"}]}]}
    ]
    rest = [innermost(e) async for e in client.stream("r1", from_sequence=sequence)]
    answered = [e for e in rest if kind(e) == "input_answered"]
    assert len(answered) == 1 and answered[0].session_id == request.path[-1]
    again = await client.submit_input("r1", request.request_id, path=request.path, approved=True)
    assert not again.applied


@pytest.mark.parametrize("order", ["a-first", "b-first"])
async def test_two_sibling_requests_are_answered_in_either_order(tree: Tree, order: str) -> None:
    client = await AgentClient.connect(tree.servers["hitl-fanout"].address)
    try:
        await client.start("{}", session_id=f"f-{order}")
        requests, _ = await requests_until_suspended(client, f"f-{order}", count=2)
        assert len({tuple(r.path) for r in requests}) == 2  # one per sibling child
        by_call = {("a" if "-remote-call_a-" in r.path[-1] else "b"): r for r in requests}
        first, second = (
            (by_call["a"], by_call["b"]) if order == "a-first" else (by_call["b"], by_call["a"])
        )
        await client.submit_input(f"f-{order}", first.request_id, path=first.path, approved=True)
        await asyncio.sleep(0.5)  # the first child finishes; the parent waits for the other
        assert (await client.get_status(f"f-{order}")).status != pb.SESSION_STATUS_COMPLETED
        await client.submit_input(f"f-{order}", second.request_id, path=second.path, approved=False)
        status = await client.get_status(f"f-{order}", wait=timedelta(seconds=30))
        assert status.status == pb.SESSION_STATUS_COMPLETED
        (a, b) = (r["result"][0] for r in json.loads(status.output_json)["result"])
        sent, denied = (a, b) if order == "a-first" else (b, a)  # the first answer approved
        assert sent == {"sent_to": "a@example.com" if order == "a-first" else "b@example.com"}
        assert "denied" in denied["error"]
    finally:
        await client.aclose()


async def test_a_client_tool_inside_a_run_subagent_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = []
    for agent in (picker, dispatcher):
        server = await create_server(
            agent, MemoryStore(), ServerConfig(lease_ttl_s=1.0), allow_unauthenticated=True
        )
        await server.start()
        servers.append(server)
        monkeypatch.setenv(address_env_var(agent.name), server.address)
    client = await AgentClient.connect(servers[1].address)
    try:
        await client.start('{"colors": ["red", "green"]}', session_id="d1")
        (request,), _ = await requests_until_suspended(client, "d1")
        assert request.kind == pb.INPUT_KIND_CLIENT_RESULT and len(request.path) == 2
        assert servers[1].runner.running == 0  # the parked parent is a row too
        await client.submit_input(
            "d1", request.request_id, path=request.path, result_json='"green"'
        )
        status = await client.get_status("d1", wait=timedelta(seconds=30))
        assert status.status == pb.SESSION_STATUS_COMPLETED, status
        assert "green" in status.output_json
    finally:
        await client.aclose()
        for server in servers:
            await server.shutdown(grace_s=1)


def _finish_beside_a_child(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        mail = ScriptedToolCall(name="mail", arguments={"to": "late@example.com"})
        return ScriptedTurn(
            tool_calls=(mail, ScriptedToolCall(name="__finish__", arguments={"result": "early"}))
        )
    return finish(result="asked again")  # the finish already given must end the run


hurried = dataclasses.replace(
    middle, name="hitl-hurried", model=register_script("hitl-hurried", _finish_beside_a_child)
)


async def test_a_finish_beside_a_child_that_suspends_ends_the_run_once_it_is_answered(
    tree: Tree,
) -> None:
    server = await create_server(
        hurried, MemoryStore(), ServerConfig(lease_ttl_s=1.0), allow_unauthenticated=True
    )
    await server.start()
    try:
        async with await AgentClient.connect(server.address) as client:
            await client.start("{}", session_id="h1")
            (request,), _ = await requests_until_suspended(client, "h1")
            await client.submit_input("h1", request.request_id, path=request.path, approved=True)
            status = await client.get_status("h1", wait=timedelta(seconds=30))
            assert status.status == pb.SESSION_STATUS_COMPLETED
            assert json.loads(status.output_json) == {"result": "early"}
            events = [e async for e in client.stream("h1")]
            assert [kind(e) for e in events].count("completed") == 1
    finally:
        await server.shutdown(grace_s=1)
