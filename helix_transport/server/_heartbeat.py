"""Heartbeats on a quiet ``Stream``: signs of life that are not part of the log.

A session waiting for its sub-agents can be silent for minutes; proxies and load
balancers drop idle connections. When no event was sent for ``interval_s`` and
the session still runs, the stream sends a ``StreamResponse`` holding only a
``heartbeat`` (no sequence, nothing stored), saying how many sub-agents the
session is waiting for (its running sub-session refs). Readers that do not care
skip it; ``EventStream`` counts them in ``heartbeats``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._status import SessionStatus
from helix_transport.store import Store


async def with_heartbeats(
    batches: AsyncIterator[list[pb.StreamEvent]],
    store: Store,
    session_id: str,
    *,
    interval_s: float,
) -> AsyncIterator[list[pb.StreamEvent] | pb.Heartbeat]:
    """``batches``, with a ``Heartbeat`` after every ``interval_s`` without one."""
    iterator = aiter(batches)
    pending: asyncio.Task[list[pb.StreamEvent]] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield await _heartbeat(store, session_id)
                continue
            task, pending = pending, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending


async def _heartbeat(store: Store, session_id: str) -> pb.Heartbeat:
    refs = await store.list_subsession_refs(session_id)
    waiting = sum(1 for ref in refs if ref.status is SessionStatus.RUNNING)
    detail = f"waiting for {waiting} sub-agent(s)" if waiting else "working"
    return pb.Heartbeat(detail=detail, pending_children=waiting)
