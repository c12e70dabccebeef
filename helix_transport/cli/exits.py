"""The exit codes of ``helix-mesh``: one table, here and in docs/cli.md.

A script tells the outcomes apart by the code alone: a session that completed,
failed or was stopped; a request the caller must fix (bad flags, bad input, a
session that does not exist, refused credentials); a service that could not be
reached or is not serving now (trying again later can help); a session that has
not ended yet.
"""

from __future__ import annotations

import enum

from helix_transport._exceptions import (
    ConnectError,
    DeadlineExceeded,
    HelixError,
    InvalidArgument,
    PermissionDenied,
    RemoteError,
    ResourceExhausted,
    ServerUnavailable,
    SessionExists,
    SessionNotFound,
    SessionStateConflict,
    StoreUnavailable,
    StreamInterrupted,
    Unauthenticated,
    UsageError,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb


class ExitCode(enum.IntEnum):
    """What a ``helix-mesh`` command's exit status means."""

    COMPLETED = 0
    """The session completed, or the command did what it was asked."""
    FAILED = 1
    """The session failed, a conformance check failed, or the service failed the request."""
    USAGE = 2
    """Bad flags or input: malformed JSON, an invalid field, no such session, refused
    credentials. Repeating the same command will not help."""
    INTERRUPTED = 3
    """The session was interrupted or terminated."""
    UNREACHABLE = 4
    """The service could not be reached, or is not serving now (draining, at capacity):
    trying again later can help."""
    RUNNING = 5
    """The session has not ended yet: running, or suspended waiting for input
    (``status``, ``tree`` without ``--follow``)."""
    CTRL_C = 130
    """Stopped by Ctrl-C (SIGINT), as shells report it."""
    BROKEN_PIPE = 141
    """The reader of standard output left (``| head``), as shells report SIGPIPE."""


_BY_STATUS = {
    pb.SESSION_STATUS_COMPLETED: ExitCode.COMPLETED,
    pb.SESSION_STATUS_FAILED: ExitCode.FAILED,
    pb.SESSION_STATUS_INTERRUPTED: ExitCode.INTERRUPTED,
    pb.SESSION_STATUS_TERMINATED: ExitCode.INTERRUPTED,
    pb.SESSION_STATUS_RUNNING: ExitCode.RUNNING,
    pb.SESSION_STATUS_SUSPENDED: ExitCode.RUNNING,  # not ended: waiting for input
}

_TERMINAL_KINDS = {
    "completed": ExitCode.COMPLETED,
    "failed": ExitCode.FAILED,
    "interrupted": ExitCode.INTERRUPTED,
    "terminated": ExitCode.INTERRUPTED,
}

# gRPC status names (RemoteError.code) that say the request itself must change.
_CALLER_MUST_FIX = frozenset({"NOT_FOUND", "PERMISSION_DENIED", "OUT_OF_RANGE", "UNIMPLEMENTED"})


def for_status(status: pb.SessionStatus.ValueType) -> ExitCode:
    """The exit code for a session in ``status``."""
    return _BY_STATUS.get(status, ExitCode.FAILED)


def for_terminal_kind(kind: str | None) -> ExitCode:
    """The exit code for a stream that ended with an event of ``kind``
    (``completed``...); ``None`` (no event at all) is ``RUNNING``."""
    if kind is None:
        return ExitCode.RUNNING
    return _TERMINAL_KINDS.get(kind, ExitCode.FAILED)


def for_error(exc: HelixError) -> ExitCode:
    """The exit code for a command that ended with ``exc``."""
    if isinstance(exc, ResourceExhausted):
        # With a retry hint (a rate, a full replica) later can work; a message too
        # large stays too large.
        return ExitCode.UNREACHABLE if exc.retryable else ExitCode.USAGE
    if isinstance(
        exc,
        ConnectError | StreamInterrupted | DeadlineExceeded | ServerUnavailable | StoreUnavailable,
    ):
        return ExitCode.UNREACHABLE
    if isinstance(
        exc,
        UsageError
        | InvalidArgument
        | SessionNotFound
        | SessionExists
        | SessionStateConflict
        | Unauthenticated
        | PermissionDenied,  # refused credentials: `gc ADDRESS` by a non-admin
    ):
        return ExitCode.USAGE
    if isinstance(exc, RemoteError) and exc.code in _CALLER_MUST_FIX:
        return ExitCode.USAGE
    return ExitCode.FAILED
