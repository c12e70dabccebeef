"""A service's recent sessions, as a stream of changes for the page.

The contract has no change feed of sessions (``ListSessions`` is a snapshot), so the
watch runs here, in the CLI process, next to the gRPC client: it lists the sessions
every ``WATCH_S`` and sends the page the list only when it differs from the one it
sent last (a session appeared, changed status or logged more). The page holds one
open response and draws what comes; it never asks again on a timer. A service that
cannot be listed is said once (``failure``), and the watch goes on, so the list comes
back by itself when the service does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._exceptions import HelixError
from helix_transport.cli.inspector.feed import KEEPALIVE_S, Message
from helix_transport.cli.jsonout import message_json
from helix_transport.transport import AgentClient

WATCH_S = 1.0
"""How often the watch lists the sessions (the page hears only of changes)."""


async def list_sessions(
    client: AgentClient, *, statuses: Sequence[SessionStatus], roots_only: bool, limit: int
) -> list[dict[str, Any]]:
    """The newest ``limit`` sessions matching the filters, as JSON values."""
    return [
        message_json(summary)
        async for summary in client.iter_sessions(
            statuses=statuses, roots_only=roots_only, limit=limit
        )
    ]


async def watch_sessions(
    client: AgentClient, *, statuses: Sequence[SessionStatus], roots_only: bool, limit: int
) -> AsyncIterator[Message]:
    """``sessions`` (``{"sessions": [...]}``) whenever the list changed, ``failure`` when
    it cannot be read (once per outage), ``keepalive`` when quiet; until cancelled."""
    sent: list[dict[str, Any]] | None = None
    failing = ""
    quiet = 0.0
    while True:
        try:
            found = await list_sessions(
                client, statuses=statuses, roots_only=roots_only, limit=limit
            )
        except HelixError as exc:
            sent = None  # the list, sent again once it can be read, clears the error
            if str(exc) != failing:
                failing = str(exc)
                quiet = 0.0
                yield Message("failure", {"error": failing})
        else:
            failing = ""
            if found != sent:
                sent = found
                quiet = 0.0
                yield Message("sessions", {"sessions": found})
        if quiet >= KEEPALIVE_S:
            quiet = 0.0
            yield Message("keepalive", {})
        await asyncio.sleep(WATCH_S)
        quiet += WATCH_S
