"""Companion tools over real gRPC servers on 127.0.0.1 (one process, several services).

Contract: malformed companion calls are error tool results, never a failed run;
auto-naming never collides; spawning a running child's name is ``already running``
(a message to it is queued, and terminating it drops the queue);
terminating a finished child reports ``terminated: false`` and keeps its result;
a terminated child re-spawns fresh on the same session; each outcome reaches the
parent's model once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import pytest

from helix_transport import AgentClient, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.delegation.companions import child_session_id
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore, SubSessionRef
from services.critic import agent as critic
from tests.agents import counter
from tests.agents.companions import planner


async def run_plan(client: AgentClient, session_id: str, steps: list[list[dict[str, Any]]]) -> Any:
    await client.start(json.dumps({"steps": steps}), session_id=session_id)
    events = [e async for e in client.stream(session_id)]
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    return json.loads(events[-1].completed.output_json), events


@pytest.fixture
async def mesh(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, AgentClient]]:
    """critic and counter services, and the planner that keeps them as companions."""
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "1")  # counters run long enough to catch
    async with AsyncExitStack() as stack:
        clients = {}
        for agent in (critic, counter, planner):
            server = await stack.enter_async_context(
                await create_server(agent, MemoryStore(), allow_unauthenticated=True)
            )
            monkeypatch.setenv(address_env_var(agent.name), server.address)
            clients[agent.name] = await stack.enter_async_context(
                await AgentClient.connect(server.address)
            )
        yield clients


def spawn(agent: str, message: str, name: str | None = None) -> dict[str, Any]:
    args = {"agent": agent, "message": message} | ({"name": name} if name is not None else {})
    return {"tool": "companion__spawn_agent", "args": args}


def use(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool": f"companion__{tool}", "args": args}


LONG = json.dumps({"steps": 50, "words": 400})


async def test_malformed_calls_are_error_results_not_failures(
    mesh: dict[str, AgentClient],
) -> None:
    calls = [
        spawn("critic", ""),
        spawn("critic", "draft", name=""),
        spawn("critic", "draft", name="x" * 129),
        spawn("critic", "draft", name="no spaces"),
        spawn("poet", "draft"),
        use("wait_for_result", name="reviewer", timeout_s=0),
        use("wait_for_result", name="reviewer", timeout_s=-1),
        use("get_child_status", name="ghost"),
        use("send_message", name="ghost", message="hi"),
        use("terminate_child", name="ghost"),
    ]
    output, events = await run_plan(mesh["planner"], "bad", [calls])
    errors = [r["error"] for r in output["results"][0]]
    assert len(errors) == len(calls)
    assert "message" in errors[0] and "must not be empty" in errors[0]
    assert "name" in errors[1] and "name" in errors[2] and "name" in errors[3]
    assert "unknown persistent agent type 'poet'" in errors[4]
    assert "timeout_s" in errors[5] and "timeout_s" in errors[6]
    assert all("no child agent named 'ghost'" in e for e in errors[7:])
    ends = [e.tool_end for e in events if e.WhichOneof("payload") == "tool_end"]
    assert [e.is_error for e in ends[: len(calls)]] == [True] * len(calls)


async def test_naming_already_running_terminate_truth_and_fresh_respawn(
    mesh: dict[str, AgentClient],
) -> None:
    steps = [
        [spawn("counter", LONG), spawn("counter", LONG), spawn("counter", LONG)],
        [
            spawn("counter", LONG, name="counter-1"),
            use("list_children"),
            spawn("critic", "v1: code", name="reviewer"),
        ],
        [use("terminate_child", name="reviewer"), use("terminate_child", name="counter-2")],
        [
            use("get_child_status", name="counter-2"),
            spawn("counter", json.dumps({"steps": 1, "words": 1}), name="counter-2"),
            use("send_message", name="counter-3", message="more"),
        ],
        [
            use("wait_for_result", name="counter-2"),
            use("terminate_child", name="counter-1"),
            use("terminate_child", name="counter-3"),
            use("wait_for_result", name="reviewer", timeout_s=5),
        ],
    ]
    output, _ = await run_plan(mesh["planner"], "p1", steps)
    first, second, third, fourth, fifth = output["results"]

    # Three concurrent spawns in one step: three distinct auto names.
    assert sorted(r["name"] for r in first) == ["counter-1", "counter-2", "counter-3"]
    assert {r["status"] for r in first} == {"running"}
    assert second[0] == {"error": "child 'counter-1' is already running"}
    assert sorted((c["name"], c["status"]) for c in second[1]) == [
        ("counter-1", "running"),
        ("counter-2", "running"),
        ("counter-3", "running"),
    ]
    assert second[2]["status"] == "completed" and second[2]["output"]["round"] == 1
    # Terminate tells the truth: a finished child keeps its result.
    assert third[0]["terminated"] is False and third[0]["status"] == "completed"
    assert third[0]["last_output"]["verdict"] == "revise"
    assert third[1]["terminated"] is True and third[1]["status"] == "terminated"
    assert fourth[0]["status"] == "terminated"
    assert fourth[1]["status"] == "running"  # re-spawned fresh
    assert fourth[2]["status"] == "running" and fourth[2]["queued"] == 1  # for its next turn
    assert fifth[0]["status"] == "completed" and fifth[0]["output"] == {"total": 1, "steps": 1}
    assert fifth[1]["terminated"] is True and fifth[2]["terminated"] is True
    assert fifth[2]["dropped_messages"] == 1 and "dropped_messages" not in fifth[1]
    assert fifth[3]["status"] == "completed"  # waiting on a delivered child just re-reads it
    # Every outcome was pulled by a tool call: nothing is pushed a second time.
    assert output["notices"] == []

    # The re-spawned child is the same session, its log continued with a fresh turn.
    child = child_session_id("p1", "counter-2", child_scope("planner", ""))
    status = await mesh["counter"].get_status(child)
    log = [e async for e in mesh["counter"].stream(child, from_sequence=0)]
    turn = [e async for e in mesh["counter"].stream(child, from_sequence=log[-1].sequence)]
    assert log[-1].WhichOneof("payload") == "interrupted"
    assert turn[0].turn_started.fresh and turn[-1].WhichOneof("payload") == "completed"
    assert status.status == pb.SESSION_STATUS_COMPLETED


async def test_interrupting_the_parent_interrupts_its_running_children(
    mesh: dict[str, AgentClient],
) -> None:
    steps = [[spawn("counter", LONG)], [use("wait_for_result", name="counter-1")]]
    planner_client, counter_client = mesh["planner"], mesh["counter"]
    child = child_session_id("p2", "counter-1", child_scope("planner", ""))
    await planner_client.start(json.dumps({"steps": steps}), session_id="p2")
    async for event in planner_client.stream("p2"):
        if event.WhichOneof("payload") == "tool_start" and "wait_for_result" in (
            event.tool_start.tool_name
        ):
            reply = await planner_client.interrupt("p2", reason="enough")
            assert reply.accepted
    child_log = [e async for e in counter_client.stream(child)]

    assert (await planner_client.get_status("p2")).status == pb.SESSION_STATUS_INTERRUPTED
    assert child_log[-1].WhichOneof("payload") == "interrupted"
    assert child_log[-1].interrupted.reason == "enough"


async def test_a_spawn_refused_as_existing_keeps_the_ref_it_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A parent that crashed after a spawn's Start landed but before its state was saved
    # spawns the name again, now with another message: the child's service refuses
    # (ALREADY_EXISTS). The ref from the first spawn must still say the child runs, so
    # that an interrupt of the parent reaches it; the refused spawn used to mark it
    # failed.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    parent_store = MemoryStore()
    async with AsyncExitStack() as stack:
        counter_server = await stack.enter_async_context(
            await create_server(counter, MemoryStore(), allow_unauthenticated=True)
        )
        monkeypatch.setenv(address_env_var(counter.name), counter_server.address)
        planner_server = await stack.enter_async_context(
            await create_server(planner, parent_store, allow_unauthenticated=True)
        )
        client, counters = [
            await stack.enter_async_context(await AgentClient.connect(server.address))
            for server in (planner_server, counter_server)
        ]
        child_id = child_session_id("p1", "worker", child_scope("planner", ""))
        await counters.start(LONG, session_id=child_id, parent_session_id="p1")
        first = SubSessionRef(
            parent_session_id="p1",
            child_session_id=child_id,
            agent_type="counter",
            tool_call_id="call_0",
            address=counter_server.address,
        )
        await parent_store.put_subsession_ref(first)
        again = json.dumps({"steps": 1, "words": 1})
        result, _ = await run_plan(client, "p1", [[spawn("counter", again, name="worker")]])
        assert "exists with another first message" in json.dumps(result)
        assert await parent_store.get_subsession_ref("p1", child_id) == first
        await counters.interrupt(child_id)
