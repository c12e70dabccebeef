"""Companion turns driven by hand (the tools and the step hook called directly, a
real critic service on 127.0.0.1): what the parent's model is shown when it
messages a child.

Contract: a finished turn's outcome reaches the parent's model exactly once, also
when the parent messages the child again before it has looked (``previous_turn``).
A message to a running child is queued; at a step's start, once the turn has
completed, the queue becomes the child's next turn (one turn, in order), also when
a crashed parent asks again; a turn that does not complete, or a terminate, drops
the queue and says so; a full queue is an error result.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from helix_transport import AgentClient, ConnectError, SessionStateConflict, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.run_cache import RunCache
from helix_transport.agent.state import CompanionChild, CompanionsState, RunState
from helix_transport.agent.tools import RunServices, ToolContext, ToolError, child_scope
from helix_transport.delegation.companions import (
    MAX_INBOX,
    Companions,
    Mode,
    NameArgs,
    PersistentChild,
    SendArgs,
    SpawnArgs,
    _lifecycle,
    child_session_id,
)
from helix_transport.delegation.forwarding import forward_child
from helix_transport.store import MemoryStore
from helix_transport.transport._pool import ClientPool
from services.critic import agent as critic

PARENT = "parent"
CHILD = child_session_id(PARENT, "critic-1", child_scope("parent", ""))


class Parent:
    """One parent run's tool contexts, sharing its state, and the events they emit."""

    def __init__(self, clients: ClientPool) -> None:
        self.events: list[pb.StreamEvent] = []
        self.run_state = RunState()  # what the companions keep, checkpointed
        self.clients = clients
        self.store = MemoryStore()
        self.cache = RunCache()  # the run's, shared by its tool calls
        self.calls = 0

    def ctx(self, call_id: str = "") -> ToolContext:
        """A tool call's context; ``call_id`` repeats a call (a resumed step's)."""
        self.calls += 1

        async def flush() -> None:
            return None

        return ToolContext(
            session_id=PARENT, agent_type="parent", tool_call_id=call_id or f"call_{self.calls}",
            step=1,
            metadata={}, emit=self.events.append,
            run=RunServices(
                flush=flush, store=self.store, clients=self.clients, state=self.run_state,
                cache=self.cache,
            ),
        )  # fmt: skip

    def checkpoint(self) -> dict[str, Any]:
        """The run state as a checkpoint stores it."""
        return copy.deepcopy(self.run_state.to_json())

    def restart(self, checkpoint: dict[str, Any]) -> None:
        """The parent crashed and resumes: its state from ``checkpoint``, a new cache."""
        self.run_state = RunState.from_json(checkpoint)
        self.cache = RunCache()

    def ends(self) -> list[pb.StreamEvent]:
        return [e for e in self.events if e.WhichOneof("payload") == "subagent_end"]

    def delivered_rounds(self) -> list[int]:
        """The critic's round in each ``subagent_end`` the parent logged."""
        return [
            json.loads(e.subagent_end.output_json)["round"]
            for e in self.events
            if e.WhichOneof("payload") == "subagent_end"
        ]


@pytest.fixture
async def parent() -> AsyncIterator[Parent]:
    clients = ClientPool()
    try:
        yield Parent(clients)
    finally:
        await clients.aclose()


def critic_companions(address: str, mode: Mode = "non-blocking") -> Companions:
    """The companion tools for one critic type at ``address``."""
    return Companions(
        [PersistentChild(agent_type="critic", mode=mode, input_field="artifact", address=address)]
    )


@pytest.fixture
async def child() -> AsyncIterator[tuple[Companions, AgentClient]]:
    async with (
        await create_server(critic, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        tools = critic_companions(server.address)
        yield tools, client


@pytest.mark.parametrize("how", ["send_message", "spawn_agent"])
async def test_a_message_after_an_unseen_turn_shows_that_turns_outcome_once(
    how: str, child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    tools, client = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    first = await client.wait(CHILD)  # it finished; the parent's model has not looked
    if how == "send_message":
        sent = await tools._send(parent.ctx(), SendArgs(name="critic-1", message="v2 tests"))
    else:
        args = SpawnArgs(agent="critic", message="v2 tests", name="critic-1")
        sent = await tools._spawn(parent.ctx(), args)
    pushed_early = await tools.deliver_finished(parent.ctx(), [])  # turn 2 may still run
    await client.wait(CHILD, from_sequence=first.last_sequence)
    pushed = await tools.deliver_finished(parent.ctx(), []) or pushed_early

    assert first.status == pb.SESSION_STATUS_COMPLETED
    assert sent["status"] == "running"
    assert sent["previous_turn"]["status"] == "completed"
    assert sent["previous_turn"]["output"]["round"] == 1
    # Only turn 2 is pushed: turn 1 was shown by the tool's result.
    assert len(pushed) == 1 and '"round":2' in pushed[0]["content"]
    assert '"round":1' not in pushed[0]["content"]
    assert parent.delivered_rounds() == [1, 2]


# --- queued messages -------------------------------------------------------------------


@pytest.fixture
def slow_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "100")  # a critic's turn takes tenths


@pytest.mark.usefixtures("slow_child")
async def test_messages_to_a_running_child_become_its_next_turn(
    child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    tools, client = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    queued = [
        await tools._send(parent.ctx(), SendArgs(name="critic-1", message=m))
        for m in ("v2", "v3 tests")
    ]
    running = await tools._status(parent.ctx(), NameArgs(name="critic-1"))
    early = await tools.deliver_finished(parent.ctx(), [])  # the turn runs: nothing yet
    first = await client.wait(CHILD)
    notice = await tools.deliver_finished(parent.ctx(), [])
    second = await client.wait(CHILD, from_sequence=first.last_sequence)
    after = await tools.deliver_finished(parent.ctx(), [])
    turn = [e async for e in client.stream(CHILD, from_sequence=first.last_sequence)]

    assert [q["queued"] for q in queued] == [1, 2]
    assert running["status"] == "running" and running["queued_messages"] == 2
    assert early == []
    lines = notice[0]["content"].splitlines()
    assert '"round":1' in lines[1]
    assert lines[2] == "Sub-agent 'critic-1' got your 2 queued message(s): its turn 2 is running."
    # One turn with both messages, in order: the critic's round 2 reviews them together.
    assert turn[0].turn_started.message == "v2\n\nv3 tests"
    verdict = json.loads(second.output_json)
    assert verdict["round"] == 2 and verdict["verdict"] == "pass" and verdict["previous"] == "v1"
    assert '"round":2' in after[0]["content"]
    assert parent.delivered_rounds() == [1, 2]
    # Each turn's start and end in the parent's log name the same tool call.
    starts = [e.subagent_start.tool_call_id for e in parent.events if e.HasField("subagent_start")]
    ends = [e.subagent_end.tool_call_id for e in parent.events if e.HasField("subagent_end")]
    assert starts == ends == ["call_1", "call_1"]


@pytest.mark.usefixtures("slow_child")
async def test_a_hand_over_asked_again_after_a_parent_crash_starts_one_turn(
    child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    # A parent killed after the hook's Continue but before its next checkpoint resumes
    # with the queue still in its state and asks again: the same turn and message, so
    # the child's service replays the turn it started, and turn 1's outcome is read
    # from its completed event (the child's status is turn 2's by then).
    tools, client = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    await tools._send(parent.ctx(), SendArgs(name="critic-1", message="v2 tests"))
    first = await client.wait(CHILD)
    checkpoint = parent.checkpoint()
    await tools.deliver_finished(parent.ctx(), [])
    second = await client.wait(CHILD, from_sequence=first.last_sequence)  # turn 2 done too
    parent.restart(checkpoint)
    again = await tools.deliver_finished(parent.ctx(), [])
    after = await tools.deliver_finished(parent.ctx(), [])
    turn = [e async for e in client.stream(CHILD, from_sequence=first.last_sequence)]
    now = await client.get_status(CHILD)

    lines = again[0]["content"].splitlines()
    assert '"round":1' in lines[1]  # turn 1's outcome, not turn 2's
    assert lines[2] == "Sub-agent 'critic-1' got your 1 queued message(s): its turn 2 is running."
    assert turn[0].turn_started.turn == 2 and turn[0].turn_started.message == "v2 tests"
    assert now.last_sequence == second.last_sequence == turn[-1].sequence  # no turn 3
    assert json.loads(second.output_json)["round"] == 2
    assert '"round":2' in after[0]["content"]


@pytest.mark.usefixtures("slow_child")
async def test_a_queue_is_dropped_when_the_turn_does_not_complete_or_on_terminate(
    child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    tools, client = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    await tools._send(parent.ctx(), SendArgs(name="critic-1", message="v2"))
    await client.interrupt(CHILD, reason="from outside")
    stopped = await client.wait(CHILD)
    notice = await tools.deliver_finished(parent.ctx(), [])
    # Spawned again (fresh), queued, terminated: the queue goes with it.
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v3", name="critic-1"))
    await tools._send(parent.ctx(), SendArgs(name="critic-1", message="v4"))
    ended = await tools._terminate(parent.ctx(), NameArgs(name="critic-1"))
    turn = [e async for e in client.stream(CHILD, from_sequence=stopped.last_sequence)]
    now = await client.get_status(CHILD)

    lines = notice[0]["content"].splitlines()
    assert "interrupted" in lines[1]
    assert "your 1 queued message(s) were dropped" in lines[2]
    assert ended["terminated"] is True and ended["dropped_messages"] == 1
    assert "queued_messages" not in ended
    # Turn 2 is the fresh re-spawn; the dropped messages never became a turn.
    assert turn[0].turn_started.turn == 2 and turn[0].turn_started.fresh
    assert now.last_sequence == turn[-1].sequence  # and nothing after its end


@pytest.mark.usefixtures("slow_child")
async def test_a_full_queue_is_an_error_result(
    child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    tools, _ = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    for i in range(MAX_INBOX):
        await tools._send(parent.ctx(), SendArgs(name="critic-1", message=f"m{i}"))
    with pytest.raises(ToolError, match=f"{MAX_INBOX} messages queued"):
        await tools._send(parent.ctx(), SendArgs(name="critic-1", message="one more"))
    await tools._terminate(parent.ctx(), NameArgs(name="critic-1"))


async def test_a_queue_stays_when_the_end_it_was_refused_for_cannot_be_read(
    parent: Parent,
) -> None:
    # The child's service refuses the queue's turn (its turn failed), then cannot be
    # reached to say how: the queue and the turn stay as they were, for the next step.
    class Flaky:
        def __init__(self) -> None:
            self.reads = 0

        async def get_status(self, session_id: str) -> pb.GetStatusResponse:
            self.reads += 1
            if self.reads > 1:
                raise ConnectError("nowhere:1", "the child's service went away")
            return pb.GetStatusResponse(status=pb.SESSION_STATUS_FAILED, last_sequence=9)

        async def continue_session(self, session_id: str, message: str, **kw: Any) -> None:
            raise SessionStateConflict(session_id, "failed; only a completed session ...")

    class Pool:
        async def get(self, address: str) -> Flaky:
            return flaky

    flaky = Flaky()
    tools = Companions([PersistentChild(agent_type="critic", address="nowhere:1")])
    entry: dict[str, Any] = {"name": "critic-1", "agent_type": "critic", "session_id": CHILD,
             "address": "nowhere:1", "tool_call_id": "call_1", "inbox": ["v2"]}  # fmt: skip
    parent.run_state.companions = CompanionsState.from_json(
        {"counters": {}, "children": {"critic-1": entry}}
    )
    ctx = parent.ctx()
    ctx = dataclasses.replace(ctx, run=dataclasses.replace(ctx.run, clients=Pool()))  # type: ignore[arg-type]

    assert await tools.deliver_finished(ctx, []) == []
    assert parent.run_state.companions.children["critic-1"] == CompanionChild(**entry)  # untouched
    assert parent.ends() == []


async def test_parallel_calls_on_one_child_do_not_undo_each_others_state(
    child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    # The model asks for a child's status and lists the children in one step: the loop
    # runs the two calls at once. list_children wrote back its stale copy of the child,
    # unmarking the outcome get_child_status had just shown, so the next step pushed it
    # again (found by review).
    import asyncio

    from helix_transport.delegation.companions import NoArgs

    tools, client = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    await client.wait(CHILD)  # it finished; the parent's state still says running
    async with asyncio.TaskGroup() as group:
        status = group.create_task(tools._status(parent.ctx(), NameArgs(name="critic-1")))
        listed = group.create_task(tools._list(parent.ctx(), NoArgs()))
    assert status.result()["status"] == "completed"
    assert listed.result() == [{"name": "critic-1", "agent": "critic", "status": "completed"}]
    assert await tools.deliver_finished(parent.ctx(), []) == []  # shown once, by the status
    assert parent.delivered_rounds() == [1]


@pytest.mark.usefixtures("slow_child")
async def test_a_re_consult_re_run_after_a_parent_crash_rejoins_the_turn_it_started(
    child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    # The parent's checkpoint says turn 1 runs (it ended during the parent's model
    # call). The spawn sees it completed, shows it, starts turn 2; the parent dies
    # before its next checkpoint. The re-run saw the child running (its own turn 2) and
    # answered "already running": turn 1's outcome never reached the model, and every
    # later re-consult asked for turn 2 again and was refused (found by review).
    tools, client = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    first = await client.wait(CHILD)
    checkpoint = parent.checkpoint()
    again = SpawnArgs(agent="critic", message="v2 tests", name="critic-1")
    tried = await tools._spawn(parent.ctx("call_re"), again)
    parent.restart(checkpoint)
    rerun = await tools._spawn(parent.ctx("call_re"), again)
    second = await client.wait(CHILD, from_sequence=first.last_sequence)
    pushed = await tools.deliver_finished(parent.ctx(), [])
    third = await tools._spawn(
        parent.ctx(), SpawnArgs(agent="critic", message="v3", name="critic-1")
    )

    assert tried["previous_turn"]["output"]["round"] == 1
    assert rerun["status"] == "running" and rerun == tried  # rejoined, shown the same
    turn = [e async for e in client.stream(CHILD, from_sequence=first.last_sequence)]
    assert turn[0].turn_started.turn == 2 and turn[0].turn_started.message == "v2 tests"
    assert turn[-1].sequence == second.last_sequence  # one turn 2, ended as it should
    assert json.loads(second.output_json)["round"] == 2
    assert '"round":2' in pushed[0]["content"]  # turn 2's outcome, as turn 2's
    assert third["status"] == "running" and "previous_turn" not in third  # turn 3 began


class _HoldsTurns(MemoryStore):
    """The child's store: holds each ``turn_started`` append until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        if any(e.WhichOneof("payload") == "turn_started" for e in events):
            self.held.set()
            await self.release.wait()
        return await super().append(session_id, events, **options)


async def test_a_child_is_recorded_running_before_its_next_turn_is_asked_for(
    parent: Parent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ref said the last turn completed until the Continue came back, so an
    # Interrupt of the parent in between did not cascade to the child, whose new turn
    # then ran on for a stopped parent (found by review). A refused turn puts the ref
    # back as it was.
    from helix_transport import SessionStatus

    store = _HoldsTurns()
    async with (
        await create_server(critic, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        tools = critic_companions(server.address)
        store.release.set()
        await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
        await client.wait(CHILD)
        await tools._status(parent.ctx(), NameArgs(name="critic-1"))
        done = await parent.store.get_subsession_ref(PARENT, CHILD)
        assert done is not None and done.status is SessionStatus.COMPLETED

        # The second turn must still run when the third is asked for (the send now
        # forwards the child's events, so a quick turn could end before it returns).
        monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "100")
        store.release.clear()
        store.held.clear()
        sending = asyncio.create_task(
            tools._send(parent.ctx("call_send"), SendArgs(name="critic-1", message="v2"))
        )
        await asyncio.wait_for(store.held.wait(), 10)
        during = await parent.store.get_subsession_ref(PARENT, CHILD)
        store.release.set()
        assert (await sending)["status"] == "running"
        with pytest.raises(ToolError, match="already running"):
            again = SpawnArgs(agent="critic", message="v3", name="critic-1")
            await tools._spawn(parent.ctx("call_again"), again)
        after = await parent.store.get_subsession_ref(PARENT, CHILD)

    assert during is not None
    assert (during.status, during.tool_call_id) == (SessionStatus.RUNNING, "call_send")
    assert after is not None  # put back: the turn the send started, not the refused one
    assert (after.status, after.tool_call_id) == (SessionStatus.RUNNING, "call_send")


async def test_an_outcome_shown_by_a_call_that_then_fails_is_in_its_error(
    child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    # A message to a child whose finished turn the model has not seen marks that
    # outcome delivered, to show it in the result; when the new turn is then refused,
    # the error is the only result, so it carries the outcome.
    from helix_transport.delegation.companions import NoArgs

    tools, client = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    await client.wait(CHILD)
    await tools._list(parent.ctx(), NoArgs())  # seen completed, not shown to the model
    await client.continue_session(CHILD, "someone else's", turn=2)  # takes turn 2
    with pytest.raises(ToolError) as refused:
        await tools._send(parent.ctx(), SendArgs(name="critic-1", message="v2"))
    assert "could not continue 'critic-1'" in refused.value.message
    assert "its previous turn, not shown before" in refused.value.message
    assert '"round": 1' in refused.value.message


async def test_a_blocking_spawn_whose_result_cannot_be_read_shows_the_previous_outcome(
    parent: Parent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same for a blocking spawn whose new turn began but whose service then went
    # out of reach for longer than the retry deadline (waiting raises).
    from helix_transport.delegation.companions import NoArgs

    async with (
        await create_server(critic, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        tools = critic_companions(server.address, mode="blocking")
        await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
        await tools._list(parent.ctx(), NoArgs())
        # Turn 1 was shown by the blocking spawn: unmark it, as a parent state
        # checkpointed before that result would have it.
        kept = parent.run_state.companions.children["critic-1"]
        assert kept is not None
        kept.delivered = False
        real_wait = AgentClient.wait

        async def unreachable(*args: Any, **kw: Any) -> Any:
            raise ConnectError(server.address, "out of reach for the test")

        # Waiting follows the child's stream (forwarding it) and may ask its status.
        monkeypatch.setattr(AgentClient, "wait", unreachable)
        monkeypatch.setattr(_lifecycle, "forward_child", unreachable)
        with pytest.raises(ToolError) as lost:
            again = SpawnArgs(agent="critic", message="v2", name="critic-1")
            await tools._spawn(parent.ctx(), again)
        monkeypatch.setattr(AgentClient, "wait", real_wait)
        monkeypatch.setattr(_lifecycle, "forward_child", forward_child)
        await client.wait(CHILD, from_sequence=1)  # turn 2 began, and ends
    assert "began its turn, but its result could not be read" in lost.value.message
    assert '"round": 1' in lost.value.message
