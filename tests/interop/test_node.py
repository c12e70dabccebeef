"""Node.js and Python, both ways, through the proto alone.

- The Node.js client example starts a session on a Python service, drops its
  connection on purpose, resumes from its last sequence and checks it saw every
  sequence exactly once.
- A Python parent (tests.agents.interop:polyglot) delegates to the Node.js service
  as a remote sub-agent; the child's events arrive nested in the parent's stream,
  also when the Node process is SIGKILLed mid-run and restarted.
- The Node service's own log survives restarts (SIGKILL and SIGTERM).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from helix_transport import AgentClient, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.delegation.remote import child_session_id
from helix_transport.registry import address_env_var
from helix_transport.server import app as server_app
from helix_transport.server._servicer import AgentServicer
from helix_transport.store import MemoryStore
from services.researcher.agent import agent as researcher
from tests.agents.interop import NODE_AGENT_TYPE, polyglot
from tests.helpers import stream_response
from tests.interop.conftest import NODE_DIR, StartNode, require_node

RESEARCH = json.dumps({"topic": "event log replay", "max_sources": 3})
TEXT = (
    "Hello world, the agent reads the event log and writes the text. Nothing is lost: "
    "every word of the session is in the log once, after a crash of the service."
)
CHILD = child_session_id("root", "call_1_0", child_scope("polyglot", ""))


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


def forwarded(events: list[pb.StreamEvent]) -> list[pb.StreamEvent]:
    return [e.child_event.event for e in events if kind(e) == "child_event"]


def wire(events: list[pb.StreamEvent]) -> list[bytes]:
    return [e.SerializeToString(deterministic=True) for e in events]


def assert_gapless(events: list[pb.StreamEvent]) -> None:
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))


async def run_client_example(address: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        require_node(), str(NODE_DIR / "client_example.js"), address, *args,
        cwd=NODE_DIR, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


# --- a Node.js client of a Python service ----------------------------------------------


async def test_node_client_drops_and_resumes_against_a_python_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_node()
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "10")
    async with await create_server(researcher, MemoryStore(), allow_unauthenticated=True) as server:
        code, out = await run_client_example(
            server.address, RESEARCH, "--drop-after", "4", "--session-id", "from-node"
        )
        async with await AgentClient.connect(server.address) as client:
            events = [e async for e in client.stream("from-node")]
            status = await client.get_status("from-node")

    assert code == 0, out
    assert out.startswith("client_example: ok session from-node (researcher)"), out
    assert f"{len(events)} events, ended completed" in out
    assert f"saw sequences 1..{len(events)} exactly once" in out
    match = re.search(r"after sequence (\d+)", out)
    assert match is not None, out
    assert 4 <= int(match.group(1)) < len(events)  # dropped mid-log, resumed from there
    assert status.status == pb.SESSION_STATUS_COMPLETED


class RepeatsASequence(AgentServicer):
    """A broken server: sends event 6 twice."""

    async def Stream(self, request: pb.StreamRequest, context: Any) -> Any:
        async for response in super().Stream(request, context):
            events = list(stream_response(response).events)
            events += [e for e in events if e.sequence == 6]
            yield pb.StreamResponse(events=sorted(events, key=lambda e: e.sequence))


async def test_node_client_reports_a_duplicate(monkeypatch: pytest.MonkeyPatch) -> None:
    require_node()
    monkeypatch.setattr(server_app, "AgentServicer", RepeatsASequence)
    async with await create_server(researcher, MemoryStore(), allow_unauthenticated=True) as server:
        code, out = await run_client_example(server.address, RESEARCH, "--drop-after", "2")
    assert code == 1, out
    assert "client_example: FAILED" in out and "duplicate: sequence 6 after 6" in out


# --- a Python parent delegating to the Node.js service --------------------------------


async def test_python_parent_delegates_to_the_node_service(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with start_node(delay_ms=2) as node:
        monkeypatch.setenv(address_env_var(NODE_AGENT_TYPE), node.address)
        async with (
            await create_server(polyglot, MemoryStore(), allow_unauthenticated=True) as parent,
            await AgentClient.connect(parent.address) as client,
        ):
            await client.start(json.dumps({"text": TEXT, "target": "de"}), session_id="root")
            events = [e async for e in client.stream("root")]
        async with await AgentClient.connect(node.address) as child_client:
            direct = [e async for e in child_client.stream(CHILD)]
            child_status = await child_client.get_status(CHILD)

    assert_gapless(events)
    order = [
        kind(e)
        for e in events
        if kind(e) in {"tool_start", "subagent_start", "child_event", "subagent_end", "tool_end"}
    ]
    delegation = order[: order.index("tool_end") + 1]  # then the parent's own __finish__
    assert delegation[:2] == ["tool_start", "subagent_start"]
    assert delegation[-2:] == ["subagent_end", "tool_end"]
    assert set(delegation[2:-2]) == {"child_event"}
    start = next(e.subagent_start for e in events if kind(e) == "subagent_start")
    assert (start.child_agent_type, start.address) == (NODE_AGENT_TYPE, node.address)

    # The parent's log holds the Node service's own log, event for event.
    child = forwarded(events)
    assert wire(child) == wire(direct)
    assert_gapless(child)
    assert {e.agent_type for e in child} == {NODE_AGENT_TYPE} and {e.session_id for e in child} == {
        CHILD
    }
    assert kind(child[0]) == "run_started" and child[0].run_started.parent_session_id == "root"
    assert child[0].run_started.metadata["helix.root_session_id"] == "root"
    assert [kind(e) for e in child].count("text_delta") == len(TEXT.split())
    # Its terminal event reports its usage, own and subtree's: none (it calls no model).
    end = child[-1].completed
    assert end.HasField("usage") and end.HasField("total_usage") and end.total_usage == end.usage

    child_output = json.loads(child_status.output_json)
    assert child_status.status == pb.SESSION_STATUS_COMPLETED
    assert child_output["translation"].startswith("Hallo Welt, der Agent liest der Ereignis")
    assert json.loads(events[-1].completed.output_json) == {
        "translation": child_output["translation"],
        "unknown": child_output["unknown"],
    }


async def test_node_service_killed_mid_stream_parent_log_holds_each_child_event_once(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = json.dumps({"text": TEXT, "words_per_step": 2})
    async with start_node(delay_ms=15, name="killed") as node:
        monkeypatch.setenv(address_env_var(NODE_AGENT_TYPE), node.address)
        async with (
            await create_server(polyglot, MemoryStore(), allow_unauthenticated=True) as parent,
            await AgentClient.connect(parent.address) as client,
        ):
            await client.start(request, session_id="root")
            events: list[pb.StreamEvent] = []
            killed_at: int | None = None
            async for event in client.stream("root"):
                events.append(event)
                inner = event.child_event.event if kind(event) == "child_event" else None
                if (
                    killed_at is None
                    and inner is not None
                    and kind(inner) == "step_started"
                    and inner.step == 4
                ):
                    await node.kill()  # SIGKILL: no drain, mid-step
                    killed_at = inner.sequence
                    await node.start()
        async with await AgentClient.connect(node.address) as child_client:
            direct = [e async for e in child_client.stream(CHILD)]
            # The same input, never interrupted, for the expected translation.
            await child_client.start(request, session_id="uninterrupted")
            reference = [e async for e in child_client.stream("uninterrupted")]

    assert killed_at is not None, "the child finished before the parent saw its step 4"
    assert_gapless(events)
    child = forwarded(events)
    assert_gapless(child)  # every child event once: nothing lost, nothing repeated
    assert wire(child) == wire(direct)
    resumed = [e for e in direct if kind(e) == "run_resumed"]
    assert len(resumed) == 1 and resumed[0].run_resumed.reason == "restart"
    assert resumed[0].sequence > killed_at and resumed[0].run_resumed.step >= 4
    assert kind(direct[-1]) == "completed"
    assert direct[-1].completed.output_json == reference[-1].completed.output_json
    assert (
        json.loads(events[-1].completed.output_json)["translation"]
        == json.loads(reference[-1].completed.output_json)["translation"]
    )


# --- the Node.js service's own durability ------------------------------------------------


async def test_node_service_restarts_keep_and_resume_sessions(start_node: StartNode) -> None:
    long_input = json.dumps({"text": TEXT, "words_per_step": 1})
    async with start_node(delay_ms=10, name="restarts") as node:
        async with await AgentClient.connect(node.address) as client:
            await client.start(json.dumps({"text": "hello world"}), session_id="done")
            done = [e async for e in client.stream("done")]
            await client.start(long_input, session_id="stopped")
            stop = await client.interrupt("stopped", reason="enough")
            stopped = [e async for e in client.stream("stopped")]
            await client.start(long_input, session_id="running")
            seen: list[pb.StreamEvent] = []
            async for event in client.stream("running"):
                seen.append(event)
                if len(seen) == 8:
                    break
        assert await node.terminate() == 0  # SIGTERM: checkpointed, left for the next process
        await node.start()
        async with await AgentClient.connect(node.address) as client:
            assert wire([e async for e in client.stream("done")]) == wire(done)
            assert wire([e async for e in client.stream("stopped")]) == wire(stopped)
            rest = [e async for e in client.stream("running", from_sequence=seen[-1].sequence)]
            statuses = {s: await client.get_status(s) for s in ("done", "stopped", "running")}
            again = await client.start(long_input, session_id="running")
            late_interrupt = await client.interrupt("running")

    assert stop.accepted and kind(stopped[-1]) == "interrupted"
    assert stopped[-1].interrupted.reason == "enough"
    running = seen + rest
    assert_gapless(running)
    assert [kind(e) for e in running].count("run_resumed") == 1
    assert kind(running[-1]) == "completed"
    assert [statuses[s].status for s in ("done", "stopped", "running")] == [
        pb.SESSION_STATUS_COMPLETED,
        pb.SESSION_STATUS_INTERRUPTED,
        pb.SESSION_STATUS_COMPLETED,
    ]
    assert statuses["running"].last_sequence == running[-1].sequence
    assert statuses["running"].step_count == len(TEXT.split()) + 1
    assert not again.created and again.status == pb.SESSION_STATUS_COMPLETED
    assert not late_interrupt.accepted
