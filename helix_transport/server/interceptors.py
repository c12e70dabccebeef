"""Server interceptors: the one place errors become gRPC status codes."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from helix_transport import _rich_status
from helix_transport._exceptions import (
    HelixError,
    InvalidArgument,
    PermissionDenied,
    RequestNotFound,
    ResourceExhausted,
    ServerUnavailable,
    SessionExists,
    SessionExpired,
    SessionNotFound,
    SessionStateConflict,
    StoreUnavailable,
    Unauthenticated,
    UsageError,
)
from helix_transport._wire import undecodable
from helix_transport.server._handlers import wrap_handler

logger = logging.getLogger("helix.server")


_CODES: list[tuple[type[HelixError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (SessionNotFound, grpc.StatusCode.NOT_FOUND),
    (SessionExists, grpc.StatusCode.ALREADY_EXISTS),
    (SessionStateConflict, grpc.StatusCode.FAILED_PRECONDITION),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (ServerUnavailable, grpc.StatusCode.UNAVAILABLE),
    (UsageError, grpc.StatusCode.FAILED_PRECONDITION),
]


def status_for(exc: HelixError) -> grpc.StatusCode:
    """The gRPC status code a ``HelixError`` maps to."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


async def _abort(context: grpc.aio.ServicerContext[Any, Any], method: str, exc: Exception) -> None:
    code, message, trailer = public_status(method, exc)
    await context.abort(code, message, trailing_metadata=trailer)


def public_status(
    method: str, exc: Exception
) -> tuple[grpc.StatusCode, str, _rich_status.Metadata]:
    """What a caller is told of ``exc`` raised in ``method``: its status code, message
    and rich details. Anything but a ``HelixError`` with a precise code is INTERNAL,
    logged here with a reference the caller can quote, its internals never sent."""
    # A HelixError mapped to INTERNAL may carry internals (a child's address): not sent.
    if isinstance(exc, HelixError) and (code := status_for(exc)) is not grpc.StatusCode.INTERNAL:
        return code, _rich_status.cut(exc.message), rich_trailer(code, exc)
    ref = uuid.uuid4().hex[:12]
    logger.error(
        "unhandled error in %s (ref %s)",
        method,
        ref,
        exc_info=exc,
        extra={"rpc": method, "ref": ref},
    )
    return grpc.StatusCode.INTERNAL, f"internal error (ref {ref}); see the server log", ()


def rich_trailer(code: grpc.StatusCode, exc: HelixError) -> _rich_status.Metadata:
    """google.rpc details for ``exc``: field violations, a retry hint."""
    if isinstance(exc, InvalidArgument):
        return _rich_status.trailing_metadata(code, exc.message, violations=exc.violations)
    if isinstance(exc, ResourceExhausted):
        return _rich_status.trailing_metadata(
            code, exc.message, retry_after_s=exc.retry_after_s, reason=exc.limit
        )
    if isinstance(exc, RequestNotFound):  # the session exists: its request does not
        return _rich_status.trailing_metadata(
            code, exc.message, reason=_rich_status.REQUEST_NOT_FOUND
        )
    if isinstance(exc, SessionExpired):  # for clients to tell it from "never existed"
        return _rich_status.trailing_metadata(
            code, exc.message, reason=_rich_status.SESSION_EXPIRED
        )
    return ()


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions raised by handlers to precise status codes, for every kind of
    RPC and handler style (grpc_health's ``Watch`` writes through ``context.write``)."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        streamed = handler.request_streaming

        async def before(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return _decoded_stream(request) if streamed else _decoded(request)

        async def on_error(exc: Exception, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await _abort(context, method, exc)

        return wrap_handler(
            handler,
            before=before,
            on_error=on_error,
            request_deserializer=_safe_deserializer(handler.request_deserializer),
        )


class _Undecodable:
    """Stands in for a request whose bytes did not parse; the handler wrapper raises
    ``error`` so it becomes INVALID_ARGUMENT, not grpc's own UNKNOWN with internals."""

    def __init__(self, error: InvalidArgument) -> None:
        self.error = error


def _safe_deserializer(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None
    message_type = getattr(deserialize, "__self__", None)

    def safe(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception:
            return _Undecodable(undecodable(message_type, raw))

    return safe


def _decoded(request: Any) -> Any:
    if isinstance(request, _Undecodable):
        raise request.error
    return request


async def _decoded_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _decoded(request)
