"""A helix parent delegating to an A2A agent: real processes, SIGKILL on either side.

The parent service (``tests.a2a.child_agents:a2a_parent``, its own process and SQLite
file) has one tool, the A2A agent ``steps-agent``, found through the mesh registry
(``a2a:http://...``). The agent (``tests.a2a.child_fixture``) is built only with
``a2a-sdk``'s server; it notes every message it receives before handling it, so each
test proves the tool call's message was sent exactly once, whatever was killed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from a2a.types import TaskState

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a._child_call import message_id_of
from helix_transport.a2a.child import child_session_id
from helix_transport.agent.tools import child_scope
from helix_transport.registry import address_env_var
from tests.a2a._peer import PeerProcess
from tests.helpers import ROOT, ServiceProcess, assert_eventually, free_port

CHILD = child_session_id("root", "call_1_0", child_scope("a2a-parent", ""))
MESSAGE_ID = message_id_of(CHILD)


@dataclass
class Mesh:
    parent: ServiceProcess
    peer: PeerProcess


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[Mesh]:
    peer = PeerProcess(tmp_path / "peer")
    parent = ServiceProcess(
        "tests.a2a.child_agents:a2a_parent",
        port=free_port(),
        store_url=f"sqlite:///{tmp_path / 'parent.db'}",
        log_path=tmp_path / "parent.log",
        env={address_env_var("steps-agent"): f"a2a:{peer.url}"},
        extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
        cwd=ROOT,
    )
    await asyncio.gather(peer.start(), parent.start())
    try:
        yield Mesh(parent=parent, peer=peer)
    finally:
        await asyncio.gather(parent.stop(), peer.stop())


def forwarded(events: list[pb.StreamEvent]) -> list[pb.StreamEvent]:
    return [e.child_event.event for e in events if e.WhichOneof("payload") == "child_event"]


def texts(events: list[pb.StreamEvent]) -> list[str]:
    return [e.text_delta.text for e in forwarded(events) if e.WhichOneof("payload") == "text_delta"]


def assert_sound(events: list[pb.StreamEvent], *, steps: int) -> None:
    """The parent's log: gapless; the child's events each once, in order; one start
    and one end of the call; every step said once."""
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    child = forwarded(events)
    assert [e.sequence for e in child] == list(range(1, len(child) + 1)), "lost or repeated"
    assert {e.session_id for e in child} == {CHILD}
    kinds = [e.WhichOneof("payload") for e in events]
    assert (kinds.count("subagent_start"), kinds.count("subagent_end")) == (1, 1), kinds
    assert texts(events) == [f"step {i}" for i in range(1, steps + 1)]
    assert child[0].WhichOneof("payload") == "run_started"
    assert child[-1].WhichOneof("payload") == "completed"
    assert events[-1].WhichOneof("payload") == "completed"


def sent_once(peer: PeerProcess) -> None:
    assert [m["message_id"] for m in peer.received()] == [MESSAGE_ID]


async def until_child_says(client: AgentClient, text: str) -> list[pb.StreamEvent]:
    events: list[pb.StreamEvent] = []
    async for event in client.stream("root"):
        events.append(event)
        inner = event.child_event.event if event.WhichOneof("payload") == "child_event" else None
        if inner is not None and inner.text_delta.text == text:
            return events
    raise AssertionError(f"the run ended before its child said {text!r}")


async def test_an_a2a_agent_is_a_child(mesh: Mesh) -> None:
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(
            json.dumps({"steps": 3, "delay_s": 0.05, "usage": True}), session_id="root"
        )
        events = [e async for e in client.stream("root")]
        status = await client.get_status("root", include_children=True)
    assert_sound(events, steps=3)
    output = json.loads(events[-1].completed.output_json)
    assert output == {"answer": [{"steps": 3, "approved": None}]}
    sent_once(mesh.peer)
    child = forwarded(events)
    artifacts = [e.tool_end for e in child if e.WhichOneof("payload") == "tool_end"]
    assert [json.loads(a.result_json)["parts"] for a in artifacts] == [
        ["part 1;"],
        ["part 2;"],
        ["part 3;"],
        [{"steps": 3, "approved": None}],
    ]
    # The usage the agent reports in its task's metadata counts in the tree's total.
    assert child[-1].completed.usage.total_tokens == 30
    assert events[-1].completed.total_usage.total_tokens >= 30
    assert status.total_usage.total_tokens >= 30
    (task,) = mesh.peer.tasks()
    assert task.context_id == CHILD and task.status.state == TaskState.TASK_STATE_COMPLETED


async def test_the_a2a_agent_killed_and_restarted_mid_task(mesh: Mesh) -> None:
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(json.dumps({"steps": 6, "delay_s": 0.3}), session_id="root")
        await until_child_says(client, "step 2")
        await mesh.peer.kill()
        await asyncio.sleep(1.0)  # the parent's stream breaks; its retries meet a closed port
        await mesh.peer.start()
        events = [e async for e in client.stream("root")]
    assert_sound(events, steps=6)
    sent_once(mesh.peer)
    assert len(mesh.peer.tasks()) == 1


async def test_the_parent_killed_and_restarted_mid_wait(mesh: Mesh) -> None:
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(json.dumps({"steps": 6, "delay_s": 0.3}), session_id="root")
        await until_child_says(client, "step 2")
    await mesh.parent.kill()
    await asyncio.sleep(0.6)  # the agent works on meanwhile: the rejoin has to catch up
    await mesh.parent.start()
    async with await AgentClient.connect(mesh.parent.address) as client:
        events = [e async for e in client.stream("root")]
    assert_sound(events, steps=6)
    sent_once(mesh.peer)
    assert len(mesh.peer.tasks()) == 1


async def test_the_a2a_agent_asks_and_the_root_answers(mesh: Mesh) -> None:
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(
            json.dumps({"steps": 4, "delay_s": 0.05, "ask": True}), session_id="root"
        )
        request: pb.InputRequired | None = None
        async for event in client.stream("root"):
            inner = (
                event.child_event.event if event.WhichOneof("payload") == "child_event" else None
            )
            if inner is not None and inner.WhichOneof("payload") == "input_required":
                request = inner.input_required
            if event.WhichOneof("payload") == "suspended":
                break
        assert request is not None and request.kind == pb.INPUT_KIND_APPROVAL
        assert list(request.path) == ["root", CHILD]
        assert json.loads(request.arguments_json)["question"] == "May I go on?"
        assert (await client.get_status("root")).status == pb.SESSION_STATUS_SUSPENDED
        # The A2A task waits too: the parent suspended without canceling it.
        (task,) = mesh.peer.tasks()
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        answered = await client.submit_input(
            "root", request.request_id, path=list(request.path), approved=True, reason="go"
        )
        assert answered.applied
        again = await client.submit_input(
            "root", request.request_id, path=list(request.path), approved=True, reason="go"
        )
        assert not again.applied  # a retried answer is not a second message
        events = [e async for e in client.stream("root")]
    assert_sound(events, steps=4)
    assert json.loads(events[-1].completed.output_json) == {
        "answer": [{"steps": 4, "approved": True}]
    }
    # The answer went to the same task, once; the task's first message was sent once.
    received = [m["message_id"] for m in mesh.peer.received()]
    assert received[0] == MESSAGE_ID and len(received) == 2
    (task,) = mesh.peer.tasks()
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    child = forwarded(events)
    answered_events = [
        e.input_answered for e in child if e.WhichOneof("payload") == "input_answered"
    ]
    assert [(a.request_id, a.outcome) for a in answered_events] == [
        (request.request_id, pb.INPUT_OUTCOME_APPROVED)
    ]


async def test_interrupting_the_parent_cancels_the_task(mesh: Mesh) -> None:
    async with await AgentClient.connect(mesh.parent.address) as client:
        await client.start(json.dumps({"steps": 50, "delay_s": 0.2}), session_id="root")
        await until_child_says(client, "step 1")
        await client.interrupt("root", reason="enough")
        status = await client.wait("root")
    assert status.status == pb.SESSION_STATUS_INTERRUPTED

    async def canceled() -> bool:
        (task,) = mesh.peer.tasks()
        return task.status.state == TaskState.TASK_STATE_CANCELED

    await assert_eventually(canceled, timeout_s=15)
