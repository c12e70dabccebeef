"""When a suspended session should run again, read from the store alone.

A suspended session is a row: nothing in memory waits for it. It runs again when an
answer for one of its requests is in the store, when a request's deadline has passed,
or when a child it waited for has moved on (its log went past where the parent's
left it: answered, expired, interrupted), or when an interrupt waits for it. ``SubmitInput`` wakes the sessions on its
path itself; this is what the run that just suspended checks once more (an answer may
have landed while it was suspending), and what every replica's periodic scan checks
for the rest (deadlines, a wake lost with a process that died).
"""

from __future__ import annotations

import asyncio
import logging
import time

from helix_transport._events import SessionStatus
from helix_transport._exceptions import HelixError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.inputs import InputState
from helix_transport.agent.state import split_state
from helix_transport.store import InterruptLookup, SessionRecord, Store
from helix_transport.transport import ClientPool

logger = logging.getLogger("helix.runner")

CHILD_STATUS_TIMEOUT_S = 5.0
"""How long the check waits for a child's service; unreachable, the next scan asks again."""


async def wake_reason(store: Store, clients: ClientPool, record: SessionRecord) -> str | None:
    """Why ``record``'s suspended session should run now (``input``, ``deadline``,
    ``child``), or ``None``."""
    if record.status is not SessionStatus.SUSPENDED:
        return None
    # An Interrupt that found the session still running as it suspended woke nothing.
    if isinstance(store, InterruptLookup) and await store.pending_interrupts([record.session_id]):
        return "interrupt"
    checkpoint = await store.load_checkpoint(record.session_id)
    if checkpoint is None:
        return None
    waiting = InputState.of(split_state(checkpoint.state)[1])
    if waiting.pending:
        answers = await store.list_answers(record.session_id)
        if not answers.keys().isdisjoint(waiting.pending):
            return "input"
        now = time.time()
        if any(r.expired(now) for r in waiting.pending.values()):
            return "deadline"
    for child in waiting.children:
        if await _moved_on(clients, child.address, child.child_session_id, child.last_sequence):
            return "child"
    return None


async def _moved_on(clients: ClientPool, address: str, child_id: str, last_sequence: int) -> bool:
    try:
        async with asyncio.timeout(CHILD_STATUS_TIMEOUT_S):
            client = await clients.get(address)
            status = await client.get_status(child_id)
    except (HelixError, TimeoutError) as exc:
        logger.info("child %s at %s not checked: %s", child_id, address, exc)
        return False
    return status.status != pb.SESSION_STATUS_SUSPENDED or status.last_sequence > last_sequence
