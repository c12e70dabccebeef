"""A new turn of a finished session, as ``Continue`` asks (see ``helix_transport.agent.turns``).

The ``turn_started`` event is appended with ``expected_sequence`` equal to the
session's last sequence (its terminal event) together with the RUNNING status,
in one atomic store write: of two concurrent continuations exactly one commits,
and a turn is either fully started or not at all. The request names its turn,
so a retry (a lost reply, a resumed parent re-running its tool call) finds the
turn already started and gets ``created=false`` instead of a second turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    SequenceConflict,
    SessionExists,
    SessionStateConflict,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.turns import StartedTurn, count_turns, find_turn
from helix_transport.server._expiry import not_found
from helix_transport.server._ownership import visible
from helix_transport.server._runner import SessionRunner
from helix_transport.server._shield import outlive_caller
from helix_transport.store import SessionRecord, SessionUpdate, Store

_KEEPS_MEMORY = frozenset({SessionStatus.COMPLETED, SessionStatus.INTERRUPTED})
"""The ends a turn can be continued from with its conversation: a completed turn, or
one an interrupt stopped (the new turn resumes it, see ``agent.turns``). A failed
turn's conversation is what failed; an aborted (terminated) one is never resumed."""


class TurnExists(SessionExists):
    """The named turn was started with a different message."""

    def __init__(self, session_id: str, turn: int) -> None:
        super().__init__(session_id)
        self.message = f"session {session_id!r}: turn {turn} already started with another message"
        self.args = (self.message,)


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """A validated ``Continue``: turn ``turn`` of the caller's session ``session_id``
    (stored under ``key``)."""

    key: str
    session_id: str
    turn: int
    message: str
    fresh: bool


@dataclass(frozen=True, kw_only=True)
class ContinuedTurn:
    """A turn started now (``created``) or before; its events follow ``from_sequence``."""

    turn: int
    created: bool
    status: SessionStatus
    from_sequence: int


async def continue_session(
    request: TurnRequest,
    *,
    store: Store,
    runner: SessionRunner,
    admit: Callable[[], AbstractContextManager[None]],
) -> ContinuedTurn:
    """Start the turn ``request`` names, or answer the one already started.

    ``admit()`` is entered only to start a new turn, so a retried ``Continue`` is
    answered even while the replica drains or is at capacity; it raises to refuse.
    """
    session_id, key = request.session_id, request.key
    for _ in range(3):  # a lost race with a concurrent Continue is re-examined
        record = await store.get_session(key)
        if record is None or record.agent_type != runner.agent.name or not visible(record):
            raise await not_found(store, key, session_id)
        turns = await count_turns(store, key)
        current = turns.count
        if request.turn <= current:
            earlier = await find_turn(store, key, turns, request.turn)
            return _replay(record, earlier, request)
        if request.turn > current + 1:
            raise SessionStateConflict(
                session_id, f"turn {request.turn} is not the next turn ({current + 1})"
            )
        _check_continuable(record, session_id, fresh=request.fresh)
        # Shielded, as Start's create-and-run is: once the turn is in the log its run
        # starts, even when the caller gives up meanwhile.
        started = await outlive_caller(
            _start_turn(store, runner, record, request, admit),
            what=f"turn {request.turn} of session {session_id}",
        )
        if started is None:
            continue
        return started
    raise SessionStateConflict(session_id, "the session changed during the request; retry")


async def _start_turn(
    store: Store,
    runner: SessionRunner,
    record: SessionRecord,
    request: TurnRequest,
    admit: Callable[[], AbstractContextManager[None]],
) -> ContinuedTurn | None:
    """Append ``turn_started`` after the log's end and run the turn; None when another
    write got there first."""
    key = record.session_id  # the store's; the event and the reply carry the caller's id
    event = pb.StreamEvent(
        session_id=request.session_id,
        agent_type=record.agent_type,
        turn_started=pb.TurnStarted(
            turn=request.turn, message=request.message, fresh=request.fresh
        ),
    )
    event.time.seconds, event.time.nanos = divmod(time.time_ns(), 1_000_000_000)
    reopen = SessionUpdate(
        status=SessionStatus.RUNNING,
        output_json="",
        error="",
        failure_reason="",
        limit_exceeded="",
    )
    with admit():  # counted as starting until runner.continue_turn counts the run
        # An interrupt accepted while the last turn's final step ran (which finished
        # first) ended nothing; it must not stop this turn. The session is terminal
        # until the append below, so no Interrupt accepts a new one meanwhile...
        stale = await store.take_interrupt(key)
        try:
            sequence = await store.append(
                key, [event], expected_sequence=record.last_sequence, update=reopen
            )
        except SequenceConflict:
            # ...unless another Continue's turn began first: then it may be that turn's.
            if stale is not None:
                await store.set_interrupt(key, stale.reason, abort=stale.abort)
            return None
        started = await store.get_session(key)
        assert started is not None  # sessions are never deleted
        await runner.continue_turn(started)
    return ContinuedTurn(
        turn=request.turn,
        created=True,
        status=SessionStatus.RUNNING,
        from_sequence=sequence - 1,
    )


def _replay(record: SessionRecord, started: StartedTurn, request: TurnRequest) -> ContinuedTurn:
    if started.message != request.message or started.fresh != request.fresh:
        raise TurnExists(request.session_id, request.turn)
    return ContinuedTurn(
        turn=request.turn,
        created=False,
        status=record.status,
        from_sequence=started.sequence - 1,
    )


def _check_continuable(record: SessionRecord, session_id: str, *, fresh: bool) -> None:
    if record.status is SessionStatus.RUNNING:
        raise SessionStateConflict(session_id, "still running; continue it once its turn has ended")
    if record.status is SessionStatus.SUSPENDED:  # its turn is not over: it waits for input
        raise SessionStateConflict(
            session_id, "still running, suspended for input; answer it or interrupt it first"
        )
    if record.status not in _KEEPS_MEMORY and not fresh:
        raise SessionStateConflict(
            session_id,
            f"{record.status.value}; only a completed or interrupted session keeps its "
            "memory (continue it with fresh=true)",
        )
