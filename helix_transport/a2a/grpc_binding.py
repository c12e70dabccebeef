"""A2A's gRPC binding: a2a-sdk's ``GrpcHandler`` over the same ``HelixRequestHandler``,
on a gRPC server of its own (helix's own contract keeps ``--port``).

An interceptor refuses an unauthenticated call (``UNAUTHENTICATED``) before the
handler reads its request, as the HTTP bindings' middleware does; the context builder
then sets the caller for the handler from the same ``authorization`` metadata.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.grpc_handler import (
    DefaultGrpcServerCallContextBuilder,
    GrpcHandler,
)
from a2a.types import a2a_pb2_grpc

from helix_transport._exceptions import Unauthenticated, UsageError
from helix_transport.a2a.handler import BEARER, PRINCIPAL, HelixRequestHandler
from helix_transport.server.edge import SessionsEdge

if TYPE_CHECKING:  # generic only in the stubs
    _Handler = grpc.RpcMethodHandler[Any, Any]
    _Context = grpc.aio.ServicerContext[Any, Any]

_HIDDEN = frozenset({"authorization"})
"""Metadata kept out of the handler's state (the credential)."""


def _authorization(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class _ContextBuilder(DefaultGrpcServerCallContextBuilder):
    """The SDK's context, with the caller and the request's metadata as headers."""

    def __init__(self, edge: SessionsEdge) -> None:
        self.edge = edge

    def build(self, context: _Context) -> ServerCallContext:
        built = super().build(context)
        metadata = context.invocation_metadata() or ()
        authorization = _authorization(metadata)
        # Refused by the interceptor already when invalid; the handler refuses it again.
        with contextlib.suppress(Unauthenticated):
            built.state[PRINCIPAL] = self.edge.authenticate(authorization)
        if authorization:
            built.state[BEARER] = authorization.partition(" ")[2].strip()
        built.state["headers"] = {
            k: v for k, v in metadata if isinstance(v, str) and k not in _HIDDEN
        }
        return built


class _Authenticate(grpc.aio.ServerInterceptor):
    """Refuses a call without valid credentials before its handler runs."""

    def __init__(self, edge: SessionsEdge) -> None:
        self.edge = edge

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        try:
            self.edge.authenticate(_authorization(handler_call_details.invocation_metadata))
        except Unauthenticated as exc:
            return _refusal(handler, exc.message)
        return handler


def _refusal(handler: _Handler, message: str) -> _Handler:
    async def refuse(request: Any, context: _Context) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def refuse_stream(request: Any, context: _Context) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - abort raises

    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            refuse_stream, handler.request_deserializer, handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        refuse, handler.request_deserializer, handler.response_serializer
    )


def grpc_server(
    edge: SessionsEdge, handler: HelixRequestHandler, *, host: str, port: int
) -> tuple[grpc.aio.Server, int]:
    """A gRPC server of A2A's ``A2AService`` on ``host:port`` (0 picks one), and its port.

    Raises:
        UsageError: the port cannot be bound.
    """
    interceptors = [_Authenticate(edge)] if edge.authenticates else []
    server = grpc.aio.server(interceptors=interceptors)
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(  # type: ignore[no-untyped-call]
        GrpcHandler(handler, context_builder=_ContextBuilder(edge)), server
    )
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:
        raise UsageError(f"cannot listen on {target} (A2A gRPC port): {exc}") from exc
    return server, bound
