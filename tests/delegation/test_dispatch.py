"""``run_subagent`` across real service processes: a parent dispatches three
researchers in one tool call and goes on; their results arrive together in one
message and the parent runs again, in the same run and the same stream, which
carries the researchers' events while the parent waits. With a run deadline, researchers still
running are interrupted and reported timed out, and the parent gives a partial answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from helix_transport import Agent, AgentClient, ServerConfig, create_server
from helix_transport._events import SessionStatus
from helix_transport._exceptions import StoreUnavailable
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore, SessionRecord, SubSessionRef
from services.researcher import agent as researcher
from tests.agents.companions import coordinator, quitter, stubborn
from tests.helpers import ROOT, ServiceProcess, assert_eventually, free_port

TOPICS = ["event sourcing", "grpc streaming", "backoff"]


@asynccontextmanager
async def mesh(
    parent: str, workdir: Path, *, child_delay_ms: int
) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess]]:
    def service(agent: str, name: str, env: dict[str, str], args: list[str]) -> ServiceProcess:
        return ServiceProcess(
            agent,
            port=free_port(),
            store_url=f"sqlite:///{workdir / (name + '.db')}",
            log_path=workdir / f"{name}.log",
            env=env,
            extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5", *args],
            cwd=ROOT,
        )

    researcher = service(
        "services.researcher:agent",
        "researcher",
        {"HELIX_SCRIPTED_DELAY_MS": str(child_delay_ms)},
        [],
    )
    coordinator = service(
        f"tests.agents.companions:{parent}",
        parent,
        {address_env_var("researcher"): researcher.address},
        ["--heartbeat-interval", "0.2"],
    )
    await asyncio.gather(researcher.start(), coordinator.start())
    try:
        yield researcher, coordinator
    finally:
        await asyncio.gather(coordinator.stop(), researcher.stop())


@asynccontextmanager
async def in_process(
    parent: Agent, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AgentClient, AgentClient]]:
    """A researcher service and ``parent``'s, in this process: their clients."""
    async with (
        await create_server(researcher, MemoryStore(), allow_unauthenticated=True) as child,
        await AgentClient.connect(child.address) as children,
    ):
        monkeypatch.setenv(address_env_var("researcher"), child.address)
        async with (
            await create_server(parent, MemoryStore(), allow_unauthenticated=True) as server,
            await AgentClient.connect(server.address) as client,
        ):
            yield client, children


def kinds(events: list[pb.StreamEvent]) -> list[str]:
    return [e.WhichOneof("payload") or "" for e in events]


async def test_results_arrive_in_one_batch_in_the_same_run_and_stream(tmp_path: Path) -> None:
    async with (
        # Researchers of ~1 s: the parent parks while they stream.
        mesh("coordinator", tmp_path, child_delay_ms=40) as (_, parent),
        await AgentClient.connect(parent.address) as client,
    ):
        await client.start(json.dumps({"topics": TOPICS}), session_id="co")
        stream = client.stream("co")
        events = [e async for e in stream]

    assert kinds(events)[-1] == "completed"
    terminal = {"completed", "failed", "interrupted", "terminated"}
    assert [k for k in kinds(events) if k in terminal] == ["completed"]  # one run
    output = json.loads(events[-1].completed.output_json)
    assert output["batches"] == 1 and output["heading"] == "[sub-agent results]"
    assert sorted(r["task_id"] for r in output["results"]) == [
        "call_1_0-0",
        "call_1_0-1",
        "call_1_0-2",
    ]
    assert {r["status"] for r in output["results"]} == {"completed"}
    assert {r["output"]["topic"] for r in output["results"]} == set(TOPICS)
    # The pass went on (pause), then ended (text only) and the run parked, beating.
    text = "".join(e.text_delta.text for e in events if e.WhichOneof("payload") == "text_delta")
    assert "Meanwhile, other work." in text and "Waiting for the researchers." in text
    # Parked, it forwards the researchers' events into its log: each one's, in order.
    forwarded: dict[str, list[int]] = {}
    for e in events:
        if e.WhichOneof("payload") == "child_event":
            child = e.child_event.event
            forwarded.setdefault(child.session_id, []).append(child.sequence)
    assert len(forwarded) == 3
    assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in forwarded.values()), forwarded
    ends = [e.subagent_end for e in events if e.WhichOneof("payload") == "subagent_end"]
    assert len(ends) == 3 and {e.status for e in ends} == {pb.SESSION_STATUS_COMPLETED}
    own = [k for k in kinds(events) if k != "child_event"]
    assert own[own.index("subagent_end") - 1] == "step_started"  # delivered at a step's start


async def test_a_parked_parent_gets_its_batch_when_a_killed_childs_service_returns(
    tmp_path: Path,
) -> None:
    # While parked the parent follows each child's stream; SIGKILL the children's service
    # under it and start it again on the same store: the streams resume (or fall back to
    # reading the status) and the batch arrives complete, in the same run.
    async with (
        mesh("coordinator", tmp_path, child_delay_ms=40) as (researcher, parent),
        await AgentClient.connect(parent.address) as client,
    ):
        await client.start(json.dumps({"topics": TOPICS}), session_id="k")
        stream = client.stream("k")
        events: list[pb.StreamEvent] = []
        killed_after: list[str] | None = None
        async for event in stream:
            events.append(event)
            # Step 4 starts parked: step 3 ended the pass with a batch still out.
            parked = event.WhichOneof("payload") == "step_started" and event.step == 4
            if parked and killed_after is None:
                killed_after = kinds(events)
                await researcher.kill()
                await asyncio.sleep(0.5)
                await researcher.start()

    assert killed_after is not None, "the parent never parked"
    assert "subagent_end" not in killed_after  # the batch was still out when its service died
    assert [k for k in kinds(events) if k in {"completed", "failed"}] == ["completed"]
    output = json.loads(events[-1].completed.output_json)
    assert output["batches"] == 1
    assert {r["status"] for r in output["results"]} == {"completed"}
    assert {r["output"]["topic"] for r in output["results"]} == set(TOPICS)


async def test_a_run_deadline_times_children_out_and_gets_a_partial_answer(
    tmp_path: Path,
) -> None:
    async with (
        mesh("hasty", tmp_path, child_delay_ms=400) as (researcher, parent),
        await AgentClient.connect(parent.address) as client,
        await AgentClient.connect(researcher.address) as children,
    ):
        await client.start(json.dumps({"topics": TOPICS}), session_id="h1")
        events = [e async for e in client.stream("h1")]
        scope = child_scope("hasty", "")
        tasks = [f"h1-task-call_1_0-{i}-{scope}" for i in range(3)]
        statuses = [(await children.get_status(task)).status for task in tasks]

    assert kinds(events)[-1] == "completed"
    output = json.loads(events[-1].completed.output_json)
    assert output["heading"] == "[sub-agent results at the deadline]"
    assert {r["status"] for r in output["results"]} == {"timed_out"}
    # The late children were interrupted, not left running.
    assert set(statuses) == {pb.SESSION_STATUS_INTERRUPTED}


async def test_a_run_still_going_after_its_last_pass_fails_with_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "100")  # the researcher outlives the deadline
    async with in_process(stubborn, monkeypatch) as (client, _):
        await client.start(json.dumps({"topics": ["x"]}), session_id="s1")
        events = [e async for e in client.stream("s1")]

    assert kinds(events)[-1] == "failed"
    assert events[-1].failed.failure_reason == "deadline"
    ends = [e.subagent_end for e in events if e.WhichOneof("payload") == "subagent_end"]
    assert [e.error for e in ends] == ["the run's deadline passed"]


async def test_a_parent_that_fails_interrupts_the_tasks_it_left_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its failure is final: nothing would collect the task's result, so the task is
    # interrupted as an Interrupt of the parent would interrupt it, not left running.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "500")  # the researcher takes seconds
    async with in_process(quitter, monkeypatch) as (client, children):
        await client.start(json.dumps({"topics": ["x"]}), session_id="q1")
        events = [e async for e in client.stream("q1")]
        task = f"q1-task-call_1_0-0-{child_scope('quitter', '')}"
        async with asyncio.timeout(5):
            status = await children.wait(task)
        child_events = [e async for e in children.stream(task)]

    assert kinds(events)[-1] == "failed"
    assert events[-1].failed.failure_reason == "max_steps"
    assert status.status == pb.SESSION_STATUS_INTERRUPTED
    assert child_events[-1].interrupted.reason == "parent q1 failed"


@pytest.mark.parametrize("wait", ["ignored", "refused"])
async def test_a_child_service_without_the_long_poll_is_asked_at_a_pace(
    wait: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service in another language may not implement GetStatusRequest.wait and answer
    # at once, or (against the contract) refuse the wait as too long: the parked parent
    # then asks every PACE_S, without the wait after a refusal, and does not spin.
    from helix_transport import InvalidArgument
    from helix_transport.server._servicer import AgentServicer
    from helix_transport.transport.client import PACE_S

    answer = AgentServicer.GetStatus
    calls: list[float] = []

    async def without_wait(
        self: AgentServicer, request: pb.GetStatusRequest, context: object
    ) -> pb.GetStatusResponse:
        calls.append(asyncio.get_running_loop().time())
        if wait == "refused" and request.HasField("wait"):
            raise InvalidArgument("wait", "longer than 1s")
        request.ClearField("wait")
        return await answer(self, request, context)  # type: ignore[arg-type]

    monkeypatch.setattr(AgentServicer, "GetStatus", without_wait)
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "40")
    async with in_process(coordinator, monkeypatch) as (client, _):
        await client.start(json.dumps({"topics": TOPICS}), session_id="p1")
        events = [e async for e in client.stream("p1")]

    assert kinds(events)[-1] == "completed"
    output = json.loads(events[-1].completed.output_json)
    assert {r["status"] for r in output["results"]} == {"completed"}
    # Three children, each asked at most once per PACE_S while parked (plus a refused
    # first ask, and the steps' refreshes): a spinning watcher would ask thousands of times.
    span = calls[-1] - calls[0]
    assert 3 <= len(calls) <= 3 * (span / PACE_S + 4), (len(calls), span)


async def test_a_continued_turn_gets_a_fresh_deadline_and_pass() -> None:
    """The deadline's clock and its one last pass belong to a turn, not the session."""
    import time

    from helix_transport.agent.state import DispatchState, RunState, TurnState
    from helix_transport.agent.tools import RunServices, ToolContext
    from helix_transport.delegation.dispatch import Dispatcher, RunDeadlineExceeded
    from helix_transport.delegation.dispatch import SubagentType as Type
    from helix_transport.transport._pool import ClientPool

    async def flush() -> None:
        return None

    dispatcher = Dispatcher([Type(agent_type="researcher")], run_deadline_s=60)
    # Turn 1 began two minutes ago and used up its last pass.
    turn_one = {"batches": [], "started_at": time.time() - 120, "final_pass_step": 3}

    def context(turn: int) -> ToolContext:
        state = RunState(turns=TurnState(turn=turn), dispatch=DispatchState.from_json(turn_one))
        return ToolContext(
            session_id="p", agent_type="parent", tool_call_id="", step=5, metadata={},
            emit=lambda event: None,
            run=RunServices(flush=flush, store=MemoryStore(), clients=ClientPool(), state=state),
        )  # fmt: skip

    with pytest.raises(RunDeadlineExceeded):  # still turn 1: the run is over
        await dispatcher.step(context(1), [])
    second = context(2)
    assert await dispatcher.step(second, []) == []  # turn 2: nothing due, no deadline yet
    assert second.run.state.dispatch.turn == 2
    started_at = second.run.state.dispatch.started_at
    assert started_at is not None and started_at > time.time() - 5


@pytest.mark.parametrize("fresh", [False, True])
async def test_a_fresh_turn_is_not_handed_the_results_of_tasks_it_never_dispatched(
    fresh: bool,
) -> None:
    # Turn 1 finished with a task out, which ended later. A next turn gets its result;
    # a fresh one (no earlier conversation) got it too, as news about a task it never
    # sent, and would have parked for a task still running.
    from helix_transport.agent.state import DispatchState, RunState, TurnState
    from helix_transport.agent.tools import RunServices, ToolContext
    from helix_transport.delegation.dispatch import Dispatcher
    from helix_transport.delegation.dispatch import SubagentType as Type
    from helix_transport.transport._pool import ClientPool

    async def flush() -> None:
        return None

    task = {
        "task_id": "call_1_0-0", "agent_type": "researcher", "session_id": "p-task-call_1_0-0",
        "address": "127.0.0.1:1", "status": "completed", "output_json": "{}", "error": "",
    }  # fmt: skip
    batch = {"tool_call_id": "call_1_0", "tasks": [task], "delivered": False}
    state = RunState(
        turns=TurnState(turn=2, fresh=fresh),
        dispatch=DispatchState.from_json({"batches": [batch], "turn": 1}),
    )
    emitted: list[pb.StreamEvent] = []
    ctx = ToolContext(
        session_id="p", agent_type="parent", tool_call_id="", step=5, metadata={},
        emit=emitted.append,
        run=RunServices(flush=flush, store=MemoryStore(), clients=ClientPool(), state=state),
    )  # fmt: skip
    messages = await Dispatcher([Type(agent_type="researcher")]).step(ctx, [])
    if fresh:
        assert messages == [] and emitted == []
    else:
        assert messages[0]["content"].startswith("[sub-agent results]")
        assert kinds(emitted) == ["subagent_end"]


class _BlipsOnThirdRef(MemoryStore):
    """The parent's store: its third child-ref write fails once (a Redis/PG blip)."""

    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        self.puts += 1
        if self.puts == 3:
            raise StoreUnavailable("down for one write")
        await super().put_subsession_ref(ref)


async def test_a_task_that_cannot_start_fails_alone_and_its_batch_is_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, the failed write failed the whole call after the other tasks' children had
    # started: they were in no batch, never delivered, and the model was told nothing ran.
    researchers = MemoryStore()
    async with (
        await create_server(researcher, researchers, allow_unauthenticated=True) as child,
    ):
        monkeypatch.setenv(address_env_var("researcher"), child.address)
        async with (
            await create_server(coordinator, _BlipsOnThirdRef(), allow_unauthenticated=True) as p,
            await AgentClient.connect(p.address) as client,
        ):
            await client.start(json.dumps({"topics": ["a", "b", "c"]}), session_id="d1")
            events = [e async for e in client.stream("d1")]
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    results = json.loads(events[-1].completed.output_json)["results"]
    assert sorted(r["status"] for r in results) == ["completed", "completed", "failed"]
    started = await researchers.list_sessions(status=SessionStatus.COMPLETED)
    assert len(started) == 2  # each started child once, none twice


async def _any(listing: Awaitable[list[SessionRecord]]) -> bool:
    return bool(await listing)


async def test_a_parked_parent_whose_task_is_gone_records_it_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The child's service loses the session (a memory store, restarted): NOT_FOUND.
    # Before, the parked parent took that for "unreachable" and waited for ever.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "100")
    first = MemoryStore()
    child = await create_server(researcher, first, allow_unauthenticated=True)
    await child.start()
    port = int(child.address.rsplit(":", 1)[1])
    monkeypatch.setenv(address_env_var("researcher"), child.address)
    async with (
        await create_server(coordinator, MemoryStore(), allow_unauthenticated=True) as p,
        await AgentClient.connect(p.address) as client,
    ):
        await client.start(json.dumps({"topics": ["a"]}), session_id="d2")
        await assert_eventually(lambda: _any(first.list_sessions(status=SessionStatus.RUNNING)))
        await child.shutdown(grace_s=0)
        again = await create_server(
            researcher, MemoryStore(), ServerConfig(port=port), allow_unauthenticated=True
        )
        async with again:
            async with asyncio.timeout(30):
                events = [e async for e in client.stream("d2")]
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    (result,) = json.loads(events[-1].completed.output_json)["results"]
    assert result["status"] == "failed" and "not found" in result["error"]
