"""Events and sessions: which events end a stream, how an event is stamped, and
``SessionStatus`` (the Python enum and its protobuf twin).

Adding an event kind to ``StreamEvent.payload`` that ends a session's stream means
adding it to ``TERMINAL_KINDS``, here and nowhere else.
"""

from __future__ import annotations

import enum
import operator
import time
from collections.abc import Sequence

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb

TERMINAL_KINDS = frozenset({"completed", "failed", "interrupted", "terminated"})
"""The ``StreamEvent.payload`` kinds that end a session's stream (and its turn)."""


def is_terminal(event: pb.StreamEvent) -> bool:
    """True for the events that end a session's stream."""
    return event.WhichOneof("payload") in TERMINAL_KINDS


_KIND = operator.methodcaller("WhichOneof", "payload")


def through_terminal(events: Sequence[pb.StreamEvent]) -> int:
    """How many of ``events`` one stream delivers: all, or up to and with the first
    terminal one (a continued session's log goes on after it with the next turn)."""
    if TERMINAL_KINDS.isdisjoint(map(_KIND, events[:-1])):  # the usual case, in C
        return len(events)
    return next(n for n, event in enumerate(events, 1) if is_terminal(event))


def stamp(event: pb.StreamEvent, *, session_id: str, agent_type: str, step: int) -> pb.StreamEvent:
    """Set what every logged event carries: session, agent type, time, and ``step``
    unless the event has one. Returns ``event``."""
    event.session_id = session_id
    event.agent_type = agent_type
    if not event.step:
        event.step = step
    # divmod beats Timestamp.FromNanoseconds, which is pure Python and per event.
    event.time.seconds, event.time.nanos = divmod(time.time_ns(), 1_000_000_000)
    return event


class SessionStatus(enum.StrEnum):
    """Lifecycle of a session. Stored as its string value."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"
    SUSPENDED = "suspended"
    """Waiting for input from people (its own request or a child's); no process runs it."""

    @property
    def is_terminal(self) -> bool:
        """True once the session can no longer change on its own."""
        return self not in (SessionStatus.RUNNING, SessionStatus.SUSPENDED)

    def to_proto(self) -> pb.SessionStatus.ValueType:
        """The ``helix.agent.v1.SessionStatus`` value."""
        return _TO_PROTO[self]

    @classmethod
    def from_proto(cls, value: pb.SessionStatus.ValueType) -> SessionStatus:
        """The status for a ``helix.agent.v1.SessionStatus`` value.

        Raises:
            ValueError: for ``SESSION_STATUS_UNSPECIFIED`` or an unknown value.
        """
        try:
            return _FROM_PROTO[value]
        except KeyError:
            raise ValueError(f"unknown session status {value}") from None


_TO_PROTO = {
    SessionStatus.RUNNING: pb.SESSION_STATUS_RUNNING,
    SessionStatus.COMPLETED: pb.SESSION_STATUS_COMPLETED,
    SessionStatus.FAILED: pb.SESSION_STATUS_FAILED,
    SessionStatus.INTERRUPTED: pb.SESSION_STATUS_INTERRUPTED,
    SessionStatus.TERMINATED: pb.SESSION_STATUS_TERMINATED,
    SessionStatus.SUSPENDED: pb.SESSION_STATUS_SUSPENDED,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}
