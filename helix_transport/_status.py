"""Session status: the Python enum and its protobuf twin."""

from __future__ import annotations

import enum

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb


class SessionStatus(enum.StrEnum):
    """Lifecycle of a session. Stored as its string value."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"

    @property
    def is_terminal(self) -> bool:
        """True once the session can no longer change on its own."""
        return self is not SessionStatus.RUNNING

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
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}
