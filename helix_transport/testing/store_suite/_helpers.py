"""Records, events and commands the store suite builds, and its small checks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from helix_transport._exceptions import SequenceConflict
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store import (
    ChildCommand,
    SessionRecord,
    Store,
    input_fingerprint,
)

Reopen = Callable[[], Awaitable[Store]]
"""Opens a new store instance on the same data as the ``store`` fixture's."""


def make_record(session_id: str = "s-1", **overrides: Any) -> SessionRecord:
    """A valid RUNNING session record; ``overrides`` replace any field."""
    input_json = overrides.pop("input_json", '{"topic": "tides"}')
    fields: dict[str, Any] = {
        "session_id": session_id,
        "agent_type": "researcher",
        "input_json": input_json,
        "input_hash": input_fingerprint(input_json),
    }
    return SessionRecord(**(fields | overrides))


def make_event(text: str, *, session_id: str = "s-1") -> StreamEvent:
    """A ``text_delta`` event carrying ``text``, with no sequence yet."""
    event = StreamEvent(session_id=session_id, agent_type="researcher", step=1)
    event.text_delta.text = text
    return event


def make_command(
    parent_session_id: str, child_session_id: str, /, **overrides: Any
) -> ChildCommand:
    """An interrupt of ``child_session_id`` at ``summarizer:50051``; ``overrides``
    replace any field."""
    fields: dict[str, Any] = {
        "parent_session_id": parent_session_id,
        "child_session_id": child_session_id,
        "address": "summarizer:50051",
    }
    return ChildCommand(**(fields | overrides))


def texts(events: list[StreamEvent]) -> list[str]:
    return [e.text_delta.text for e in events]


async def append_racing(store: Store, session_id: str, event: StreamEvent, *, end: int) -> int:
    """Append ``event`` at the log's end, guessed to be ``end``: a writer that loses the
    race to another is told where the log ends now, and tries again there."""
    while True:
        try:
            return await store.append(session_id, [event], expected_sequence=end)
        except SequenceConflict as conflict:
            assert event.sequence == 0  # a missed fence numbers nothing
            end = conflict.actual


def sequences(events: list[StreamEvent]) -> list[int]:
    return [e.sequence for e in events]
