"""Turns of a continued session, as the log records them.

Turn 1 is the run ``Start`` began. ``Continue`` appends a ``turn_started`` event
right after the terminal event of the previous turn, in the same atomic write
that sets the session RUNNING again: that event is the commit point of a new
turn, so the run loop (fresh start, restart or takeover alike) finds a turn to
begin by looking for a ``turn_started`` newer than its checkpoint.

A continued turn (not ``fresh``) keeps the conversation: of a completed turn, or of
an interrupted one, which it resumes. A checkpoint may have been taken after a
step's model call and before that call's tools ran (a completed turn's, from before
its end rode with the checkpoint; an interrupted turn's, cut off in its tools), so
its messages end with tool calls that have no results. Those that ran have their
results in the log (``tool_end``); the calls the interrupt cut off get the error
``{"error": "interrupted"}``. ``heal`` adds them back before the new message, so the
model sees a valid conversation.

A turn's checkpoints name the turn and where its ``turn_started`` is (their run
state's ``TurnState``, see ``helix_transport.agent.state``), so
``Continue`` learns how many turns there are from the last checkpoint and the few
events after it, not from the whole log (``count_turns``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.state import OUTCOME_UNKNOWN, split_state
from helix_transport.store import EventLogStore, Store, pages


@dataclass(frozen=True, kw_only=True)
class StartedTurn:
    """One ``turn_started`` event."""

    turn: int
    message: str
    fresh: bool
    sequence: int
    """The sequence of the ``turn_started`` event."""


def _started(event: pb.StreamEvent) -> StartedTurn:
    started = event.turn_started
    return StartedTurn(
        turn=started.turn, message=started.message, fresh=started.fresh, sequence=event.sequence
    )


async def read_turns(
    store: EventLogStore, session_id: str, *, from_sequence: int = 0
) -> list[StartedTurn]:
    """Every ``turn_started`` event with ``sequence > from_sequence``, in log order."""
    turns: list[StartedTurn] = []
    async for events in pages(store, session_id, from_sequence=from_sequence):
        turns += [_started(e) for e in events if e.WhichOneof("payload") == "turn_started"]
    return turns


@dataclass(frozen=True, kw_only=True)
class Turns:
    """A session's turns as ``Continue`` needs them, found without reading the whole log."""

    count: int
    """Turns started so far (1: only the run ``Start`` began)."""
    read: dict[int, StartedTurn]
    """The turns whose ``turn_started`` came after the last checkpoint, by number."""
    checkpointed: tuple[int, int] | None
    """The checkpointed turn's number and the sequence of its ``turn_started``."""


async def count_turns(store: Store, session_id: str) -> Turns:
    """How many turns the session has started: the last checkpoint's turn, plus those
    started after it.

    A session's log grows with every turn (a turn that streams text logs an event
    per delta); its checkpoint is one record. Only the events after the checkpoint
    are read, so a long-lived session's ``Continue`` costs the same at turn 50 as
    at turn 2.
    """
    checkpoint = await store.load_checkpoint(session_id)
    if checkpoint is None:  # the first turn ended before its first checkpoint
        count, from_sequence, checkpointed = 1, 0, None
    else:
        turns = split_state(checkpoint.state)[1].turns  # the run state's (agent.state)
        count, from_sequence = turns.turn, checkpoint.last_sequence
        checkpointed = None if turns.sequence is None else (count, turns.sequence)
    read = {
        started.turn: started
        for started in await read_turns(store, session_id, from_sequence=from_sequence)
    }
    return Turns(count=max([count, *read]), read=read, checkpointed=checkpointed)


async def find_turn(store: EventLogStore, session_id: str, turns: Turns, turn: int) -> StartedTurn:
    """Turn ``turn``'s ``turn_started`` (2 <= ``turn`` <= ``turns.count``): one read
    when ``count_turns`` found where it is; a scan of the log for an older turn (a
    retried ``Continue``, so rare)."""
    if turn in turns.read:
        return turns.read[turn]
    if turns.checkpointed is not None and turns.checkpointed[0] == turn:
        started = await turn_started_at(store, session_id, turns.checkpointed[1])
        if started is not None:
            return started
    for started in await read_turns(store, session_id):
        if started.turn == turn:
            return started
    raise LookupError(f"session {session_id!r}: no turn_started for turn {turn}")


async def turn_started_at(
    store: EventLogStore, session_id: str, sequence: int
) -> StartedTurn | None:
    """The ``turn_started`` event at ``sequence`` (one read); ``None`` when it is not one."""
    events = await store.read(session_id, from_sequence=sequence - 1, limit=1)
    if (
        events
        and events[0].sequence == sequence
        and events[0].WhichOneof("payload") == "turn_started"
    ):
        return _started(events[0])
    return None


async def heal(
    store: EventLogStore,
    session_id: str,
    messages: list[dict[str, Any]],
    *,
    from_sequence: int,
    until: int,
    started: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """``messages`` with results for the tool calls its last assistant message left open.

    The results come from the ``tool_end`` events logged between ``from_sequence`` (the
    checkpoint's sequence) and ``until`` (the new turn's ``turn_started``); a
    call retried after a crash was logged twice, and the last result counts. A call
    with none was cut off: ``{"error": "interrupted"}`` when an interrupt ended the
    turn (the event just before ``until``), else ``{"error": "no result"}``; but a call
    in ``started`` (at most once, see ``InputState.started``) may have had its effect
    and the model must not take it for one that never ran: its outcome is unknown.
    """
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or not last.get("tool_calls"):
        return list(messages)
    results: dict[str, pb.ToolEnd] = {}
    ended = ""  # how the turn ended: the payload of its terminal event
    async for events in pages(store, session_id, from_sequence=from_sequence):
        for event in events:
            kind = event.WhichOneof("payload")
            if event.sequence < until and kind == "tool_end":
                results[event.tool_end.tool_call_id] = event.tool_end
            elif event.sequence == until - 1:
                ended = kind or ""
        if events[-1].sequence >= until:
            break
    missing = json.dumps({"error": "interrupted" if ended == "interrupted" else "no result"})
    unknown = json.dumps({"error": OUTCOME_UNKNOWN})
    healed = list(messages)
    for call in last["tool_calls"]:
        end = results.get(call["id"])
        if end is not None:
            content = end.result_json
        else:
            content = unknown if call["id"] in started else missing
        name = call["function"]["name"]
        healed.append(
            {"role": "tool", "tool_call_id": call["id"], "name": name, "content": content}
        )
    return healed
