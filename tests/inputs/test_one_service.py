"""Input from people within one service: approvals, denials, client tools, deadlines,
idempotent answers, and the suspended session as a row (no run, no lease)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from helix_transport import AgentClient, AgentServer, ServerConfig, create_server
from helix_transport._exceptions import RequestNotFound, SessionStateConflict
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    steps_taken,
)
from helix_transport.store import MemoryStore, open_store
from tests.agents.approvals import hasty, mailer, picker


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


async def serve(agent: Agent) -> AgentServer:
    server = await create_server(
        agent, MemoryStore(), ServerConfig(lease_ttl_s=1.0), allow_unauthenticated=True
    )
    await server.start()
    return server


@pytest.fixture
async def mailer_service() -> AsyncIterator[tuple[AgentServer, AgentClient]]:
    server = await serve(mailer)
    client = await AgentClient.connect(server.address)
    yield server, client
    await client.aclose()
    await server.shutdown(grace_s=1)


async def until_suspended(client: AgentClient, session_id: str) -> list[pb.StreamEvent]:
    """The session's events up to its ``suspended`` event."""
    seen: list[pb.StreamEvent] = []
    async with asyncio.timeout(20):
        async for event in client.stream(session_id):
            seen.append(event)
            if kind(event) == "suspended":
                return seen
    raise AssertionError(f"never suspended: {[kind(e) for e in seen]}")


async def test_an_approved_call_runs_after_the_answer(
    mailer_service: tuple[AgentServer, AgentClient],
) -> None:
    server, client = mailer_service
    await client.start('{"to": "x@example.com"}', session_id="s1")
    events = await until_suspended(client, "s1")
    asked = [e.input_required for e in events if kind(e) == "input_required"]
    assert len(asked) == 1
    request = asked[0]
    assert request.tool_name == "send" and request.kind == pb.INPUT_KIND_APPROVAL
    assert list(request.path) == ["s1"]
    assert [kind(e) for e in events].count("tool_start") == 0  # not run before the answer
    status = await client.get_status("s1")
    assert status.status == pb.SESSION_STATUS_SUSPENDED
    assert server.runner.running == 0  # a row, not a task

    reply = await client.submit_input("s1", request.request_id, approved=True, reason="ok")
    assert reply.applied
    again = await client.submit_input("s1", request.request_id, approved=True, reason="ok")
    assert not again.applied
    with pytest.raises(SessionStateConflict):
        await client.submit_input("s1", request.request_id, approved=False)

    rest = [e async for e in client.stream("s1", from_sequence=events[-1].sequence)]
    kinds = [kind(e) for e in rest]
    assert kinds[0] == "run_resumed" and rest[0].run_resumed.reason == "input"
    assert kinds.index("input_answered") < kinds.index("tool_start") < kinds.index("tool_end")
    answered = next(e.input_answered for e in rest if kind(e) == "input_answered")
    assert answered.outcome == pb.INPUT_OUTCOME_APPROVED and answered.reason == "ok"
    assert kinds[-1] == "completed"
    assert json.loads(rest[-1].completed.output_json) == {"result": [{"sent_to": "x@example.com"}]}


async def test_a_denied_call_never_runs_and_the_model_sees_why(
    mailer_service: tuple[AgentServer, AgentClient],
) -> None:
    _, client = mailer_service
    await client.start("{}", session_id="s2")
    events = await until_suspended(client, "s2")
    request_id = next(e.input_required.request_id for e in events if kind(e) == "input_required")
    await client.submit_input("s2", request_id, approved=False, reason="not today")
    rest = [e async for e in client.stream("s2", from_sequence=events[-1].sequence)]
    ends = [e.tool_end for e in rest if kind(e) == "tool_end" and e.tool_end.tool_name == "send"]
    assert len(ends) == 1 and ends[0].is_error and "not today" in ends[0].result_json
    assert "denied" in rest[-1].completed.output_json


async def test_unknown_requests_and_sessions_are_not_found(
    mailer_service: tuple[AgentServer, AgentClient],
) -> None:
    _, client = mailer_service
    await client.start("{}", session_id="s3")
    await until_suspended(client, "s3")
    with pytest.raises(RequestNotFound):
        await client.submit_input("s3", "no-such-call", approved=True)
    with pytest.raises(RequestNotFound):
        await client.submit_input("s3", "x", path=["s3", "no-child"], approved=True)


async def test_a_client_tool_gets_its_result_from_the_caller() -> None:
    server = await serve(picker)
    client = await AgentClient.connect(server.address)
    try:
        await client.start('{"options": ["red", "green"]}', session_id="p1")
        events = await until_suspended(client, "p1")
        request = next(e.input_required for e in events if kind(e) == "input_required")
        assert request.kind == pb.INPUT_KIND_CLIENT_RESULT
        await client.submit_input("p1", request.request_id, result_json='{"picked": "green"}')
        status = await client.get_status("p1", wait=timedelta(seconds=20))
        assert status.status == pb.SESSION_STATUS_COMPLETED
        assert json.loads(status.output_json) == {"result": [{"picked": "green"}]}
    finally:
        await client.aclose()
        await server.shutdown(grace_s=1)


async def test_a_request_past_its_deadline_becomes_an_error_result() -> None:
    server = await serve(hasty)
    client = await AgentClient.connect(server.address)
    try:
        await client.start("{}", session_id="h1")
        events = await until_suspended(client, "h1")
        request = next(e.input_required for e in events if kind(e) == "input_required")
        assert request.HasField("deadline")
        status = await client.get_status("h1", wait=timedelta(seconds=20))
        assert status.status == pb.SESSION_STATUS_COMPLETED
        assert "expired" in status.output_json
        with pytest.raises(SessionStateConflict):  # too late: the deadline answered first
            await client.submit_input("h1", request.request_id, approved=True)
    finally:
        await client.aclose()
        await server.shutdown(grace_s=1)


async def test_a_restarted_service_holds_nothing_for_a_suspended_session(
    tmp_path: Path,
) -> None:
    """The suspended session is a row: a new process over the same store runs no task
    for it, scan after scan, until the answer comes; then it runs to its end."""
    store_url = f"sqlite:///{tmp_path / 'mailer.db'}"
    config = ServerConfig(lease_ttl_s=0.3)
    store = await open_store(store_url)
    first = await create_server(mailer, store, config, allow_unauthenticated=True)
    await first.start()
    async with await AgentClient.connect(first.address) as client:
        await client.start("{}", session_id="long-wait")
        events = await until_suspended(client, "long-wait")
    await first.shutdown(grace_s=1)
    await store.aclose()

    store = await open_store(store_url)
    second = await create_server(mailer, store, config, allow_unauthenticated=True)
    await second.start()
    try:
        await asyncio.sleep(1.5)  # five orphan and suspended scans
        assert second.runner.running == 0
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "run:long-wait"]
        async with await AgentClient.connect(second.address) as client:
            assert (await client.get_status("long-wait")).status == pb.SESSION_STATUS_SUSPENDED
            request_id = next(
                e.input_required.request_id for e in events if kind(e) == "input_required"
            )
            await client.submit_input("long-wait", request_id, approved=True)
            status = await client.get_status("long-wait", wait=timedelta(seconds=20))
            assert status.status == pb.SESSION_STATUS_COMPLETED
    finally:
        await second.shutdown(grace_s=1)
        await store.aclose()


def _send_and_finish(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:  # the finish beside a call waiting for its approval
        return ScriptedTurn(tool_calls=(call("send", to="x@example.com"), call("__finish__")))
    return finish(result=[value for _, value in step_results(messages)])


eager = dataclasses.replace(
    mailer, name="hitl-eager", model=register_script("hitl-eager", _send_and_finish)
)


async def test_a_finish_beside_a_call_waiting_for_input_is_refused() -> None:
    server = await serve(eager)
    client = await AgentClient.connect(server.address)
    try:
        await client.start("{}", session_id="e1")
        events = await until_suspended(client, "e1")
        refused = [e.tool_end for e in events if kind(e) == "tool_end"]
        assert [(r.tool_name, r.is_error) for r in refused] == [("__finish__", True)]
        request_id = next(
            e.input_required.request_id for e in events if kind(e) == "input_required"
        )
        await client.submit_input("e1", request_id, approved=True)
        status = await client.get_status("e1", wait=timedelta(seconds=20))
        output = json.loads(status.output_json)["result"]
        assert output[0] == {"sent_to": "x@example.com"} and "error" in output[1]
    finally:
        await client.aclose()
        await server.shutdown(grace_s=1)
