"""What the run loop writes at its step boundaries, and what a failed write leaves behind."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from helix_transport._events import SessionStatus
from helix_transport._exceptions import SequenceConflict
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.interrupt_signal import InterruptSignal
from helix_transport.agent.loop import RunLoop
from helix_transport.agent.scripted import ScriptedTurn, finish, register_script, steps_taken
from helix_transport.agent.scripted import call as scripted_call
from helix_transport.agent.tools import Tool, ToolContext, tool
from helix_transport.log import EventHub, SessionWriter
from helix_transport.store import Checkpoint, Interrupt, SessionRecord
from helix_transport.store.memory import MemoryStore
from helix_transport.transport._pool import ClientPool
from tests.agents import counter


class _RecordingStore(MemoryStore):
    """Notes each append's events (by kind) and the step of the checkpoint it carries."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[tuple[list[str], int | None]] = []

    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        kinds: list[str] = [
            pb.StreamEvent.FromString(e).WhichOneof("payload") or "" for e in options["encoded"]
        ]
        checkpoint: Checkpoint | None = options.get("checkpoint")
        self.appends.append((kinds, None if checkpoint is None else checkpoint.step))
        return await super().append(session_id, events, **options)


async def _create(store: MemoryStore, input_json: str = "{}") -> None:
    await store.create_session(
        SessionRecord(session_id="s", agent_type=counter.name, input_json=input_json, input_hash="")
    )


async def _run(
    agent: Agent,
    store: MemoryStore,
    *,
    resume_reason: str = "",
    interrupt_signal: asyncio.Event | None = None,
) -> SessionStatus:
    """Run session ``s`` (already in ``store``) to its end, as a server's runner would."""
    record = await store.get_session("s")
    assert record is not None
    writer = SessionWriter(
        store, EventHub(), session_id="s", agent_type=agent.name,
        last_sequence=record.last_sequence,
    )  # fmt: skip
    loop = RunLoop(
        agent,
        record,
        store=store,
        writer=writer,
        interrupt_signal=interrupt_signal or asyncio.Event(),
        clients=ClientPool(),
    )
    return await loop.run(resume_reason=resume_reason)


async def test_a_step_that_only_finishes_is_written_once_with_the_runs_end() -> None:
    store = _RecordingStore()
    await _create(store, json.dumps({"steps": 1, "words": 2}))
    status = await _run(counter, store)
    assert status is SessionStatus.COMPLETED
    # The tick's calls before it runs, the end of step 1, then step 2 only with the
    # run's end: its finish call has no checkpoint of its own. Nor is there one before
    # step 1: it would hold only the input.
    assert [step for _, step in store.appends if step is not None] == [0, 1, 2]
    # The run's start rides with its first step's start: one write, not two.
    assert store.appends[0] == (["run_started", "step_started"], None)
    last_kinds, last_checkpoint = store.appends[-1]
    assert last_checkpoint == 2
    assert last_kinds[-4:] == ["tool_start", "tool_end", "output", "completed"]
    events = await store.read("s")
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    # The end's checkpoint holds the whole conversation, for a new turn to start from.
    saved = await store.load_checkpoint("s")
    assert saved is not None and saved.last_sequence == events[-1].sequence
    finish_call, finish_result = saved.messages[-2:]
    assert finish_call["tool_calls"][0]["function"]["name"] == "__finish__"
    assert finish_result["role"] == "tool" and finish_result["name"] == "__finish__"


class _CountsRefReads(MemoryStore):
    ref_reads = 0

    async def list_subsession_refs(self, parent_session_id: str) -> list[Any]:
        self.ref_reads += 1
        return await super().list_subsession_refs(parent_session_id)


async def test_a_run_that_made_no_tool_context_reads_no_refs_at_its_end() -> None:
    at_once = dataclasses.replace(
        counter, model=register_script("finishes-at-once", lambda _: finish(total=0, steps=0))
    )
    store = _CountsRefReads()
    await _create(store)
    assert await _run(at_once, store) is SessionStatus.COMPLETED
    assert store.ref_reads == 0  # only the finish tool: nothing could start a child
    # A tool ran: it may have started a child, whose close policy the end applies.
    store = _CountsRefReads()
    await _create(store, json.dumps({"steps": 1, "words": 0}))
    assert await _run(counter, store) is SessionStatus.COMPLETED
    assert store.ref_reads == 1
    # Resumed: an earlier run of the session may have started children.
    store = _CountsRefReads()
    await _create(store)
    assert await _run(at_once, store, resume_reason="restart") is SessionStatus.COMPLETED
    assert store.ref_reads == 1


async def test_an_interrupt_requested_before_the_first_step_stops_the_run_there() -> None:
    store = MemoryStore()
    await _create(store)
    await store.set_interrupt("s", "changed my mind")
    assert await _run(counter, store) is SessionStatus.INTERRUPTED
    events = await store.read("s")
    assert [e.WhichOneof("payload") for e in events] == ["run_started", "interrupted"]
    assert events[-1].interrupted.reason == "changed my mind"


class _LosesTheSession(MemoryStore):
    """Asked to stop while step 1's tools run, then taken over by another process:
    the checkpoint at the end of step 1 is refused."""

    checkpoints = 0

    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        if options.get("checkpoint") is not None:
            self.checkpoints += 1
            if self.checkpoints > 1:
                raise SequenceConflict(session_id, options["expected_sequence"], 99)
            await self.set_interrupt(session_id, "stop")  # beside step 1's tool calls
        return await super().append(session_id, events, **options)


async def test_an_interrupt_taken_beside_a_refused_checkpoint_is_put_back() -> None:
    # The boundary checks for an interrupt while it checkpoints; when the checkpoint is
    # refused this process no longer runs the session, and the new owner must still
    # see the interrupt.
    store = _LosesTheSession()
    await _create(store, json.dumps({"steps": 1, "words": 2}))
    with pytest.raises(SequenceConflict):
        await _run(counter, store)
    assert await store.take_interrupt("s") == Interrupt("stop")


class _Died(Exception):
    """The process died here."""


class _DiesBeforeItsFirstCheckpoint(MemoryStore):
    """The process dies once, when the run's first events have landed but its first
    checkpoint has not."""

    died = False

    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        if options.get("checkpoint") is not None and not self.died:
            self.died = True
            await super().append(session_id, events, **{**options, "checkpoint": None})
            raise _Died
        return await super().append(session_id, events, **options)


async def test_a_run_that_died_before_its_first_checkpoint_resumes_with_one_run_started() -> None:
    store = _DiesBeforeItsFirstCheckpoint()
    await _create(store, json.dumps({"steps": 1, "words": 2}))
    with pytest.raises(_Died):
        await _run(counter, store)
    assert [e.WhichOneof("payload") for e in await store.read("s")][:1] == ["run_started"]
    assert await store.load_checkpoint("s") is None

    assert await _run(counter, store, resume_reason="restart") is SessionStatus.COMPLETED

    events = await store.read("s")
    kinds = [e.WhichOneof("payload") for e in events]
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert kinds.count("run_started") == 1 and kinds[0] == "run_started"
    resumed = [e.run_resumed for e in events if e.WhichOneof("payload") == "run_resumed"]
    assert [(r.step, r.reason) for r in resumed] == [(1, "restart")]
    assert json.loads(events[-2].output.output_json) == {"total": 1, "steps": 1}


class _RaceInput(BaseModel):
    q: str = "x"


@tool
async def race_backends(ctx: ToolContext, args: _RaceInput) -> str:
    """Keep the first of two answers; awaits the loser it cancelled (a common slip)."""
    slow = asyncio.create_task(asyncio.sleep(10, result="slow"))
    fast = await asyncio.sleep(0.01, result="fast")
    slow.cancel()
    await slow  # raises CancelledError into the tool
    return fast


def _race_script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(scripted_call("race_backends", q="x"),))
    return finish(ok=True)


class _Ok(BaseModel):
    ok: bool


def _one_tool_agent(name: str, one: Tool, script: Callable[..., ScriptedTurn]) -> Agent:
    """An agent whose script calls ``one`` once, then finishes."""
    return Agent(
        name=name,
        description=f"calls {one.name} once",
        input_model=_RaceInput,
        output_model=_Ok,
        tools=[one],
        model=register_script(name, script),
    )


async def test_a_tool_that_cancels_itself_fails_its_call_not_the_run() -> None:
    # Before, the CancelledError escaping the tool read as an interrupt: the session
    # ended `interrupted` with no reason (and would have cascaded to its children).
    racer = _one_tool_agent("racer", race_backends, _race_script)
    store = MemoryStore()
    await _create(store)
    assert await _run(racer, store) is SessionStatus.COMPLETED
    events = await store.read("s", from_sequence=0)
    ends = [e.tool_end for e in events if e.WhichOneof("payload") == "tool_end"]
    assert ends[0].is_error and "CancelledError" in ends[0].result_json


@tool
async def remember_badly(ctx: ToolContext, args: _RaceInput) -> str:
    """Keeps a set in the run's durable state (JSON has no sets)."""
    ctx.state["seen"] = {args.q}
    return "noted"


def _remember_script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(scripted_call("remember_badly", q="x"),))
    return finish(ok=True)


async def test_state_that_is_not_json_fails_the_run_with_a_clear_error() -> None:
    # Before, the store refused the step's checkpoint with a TypeError: the run crashed
    # (to be resumed into the same refusal), and on SQLite the error also failed the
    # appends of other sessions in the same write.
    agent = _one_tool_agent("rememberer", remember_badly, _remember_script)
    store = MemoryStore()
    await _create(store)
    assert await _run(agent, store) is SessionStatus.FAILED
    record = await store.get_session("s")
    assert record is not None and record.failure_reason == "invalid_state"
    assert "ToolContext.state must hold JSON values only" in record.error


class _TakenOverWhileInterrupted(MemoryStore):
    """An interrupt arrives as the run starts; by the time the run writes its end,
    another replica owns the session (the fence refuses that write)."""

    async def append(self, session_id: str, events: Any, **options: Any) -> int:
        kinds = [pb.StreamEvent.FromString(e).WhichOneof("payload") for e in options["encoded"]]
        if "run_started" in kinds:
            await self.set_interrupt(session_id, "stop")
        if "interrupted" in kinds:
            raise SequenceConflict(session_id, options["expected_sequence"], 99)
        return await super().append(session_id, events, **options)


async def test_an_interrupt_taken_by_a_run_that_lost_its_session_is_put_back() -> None:
    # Before, the run took the interrupt, could not write its end, and the interrupt
    # was gone: the replica that took the session over ran on.
    store = _TakenOverWhileInterrupted()
    await _create(store)
    record = await store.get_session("s")
    assert record is not None
    signal = asyncio.Event()
    signal.set()  # the interrupt's wake-up reached this run mid-step
    loop = RunLoop(
        counter,
        record,
        store=store,
        writer=SessionWriter(
            store, EventHub(), session_id="s", agent_type=counter.name, last_sequence=0
        ),
        interrupt_signal=signal,
        clients=ClientPool(),
    )
    with pytest.raises(SequenceConflict):
        await loop.run()
    assert await store.take_interrupt("s") == Interrupt("stop")


async def test_a_step_that_only_finishes_starts_no_helper_task() -> None:
    # No task waits on the interrupt signal (the server's resolves a future), and the
    # finish call, which never waits for a child, runs without a task of its own or a
    # watch for blocked calls.
    at_once = dataclasses.replace(
        counter, model=register_script("finish-at-once", lambda _: finish(total=0, steps=0))
    )
    store = MemoryStore()
    await _create(store, json.dumps({"steps": 1, "words": 0}))
    started: list[str] = []
    loop = asyncio.get_running_loop()

    def factory(loop: Any, coro: Any, **options: Any) -> asyncio.Task[Any]:
        started.append(getattr(coro, "__qualname__", ""))
        return asyncio.Task(coro, loop=loop, **options)

    loop.set_task_factory(factory)
    try:
        status = await _run(at_once, store, interrupt_signal=InterruptSignal())
    finally:
        loop.set_task_factory(None)
    assert status is SessionStatus.COMPLETED
    assert "RunLoop._step" in started  # the step itself still races the signal
    assert not {"Event.wait", "Blockage.settle", "ToolRunner.run"} & set(started), started
