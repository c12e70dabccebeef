"""Persistent children across real service processes, one SQLite file each.

- maker/critic: the maker re-consults the same critic session; the critic's second
  verdict quotes the first round's draft (its memory), with a fresh step budget.
- non-blocking researchers: three run in the background while the parent goes on;
  each result reaches the parent's model once, pushed at a later step.
- a parent SIGKILLed after a child finished and before its delivery, and again
  after the delivery, still delivers exactly once.
- a parent SIGKILLed right after its step hook handed a queued message over (the
  child's next turn started) and before that step's checkpoint asks again on resume:
  one next turn, each round seen once.

The scripted provider logs every model call (HELIX_SCRIPTED_CALL_LOG).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from helix_transport import AgentClient, ConnectError, SessionNotFound
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.delegation.companions import child_session_id
from helix_transport.registry import address_env_var
from tests.helpers import ROOT, ServiceProcess, assert_eventually, free_port


def _service(agent: str, workdir: Path, env: dict[str, str] | None = None) -> ServiceProcess:
    module, attribute = agent.split(":")
    name = module.split(".")[-1] if attribute == "agent" else attribute
    return ServiceProcess(
        agent,
        port=free_port(),
        store_url=f"sqlite:///{workdir / (name + '.db')}",
        log_path=workdir / f"{name}.log",
        env={"HELIX_SCRIPTED_CALL_LOG": str(workdir / "calls.log"), **(env or {})},
        extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
        cwd=ROOT,
    )


@asynccontextmanager
async def services(
    child: str,
    parent: str,
    workdir: Path,
    child_env: dict[str, str] | None = None,
    parent_env: dict[str, str] | None = None,
) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess]]:
    child_service = _service(child, workdir, child_env)
    child_type = child.split(":")[0].split(".")[-1]
    parent_service = _service(
        parent,
        workdir,
        {address_env_var(child_type): child_service.address, **(parent_env or {})},
    )
    await asyncio.gather(child_service.start(), parent_service.start())
    try:
        yield child_service, parent_service
    finally:
        await asyncio.gather(parent_service.stop(), child_service.stop())


def model_calls(workdir: Path, agent: str, session_id: str) -> int:
    lines = (workdir / "calls.log").read_text().splitlines()
    return sum(1 for line in lines if line.split() == [agent, session_id])


def kinds(events: list[pb.StreamEvent]) -> list[str]:
    return [e.WhichOneof("payload") or "" for e in events]


async def test_maker_reconsults_a_critic_that_remembers(tmp_path: Path) -> None:
    drafts = ["v1: code", "v2: code and tests"]
    async with services("services.critic:agent", "tests.agents.companions:maker", tmp_path) as (
        critic,
        maker,
    ):
        async with await AgentClient.connect(maker.address) as client:
            await client.start(json.dumps({"drafts": drafts}), session_id="make")
            events = [e async for e in client.stream("make")]
        reviewer = child_session_id("make", "reviewer", child_scope("maker", ""))
        async with await AgentClient.connect(critic.address) as client:
            turn1 = [e async for e in client.stream(reviewer)]
            turn2 = [e async for e in client.stream(reviewer, from_sequence=turn1[-1].sequence)]
            status = await client.get_status(reviewer)

    assert kinds(events)[-1] == "completed", events
    first, second = json.loads(events[-1].completed.output_json)["verdicts"]
    assert first == {"verdict": "revise", "notes": "round 1: add tests", "round": 1, "previous": ""}
    assert second["verdict"] == "pass" and second["round"] == 2
    assert second["previous"] == "v1: code"  # remembered from round 1
    # One critic session, its log continued by a second turn; two steps per turn with
    # max_steps=2, so the second turn had a fresh budget.
    assert kinds(turn1)[-1] == "completed" and kinds(turn2)[0] == "turn_started"
    assert kinds(turn2)[-1] == "completed" and turn2[0].turn_started.message == drafts[1]
    assert status.step_count == 4 and status.status == pb.SESSION_STATUS_COMPLETED
    assert model_calls(tmp_path, "critic", reviewer) == 4
    # The parent's log: a subagent_start and a subagent_end per round, same child.
    starts = [e.subagent_start for e in events if e.WhichOneof("payload") == "subagent_start"]
    ends = [e.subagent_end for e in events if e.WhichOneof("payload") == "subagent_end"]
    assert [s.child_session_id for s in starts] == [reviewer, reviewer]
    assert [e.status for e in ends] == [pb.SESSION_STATUS_COMPLETED] * 2


async def test_a_parent_killed_while_a_child_turn_runs_logs_one_start_per_turn(
    tmp_path: Path,
) -> None:
    # The maker re-consults its critic (turn 2 of the same child); SIGKILL the maker while
    # that turn streams. The resumed maker re-runs the call, and the critic's service
    # answers its Continue with a replay of turn 2: before the fix the maker logged that
    # turn's subagent_start again (the start of a later turn was never looked up in the
    # log, only a first turn's), giving 3 starts and 2 ends for 2 turns.
    drafts = ["v1: code", "v2: code and tests"]
    reviewer = child_session_id("make", "reviewer", child_scope("maker", ""))
    async with services(
        "services.critic:agent",
        "tests.agents.companions:maker",
        tmp_path,
        child_env={"HELIX_SCRIPTED_DELAY_MS": "40"},  # a turn streams for a while
    ) as (_, maker):
        async with await AgentClient.connect(maker.address) as client:
            await client.start(json.dumps({"drafts": drafts}), session_id="make")
            starts = 0
            async for event in client.stream("make"):
                starts += event.WhichOneof("payload") == "subagent_start"
                if starts == 2 and event.WhichOneof("payload") == "child_event":
                    break  # turn 2 began and streams into the maker's log
        await maker.kill()
        await maker.start()
        async with await AgentClient.connect(maker.address) as client:
            retry = client.config.reconnect.until_cancelled()
            events = [e async for e in client.stream("make", retry=retry)]

    assert kinds(events)[-1] == "completed"
    assert "run_resumed" in kinds(events)
    started = [e.subagent_start for e in events if e.WhichOneof("payload") == "subagent_start"]
    ended = [e.subagent_end for e in events if e.WhichOneof("payload") == "subagent_end"]
    assert [s.child_session_id for s in started] == [reviewer, reviewer]
    assert [e.status for e in ended] == [pb.SESSION_STATUS_COMPLETED] * 2
    # Both turns' events, each once, in order, whatever the kill cut off.
    forwarded = [e.child_event.event.sequence for e in events if e.HasField("child_event")]
    assert forwarded == list(range(1, len(forwarded) + 1))
    assert events[-2].WhichOneof("payload") == "output"


async def test_background_researchers_are_each_delivered_once(tmp_path: Path) -> None:
    topics = ["event sourcing", "grpc streaming", "backoff"]
    async with (
        services(
            "services.researcher:agent",
            "tests.agents.companions:lead",
            tmp_path,
            child_env={"HELIX_SCRIPTED_DELAY_MS": "20"},  # researchers take a while
        ) as (_, lead),
        await AgentClient.connect(lead.address) as client,
    ):
        await client.start(json.dumps({"topics": topics}), session_id="lead")
        events = [e async for e in client.stream("lead")]

    assert kinds(events)[-1] == "completed"
    output = json.loads(events[-1].completed.output_json)
    names = sorted(s["name"] for s in output["spawned"])
    assert names == ["researcher-1", "researcher-2", "researcher-3"]
    assert {s["status"] for s in output["spawned"]} == {"running"}  # the parent went on
    for name in names:
        delivered = [n for n in output["notices"] if n.startswith(f"Sub-agent '{name}'")]
        assert len(delivered) == 1, output["notices"]
        assert "completed with result" in delivered[0]
    # The parent kept working (pause steps) while the researchers ran.
    paused = [e for e in events if e.WhichOneof("payload") == "tool_end"]
    assert any(e.tool_end.tool_name == "pause" for e in paused)


async def test_delivery_is_exactly_once_across_parent_sigkills(tmp_path: Path) -> None:
    before, after = tmp_path / "go-1", tmp_path / "go-2"
    request = {"topics": ["event sourcing"], "hold": [str(before), str(after)]}
    child = child_session_id("lead", "researcher-1", child_scope("lead", ""))
    async with (
        services(
            "services.researcher:agent",
            "tests.agents.companions:lead",
            tmp_path,
            child_env={"HELIX_SCRIPTED_DELAY_MS": "20"},  # it ends after the parent holds
        ) as (researcher, lead),
        await AgentClient.connect(lead.address) as client,
        await AgentClient.connect(researcher.address) as children,
    ):
        await client.start(json.dumps(request), session_id="lead")

        def holding(times: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                try:
                    events = [e async for e in _read(client, "lead")]
                except ConnectError:
                    # Right after a restart this client's channel may still be waiting out
                    # its reconnect backoff from the kill: not holding yet, ask again.
                    return False
                holds = [
                    e for e in events
                    if e.WhichOneof("payload") == "tool_start" and e.tool_start.tool_name == "hold"
                ]  # fmt: skip
                return len(holds) >= times

            return check

        # 1. The child finished, the parent holds before its next step: kill it there.
        await assert_eventually(holding(1), timeout_s=30)
        child_log = [e async for e in children.stream(child)]
        assert kinds(child_log)[-1] == "completed"
        so_far = kinds([e async for e in _read(client, "lead")])
        assert "subagent_end" not in so_far  # finished, not delivered yet
        await lead.kill()
        await lead.start()
        before.touch()
        # 2. Delivered (the restarted parent re-ran hold, then held again): kill it again.
        await assert_eventually(holding(3), timeout_s=30)
        await lead.kill()
        await lead.start()
        after.touch()
        events = [e async for e in client.stream("lead")]

    assert kinds(events)[-1] == "completed"
    output = json.loads(events[-1].completed.output_json)
    assert len(output["notices"]) == 1, output["notices"]
    assert output["notices"][0].startswith("Sub-agent 'researcher-1' (researcher) completed")
    assert kinds(events).count("run_resumed") == 2
    assert model_calls(tmp_path, "researcher", child) == 3  # the child ran once


async def test_a_queue_handed_over_just_before_a_parent_sigkill_is_one_turn(
    tmp_path: Path,
) -> None:
    # The parent's step hook hands the queued draft over (Continue: the critic's turn 2
    # starts), then calls its slow model: killed then, before that step's checkpoint, it
    # resumes with the draft still queued and asks again. The critic's service replays
    # the turn: one turn 2, and the parent's model sees each round once.
    slow = {"HELIX_SCRIPTED_DELAY_MS": "300"}
    child = child_session_id("relay", "critic", child_scope("relay", ""))
    async with (
        services(
            "services.critic:agent",
            "tests.agents.companions:relay",
            tmp_path,
            child_env=slow,  # round 1 is still running when the draft is sent
            parent_env=slow,  # the kill lands inside the model call after the hand-over
        ) as (critic, relay),
        await AgentClient.connect(relay.address) as client,
        await AgentClient.connect(critic.address) as children,
    ):
        await client.start(json.dumps({"drafts": ["v1", "v2 tests"]}), session_id="relay")

        await assert_eventually(_exists(children, child), timeout_s=30)
        first = await children.wait(child)

        async def next_turn_started() -> bool:
            return (await children.get_status(child)).last_sequence > first.last_sequence

        await assert_eventually(next_turn_started, timeout_s=30, interval_s=0.01)
        await relay.kill()
        await relay.start()
        events = [e async for e in client.stream("relay")]
        turn = [e async for e in children.stream(child, from_sequence=first.last_sequence)]
        now = await children.get_status(child)

    assert kinds(events)[-1] == "completed"
    assert kinds(events).count("run_resumed") == 1
    seen = json.loads(events[-1].completed.output_json)["notices"]
    rounds = [line for line in seen if "completed with result" in line]
    assert len(rounds) == 2 and '"round":1' in rounds[0] and '"round":2' in rounds[1], seen
    assert turn[0].turn_started.turn == 2 and turn[0].turn_started.message == "v2 tests"
    assert now.last_sequence == turn[-1].sequence  # no turn 3
    assert model_calls(tmp_path, "critic", child) == 4  # two rounds of two calls, once each


def _exists(client: AgentClient, session_id: str) -> Callable[[], Awaitable[bool]]:
    """A check: does ``session_id`` exist yet?"""

    async def exists() -> bool:
        try:
            await client.get_status(session_id)
        except SessionNotFound:
            return False
        return True

    return exists


async def _read(client: AgentClient, session_id: str) -> AsyncIterator[pb.StreamEvent]:
    """The session's log so far, without waiting for its end."""
    status = await client.get_status(session_id)
    if status.last_sequence == 0:
        return
    async for event in client.stream(session_id):
        yield event
        if event.sequence >= status.last_sequence:
            return
