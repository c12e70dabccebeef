"""Heartbeats on a quiet ``Stream``: signs of life that are not part of the log.

A session waiting for its sub-agents can be silent for minutes; proxies and load
balancers drop idle connections. When ``follow`` has yielded nothing for the
server's heartbeat interval (``follow(idle_s=...)`` yields an empty batch), the
stream sends a ``StreamResponse`` holding only a ``heartbeat`` (no sequence,
nothing stored) saying how many sub-agents the session is waiting for (its running
sub-session refs), or that it is suspended, waiting for input. Readers that do not care skip it; ``EventStream`` counts them
in ``heartbeats``. The check rides on ``follow``'s own wake-ups and polls, so a
busy stream pays nothing for it.
"""

from __future__ import annotations

import asyncio

from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import Store


async def heartbeat(store: Store, session_id: str) -> pb.Heartbeat:
    """The heartbeat for ``session_id`` now."""
    record, refs = await asyncio.gather(
        store.get_session(session_id), store.list_subsession_refs(session_id)
    )
    waiting = sum(1 for ref in refs if ref.status is SessionStatus.RUNNING)
    if record is not None and record.status is SessionStatus.SUSPENDED:
        detail = "suspended: waiting for input"
    else:
        detail = f"waiting for {waiting} sub-agent(s)" if waiting else "working"
    return pb.Heartbeat(detail=detail, pending_children=waiting)
