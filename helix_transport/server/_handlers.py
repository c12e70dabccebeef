"""Wrapping a gRPC method handler in an interceptor, whatever style it is written in.

grpc.aio serves a streamed response from an async generator (``yield``) or from a
coroutine that writes through ``context.write`` (grpc_health's ``Watch``); a wrapper
that assumed the first answered every ``Watch`` with INTERNAL. The wrappers here are
async generators that iterate what the handler returns, or await it when it is a
coroutine (``context.write`` sends from inside a generator handler too), so every
interceptor passes both styles.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:  # grpc's classes are generic only in its stubs
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]

Before = Callable[[Any, "Context"], Awaitable[Any]]
"""Runs before the handler with its request (or request iterator) and returns the one
to hand on; raising refuses the call."""
OnError = Callable[[Exception, "Context"], Awaitable[None]]
"""Turns an exception of the handler (or of ``before``) into a status; it must raise."""


def wrap_handler(
    handler: Handler,
    *,
    before: Before,
    on_error: OnError | None = None,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> Handler:
    """``handler`` with ``before`` run first and ``on_error`` around both.

    Args:
        before: checks the call, returns the request to pass on.
        on_error: maps an exception (grpc's own abort always passes untouched);
            without it exceptions propagate.
        request_deserializer: replaces the handler's.
    """
    deserializer = request_deserializer or handler.request_deserializer
    serializer = handler.response_serializer
    # grpc's stubs type handler behaviours as sync; under grpc.aio they are async.
    inner: Any
    if (inner := handler.unary_unary) is not None:
        unary = _unary_response(inner, before, on_error)
        return grpc.unary_unary_rpc_method_handler(unary, deserializer, serializer)
    if (inner := handler.stream_unary) is not None:
        unary = _unary_response(inner, before, on_error)
        return grpc.stream_unary_rpc_method_handler(unary, deserializer, serializer)
    if (inner := handler.unary_stream) is not None:
        stream = _stream_response(inner, before, on_error)
        return grpc.unary_stream_rpc_method_handler(stream, deserializer, serializer)
    stream = _stream_response(handler.stream_stream, before, on_error)
    return grpc.stream_stream_rpc_method_handler(stream, deserializer, serializer)


def _unary_response(
    inner: Any, before: Before, on_error: OnError | None
) -> Callable[[Any, Context], Awaitable[Any]]:
    async def unary(request: Any, context: Context) -> Any:
        try:
            return await inner(await before(request, context), context)
        except Exception as exc:
            if on_error is None or is_abort(exc):
                raise
            await on_error(exc, context)

    return unary


def _stream_response(
    inner: Any, before: Before, on_error: OnError | None
) -> Callable[[Any, Context], AsyncIterator[Any]]:
    async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
        try:
            responses = inner(await before(request, context), context)
            if inspect.isawaitable(responses):  # coroutine style: it writes itself
                await responses
                return
            async for response in responses:
                yield response
        except Exception as exc:
            if on_error is None or is_abort(exc):
                raise
            await on_error(exc, context)

    return stream


def is_abort(exc: BaseException) -> bool:
    """True for grpc's own ``AbortError``, which ``context.abort()`` raises."""
    return type(exc).__name__ == "AbortError"
