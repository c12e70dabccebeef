"""The one boundary where gRPC errors become ``HelixError``s."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from helix_transport._exceptions import (
    ConnectError,
    DeadlineExceeded,
    HelixError,
    InvalidArgument,
    PermissionDenied,
    RemoteError,
    RequestNotFound,
    ResourceExhausted,
    SessionExists,
    SessionExpired,
    SessionNotFound,
    SessionStateConflict,
    Unauthenticated,
)
from helix_transport._rich_status import REQUEST_NOT_FOUND, SESSION_EXPIRED, read_details

RESUMABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,  # server down, restarting, or unreachable
        grpc.StatusCode.CANCELLED,  # the server cancelled the call while shutting down
        grpc.StatusCode.INTERNAL,  # a reset HTTP/2 stream surfaces as INTERNAL
        grpc.StatusCode.UNKNOWN,  # a connection dropped mid-message
    }
)
"""Status codes after which a stream is resumed from its last sequence."""


def to_helix_error(
    exc: grpc.aio.AioRpcError, *, address: str, session_id: str = "", request_id: str = ""
) -> HelixError:
    """The most specific ``HelixError`` for a failed call."""
    code, detail = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.NOT_FOUND and session_id:
        reason = read_details(code, exc.trailing_metadata()).reason
        if reason == SESSION_EXPIRED:
            return SessionExpired(session_id)
        if reason == REQUEST_NOT_FOUND:
            return RequestNotFound(session_id, request_id)
        return SessionNotFound(session_id)
    if code == grpc.StatusCode.ALREADY_EXISTS and session_id:
        return SessionExists(session_id)
    if code == grpc.StatusCode.FAILED_PRECONDITION and session_id:
        # The server's message is "session 'id': problem"; keep only the problem.
        return SessionStateConflict(session_id, detail.partition(": ")[2] or detail)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        violations = read_details(code, exc.trailing_metadata()).violations
        if violations:  # google.rpc BadRequest: every field, not just the first
            return InvalidArgument(*violations[0], violations=violations)
        field, _, problem = detail.partition(": ")
        return InvalidArgument(field, problem) if problem else InvalidArgument("request", detail)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(f"UNAUTHENTICATED by {address}: {detail}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"PERMISSION_DENIED by {address}: {detail}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        rich = read_details(code, exc.trailing_metadata())
        return ResourceExhausted(
            rich.reason or "resource",
            detail.partition("; retry after ")[0],  # the hint is rebuilt from RetryInfo
            retry_after_s=rich.retry_after_s,
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return ConnectError(address, detail)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"call to {address} exceeded its deadline")
    return RemoteError(code.name, detail)


@contextmanager
def map_grpc_errors(address: str, session_id: str = "", request_id: str = "") -> Iterator[None]:
    """Re-raise ``AioRpcError`` as the matching ``HelixError``."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise to_helix_error(
            exc, address=address, session_id=session_id, request_id=request_id
        ) from exc
