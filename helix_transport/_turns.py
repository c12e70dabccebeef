"""Turns of a continued session, as the log records them.

Turn 1 is the run ``Start`` began. ``Continue`` appends a ``turn_started`` event
right after the terminal event of the previous turn, in the same atomic write
that sets the session RUNNING again: that event is the commit point of a new
turn, so the run loop (fresh start, restart or takeover alike) finds a turn to
begin by looking for a ``turn_started`` newer than its checkpoint.

A continued turn (not ``fresh``) keeps the conversation. The checkpoint a
completed turn leaves behind was taken after its last model call and before that
call's tools ran, so its messages end with tool calls that have no results yet
(one of them the ``__finish__`` that completed the turn). Their results are in
the log (``tool_end``), so ``heal`` adds them back before the new message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import READ_LIMIT, Store

TURN_KEY = "helix.turn"
"""Checkpoint ``state`` key: the turn the checkpointed run is in (1 when absent)."""
TURN_BASE_KEY = "helix.turn_base_step"
"""Checkpoint ``state`` key: steps taken before the turn began (its budget starts there)."""


@dataclass(frozen=True, kw_only=True)
class StartedTurn:
    """One ``turn_started`` event."""

    turn: int
    message: str
    fresh: bool
    sequence: int
    """The sequence of the ``turn_started`` event."""


async def read_turns(store: Store, session_id: str, *, after: int = 0) -> list[StartedTurn]:
    """Every ``turn_started`` event with ``sequence > after``, in log order."""
    turns: list[StartedTurn] = []
    position = after
    while True:
        events = await store.read(session_id, from_sequence=position, limit=READ_LIMIT)
        for event in events:
            if event.WhichOneof("payload") == "turn_started":
                started = event.turn_started
                turns.append(
                    StartedTurn(
                        turn=started.turn,
                        message=started.message,
                        fresh=started.fresh,
                        sequence=event.sequence,
                    )
                )
        if len(events) < READ_LIMIT:
            return turns
        position = events[-1].sequence


async def heal(
    store: Store, session_id: str, messages: list[dict[str, Any]], *, after: int, until: int
) -> list[dict[str, Any]]:
    """``messages`` with results for the tool calls its last assistant message left open.

    The results come from the ``tool_end`` events logged between ``after`` (the
    checkpoint's sequence) and ``until`` (the new turn's ``turn_started``); a
    call retried after a crash was logged twice, and the last result counts.
    """
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or not last.get("tool_calls"):
        return list(messages)
    results: dict[str, pb.ToolEnd] = {}
    position = after
    while position < until:
        events = await store.read(session_id, from_sequence=position, limit=READ_LIMIT)
        for event in events:
            if event.sequence < until and event.WhichOneof("payload") == "tool_end":
                results[event.tool_end.tool_call_id] = event.tool_end
        if len(events) < READ_LIMIT:
            break
        position = events[-1].sequence
    healed = list(messages)
    for call in last["tool_calls"]:
        end = results.get(call["id"])
        content = end.result_json if end is not None else json.dumps({"error": "no result"})
        name = call["function"]["name"]
        healed.append(
            {"role": "tool", "tool_call_id": call["id"], "name": name, "content": content}
        )
    return healed
