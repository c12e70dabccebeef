"""A session's events across its turns, as ``call --follow``, ``tree`` and the inspect
page read them.

One ``Stream`` ends at a terminal event, which ends a turn; a continued session's log
goes on after it with the next turn's ``turn_started``. Here each stream that ends is
followed by a ``GetStatus``: while the log holds more, or the session runs again,
the next stream resumes from the last sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

from helix_transport._config import RetryConfig
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.transport import AgentClient

_GOING_ON = (pb.SESSION_STATUS_RUNNING, pb.SESSION_STATUS_SUSPENDED)
"""Statuses whose log can still grow: a suspended session resumes when answered."""


async def session_events(
    client: AgentClient,
    session_id: str,
    *,
    from_sequence: int = 0,
    until_sequence: int | None = None,
    retry: RetryConfig | None = None,
) -> AsyncIterator[pb.StreamEvent]:
    """The events of ``session_id`` after ``from_sequence``, every turn, in order.

    Ends once the session has ended (not merely suspended) with nothing more in its
    log, or with
    ``until_sequence`` after the event of that sequence (a snapshot: read what was
    logged when ``GetStatus`` answered, then stop). Each stream resumes across breaks
    as ``EventStream`` does, with ``retry`` (``client.config.reconnect`` by default).
    """
    last = from_sequence
    while until_sequence is None or last < until_sequence:
        stream = client.stream(session_id, from_sequence=last, retry=retry)
        events = cast(AsyncGenerator[pb.StreamEvent, None], aiter(stream))
        async with contextlib.aclosing(events):  # a reader that stops early ends the call
            async for event in events:
                yield event
                if until_sequence is not None and event.sequence >= until_sequence:
                    return
        last = stream.last_sequence
        status = await client.get_status(session_id)
        if status.last_sequence <= last and status.status not in _GOING_ON:
            return
