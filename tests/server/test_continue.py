"""``Continue``: a new turn on a finished session, over real gRPC, on every store.

Contract: a completed session continued with a message runs a new turn that
remembers the earlier ones, with a fresh step budget; its log continues after the
terminal event with ``turn_started``; the request names its turn, so a retry never
starts a second one; a running session, a wrong turn or a failed session without
``fresh`` is FAILED_PRECONDITION, never a corrupted log.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
from collections.abc import Sequence
from typing import Any, cast

import pytest
from pydantic import BaseModel

from helix_transport import (
    Agent,
    AgentClient,
    InvalidArgument,
    SequenceConflict,
    ServerConfig,
    SessionExists,
    SessionNotFound,
    SessionStateConflict,
    StoreUnavailable,
    create_server,
)
from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.scripted import ScriptedTurn, finish, register_script
from helix_transport.agent.state import RUN_STATE_KEY
from helix_transport.server._continue import TurnRequest, _start_turn
from helix_transport.server._runner import SessionRunner
from helix_transport.store import Checkpoint, Interrupt, MemoryStore, Store
from helix_transport.testing.store_suite import make_record
from services.critic import agent as critic
from tests.agents import counter, looper
from tests.conftest import Serve


async def collect(client: AgentClient, session_id: str, after: int = 0) -> list[pb.StreamEvent]:
    return [e async for e in client.stream(session_id, from_sequence=after)]


def kinds(events: list[pb.StreamEvent]) -> list[str]:
    return [e.WhichOneof("payload") or "" for e in events]


async def test_a_continued_session_remembers_and_gets_a_fresh_step_budget(serve: Serve) -> None:
    async with serve(critic) as (_, client):
        await client.start(json.dumps({"artifact": "v1: code"}), session_id="c1")
        first = await collect(client, "c1")
        verdict1 = json.loads(first[-1].completed.output_json)
        status1 = await client.get_status("c1")
        reply = await client.continue_session("c1", "v2: code and tests", turn=2)
        second = await collect(client, "c1", after=reply.from_sequence)
        status = await client.get_status("c1")
        whole = await collect(client, "c1")
        # What the server itself sends, not what the client keeps of it.
        sent = [
            event
            async for response in client._stub.Stream(
                pb.StreamRequest(session_id="c1"), metadata=client._metadata()
            )
            for event in response.events
        ]

    assert verdict1 == {
        "verdict": "revise",
        "notes": "round 1: add tests",
        "round": 1,
        "previous": "",
    }
    assert reply.created and reply.turn == 2 and reply.from_sequence == first[-1].sequence
    assert kinds(second)[0] == "turn_started" and kinds(second)[-1] == "completed"
    assert second[0].turn_started.message == "v2: code and tests"
    verdict2 = json.loads(second[-1].completed.output_json)
    # The critic remembers round 1; max_steps=2 twice over: the budget is per turn.
    assert verdict2["verdict"] == "pass" and verdict2["round"] == 2
    assert verdict2["previous"] == "v1: code"
    # One log, gapless; a stream from 0 ends at turn 1's terminal event.
    assert whole == first
    assert sent == first
    log = first + second
    assert [e.sequence for e in log] == list(range(1, len(log) + 1))
    assert [e.step for e in log if e.WhichOneof("payload") == "step_started"] == [1, 2, 3, 4]
    assert status.status == pb.SESSION_STATUS_COMPLETED and status.step_count == 4
    assert json.loads(status.output_json) == verdict2
    # finished_at is this turn's end, after the new turn started, not turn 1's.
    turn2_started = second[0].time.ToNanoseconds()
    assert status1.finished_at.ToNanoseconds() < turn2_started
    assert status.finished_at.ToNanoseconds() >= turn2_started


class _Said(BaseModel):
    said: str = ""
    earlier: list[str] = []


def _recall(messages: list[dict[str, object]]) -> ScriptedTurn:
    # What this agent answered before: the arguments of its earlier __finish__ calls.
    earlier = [
        json.loads(call["function"]["arguments"])["said"]
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []  # type: ignore[attr-defined]
        if call["function"]["name"] == "__finish__"
    ]
    return finish(said=f"answer {len(earlier) + 1}", earlier=earlier)


recaller = Agent(
    name="recaller",
    description="Answers with a new answer and all its earlier ones.",
    input_model=_Said,
    output_model=_Said,
    model=register_script("recaller", _recall),
    max_steps=2,
)


async def test_a_new_turn_sees_the_answer_that_ended_the_last_one(serve: Serve) -> None:
    # A run's last step (its finish call and that call's result) is in the conversation
    # a new turn starts from, though it is written only with the run's end.
    async with serve(recaller) as (_, client):
        await client.start("{}", session_id="m1")
        await collect(client, "m1")
        reply = await client.continue_session("m1", "{}", turn=2)
        second = await collect(client, "m1", after=reply.from_sequence)
        reply = await client.continue_session("m1", "{}", turn=3)
        third = await collect(client, "m1", after=reply.from_sequence)

    assert json.loads(second[-1].completed.output_json) == {
        "said": "answer 2",
        "earlier": ["answer 1"],
    }
    assert json.loads(third[-1].completed.output_json) == {
        "said": "answer 3",
        "earlier": ["answer 1", "answer 2"],
    }


async def test_continue_is_idempotent_on_the_turn_and_checks_the_state(serve: Serve) -> None:
    async with serve(critic) as (_, client):
        await client.start(json.dumps({"artifact": "v1"}), session_id="c2")
        await collect(client, "c2")
        # Two concurrent requests for turn 2 with the same message: one turn.
        replies = await asyncio.gather(
            client.continue_session("c2", "v2", turn=2), client.continue_session("c2", "v2", turn=2)
        )
        assert sorted(r.created for r in replies) == [False, True]
        assert replies[0].from_sequence == replies[1].from_sequence
        with pytest.raises(SessionExists):
            await client.continue_session("c2", "something else", turn=2)
        with pytest.raises(SessionStateConflict, match="not the next turn"):
            await client.continue_session("c2", "v4", turn=4)
        turn2 = await collect(client, "c2", after=replies[0].from_sequence)
        retry = await client.continue_session("c2", "v2", turn=2)  # after the turn ended
        with pytest.raises(InvalidArgument, match="message"):
            await client.continue_session("c2", "  ", turn=3)
        with pytest.raises(InvalidArgument, match="turn"):
            await client.continue_session("c2", "v1 again", turn=1)
        with pytest.raises(SessionNotFound):
            await client.continue_session("nope", "hello", turn=2)
        log = await collect(client, "c2") + turn2

    assert not retry.created and retry.status == pb.SESSION_STATUS_COMPLETED
    assert kinds(turn2)[-1] == "completed"
    assert kinds(log).count("turn_started") == 1 and kinds(log).count("completed") == 2


async def test_an_interrupt_left_over_from_the_last_turn_does_not_stop_the_next(
    serve: Serve, store: Store
) -> None:
    # An Interrupt accepted while a turn's last step ran, which finished first, ends
    # nothing; left in the store, it used to interrupt the next turn at its start.
    async with serve(critic) as (_, client):
        await client.start(json.dumps({"artifact": "v1: code"}), session_id="c1")
        await collect(client, "c1")
        await store.set_interrupt("c1", "too late for turn 1")
        reply = await client.continue_session("c1", "v2: code and tests", turn=2)
        second = await collect(client, "c1", after=reply.from_sequence)
        interrupted = await client.interrupt("c1", reason="for turn 2")  # ended: moot

    assert kinds(second)[0] == "turn_started" and kinds(second)[-1] == "completed"
    assert not interrupted.accepted


async def test_a_turn_after_one_that_ended_before_any_checkpoint_runs_its_own_input(
    serve: Serve, store: Store
) -> None:
    # No checkpoint is written before step 1, so a turn interrupted before its first
    # step ends with none; the next turn's run took that for a crash and re-ran the
    # first turn's input instead of the new one (found by a companion test).
    async with serve(counter) as (_, client):
        await store.set_interrupt("i1", "before it begins")
        await client.start(json.dumps({"steps": 40, "words": 5}), session_id="i1")
        first = await collect(client, "i1")
        assert kinds(first) == ["run_started", "interrupted"]
        assert await store.load_checkpoint("i1") is None
        fresh = json.dumps({"steps": 1, "words": 1})
        reply = await client.continue_session("i1", fresh, turn=2, fresh=True)
        second = await collect(client, "i1", after=reply.from_sequence)
        reply = await client.continue_session("i1", "once more", turn=3)
        third = await collect(client, "i1", after=reply.from_sequence)

    assert kinds(second)[0] == "turn_started" and kinds(second)[-1] == "completed"
    assert json.loads(second[-1].completed.output_json) == {"total": 1, "steps": 1}
    assert kinds(third)[0] == "turn_started" and kinds(third)[-1] == "completed"


async def test_a_running_session_cannot_be_continued(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 40, "words": 200}), session_id="r1")
        with pytest.raises(SessionStateConflict, match="still running"):
            await client.continue_session("r1", "more", turn=2)
        await client.interrupt("r1", reason="done")
        await collect(client, "r1")


async def test_a_failed_session_continues_only_fresh(serve: Serve) -> None:
    async with serve(looper) as (_, client):
        await client.start(json.dumps({"steps": 1}), session_id="f1")
        first = await collect(client, "f1")
        with pytest.raises(SessionStateConflict, match="fresh"):
            await client.continue_session("f1", '{"steps": 1}', turn=2)
        reply = await client.continue_session("f1", '{"steps": 1}', turn=2, fresh=True)
        second = await collect(client, "f1", after=reply.from_sequence)

    assert kinds(first)[-1] == "failed" and kinds(second)[-1] == "failed"
    # A whole new budget of three steps, numbered on from the first turn's.
    assert [e.step for e in second if e.WhichOneof("payload") == "step_started"] == [4, 5, 6]
    assert second[0].turn_started.fresh


class _HoldsNewTurns(MemoryStore):
    """Holds each ``turn_started`` append, once written, until ``release`` is set;
    with ``fail``, that append then raises instead of returning."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.written = asyncio.Event()
        self.release = asyncio.Event()
        self.fail = fail

    async def append(self, session_id: str, events: Sequence[pb.StreamEvent], **kw: Any) -> int:
        last = await super().append(session_id, events, **kw)
        if any(e.WhichOneof("payload") == "turn_started" for e in events):
            self.written.set()
            await self.release.wait()
            if self.fail:
                raise StoreUnavailable("the test's store went away")
        return last


async def test_a_turn_in_the_log_runs_even_when_its_caller_gave_up() -> None:
    # As for Start: once turn_started is stored, the turn's run starts at once, not when
    # an orphan scan (a lease TTL later, here a minute) finds the session RUNNING unrun.
    store = _HoldsNewTurns()
    config = ServerConfig(lease_ttl_s=60)
    async with (
        await create_server(counter, store, config, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start('{"steps": 1}', session_id="s")
        first = await client.wait("s")
        call = client._stub.Continue(
            pb.ContinueRequest(session_id="s", message="again", turn=2),
            metadata=client._metadata(),
        )
        await asyncio.wait_for(store.written.wait(), 5)
        call.cancel()  # the caller leaves while the turn's write is in flight
        await asyncio.sleep(0.2)  # the server's handler is cancelled meanwhile
        store.release.set()
        ended = await asyncio.wait_for(client.wait("s", from_sequence=first.last_sequence), 5)
    assert ended.status == pb.SESSION_STATUS_COMPLETED
    assert ended.last_sequence > first.last_sequence + 1  # turn_started and the turn's run


async def test_a_turn_failing_after_its_caller_gave_up_is_logged_as_such(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nobody is left to answer: the failure goes to the server's log, named, once,
    # not to asyncio's "exception was never retrieved" when the task is collected.
    store = _HoldsNewTurns(fail=True)
    async with (
        await create_server(counter, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start('{"steps": 1}', session_id="s")
        await client.wait("s")
        call = client._stub.Continue(
            pb.ContinueRequest(session_id="s", message="again", turn=2),
            metadata=client._metadata(),
        )
        await asyncio.wait_for(store.written.wait(), 5)
        call.cancel()
        await asyncio.sleep(0.2)
        store.release.set()
        await asyncio.sleep(0.1)
        gc.collect()  # asyncio reports an unretrieved exception when its task is collected
    messages = [r.getMessage() for r in caplog.records]
    assert "turn 2 of session s failed after its caller left" in messages
    assert not [m for m in messages if "never retrieved" in m], messages


class _CountsReads(MemoryStore):
    """Notes where each log read starts; with ``old_checkpoints``, checkpoints read as
    an earlier version wrote them, without where their turn began."""

    def __init__(self, *, old_checkpoints: bool = False) -> None:
        super().__init__()
        self.reads: list[int] = []
        self.old_checkpoints = old_checkpoints

    async def read(self, session_id: str, **kw: Any) -> list[pb.StreamEvent]:
        self.reads.append(kw.get("from_sequence", 0))
        return await super().read(session_id, **kw)

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        checkpoint = await super().load_checkpoint(session_id)
        if checkpoint is not None and self.old_checkpoints:
            # That version kept the turn as "helix.*" keys among the tools' state.
            run = checkpoint.state.pop(RUN_STATE_KEY, None) or {"turns": {}, "extensions": {}}
            turns = run["turns"]
            checkpoint.state["helix.turn"] = turns.get("turn", 1)
            checkpoint.state["helix.turn_base_step"] = turns.get("base_step", 0)
            checkpoint.state["helix.turn_fresh"] = turns.get("fresh", False)
            for name, value in run["extensions"].items():
                checkpoint.state[f"helix.{name}"] = value
        return checkpoint


@pytest.mark.parametrize("old_checkpoints", [False, True], ids=["checkpoint", "old-checkpoint"])
async def test_continue_reads_the_log_from_the_last_checkpoint(old_checkpoints: bool) -> None:
    # A long-lived session's log grows with every turn; finding the next turn's number
    # must not mean reading all of it. Retries still find the turn they name.
    store = _CountsReads(old_checkpoints=old_checkpoints)
    replies: dict[int, pb.ContinueResponse] = {}
    async with (
        await create_server(critic, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(json.dumps({"artifact": "v1"}), session_id="long")
        await client.wait("long")
        for turn in range(2, 6):
            checkpoint = await store.load_checkpoint("long")
            assert checkpoint is not None
            store.reads.clear()
            replies[turn] = await client.continue_session("long", f"v{turn}", turn=turn)
            assert store.reads and min(store.reads) >= checkpoint.last_sequence, turn
            await client.wait("long", from_sequence=replies[turn].from_sequence)
        store.reads.clear()
        latest = await client.continue_session("long", "v5", turn=5)  # a retry, after it ended
        reads_for_latest = list(store.reads)
        older = await client.continue_session("long", "v3", turn=3)
        with pytest.raises(SessionExists):
            await client.continue_session("long", "not v3", turn=3)

    assert [r.created for r in replies.values()] == [True] * 4
    assert (latest.created, latest.from_sequence) == (False, replies[5].from_sequence)
    assert (older.created, older.from_sequence) == (False, replies[3].from_sequence)
    # The latest turn's start is one read where the checkpoint says it is; an old
    # checkpoint does not say, so that retry reads the log.
    assert (0 in reads_for_latest) is old_checkpoints


class SlowToRelease(MemoryStore):
    """A store shared by replicas whose lease releases take ``delay_s`` once ``slow``."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.slow = False

    async def release_lease(self, session_id: str, owner: str) -> None:
        if self.slow:
            await asyncio.sleep(self.delay_s)
        await super().release_lease(session_id, owner)


async def test_a_turn_continued_through_another_replica_starts_once_the_lease_is_free() -> None:
    # Replica A ran turn 1 and is still releasing its lease when B takes the Continue.
    # Before, B answered created=true but left the turn to its orphan scan (up to a
    # lease TTL later, 5 s here), which logged it as a resumed run.
    store = SlowToRelease(delay_s=1.0)
    async with (
        await create_server(critic, store, allow_unauthenticated=True) as a,
        await create_server(critic, store, allow_unauthenticated=True) as b,
        await AgentClient.connect(a.address) as via_a,
        await AgentClient.connect(b.address) as via_b,
    ):
        store.slow = True
        await via_a.start(json.dumps({"artifact": "v1: code"}), session_id="r1")
        await collect(via_a, "r1")  # turn 1 ended; A holds the lease for 1 s more
        started = asyncio.get_running_loop().time()
        reply = await via_b.continue_session("r1", "v2: code and tests", turn=2)
        second = await collect(via_b, "r1", after=reply.from_sequence)
        took = asyncio.get_running_loop().time() - started
    assert reply.created
    assert kinds(second)[0] == "turn_started" and "run_resumed" not in kinds(second)
    assert second[-1].WhichOneof("payload") == "completed"
    assert took < 4, took  # the lease was free after ~1 s


class _ContinuedElsewhere(MemoryStore):
    """Another Continue's turn_started lands first: this one's append is fenced off."""

    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        raise SequenceConflict(session_id, options["expected_sequence"], 99)


async def test_an_abort_taken_by_a_turn_that_lost_the_race_goes_back_as_an_abort() -> None:
    # The stale interrupt a turn takes before it starts may be the winning turn's: put
    # back, an abort stays an abort (a plain interrupt in its place would only stop a
    # turn the person meant to end).
    store = _ContinuedElsewhere()
    record, _ = await store.create_session(make_record("c1", status=SessionStatus.COMPLETED))
    await store.set_interrupt("c1", "end it all", abort=True)
    request = TurnRequest(key="c1", session_id="c1", turn=2, message="again", fresh=False)
    runner = cast(SessionRunner, None)  # never reached: the append is refused first
    assert await _start_turn(store, runner, record, request, contextlib.nullcontext) is None
    assert await store.take_interrupt("c1") == Interrupt("end it all", abort=True)
