"""A2A agents as children, in-process parent: the projection of a task into the
parent's log, the tool built from a card, the rejoin of a task whose id the parent never
recorded, and the trace context on the A2A calls. The agent is always the fixture
process (``tests.a2a.child_fixture``); the crashes are in ``test_child_processes``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
)
from google.protobuf.struct_pb2 import Value

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a._child_call import (
    apply_artifact,
    first_message,
    message_id_of,
    peer_sequence,
)
from helix_transport.a2a._child_client import a2a_address
from helix_transport.a2a._child_projection import PEER_SEQUENCE_KEY, ChildIdentity, Cursor, project
from helix_transport.a2a.child import (
    TEXT_SCHEMA,
    a2a_agent_tool,
    a2a_agent_tool_from_card,
    child_session_id,
)
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import NoHooks, RunHooks
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    steps_taken,
)
from helix_transport.agent.tools import child_scope
from helix_transport.registry import address_env_var
from helix_transport.server import create_server
from helix_transport.store import MemoryStore, SessionRecord, SubSessionRef
from tests.a2a._peer import PeerProcess
from tests.a2a.child_agents import Answer, PeerInput, a2a_parent
from tests.a2a.child_fixture import INPUT_SCHEMA
from tests.helpers import assert_eventually

CHILD = child_session_id("root", "call_1_0", child_scope("a2a-parent", ""))
IDENTITY = ChildIdentity(session_id="c", agent_type="peer", parent_session_id="p", path=("p", "c"))


@pytest.fixture
async def peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[PeerProcess]:
    process = PeerProcess(tmp_path / "peer")
    await process.start()
    monkeypatch.setenv(address_env_var("steps-agent"), f"a2a:{process.url}")
    try:
        yield process
    finally:
        await process.stop()


def _message(message_id: str, role: Role, text: str = "", **data: Any) -> Message:
    parts = [Part(text=text)] if text else []
    if data:
        value = Value()
        value.struct_value.update(data)
        parts.append(Part(data=value))
    return Message(message_id=message_id, role=role, parts=parts)


def _task(*history: Message, state: TaskState = TaskState.TASK_STATE_WORKING) -> Task:
    task = Task(id="t", context_id="c", history=list(history))
    task.status.state = state
    return task


def _kinds(events: list[pb.StreamEvent]) -> list[str]:
    return [e.WhichOneof("payload") or "" for e in events]


def _replayed(events: list[pb.StreamEvent]) -> Cursor:
    """The cursor a restarted parent reads back from the events its log holds."""
    cursor = Cursor()
    for event in events:
        cursor.note(event)
    return cursor


def test_a_snapshot_adds_only_what_the_log_lacks() -> None:
    ask = _message("m0", Role.ROLE_USER, steps=2)
    task = _task(ask, _message("a1", Role.ROLE_AGENT, "step 1"))
    cursor = Cursor()
    first = project(task, cursor, IDENTITY)
    assert _kinds(first) == ["run_started", "text_delta"]
    assert json.loads(first[0].run_started.input_json) == {"steps": 2}
    # A break: the next snapshot has moved on by a message, an artifact and the end.
    task.history.append(_message("a2", Role.ROLE_AGENT, "step 2"))
    task.artifacts.append(Artifact(artifact_id="out", parts=[Part(text="done")]))
    task.status.state = TaskState.TASK_STATE_COMPLETED
    for cursor_now in (cursor, _replayed(first)):  # this run's, or a restarted parent's
        later = project(task, cursor_now, IDENTITY)
        assert _kinds(later) == ["text_delta", "tool_start", "tool_end", "output", "completed"]
        assert [e.sequence for e in later] == [3, 4, 5, 6, 7]
        assert later[0].text_delta.text == "step 2"
        assert json.loads(later[-1].completed.output_json) == "done"
        assert project(task, cursor_now, IDENTITY) == []  # nothing twice


def test_artifacts_are_forwarded_part_by_part() -> None:
    task = _task(_message("m0", Role.ROLE_USER, "go"))
    task.artifacts.append(Artifact(artifact_id="a", parts=[Part(text="1")]))
    cursor = Cursor()
    events = project(task, cursor, IDENTITY)
    task.artifacts[0].parts.extend([Part(text="2"), Part(text="3")])
    events += project(task, cursor, IDENTITY)
    ends = [e.tool_end for e in events if e.WhichOneof("payload") == "tool_end"]
    assert [(e.tool_call_id, json.loads(e.result_json)["parts"]) for e in ends] == [
        ("a:0:2", ["1"]),
        ("a:1:4", ["2", "3"]),
    ]
    assert _replayed(events).parts == cursor.parts == {"a": 3}
    # Replaced by a shorter artifact (append=false): all of it is new.
    del task.artifacts[0].parts[:]
    task.artifacts[0].parts.append(Part(text="x"))
    (_, end) = project(task, cursor, IDENTITY)
    assert end.tool_end.tool_call_id == "a:0:6" and json.loads(end.tool_end.result_json) == {
        "parts": ["x"]
    }


def test_input_required_then_the_answer() -> None:
    question = _message("q1", Role.ROLE_AGENT, "May I?", kind="approval")
    task = _task(_message("m0", Role.ROLE_USER, "go"), state=TaskState.TASK_STATE_INPUT_REQUIRED)
    task.status.message.CopyFrom(question)
    cursor = Cursor()
    asked = project(task, cursor, IDENTITY)
    assert _kinds(asked) == ["run_started", "input_required", "suspended"]
    request = asked[1].input_required
    assert (request.request_id, request.kind, list(request.path)) == (
        "q1",
        pb.INPUT_KIND_APPROVAL,
        ["p", "c"],
    )
    # The agent's store moves the question into the history, then the answer follows.
    task.history.extend([question, _message("ans", Role.ROLE_USER, "approved", approved=True)])
    task.ClearField("status")
    task.status.state = TaskState.TASK_STATE_WORKING
    for cursor_now in (cursor, _replayed(asked)):
        (answered,) = project(task, cursor_now, IDENTITY)
        assert answered.input_answered.request_id == "q1"
        assert answered.input_answered.outcome == pb.INPUT_OUTCOME_APPROVED


def test_an_agent_without_history_is_followed_by_its_status_messages() -> None:
    # A2A leaves the history to the agent: one that keeps none shows its current status
    # message only. The call's own message stands in for the first; a status message
    # is new when its timestamp is.
    sent = _message("m0", Role.ROLE_USER, steps=2)
    child = dataclasses.replace(IDENTITY, message=sent)
    task = _task()
    task.status.message.CopyFrom(_message("a1", Role.ROLE_AGENT, "step 1"))
    task.status.timestamp.FromSeconds(100)
    cursor = Cursor()
    first = project(task, cursor, child)
    assert _kinds(first) == ["run_started", "text_delta"]
    assert project(task, cursor, child) == []
    task.status.message.CopyFrom(_message("q", Role.ROLE_AGENT, "May I?", kind="approval"))
    task.status.timestamp.FromSeconds(101)
    task.status.state = TaskState.TASK_STATE_INPUT_REQUIRED
    asked = project(task, cursor, child)
    assert _kinds(asked) == ["input_required", "suspended"]
    assert asked[0].time.ToSeconds() == 101  # when the agent said it
    # Answered while the parent was away (a restart): how is not in the task any more.
    task.status.state = TaskState.TASK_STATE_WORKING
    task.status.message.CopyFrom(_message("a2", Role.ROLE_AGENT, "step 2"))
    task.status.timestamp.FromSeconds(102)
    restarted = _replayed(first + asked)
    later = project(task, restarted, child)
    assert _kinds(later) == ["input_answered", "text_delta"]
    assert later[0].input_answered.request_id == "q"
    assert project(task, restarted, child) == []
    # A snapshot taken again after a restart holds the same message: not again.
    assert project(task, _replayed(first + asked + later), child) == []


def test_a_failed_or_canceled_task_ends_the_child() -> None:
    task = _task(_message("m0", Role.ROLE_USER, "go"), state=TaskState.TASK_STATE_REJECTED)
    task.status.message.CopyFrom(_message("r", Role.ROLE_AGENT, "not my job"))
    events = project(task, Cursor(), IDENTITY)
    assert _kinds(events)[-1] == "failed"
    assert events[-1].failed.failure_reason == "a2a_rejected"
    assert "not my job" in events[-1].failed.error
    task.status.state = TaskState.TASK_STATE_CANCELED
    assert _kinds(project(task, Cursor(), IDENTITY))[-1] == "interrupted"


def test_the_first_message_is_text_or_data() -> None:
    text = first_message("c", {"message": "hi"}, text_only=True)
    assert (text.message_id, text.context_id, text.parts[0].text) == (message_id_of("c"), "c", "hi")
    data = first_message("c", {"steps": 2}, text_only=False)
    assert data.parts[0].HasField("data")


async def test_the_tool_takes_its_schema_and_description_from_the_card(peer: PeerProcess) -> None:
    tool = await a2a_agent_tool_from_card(peer.url)
    assert tool.name == "steps-agent"
    assert tool.parameters == INPUT_SCHEMA
    assert "steps" in tool.description
    # An agent whose card says nothing of its input takes a text message.
    assert a2a_agent_tool(peer.url, name="peer").parameters == TEXT_SCHEMA


class _Traced(NoHooks):
    TRACEPARENT = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"

    def on_delegation_start(
        self, *, tool_call_id: str, child_session_id: str, agent_type: str
    ) -> Mapping[str, str]:
        return {"traceparent": self.TRACEPARENT}


def _traced(agent: Agent, record: SessionRecord) -> RunHooks:
    return _Traced()


async def test_a_restarted_parent_finds_the_task_it_never_recorded(peer: PeerProcess) -> None:
    # The parent died after its message reached the agent, before it heard the task's
    # id: its ref has the agent's address alone. The message went; now the parent runs.
    store = MemoryStore()
    ref = SubSessionRef(
        parent_session_id="root",
        child_session_id=CHILD,
        agent_type="steps-agent",
        tool_call_id="call_1_0",
        address=a2a_address(peer.url),
    )
    await store.put_subsession_ref(ref)
    a2a = await create_client(peer.url, client_config=ClientConfig(streaming=False, polling=True))
    message = first_message(CHILD, {"steps": 2, "delay_s": 0.05}, text_only=False)
    request = SendMessageRequest(
        message=message, configuration=SendMessageConfiguration(return_immediately=True)
    )
    async for _ in a2a.send_message(request):
        break
    await a2a.close()
    async with (
        await create_server(a2a_parent, store, allow_unauthenticated=True, hooks=_traced) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 2, "delay_s": 0.05}), session_id="root")
        events = [e async for e in client.stream("root")]
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    assert [m["message_id"] for m in peer.received()] == [message.message_id]  # not again
    (task,) = peer.tasks()
    (saved,) = await store.list_subsession_refs("root")
    assert saved.address == a2a_address(peer.url, task.id)  # recorded once found


async def test_the_a2a_calls_carry_the_delegation_trace_context(peer: PeerProcess) -> None:
    async with (
        await create_server(
            a2a_parent, MemoryStore(), allow_unauthenticated=True, hooks=_traced
        ) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 1, "delay_s": 0.01}), session_id="root")
        events = [e async for e in client.stream("root")]
    assert events[-1].WhichOneof("payload") == "completed"
    assert [m["traceparent"] for m in peer.received()] == [_Traced.TRACEPARENT]


async def test_a_registry_entry_that_is_not_a2a_is_an_error_result(
    peer: PeerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(address_env_var("steps-agent"), "127.0.0.1:1")
    async with (
        await create_server(a2a_parent, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"steps": 1}), session_id="root")
        events = [e async for e in client.stream("root")]
    (end,) = [e.tool_end for e in events if e.tool_end.tool_name == "steps"]
    assert end.is_error and "not an A2A agent" in end.result_json
    assert peer.received() == []


def _once(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(call("slow", steps=50, delay_s=0.2),))
    return finish(answer=[value for _, value in step_results(messages)])


async def test_a_call_that_times_out_cancels_its_task(peer: PeerProcess) -> None:
    slow = a2a_agent_tool(peer.url, name="slow", parameters=INPUT_SCHEMA, timeout_s=1.0)
    agent = Agent(
        name="impatient",
        description="Gives an A2A agent one second.",
        input_model=PeerInput,
        output_model=Answer,
        tools=[slow],
        model=register_script("a2a-impatient", _once),
    )
    async with (
        await create_server(agent, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start("{}", session_id="root")
        events = [e async for e in client.stream("root")]
    (end,) = [e.subagent_end for e in events if e.WhichOneof("payload") == "subagent_end"]
    assert end.status == pb.SESSION_STATUS_FAILED and "timed out" in end.error

    async def canceled() -> bool:
        (task,) = peer.tasks()
        return task.status.state == TaskState.TASK_STATE_CANCELED

    await assert_eventually(canceled, timeout_s=15)


def test_a_helix_peers_sequence_is_kept_with_the_parts_it_forwarded() -> None:
    # A helix service's A2A events carry its log's sequence; a subscribe replays its
    # turn unless told where to start (helix-from-sequence). The sequence of the last
    # artifact update applied is kept with the parts forwarded, so a restarted parent
    # subscribes from there and no replayed append adds a part twice.
    update = TaskArtifactUpdateEvent(artifact=Artifact(artifact_id="text", parts=[Part(text="a")]))
    update.metadata.update({"helix": {"sequence": 12, "kind": "text_delta"}})
    assert peer_sequence(StreamResponse(artifact_update=update)) == 12
    assert peer_sequence(StreamResponse(artifact_update=TaskArtifactUpdateEvent())) == 0
    task = _task(_message("m0", Role.ROLE_USER, "go"))
    apply_artifact(task, update)  # an append to an artifact not seen yet creates it
    task.artifacts[0].metadata.update({PEER_SEQUENCE_KEY: 12})
    events = project(task, Cursor(), IDENTITY)
    assert _replayed(events).peer_sequence == 12
