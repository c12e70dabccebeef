"""Remote sub-agents over real gRPC: four services on 127.0.0.1, each with its own store.

The parent knows its children only through the contract: every call crosses a
real gRPC channel, found through the mesh registry (HELIX_AGENT_ADDRESS_<TYPE>).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc
import pytest

from helix_transport import (
    AgentClient,
    AgentServer,
    ClientConfig,
    RetryConfig,
    ServerConfig,
    create_server,
)
from helix_transport._events import SessionStatus
from helix_transport._exceptions import UsageError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.run_cache import RunCache
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    finish,
    register_script,
    steps_taken,
)
from helix_transport.agent.tools import RunServices, ToolContext, child_scope
from helix_transport.delegation.forwarding import forwarded_so_far
from helix_transport.delegation.remote import child_session_id, remote_agent_tool_from_service
from helix_transport.registry import address_env_var
from helix_transport.server.limits import Limits
from helix_transport.store import MemoryStore, SessionRecord, Store, SubSessionRef
from helix_transport.transport._pool import ClientPool
from tests.agents import counter, delegator, looper, middle
from tests.helpers import BlinkingStore, assert_eventually, free_port


def child_of(parent_session_id: str, tool_call_id: str, parent_type: str = "delegator") -> str:
    """The id of the child a tool call of an (anonymous) ``parent_type`` session starts."""
    return child_session_id(parent_session_id, tool_call_id, child_scope(parent_type, ""))


FAST_GIVE_UP = ClientConfig(
    reconnect=RetryConfig(
        initial_backoff=timedelta(milliseconds=20),
        max_backoff=timedelta(milliseconds=200),
        deadline=timedelta(seconds=1),
    )
)


@dataclass
class Mesh:
    client: AgentClient
    """A client of the root (delegator) service."""
    stores: dict[str, Store]
    addresses: dict[str, str]
    servers: dict[str, AgentServer]


@pytest.fixture
async def mesh(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Mesh]:
    stores: dict[str, Store] = {}
    addresses: dict[str, str] = {}
    servers: dict[str, AgentServer] = {}
    for agent in (counter, looper, middle, delegator):
        stores[agent.name] = MemoryStore()
        server = await create_server(
            agent, stores[agent.name], ServerConfig(client=FAST_GIVE_UP), allow_unauthenticated=True
        )
        await server.start()
        servers[agent.name] = server
        addresses[agent.name] = server.address
        monkeypatch.setenv(address_env_var(agent.name), server.address)
    client = await AgentClient.connect(addresses["delegator"])
    try:
        yield Mesh(client=client, stores=stores, addresses=addresses, servers=servers)
    finally:
        await client.aclose()
        for server in reversed(servers.values()):
            await server.shutdown(grace_s=1)


def calls(*items: tuple[str, Mapping[str, object]]) -> str:
    return json.dumps({"calls": [{"tool": t, "args": a} for t, a in items]})


async def run(mesh: Mesh, input_json: str, session_id: str = "root") -> list[pb.StreamEvent]:
    await mesh.client.start(input_json, session_id=session_id)
    return [e async for e in mesh.client.stream(session_id)]


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


def forwarded(events: list[pb.StreamEvent], tool_call_id: str) -> list[pb.StreamEvent]:
    return [
        e.child_event.event
        for e in events
        if kind(e) == "child_event" and e.child_event.tool_call_id == tool_call_id
    ]


async def test_child_events_arrive_in_order_between_start_and_end(mesh: Mesh) -> None:
    events = await run(mesh, calls(("count", {"steps": 2, "words": 3})))

    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    order = [
        kind(e)
        for e in events
        if kind(e) in {"tool_start", "subagent_start", "child_event", "subagent_end", "tool_end"}
    ]
    first_call = order[: order.index("tool_end") + 1]
    assert first_call[:2] == ["tool_start", "subagent_start"]
    assert first_call[-2:] == ["subagent_end", "tool_end"]
    assert set(first_call[2:-2]) == {"child_event"}

    child_id = child_of("root", "call_1_0")
    child = forwarded(events, "call_1_0")
    assert {e.session_id for e in child} == {child_id} and {e.agent_type for e in child} == {
        "counter"
    }
    assert [e.sequence for e in child] == list(range(1, len(child) + 1))
    assert kind(child[-1]) == "completed"
    # The child's log, read from the child's own service, is what the parent forwarded.
    async with await AgentClient.connect(mesh.addresses["counter"]) as counter_client:
        direct = [e async for e in counter_client.stream(child_id)]
    # Compared as messages: protobuf does not fix the order of map entries when it
    # serializes, so equal events may differ in bytes.
    assert direct == child

    end = next(e.subagent_end for e in events if kind(e) == "subagent_end")
    assert end.status == pb.SESSION_STATUS_COMPLETED and end.child_session_id == child_id
    assert json.loads(events[-1].completed.output_json) == {"results": [{"total": 2, "steps": 2}]}


async def test_sub_session_ref_is_stored_with_every_field(mesh: Mesh) -> None:
    await run(mesh, calls(("count", {"steps": 1})))
    refs = await mesh.stores["delegator"].list_subsession_refs("root")

    assert len(refs) == 1
    ref = refs[0]
    assert ref.child_session_id == child_of("root", "call_1_0")
    assert (ref.agent_type, ref.tool_call_id, ref.address) == (
        "counter",
        "call_1_0",
        mesh.addresses["counter"],
    )
    assert ref.status.value == "completed" and ref.completed_at is not None
    assert ref.completed_at >= ref.started_at
    assert json.loads(ref.output_json) == {"total": 1, "steps": 1}
    child = await mesh.stores["counter"].get_session(ref.child_session_id)
    assert child is not None and child.parent_session_id == "root"
    assert child.metadata["helix.root_session_id"] == "root"


async def test_sibling_calls_run_concurrently(mesh: Mesh, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "10")
    events = await run(mesh, calls(*[("count", {"steps": 2, "words": 5})] * 3))

    ids = ["call_1_0", "call_1_1", "call_1_2"]
    first_seen = {
        i: next(
            n
            for n, e in enumerate(events)
            if kind(e) == "child_event" and e.child_event.tool_call_id == i
        )
        for i in ids
    }
    last_seen = {
        i: max(
            n
            for n, e in enumerate(events)
            if kind(e) == "child_event" and e.child_event.tool_call_id == i
        )
        for i in ids
    }
    # Every child had started streaming before any of them finished.
    assert max(first_seen.values()) < min(last_seen.values())
    assert json.loads(events[-1].completed.output_json)["results"] == [{"total": 2, "steps": 2}] * 3


async def test_failed_child_is_an_error_result_and_siblings_go_on(mesh: Mesh) -> None:
    events = await run(mesh, calls(("loop", {}), ("count", {"steps": 1})))

    results = json.loads(events[-1].completed.output_json)["results"]
    assert "error" in results[0] and "3 steps" in results[0]["error"]
    assert results[1] == {"total": 1, "steps": 1}
    ends = {e.tool_end.tool_call_id: e.tool_end for e in events if kind(e) == "tool_end"}
    assert ends["call_1_0"].is_error and not ends["call_1_1"].is_error


async def test_an_unreachable_child_is_waited_for_until_the_tools_timeout(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens there: as a restarting service looks. Not a failure of the child
    # (the parent waits on), but the tool's timeout ends the wait.
    monkeypatch.setenv(address_env_var("looper"), f"127.0.0.1:{free_port()}")
    events = await run(mesh, calls(("loop_briefly", {}), ("count", {"steps": 1})))

    results = json.loads(events[-1].completed.output_json)["results"]
    assert results[0] == {"error": "looper timed out after 2s"}
    assert results[1] == {"total": 1, "steps": 1}


async def test_timeout_interrupts_the_child(mesh: Mesh, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    events = await run(mesh, calls(("count_quickly", {"steps": 30, "words": 5})))

    results = json.loads(events[-1].completed.output_json)["results"]
    assert "timed out" in results[0]["error"]
    async with await AgentClient.connect(mesh.addresses["counter"]) as counter_client:
        child = child_of("root", "call_1_0")

        async def interrupted() -> bool:
            status = await counter_client.get_status(child)
            return status.status == pb.SESSION_STATUS_INTERRUPTED

        await assert_eventually(interrupted, timeout_s=5)


async def test_three_levels_nest_at_every_level(mesh: Mesh) -> None:
    nested = {"calls": [{"tool": "count", "args": {"steps": 1, "words": 2}}]}
    events = await run(mesh, calls(("delegate", nested)))

    middle_events = forwarded(events, "call_1_0")
    assert {e.agent_type for e in middle_events} == {"middle"}
    assert [e.sequence for e in middle_events] == list(range(1, len(middle_events) + 1))
    leaf = [e.child_event.event for e in middle_events if kind(e) == "child_event"]
    middle_id = child_of("root", "call_1_0")
    assert {e.session_id for e in leaf} == {child_of(middle_id, "call_1_0", "middle")}
    assert {e.agent_type for e in leaf} == {"counter"}
    assert [e.sequence for e in leaf] == list(range(1, len(leaf) + 1)) and kind(
        leaf[-1]
    ) == "completed"
    assert json.loads(events[-1].completed.output_json) == {
        "results": [{"results": [{"total": 1, "steps": 1}]}]
    }


async def test_interrupting_the_root_interrupts_every_level(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    nested = {"calls": [{"tool": "count", "args": {"steps": 40, "words": 5}}]}
    await mesh.client.start(calls(("delegate", nested)), session_id="root")
    middle_id = child_of("root", "call_1_0")
    leaf_id = child_of(middle_id, "call_1_0", "middle")
    events: list[pb.StreamEvent] = []
    async for event in mesh.client.stream("root"):
        events.append(event)
        inner = event.child_event.event if kind(event) == "child_event" else None
        if (
            inner is not None
            and kind(inner) == "child_event"
            and kind(inner.child_event.event) == "text_delta"
        ):
            await mesh.client.interrupt("root", reason="stop everything")

    assert kind(events[-1]) == "interrupted"
    for agent_type, session_id in (("middle", middle_id), ("counter", leaf_id)):
        async with await AgentClient.connect(mesh.addresses[agent_type]) as client:

            async def stopped(client: AgentClient = client, session_id: str = session_id) -> bool:
                status = await client.get_status(session_id)
                return status.status == pb.SESSION_STATUS_INTERRUPTED

            await assert_eventually(stopped, timeout_s=5)


async def test_tool_built_from_describe_alone(mesh: Mesh) -> None:
    tool = await remote_agent_tool_from_service("count", address=mesh.addresses["counter"])
    schema = tool.schema()["function"]
    assert tool.args_model is None
    assert schema["parameters"]["properties"]["steps"]["maximum"] == 50
    assert "ticks once per step" in schema["description"]


async def test_parents_of_two_types_sharing_a_session_id_get_children_of_their_own(
    mesh: Mesh,
) -> None:
    # Session ids are caller-chosen, and both parent services present one identity to the
    # counter service. With a child id of the parent's session id and tool call id alone,
    # the second parent was refused the child (another input: ALREADY_EXISTS) or, with the
    # same input, was handed the first parent's child and its output.
    first = await run(mesh, calls(("count", {"steps": 1, "words": 2})), session_id="shared")
    async with await AgentClient.connect(mesh.addresses["middle"]) as other:
        await other.start(calls(("count", {"steps": 2, "words": 2})), session_id="shared")
        second = [e async for e in other.stream("shared")]

    assert json.loads(first[-1].completed.output_json) == {"results": [{"total": 1, "steps": 1}]}
    assert json.loads(second[-1].completed.output_json) == {"results": [{"total": 2, "steps": 2}]}
    ids = {e.subagent_start.child_session_id for e in first + second if kind(e) == "subagent_start"}
    assert ids == {child_of("shared", "call_1_0"), child_of("shared", "call_1_0", "middle")}
    for child_id in ids:
        assert await mesh.stores["counter"].get_session(child_id) is not None


def test_a_child_scope_is_one_parent_type_and_owner() -> None:
    scope = child_scope("delegator", "alice", "acme")
    assert scope == child_scope("delegator", "alice", "acme")  # a resumed parent rejoins
    others = {
        child_scope("middle", "alice", "acme"),
        child_scope("delegator", "bob", "acme"),
        child_scope("delegator", "alice", "other"),
        child_scope("delegator", "alice", ""),
        child_scope("delegator", "acme/alice", ""),  # no concatenation can collide
    }
    assert scope not in others and len(others) == 5
    # Records written before sessions had owners belong to anonymous, as ownership says.
    assert child_scope("delegator", "") == child_scope("delegator", "anonymous")
    assert len(scope) == 16 and int(scope, 16) >= 0


async def test_retried_dispatch_reaches_the_same_child(mesh: Mesh) -> None:
    await run(mesh, calls(("count", {"steps": 1})), session_id="once")
    child_id = child_of("once", "call_1_0")
    async with await AgentClient.connect(mesh.addresses["counter"]) as counter_client:
        again = await counter_client.start(
            json.dumps({"steps": 1, "words": 4}), session_id=child_id
        )
    assert not again.created


async def test_fan_out_shares_one_channel_per_service(mesh: Mesh) -> None:
    events = await run(mesh, calls(*[("count", {"steps": 1, "words": 0})] * 20))
    assert len(json.loads(events[-1].completed.output_json)["results"]) == 20
    assert mesh.servers["delegator"].clients.addresses() == [mesh.addresses["counter"]]


class _CountsReads(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read(self, session_id: str, **kw: Any) -> list[pb.StreamEvent]:
        self.reads += 1
        await asyncio.sleep(0)  # as a real store's read would, let other tasks run
        return await super().read(session_id, **kw)


async def test_a_resumed_parent_reads_its_log_once_for_all_the_children_it_rejoins() -> None:
    # A parent that crashed mid-fan-out rejoins every running child at once; each needs
    # the last event of its own the log holds. 40 children, 2,400 forwarded events.
    store = _CountsReads()
    await store.create_session(
        SessionRecord(session_id="p", agent_type="parent", input_json="{}", input_hash="")
    )
    last = 0
    for round_ in range(1, 61):
        events = [
            pb.StreamEvent(
                child_event=pb.ChildEvent(
                    tool_call_id=f"call_{n}", event=pb.StreamEvent(sequence=round_ + n % 7)
                )
            )
            for n in range(40)
        ]
        last = await store.append("p", events, expected_sequence=last)

    async def flush() -> None:
        pass

    cache = RunCache()

    def context(tool_call_id: str) -> ToolContext:
        return ToolContext(
            session_id="p", agent_type="parent", tool_call_id=tool_call_id, step=1, metadata={},
            emit=lambda event: None,
            run=RunServices(flush=flush, store=store, clients=ClientPool(), cache=cache),
        )  # fmt: skip

    lasts = await asyncio.gather(
        *(forwarded_so_far(context(f"call_{n}")).last(f"call_{n}") for n in range(40))
    )
    assert lasts == [60 + n % 7 for n in range(40)]
    # 2,400 events, 1,000 a read: one pass while the others wait (three pages and the
    # empty one that ends the log: a short page may not), then one read of nothing for
    # those asked while it ran; not a pass per child.
    assert store.reads == 5
    # What the log gains later is read on the next lookup, and only that.
    more = pb.ChildEvent(tool_call_id="call_3", event=pb.StreamEvent(sequence=99))
    await store.append("p", [pb.StreamEvent(child_event=more)], expected_sequence=last)
    assert await forwarded_so_far(context("call_3")).last("call_3") == 99
    assert await forwarded_so_far(context("call_new")).last("call_new") == 0
    assert store.reads == 8


async def test_a_child_whose_start_was_refused_adds_no_usage_to_its_parents_total(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child's service refuses the input (too large for it): the call fails, the
    # parent records the child as failed, and its total counts the child as nothing.
    strict = await create_server(
        counter, MemoryStore(), ServerConfig(limits=Limits(max_input_bytes=10)),
        allow_unauthenticated=True,
    )  # fmt: skip
    await strict.start()
    monkeypatch.setenv(address_env_var("counter"), strict.address)
    try:
        events = await run(mesh, calls(("count", {"steps": 1, "words": 4})))
        results = json.loads(events[-1].completed.output_json)["results"]
        assert "larger than 10 bytes" in results[0]["error"]
        status = await mesh.client.get_status("root", include_children=True)
    finally:
        await strict.shutdown(grace_s=1)
    assert status.status == pb.SESSION_STATUS_COMPLETED
    assert status.total_usage == status.usage


async def test_a_total_whose_child_service_is_down_is_unavailable_without_its_address(
    mesh: Mesh,
) -> None:
    # Before, the child's ConnectError crossed the wire as INTERNAL, carrying the child
    # service's address and grpc's resolver detail; and INTERNAL is not retried.
    events = await run(mesh, calls(("count", {"steps": 1, "words": 2})))
    assert kind(events[-1]) == "completed"
    await mesh.servers["counter"].shutdown(grace_s=0)
    stub = pb_grpc.AgentServiceStub(mesh.client._channel)
    request = pb.GetStatusRequest(session_id="root", include_children=True)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetStatus(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    details = info.value.details() or ""
    assert details.startswith("could not read the usage of child session 'root-remote-")
    assert mesh.addresses["counter"] not in details


class _SlowToRecordAnEnd(MemoryStore):
    """A parent's store slow to record a child's end (a store round trip under load)."""

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        if ref.status is not SessionStatus.RUNNING:
            await asyncio.sleep(1.0)
        await super().put_subsession_ref(ref)


async def test_a_delegation_that_ends_as_its_timeout_expires_ends_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `count_quickly` gives up after 0.5 s; the child is done in milliseconds, but
    # recording its end takes 1 s. Before, the timeout covered that recording too: the
    # call logged a second subagent_end (failed) and told the model the child timed out.
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as child,
    ):
        monkeypatch.setenv(address_env_var("counter"), child.address)
        parent_store = _SlowToRecordAnEnd()
        async with (
            await create_server(delegator, parent_store, allow_unauthenticated=True) as parent,
            await AgentClient.connect(parent.address) as client,
        ):
            await client.start(calls(("count_quickly", {"steps": 1, "words": 1})), session_id="t1")
            events = [e async for e in client.stream("t1")]
            (ref,) = await parent_store.list_subsession_refs("t1")
    ends = [e.subagent_end for e in events if kind(e) == "subagent_end"]
    assert [e.status for e in ends] == [pb.SESSION_STATUS_COMPLETED]
    (tool_end,) = [e.tool_end for e in events if e.tool_end.tool_name == "count_quickly"]
    assert not tool_end.is_error, tool_end.result_json
    assert ref.status is SessionStatus.COMPLETED


async def test_a_child_inherits_the_root_not_its_grandparents_trace_context() -> None:
    # Dispatched and companion children got the parent's metadata as it was, with the
    # traceparent the parent itself inherited: their spans nested under the
    # grandparent's delegation span (found by review).
    from helix_transport._metadata import SessionLineage, split_metadata
    from helix_transport.agent.tools import RunServices, ToolContext
    from helix_transport.delegation.child_records import child_metadata
    from helix_transport.store import MemoryStore
    from helix_transport.transport._pool import ClientPool

    async def flush() -> None:
        pass

    inherited = {"team": "a", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    stored = {**inherited, "tracestate": "x=1", "helix.root_session_id": "root"}
    user, lineage = split_metadata(stored)  # as the run loop splits the session's
    ctx = ToolContext(
        session_id="mid",
        agent_type="counter",
        tool_call_id="c1",
        step=1,
        metadata=user,
        emit=lambda event: None,
        run=RunServices(flush=flush, store=MemoryStore(), clients=ClientPool(), lineage=lineage),
    )
    assert child_metadata(ctx) == {"team": "a", "helix.root_session_id": "root"}
    mine = {"traceparent": "00-" + "1" * 32 + "-" + "3" * 16 + "-01"}
    assert child_metadata(ctx, mine) == {"team": "a", "helix.root_session_id": "root", **mine}
    # A root is the tree's root.
    root = dataclasses.replace(
        ctx, metadata={}, run=dataclasses.replace(ctx.run, lineage=SessionLineage())
    )
    assert child_metadata(root) == {"helix.root_session_id": "mid"}


def _repeats_its_ids(messages: list[dict[str, Any]]) -> ScriptedTurn:
    # A provider whose tool call ids repeat: "call_0" within a step and across steps.
    def count(steps: int) -> ScriptedToolCall:
        return ScriptedToolCall(name="count", arguments={"steps": steps, "words": 1}, id="call_0")

    step = steps_taken(messages)
    if step == 0:
        return ScriptedTurn(tool_calls=(count(1), count(2)))
    if step == 1:
        return ScriptedTurn(tool_calls=(count(3),))
    results = [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]
    return finish(results=results)


async def test_a_provider_repeating_tool_call_ids_still_gets_one_child_per_call(
    mesh: Mesh,
) -> None:
    # Children are named after their tool call: a repeated id would have made the second
    # and third calls rejoin the first call's child (or fail as "a different call owns it").
    agent = dataclasses.replace(
        delegator, name="repeater", model=register_script("repeater", _repeats_its_ids)
    )
    store = MemoryStore()
    async with (
        await create_server(agent, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(calls(), session_id="r")
        events = [e async for e in client.stream("r")]

    assert json.loads(events[-1].completed.output_json) == {
        "results": [{"total": n, "steps": n} for n in (1, 2, 3)]
    }
    ends = [e.subagent_end for e in events if kind(e) == "subagent_end"]
    assert [e.status for e in ends] == [pb.SESSION_STATUS_COMPLETED] * 3
    assert len({e.child_session_id for e in ends}) == 3
    refs = await store.list_subsession_refs("r")
    assert len({r.tool_call_id for r in refs}) == 3


async def test_a_blip_in_the_parents_own_store_leaves_its_child_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The parent's run pauses and is resumed; the child it forwards must not be stopped
    # as if its stream were lost (the resumed parent would rejoin a child it killed).
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    parent_store = BlinkingStore()
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as child,
        await AgentClient.connect(child.address) as child_client,
    ):
        monkeypatch.setenv(address_env_var("counter"), child.address)
        async with (
            await create_server(
                delegator, parent_store, ServerConfig(lease_ttl_s=1.0), allow_unauthenticated=True
            ) as parent,
            await AgentClient.connect(parent.address) as client,
        ):
            await client.start(calls(("count", {"steps": 20, "words": 3})), session_id="root")
            async for event in client.stream("root"):  # until the child is well under way
                if kind(event) == "child_event" and event.child_event.event.step >= 3:
                    break
            parent_store.down = True
            await asyncio.sleep(0.3)
            parent_store.down = False
            child_status = await child_client.wait(child_of("root", "call_1_0"))
            async with asyncio.timeout(30):
                root = await client.wait("root")
    assert child_status.status == pb.SESSION_STATUS_COMPLETED
    assert root.status == pb.SESSION_STATUS_COMPLETED
    assert json.loads(root.output_json) == {"results": [{"total": 20, "steps": 20}]}


class _RecordsWhatTheChildIs(MemoryStore):
    """A parent's store that notes, at each ref it saves, whether the child exists yet."""

    def __init__(self, child_store: Store) -> None:
        super().__init__()
        self.child_store = child_store
        self.saved: list[tuple[SessionStatus, bool]] = []

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        child = await self.child_store.get_session(ref.child_session_id)
        self.saved.append((ref.status, child is not None))
        await super().put_subsession_ref(ref)


async def test_the_ref_records_a_running_child_before_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An interrupt cascading while the Start is in flight must find the child (see
    # Cascade): the ref is the first thing written, and the only one until the end
    # (a child streaming for a second: no cursor rewritten on the way).
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    child_store = MemoryStore()
    parent_store = _RecordsWhatTheChildIs(child_store)
    async with await create_server(counter, child_store, allow_unauthenticated=True) as child:
        monkeypatch.setenv(address_env_var("counter"), child.address)
        async with (
            await create_server(delegator, parent_store, allow_unauthenticated=True) as parent,
            await AgentClient.connect(parent.address) as client,
        ):
            await client.start(calls(("count", {"steps": 5, "words": 10})), session_id="root")
            events = [e async for e in client.stream("root")]
    assert kind(events[-1]) == "completed"
    assert parent_store.saved == [
        (SessionStatus.RUNNING, False),
        (SessionStatus.COMPLETED, True),
    ]


async def test_a_closed_client_pool_connects_no_more() -> None:
    # A background interrupt still retrying after shutdown opened a channel nothing closed.
    pool = ClientPool()
    await pool.get("127.0.0.1:1")
    await pool.aclose()
    with pytest.raises(UsageError, match="closed"):
        await pool.get("127.0.0.1:1")
    assert pool.addresses() == []
