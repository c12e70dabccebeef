"""``@tool(once=True)``: declared, marked, resumed (in one process; the SIGKILL proof
across processes is ``tests/crash/test_once.py``).

A ``once`` call is marked as started in the store before its tool runs, in the
checkpoint the step takes before its tools; a run resumed with the mark and no result
takes the result the call logged, or gives the model an error saying its outcome is
unknown, and never calls the tool. What is refused when the tool is declared, and the
idempotency key a call passes to other systems.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

from helix_transport import UsageError, client_tool, tool
from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.loop import RunLoop
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    finish,
    register_script,
    step_results,
    steps_taken,
)
from helix_transport.agent.state import InputState, RunState, TurnState, joined_state, split_state
from helix_transport.agent.tools import RunServices, Tool, ToolContext
from helix_transport.log import EventHub, SessionWriter
from helix_transport.store import Checkpoint, SessionRecord, SessionUpdate
from helix_transport.store.memory import MemoryStore
from helix_transport.transport._pool import ClientPool


class _Args(BaseModel):
    n: int = 0


class _Outcome(BaseModel):
    result: Any = None


STORE = MemoryStore()
RUNS: list[tuple[str, bool]] = []
"""(tool, whether the store had its call marked started when its body began)."""


async def _marked(ctx: ToolContext) -> bool:
    saved = await STORE.load_checkpoint(ctx.session_id)
    return saved is not None and ctx.tool_call_id in split_state(saved.state)[1].inputs.started


@tool(once=True)
async def charge(ctx: ToolContext, args: _Args) -> dict[str, Any]:
    """Charge a card (at most once)."""
    RUNS.append(("charge", await _marked(ctx)))
    return {"charged": args.n, "key": ctx.idempotency_key}


@tool
async def log_line(ctx: ToolContext, args: _Args) -> dict[str, Any]:
    """Log a line (safe to repeat)."""
    RUNS.append(("log_line", await _marked(ctx)))
    return {"logged": args.n}


def _script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return ScriptedTurn(
            tool_calls=(
                ScriptedToolCall(name="charge", arguments={"n": 5}, id="call_c"),
                ScriptedToolCall(name="log_line", arguments={"n": 1}, id="call_l"),
            )
        )
    return finish(result=dict(step_results(messages)))


shop = Agent(
    name="once-shop",
    description="Charges once and logs a line.",
    input_model=_Args,
    output_model=_Outcome,
    tools=[charge, log_line],
    model=register_script("once-shop", _script),
)


async def _run(session_id: str, *, resume_reason: str = "") -> dict[str, Any]:
    record = await STORE.get_session(session_id)
    assert record is not None
    writer = SessionWriter(
        STORE, EventHub(), session_id=session_id, agent_type=shop.name,
        last_sequence=record.last_sequence,
    )  # fmt: skip
    loop = RunLoop(
        shop,
        record,
        store=STORE,
        writer=writer,
        interrupt_signal=asyncio.Event(),
        clients=ClientPool(),
    )
    assert await loop.run(resume_reason=resume_reason) is SessionStatus.COMPLETED
    done = await STORE.get_session(session_id)
    assert done is not None
    result: dict[str, Any] = json.loads(done.output_json)["result"]
    return result


async def _create(session_id: str) -> None:
    await STORE.create_session(
        SessionRecord(session_id=session_id, agent_type=shop.name, input_json="{}", input_hash="")
    )


async def test_a_once_call_is_marked_started_in_the_store_before_its_tool_runs() -> None:
    RUNS.clear()
    await _create("fresh")
    result = await _run("fresh")
    assert sorted(RUNS) == [("charge", True), ("log_line", False)]
    assert result["charge"]["charged"] == 5
    saved = await STORE.load_checkpoint("fresh")
    assert saved is not None and split_state(saved.state)[1].inputs == InputState()  # step whole


async def _cut_off_after_the_model_call(session_id: str, *, charge_logged: bool) -> None:
    """The store as a run leaves it when a crash cut its step off while the tools ran:
    the checkpoint before the tools (``call_c`` marked), and the events it logged."""
    await _create(session_id)
    calls = [
        {"id": "call_c", "type": "function",
         "function": {"name": "charge", "arguments": '{"n": 5}'}},
        {"id": "call_l", "type": "function",
         "function": {"name": "log_line", "arguments": '{"n": 1}'}},
    ]  # fmt: skip
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "x"},
        {"role": "user", "content": "{}"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    events = [
        pb.StreamEvent(run_started=pb.RunStarted(input_json="{}")),
        pb.StreamEvent(step_started=pb.StepStarted()),
    ]
    last = await STORE.append(session_id, events, expected_sequence=0)
    run = RunState(inputs=InputState(started=["call_c"]))
    await STORE.save_checkpoint(
        Checkpoint(
            session_id=session_id,
            step=0,
            messages=messages,
            last_sequence=last,
            state=joined_state({}, run),
        )
    )
    if charge_logged:  # it returned and its result was written; the crash came after
        start = pb.ToolStart(tool_call_id="call_c", tool_name="charge", arguments_json="{}")
        end = pb.ToolEnd(tool_call_id="call_c", tool_name="charge", result_json='{"charged": 5}')
        await STORE.append(
            session_id,
            [pb.StreamEvent(tool_start=start), pb.StreamEvent(tool_end=end)],
            expected_sequence=last,
        )


async def test_a_resumed_step_never_runs_a_cut_off_once_call_and_says_so() -> None:
    RUNS.clear()
    await _cut_off_after_the_model_call("cut", charge_logged=False)
    result = await _run("cut", resume_reason="restart")
    assert RUNS == [("log_line", False)]  # the ordinary tool runs again; charge never
    assert "outcome is unknown" in result["charge"]["error"]
    log = await STORE.read("cut")
    errors = [e.error for e in log if e.WhichOneof("payload") == "error"]
    assert [e.code for e in errors] == ["outcome_unknown"] and "call_c" in errors[0].message
    ends = [e.tool_end for e in log if e.WhichOneof("payload") == "tool_end"]
    assert [(e.tool_call_id, e.is_error) for e in ends if e.tool_call_id == "call_c"] == [
        ("call_c", True)
    ]


async def test_a_resumed_step_takes_the_result_a_once_call_logged() -> None:
    RUNS.clear()
    await _cut_off_after_the_model_call("logged", charge_logged=True)
    result = await _run("logged", resume_reason="restart")
    assert RUNS == [("log_line", False)]
    assert result["charge"] == {"charged": 5}
    log = await STORE.read("logged")
    assert not [e for e in log if e.WhichOneof("payload") == "error"]
    ends = [e for e in log if e.WhichOneof("payload") == "tool_end"]
    assert sum(e.tool_end.tool_call_id == "call_c" for e in ends) == 1  # not logged again


async def test_a_turn_after_an_interrupt_says_a_cut_off_once_call_is_unknown() -> None:
    """An ordinary call an interrupt cut off was "interrupted" (the model may call it
    again); a ``once`` call may have had its effect: "unknown", never "interrupted"."""
    RUNS.clear()
    await _cut_off_after_the_model_call("continued", charge_logged=False)
    last = (await STORE.read("continued"))[-1].sequence
    ended = pb.StreamEvent(interrupted=pb.Interrupted(reason="stop"))
    last = await STORE.append(
        "continued",
        [ended],
        expected_sequence=last,
        update=SessionUpdate(status=SessionStatus.INTERRUPTED),
    )
    turn = pb.StreamEvent(turn_started=pb.TurnStarted(turn=2, message="go on"))
    await STORE.append(
        "continued",
        [turn],
        expected_sequence=last,
        update=SessionUpdate(status=SessionStatus.RUNNING),
    )
    await _run("continued")
    assert RUNS == []
    saved = await STORE.load_checkpoint("continued")
    assert saved is not None
    results = {m["tool_call_id"]: m["content"] for m in saved.messages if m["role"] == "tool"}
    assert "outcome is unknown" in json.loads(results["call_c"])["error"]
    assert json.loads(results["call_l"]) == {"error": "interrupted"}


async def _noop(ctx: ToolContext, args: Any) -> Any:
    return {}


def test_once_false_is_refused_where_every_call_is_at_most_once_already() -> None:
    with pytest.raises(UsageError, match="an approved call runs at most once"):
        Tool(name="x", description="", args_model=_Args, fn=_noop, approval=True, once=False)
    with pytest.raises(UsageError, match="a client tool's result is recorded at most once"):
        Tool(name="x", description="", args_model=_Args, fn=_noop, client=True, once=False)
    # Consistent declarations stand: once=True on an approval tool says what it is,
    # and with a rule it makes the calls that need no approval at most once too.
    assert Tool(name="x", description="", args_model=_Args, fn=_noop, approval=True, once=True)
    ruled = Tool(name="x", description="", args_model=_Args, fn=_noop, approval=bool, once=False)
    assert ruled.once is False
    assert client_tool("pick", description="Pick.").once is None
    assert charge.once is True and log_line.once is None


def _context(**changes: Any) -> ToolContext:
    fields: dict[str, Any] = {
        "session_id": "s",
        "agent_type": "a",
        "tool_call_id": "call_1",
        "step": 1,
        "metadata": {},
        "emit": lambda event: None,
        "principal": "alice",
        "tenant": "acme",
    }
    turn = changes.pop("turn", 1)
    fields.update(changes)
    services = RunServices(
        store=STORE, clients=ClientPool(), flush=_flush, state=RunState(turns=TurnState(turn=turn))
    )
    return ToolContext(run=services, **fields)


async def _flush() -> None:
    return None


def test_the_idempotency_key_is_the_calls_and_no_other_calls() -> None:
    key = _context().idempotency_key
    assert len(key) == 32 and int(key, 16) >= 0
    assert _context(step=7).idempotency_key == key  # a resumed step of the same call
    others = [
        _context(tool_call_id="call_2"),
        _context(session_id="t"),
        _context(agent_type="b"),
        _context(principal="bob"),
        _context(tenant="other"),
        _context(turn=2),
    ]
    assert len({key, *(c.idempotency_key for c in others)}) == 1 + len(others)
