"""``run_subagent`` as the seeds describe it, importable by server subprocesses.

- ``notetaker``: a child that remembers. Each turn it answers with every note of its
  conversation (its memory) and every message it was shown (``shown``), so a test sees
  what reached its model call: the parent's context when it inherited one.
- ``delegator``: a parent whose turn messages say what to dispatch: ``new <note>`` (a
  new notetaker conversation, inheriting the delegator's context), ``again <note>`` (the
  last conversation again, by its key), ``key <key> <note>`` (a key given to it),
  ``virtual`` (a task naming no agent: a delegator like itself, which calls the
  delegator's ``lookup`` tool and tries ``run_subagent``, which it must not have),
  ``nap <note>`` (a ``sleeper``: one slow, silent model call).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.loop import NUDGE
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
)
from helix_transport.delegation.dispatch import SubagentType, VirtualTasks, with_dispatch

RESULTS = "[sub-agent results]"


class NoteInput(BaseModel):
    note: str


class Notes(BaseModel):
    notes: list[str]
    shown: list[str]


def _notetaker(messages: list[dict[str, Any]]) -> ScriptedTurn:
    notes: list[str] = []
    for m in messages:
        content = str(m.get("content") or "")
        if m.get("role") != "user":
            continue
        if content.startswith('{"note"'):
            notes.append(json.loads(content)["note"])
        elif content.startswith("note "):  # a continued turn's message
            notes.append(content.removeprefix("note "))
    shown = [str(m.get("content") or "") for m in messages if m.get("role") != "system"]
    return finish(notes=notes, shown=shown)


notetaker = Agent(
    name="notetaker",
    description="Takes notes and remembers every note of its conversation.",
    input_model=NoteInput,
    output_model=Notes,
    model=register_script("notetaker", _notetaker),
    max_steps=3,
)


def _sleeper(messages: list[dict[str, Any]]) -> ScriptedTurn:
    # One slow model call: its stream, and its parent's parked on it, stay quiet meanwhile.
    return ScriptedTurn(latency_s=1.5, tool_calls=_notetaker(messages).tool_calls)


sleeper = Agent(
    name="sleeper",
    description="Takes a note slowly, in silence.",
    input_model=NoteInput,
    output_model=Notes,
    model=register_script("sleeper", _sleeper),
    max_steps=3,
)


class DelegatorInput(BaseModel):
    goal: str = ""
    message: str = ""
    """Set for a virtual child: its task."""


class Results(BaseModel):
    results: list[Any]


class LookupArgs(BaseModel):
    key: str


@tool
async def lookup(ctx: ToolContext, args: LookupArgs) -> dict[str, str]:
    """Look a key up in the delegator's table."""
    return {"key": args.key, "value": f"value-of-{args.key}", "session": ctx.session_id}


def _turn_start(messages: list[dict[str, Any]]) -> int:
    """Where the current turn's own messages begin (after its user message)."""
    for index in range(len(messages) - 1, -1, -1):
        m = messages[index]
        content = str(m.get("content") or "")
        if m.get("role") == "user" and content != NUDGE and not content.startswith(RESULTS):
            return index + 1
    return len(messages)


def _keys(messages: list[dict[str, Any]]) -> list[str]:
    """Every conversation key the delegator was given, oldest first."""
    keys = []
    for m in messages:
        content = str(m.get("content") or "")
        if m.get("role") == "tool" and '"conversation_key"' in content:
            keys += [t["conversation_key"] for t in json.loads(content).get("tasks", [])]
    return keys


def _delegator(messages: list[dict[str, Any]]) -> ScriptedTurn:
    first = next(m for m in messages if m.get("role") == "user")
    task = json.loads(str(first["content"])).get("message", "")
    if task:  # a virtual child: use the parent's tools, then answer
        done = step_results(messages)
        if done:
            return finish(results=[value for _, value in done])
        return ScriptedTurn(
            tool_calls=(
                call("lookup", key="k1"),
                call("run_subagent", tasks=[{"message": "deeper"}]),
            )
        )
    start = _turn_start(messages)
    own = messages[start:]
    delivered = [m for m in own if str(m.get("content") or "").startswith(RESULTS)]
    if delivered:
        reports = json.loads(str(delivered[-1]["content"]).split("\n", 1)[1])
        return finish(results=reports)
    if own:  # dispatched: an error ends the turn, else wait for the batch
        refused = [v for _, v in step_results(messages) if isinstance(v, dict) and "error" in v]
        return finish(results=refused) if refused else ScriptedTurn(text="Waiting.")
    said = str(messages[start - 1]["content"])
    words = (json.loads(said)["goal"] if messages[start - 1] is first else said).split(" ", 2)
    if words[0] == "new":
        tasks = [{"agent": "notetaker", "message": words[-1], "context": "inherit"}]
    elif words[0] == "nap":
        tasks = [{"agent": "sleeper", "message": words[-1]}]
    elif words[0] == "again":
        tasks = [{"message": f"note {words[1]}", "conversation_key": _keys(messages)[-1]}]
    elif words[0] == "key":
        tasks = [{"message": f"note {words[2]}", "conversation_key": words[1]}]
    else:
        tasks = [{"message": "use lookup"}]
    return ScriptedTurn(tool_calls=(call("run_subagent", tasks=tasks),))


delegator = with_dispatch(
    Agent(
        name="delegator",
        description="Delegates note-taking; looks keys up.",
        input_model=DelegatorInput,
        output_model=Results,
        tools=[lookup],
        model=register_script("delegator", _delegator),
        max_steps=8,
    ),
    [
        SubagentType(agent_type="notetaker", input_field="note", description=notetaker.description),
        SubagentType(agent_type="sleeper", input_field="note", description=sleeper.description),
    ],
    virtual=VirtualTasks(input_field="message"),
)
