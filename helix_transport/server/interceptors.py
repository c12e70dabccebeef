"""Server interceptors: the one place errors become gRPC status codes."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from helix_transport._exceptions import (
    HelixError,
    InvalidArgument,
    SessionExists,
    SessionNotFound,
    SessionStateConflict,
    StoreUnavailable,
    Unauthenticated,
    UsageError,
)

logger = logging.getLogger("helix.server")


class ServerUnavailable(HelixError):
    """The server is draining or not ready; retry elsewhere."""

    retryable = True


_CODES: list[tuple[type[HelixError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
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
    if isinstance(exc, HelixError):
        await context.abort(status_for(exc), exc.message)
    # Never send internals across the wire: log them with a reference the caller can quote.
    ref = uuid.uuid4().hex[:12]
    logger.error("unhandled error in %s (ref %s)", method, ref, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error (ref {ref}); see the server log")


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions raised by handlers to precise status codes."""

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
        # grpc's stubs type handler behaviours as sync; under grpc.aio they are async.
        inner_unary: Any = handler.unary_unary
        inner_stream: Any = handler.unary_stream
        if inner_unary is not None:

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                try:
                    return await inner_unary(request, context)
                except Exception as exc:
                    if _is_abort(exc):
                        raise
                    await _abort(context, method, exc)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if inner_stream is not None:

            async def stream(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                try:
                    async for response in inner_stream(request, context):
                        yield response
                except Exception as exc:
                    if _is_abort(exc):
                        raise
                    await _abort(context, method, exc)

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def _is_abort(exc: Exception) -> bool:
    # context.abort() raises grpc's own AbortError; let it through untouched.
    return type(exc).__name__ == "AbortError"
