"""The library's run state lives beside the tools' state, never in it.

A tool's ``ctx.state`` holds the keys tools put there and nothing else, in a fresh run,
a continued turn and a run resumed from a checkpoint an earlier version wrote (with the
library's ``"helix.*"`` keys among the tools'): those move into the run state on load.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.loop import RunLoop
from helix_transport.agent.scripted import ScriptedTurn, finish, register_script, tool_results
from helix_transport.agent.scripted import call as scripted_call
from helix_transport.agent.state import (
    RUN_STATE_KEY,
    CompanionsState,
    DispatchState,
    InputState,
    OpenSpan,
    RunState,
    TurnState,
    joined_state,
    split_state,
)
from helix_transport.agent.tools import ToolContext, tool
from helix_transport.agent.turns import count_turns
from helix_transport.log import EventHub, SessionWriter
from helix_transport.store import Checkpoint, SessionRecord, SessionUpdate
from helix_transport.store.memory import MemoryStore
from helix_transport.transport._pool import ClientPool


class _Nothing(BaseModel):
    pass


class _Seen(BaseModel):
    keys: list[str]


@tool
async def look(ctx: ToolContext, args: _Nothing) -> list[str]:
    """The keys of the run's state, as a tool sees them; notes one of its own."""
    ctx.state["looked"] = ctx.state.get("looked", 0) + 1
    return sorted(ctx.state)


def _looks_then_finishes(messages: list[dict[str, Any]]) -> ScriptedTurn:
    # One look per turn: a turn's last user message comes after its last look result.
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    if not any(m.get("role") == "tool" for m in messages[last_user:]):
        return ScriptedTurn(tool_calls=(scripted_call("look"),))
    return finish(keys=tool_results(messages)["look"])


looker = Agent(
    name="looker",
    description="Looks at its state once per turn and reports the keys it saw.",
    input_model=_Nothing,
    output_model=_Seen,
    tools=[look],
    model=register_script("run-state-looker", _looks_then_finishes),
    max_steps=2,
)


async def _run(store: MemoryStore) -> SessionStatus:
    record = await store.get_session("s")
    assert record is not None
    writer = SessionWriter(
        store, EventHub(), session_id="s", agent_type=looker.name,
        last_sequence=record.last_sequence,
    )  # fmt: skip
    loop = RunLoop(
        looker,
        record,
        store=store,
        writer=writer,
        interrupt_signal=asyncio.Event(),
        clients=ClientPool(),
    )
    return await loop.run()


async def _output(store: MemoryStore) -> list[str]:
    record = await store.get_session("s")
    assert record is not None and record.status is SessionStatus.COMPLETED, record
    return _Seen.model_validate_json(record.output_json).keys


async def _create(store: MemoryStore) -> None:
    await store.create_session(
        SessionRecord(session_id="s", agent_type=looker.name, input_json="{}", input_hash="")
    )


async def test_tools_see_only_their_own_keys_in_a_continued_turn() -> None:
    store = MemoryStore()
    await _create(store)
    assert await _run(store) is SessionStatus.COMPLETED
    assert await _output(store) == ["looked"]
    # A new turn, committed as Continue commits it.
    last = (await store.read("s"))[-1].sequence
    started = pb.StreamEvent(turn_started=pb.TurnStarted(turn=2, message="again"))
    await store.append(
        "s", [started], expected_sequence=last, update=SessionUpdate(status=SessionStatus.RUNNING)
    )
    assert await _run(store) is SessionStatus.COMPLETED
    assert await _output(store) == ["looked"]
    saved = await store.load_checkpoint("s")
    assert saved is not None
    user, run = split_state(saved.state)
    assert user == {"looked": 2}
    assert run.turns == TurnState(turn=2, base_step=2, sequence=last + 1, fresh=False)
    assert (await count_turns(store, "s")).count == 2


async def test_a_checkpoint_an_earlier_version_wrote_resumes_with_its_keys_moved() -> None:
    store = MemoryStore()
    await _create(store)
    first = pb.StreamEvent(run_started=pb.RunStarted(input_json="{}"))
    turn = pb.StreamEvent(turn_started=pb.TurnStarted(turn=2, message="again"))
    last = await store.append("s", [first, turn], expected_sequence=0)
    companions = {"counters": {"critic": 1}, "children": {}}
    messages = [
        {"role": "system", "content": "x"},
        {"role": "user", "content": "{}"},
        {"role": "user", "content": "again"},
    ]
    # As the previous version kept it: the library's keys among the tools'.
    old = {
        "looked": 1,
        "helix.turn": 2,
        "helix.turn_base_step": 5,
        "helix.turn_sequence": 2,
        "helix.turn_fresh": False,
        "helix.companions": companions,
    }
    await store.save_checkpoint(
        Checkpoint(session_id="s", step=5, messages=messages, last_sequence=last, state=old)
    )
    # max_steps is 2: counted from step 5, where the old checkpoint's turn began.
    assert await _run(store) is SessionStatus.COMPLETED
    assert await _output(store) == ["looked"]
    saved = await store.load_checkpoint("s")
    assert saved is not None
    assert set(saved.state) == {"looked", RUN_STATE_KEY}
    user, run = split_state(saved.state)
    assert user == {"looked": 2}
    assert run.turns == TurnState(turn=2, base_step=5, sequence=2, fresh=False)
    assert run.companions == CompanionsState.from_json(companions)
    assert run.to_json()["extensions"] == {"companions": companions}
    assert (await count_turns(store, "s")).count == 2


def test_the_run_state_round_trips_beside_the_tools_keys() -> None:
    run = RunState(turns=TurnState(turn=3, base_step=7, sequence=40, fresh=True))
    run.dispatch = DispatchState(turn=3, started_at=100.0)
    # A tool's own "helix.*" key is the tool's once the run state has its key.
    stored = joined_state({"a": 1, "helix.mine": 2}, run)
    assert split_state(stored) == ({"a": 1, "helix.mine": 2}, run)
    assert split_state({}) == ({}, RunState())


# The run state exactly as the version before typed extensions wrote it (its extensions a
# dict by name): every record kind, with the values its modules put there.
_STORED_RUN_STATE: dict[str, Any] = {
    "turns": {"turn": 1, "base_step": 0, "sequence": None, "fresh": False},
    "extensions": {
        "inputs": {
            "pending": [
                {"request_id": "call_9", "tool_name": "deploy", "kind": "approval",
                 "deadline": 1700000000.5},
            ],
            "results": {"call_8": {"role": "tool", "tool_call_id": "call_8", "content": "1"}},
            "approved": ["call_7"],
            "output_json": None,
            "children": [{"child_session_id": "c1", "address": "h:1", "last_sequence": 4}],
            "suspended_at": 1700000000.0,
        },
        "companions": {
            "counters": {"critic": 2},
            "children": {
                "critic-1": {
                    "name": "critic-1", "agent_type": "critic", "session_id": "p-agent-critic-1",
                    "address": "h:2", "tool_call_id": "call_1", "turn": 2, "from_sequence": 9,
                    "status": "completed", "output_json": "{}", "error": "",
                    "delivered": True, "inbox": ["more"],
                },
                "critic-2": None,
            },
        },
        "dispatch": {
            "batches": [
                {
                    "tool_call_id": "call_3",
                    "tasks": [
                        {"task_id": "call_3-0", "agent_type": "researcher",
                         "session_id": "p-task-call_3-0", "address": "h:3",
                         "status": "timed_out", "output_json": "",
                         "error": "the run's deadline passed"},
                    ],
                    "delivered": False,
                },
            ],
            "turn": 1,
            "started_at": 1700000000.25,
            "final_pass_step": 4,
        },
        "delegations": {
            "p-agent-critic-1": {"tool_call_id": "call_1", "agent_type": "critic", "turn": 1},
        },
    },
}  # fmt: skip


def test_a_run_state_the_previous_version_stored_loads_typed_and_stores_the_same() -> None:
    run = RunState.from_json(_STORED_RUN_STATE)
    assert run.inputs.pending["call_9"].deadline == 1700000000.5
    assert run.inputs.children[0].last_sequence == 4
    critic = run.companions.children["critic-1"]
    assert critic is not None and critic.inbox == ["more"] and critic.turn == 2
    assert run.companions.children["critic-2"] is None  # a name still reserved
    assert run.dispatch.batches[0].tasks[0].status == "timed_out"
    assert run.dispatch.final_pass_step == 4
    assert run.delegations.open["p-agent-critic-1"] == OpenSpan(
        tool_call_id="call_1", agent_type="critic", turn=1
    )
    assert run.unknown_extensions == {}
    # Stored again in the same form: the previous version reads what this one writes.
    assert run.to_json() == _STORED_RUN_STATE


def test_missing_and_unknown_entries_of_a_stored_run_state() -> None:
    # Dispatch's first turn never wrote "turn" or "final_pass_step"; an entry this
    # version does not know is kept as it was.
    stored = {"turns": {}, "extensions": {"dispatch": {"batches": [], "started_at": 5.0},
                                          "later": {"x": 1}}}  # fmt: skip
    run = RunState.from_json(stored)
    assert run.dispatch == DispatchState(turn=1, started_at=5.0, final_pass_step=None)
    assert run.to_json()["extensions"]["later"] == {"x": 1}
    assert RunState().to_json() == {"turns": TurnState().to_json(), "extensions": {}}


async def test_a_checkpoint_the_previous_version_stored_resumes_with_its_records() -> None:
    store = MemoryStore()
    await _create(store)
    last = await store.append(
        "s", [pb.StreamEvent(run_started=pb.RunStarted(input_json="{}"))], expected_sequence=0
    )
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "{}"}]
    extensions = {k: v for k, v in _STORED_RUN_STATE["extensions"].items() if k != "inputs"}
    stored = {"looked": 0, RUN_STATE_KEY: {**_STORED_RUN_STATE, "extensions": extensions}}
    await store.save_checkpoint(
        Checkpoint(session_id="s", step=0, messages=messages, last_sequence=last, state=stored)
    )
    assert await _run(store) is SessionStatus.COMPLETED
    assert await _output(store) == ["looked"]  # the tool saw its own key only
    saved = await store.load_checkpoint("s")
    assert saved is not None
    user, run = split_state(saved.state)
    assert user == {"looked": 1}
    # The records rode through the run untouched, and are stored as they were.
    assert run.to_json()["extensions"] == extensions


def test_a_working_copy_of_the_input_state_changes_the_runs_only_once_saved() -> None:
    run = RunState()  # a step waiting for nothing: the copy is a new empty state
    working = InputState.of(run)
    working.started.append("call_1")
    assert run.inputs == InputState()
    working.save(run)
    working.started.append("call_2")  # saved as a copy
    assert run.inputs.started == ["call_1"]
    again = InputState.of(run)
    again.started.clear()
    assert run.inputs.started == ["call_1"]
    InputState().save(run)  # an empty state saved is a new one too
    emptied = InputState.of(run)
    emptied.started.append("call_3")
    assert run.inputs == InputState()
