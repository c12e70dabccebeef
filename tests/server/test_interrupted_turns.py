"""``Continue`` on an interrupted session resumes it with its memory, over real gRPC.

Contract: a session stopped by an interrupt can be continued without ``fresh``; the
new turn starts from the interrupted turn's last checkpoint, so the model sees the
earlier turn's messages. The calls of a step the interrupt cut off that logged no
result are answered ``{"error": "interrupted"}`` (a call of that step that finished
keeps its result), so the conversation the model sees is valid. A failed session
still needs ``fresh``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

from helix_transport import Agent, AgentClient, SessionStateConflict, ToolContext, tool
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    steps_taken,
)
from tests.conftest import Serve

QUESTION = "what did you note before the interrupt?"


class Topic(BaseModel):
    topic: str


class Recall(BaseModel):
    users: list[str]
    """Every user message the model saw, in order."""
    results: list[Any]
    """Every tool result the model saw, in order, parsed."""


class NoteArgs(BaseModel):
    text: str


class Nothing(BaseModel):
    pass


@tool
async def note(ctx: ToolContext, args: NoteArgs) -> dict[str, str]:
    """Note a fact."""
    return {"noted": args.text}


@tool
async def block(ctx: ToolContext, args: Nothing) -> str:
    """Wait until interrupted."""
    await asyncio.sleep(3600)
    return "never"


def _recaller(messages: list[dict[str, Any]]) -> ScriptedTurn:
    users = [str(m.get("content")) for m in messages if m.get("role") == "user"]
    if len(users) > 1:  # a continued turn: say what the conversation holds
        results = [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]
        return finish(users=users, results=results)
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(call("note", text="first"),))
    # The step the interrupt cuts off: one call ends, the other never does.
    return ScriptedTurn(tool_calls=(call("note", text="second"), call("block")))


resumer = Agent(
    name="resumer",
    description="Notes facts, blocks, and once continued says what it remembers.",
    input_model=Topic,
    output_model=Recall,
    tools=[note, block],
    model=register_script("resumed-recaller", _recaller),
)


async def _until_blocked(client: AgentClient, session_id: str) -> list[pb.StreamEvent]:
    """The session's events up to ``block``'s start (the step is then mid-tool)."""
    events: list[pb.StreamEvent] = []
    async for event in client.stream(session_id):
        events.append(event)
        if event.WhichOneof("payload") == "tool_start" and event.tool_start.tool_name == "block":
            return events
    raise AssertionError("the run ended before it blocked")


async def test_an_interrupted_session_continues_with_its_memory(serve: Serve) -> None:
    async with serve(resumer) as (_, client):
        await client.start(json.dumps({"topic": "t"}), session_id="m1")
        async with asyncio.timeout(30):
            seen = await _until_blocked(client, "m1")
        assert (await client.interrupt("m1", reason="hold on")).accepted
        first = seen + [e async for e in client.stream("m1", from_sequence=seen[-1].sequence)]
        reply = await client.continue_session("m1", QUESTION, turn=2)
        second = [e async for e in client.stream("m1", from_sequence=reply.from_sequence)]
        status = await client.get_status("m1")

    assert first[-1].WhichOneof("payload") == "interrupted"
    assert first[-1].interrupted.reason == "hold on"
    assert reply.created and reply.from_sequence == first[-1].sequence
    assert second[0].WhichOneof("payload") == "turn_started"
    assert not second[0].turn_started.fresh
    assert second[-1].WhichOneof("payload") == "completed", second[-1]
    recall = json.loads(second[-1].completed.output_json)
    # The earlier turn's messages: its input, then the new message.
    assert recall["users"] == [json.dumps({"topic": "t"}, separators=(",", ":")), QUESTION]
    # The finished calls keep their results; the cut-off one is answered "interrupted".
    assert recall["results"] == [
        {"noted": "first"},
        {"noted": "second"},
        {"error": "interrupted"},
    ]
    assert status.status == pb.SESSION_STATUS_COMPLETED


async def test_an_interrupt_at_a_step_boundary_leaves_nothing_to_answer(
    serve: Serve,
) -> None:
    # Interrupted before its run begins: no checkpoint, no open calls; the new turn
    # starts from the input, which it remembers.
    async with serve(resumer) as (server, client):
        await server.store.set_interrupt("m2", "before it begins")
        await client.start(json.dumps({"topic": "u"}), session_id="m2")
        first = [e async for e in client.stream("m2")]
        reply = await client.continue_session("m2", QUESTION, turn=2)
        second = [e async for e in client.stream("m2", from_sequence=reply.from_sequence)]

    assert first[-1].WhichOneof("payload") == "interrupted"
    recall = json.loads(second[-1].completed.output_json)
    assert recall == {"users": ['{"topic":"u"}', QUESTION], "results": []}


async def test_a_session_that_failed_still_continues_only_fresh(serve: Serve) -> None:
    never = Agent(
        name="resumer",
        description="Never finishes.",
        input_model=Topic,
        output_model=Recall,
        model=register_script("resumed-never", lambda m: ScriptedTurn(text="hmm")),
        max_steps=1,
    )
    async with serve(never) as (_, client):
        await client.start(json.dumps({"topic": "v"}), session_id="m3")
        first = [e async for e in client.stream("m3")]
        with pytest.raises(SessionStateConflict, match="fresh"):
            await client.continue_session("m3", QUESTION, turn=2)
    assert first[-1].WhichOneof("payload") == "failed"
