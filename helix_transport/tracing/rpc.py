"""SERVER spans for the RPCs a service answers, CLIENT spans for the calls it makes.

Both are grpc.aio interceptors a service's tracing installs (``OtelTracing``); the
W3C context travels in gRPC metadata through OpenTelemetry's global propagator.

A SERVER span's place depends on what the caller asked (``helix-trace`` metadata):

- ``parent``: it nests under the caller's span. Services of the mesh ask it for
  every call to a child (their CLIENT span is already in the session's trace); an
  application asks it (``AgentClient.connect(..., join_trace=True)``) to have the
  sessions it starts join its own trace: the root ``Start`` then records the
  caller's context in the session's metadata (``traceparent``, ``tracestate`` and
  ``helix.trace: parent``), so every run of the session, resumed ones included,
  nests under it.
- anything else: the span is in the trace of the session the request names (its
  id derived from the session key, as the runs') and *links* to the caller's span;
  the root run started by that ``Start`` links to it too.

A call a service makes outside of any span gets a CLIENT span only when it names
the session it is made for (``_trace_context.on_behalf_of``: the outbox's interrupts
to a session's children): the span goes in that session's trace, where its runs'
spans go (``session_trace``). Any other gets none; its SERVER span is then the
session's, unlinked.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from helix_transport._metadata import ROOT_SESSION_KEY, TRACE_MODE_KEY
from helix_transport._trace_context import PARENT, TRACE_HEADER, TracedSession, on_behalf
from helix_transport.tracing.ids import forced_ids, trace_id_for

logger = logging.getLogger("helix.tracing")

SERVICE = "helix.agent.v1.AgentService"

_CALLER: contextvars.ContextVar[SpanContext | None] = contextvars.ContextVar(
    "helix_rpc_caller", default=None
)


def caller_span_context() -> SpanContext | None:
    """The span of the caller of the ``Start`` being handled, when it sent one (a run
    started by that ``Start`` inherits it, and links to it)."""
    return _CALLER.get()


SessionKey = Callable[[str], str]
"""Maps a request's session id to the session's key (the caller's namespace)."""

_W3C = TraceContextTextMapPropagator()
"""The form a session's metadata records its trace context in."""


@dataclass(frozen=True)
class SessionTrace:
    """Where a session's spans go."""

    root_session_id: str
    """The tree's root: the trace's id is derived from it when there is no ``parent``."""
    parent: Context | None
    """The remote parent of its runs (a child's delegation span, a joined root's
    caller), or ``None``: they are roots of the trace keyed on ``root_session_id``."""
    joined: bool
    """A root session in its caller's trace (``helix-trace: parent`` at its Start)."""


def session_trace(session: TracedSession) -> SessionTrace:
    """Where ``session``'s spans go, from its stored record."""
    # A root session is its own root, whatever its metadata says: the trace of a
    # session id is derived from it, so a caller naming another's root id (or its
    # trace, in a `traceparent`) would have put its run in that trace.
    child = bool(session.parent_session_id)
    inherited = session.metadata if child else {}
    root = inherited.get(ROOT_SESSION_KEY) or session.session_id
    # A root session joins its caller's trace only when the caller asked, at Start
    # (``helix-trace: parent``): the context recorded then.
    joined = not child and session.metadata.get(TRACE_MODE_KEY) == PARENT
    remote = _W3C.extract(carrier=dict(session.metadata if joined else inherited))
    if trace.get_current_span(remote).get_span_context().is_valid:
        return SessionTrace(root, remote, joined)
    return SessionTrace(root, None, False)  # a root run: its trace id is forced


class ServerSpans(grpc.aio.ServerInterceptor):
    """A SERVER span around every ``AgentService`` call."""

    def __init__(self, tracer: trace.Tracer, *, session_key: SessionKey) -> None:
        self.tracer = tracer
        self.session_key = session_key

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(f"/{SERVICE}/"):
            return handler  # health, reflection: not traced
        headers = {
            k: v for k, v in handler_call_details.invocation_metadata or () if isinstance(v, str)
        }
        incoming = propagate.extract(headers)
        caller = trace.get_current_span(incoming).get_span_context()
        call = _Call(self, method.rsplit("/", 1)[1], incoming, caller, headers)
        inner: Any
        if (inner := handler.unary_unary) is not None:
            return grpc.unary_unary_rpc_method_handler(
                call.unary(inner), handler.request_deserializer, handler.response_serializer
            )
        if (inner := handler.unary_stream) is not None:
            return grpc.unary_stream_rpc_method_handler(
                call.stream(inner), handler.request_deserializer, handler.response_serializer
            )
        return handler


class _Call:
    """One intercepted call: where its span goes, and the span around the handler."""

    def __init__(
        self,
        spans: ServerSpans,
        name: str,
        incoming: Context,
        caller: SpanContext,
        headers: dict[str, str],
    ) -> None:
        self.spans = spans
        self.name = name
        self.incoming = incoming
        self.caller = caller if caller.is_valid else None
        self.parented = self.caller is not None and headers.get(TRACE_HEADER) == PARENT

    def _start(self, request: Any) -> Span:
        try:
            return self._span(request)
        except Exception:  # tracing must never fail a call
            logger.warning("no SERVER span for %s", self.name, exc_info=True)
            return trace.INVALID_SPAN

    def _span(self, request: Any) -> Span:
        # The request may stand in for one that did not parse (see ErrorMappingInterceptor).
        session_id = str(getattr(request, "session_id", "") or "")
        parent_session_id = str(getattr(request, "parent_session_id", "") or "")
        attributes: dict[str, str] = {
            "rpc.system": "grpc",
            "rpc.service": SERVICE,
            "rpc.method": self.name,
        }
        if session_id:
            attributes["helix.session_id"] = session_id
        name = f"{SERVICE}/{self.name}"
        if self.parented:
            if self.name == "Start" and not parent_session_id and hasattr(request, "metadata"):
                _record_parent(request, self.incoming)
            return self.spans.tracer.start_span(
                name, context=self.incoming, kind=SpanKind.SERVER, attributes=attributes
            )
        trace_id = self._session_trace(request, session_id, parent_session_id)
        links = [Link(self.caller)] if self.caller is not None else []
        with forced_ids(trace_id=trace_id):
            return self.spans.tracer.start_span(
                name, context=Context(), kind=SpanKind.SERVER, attributes=attributes, links=links
            )

    def _session_trace(self, request: Any, session_id: str, parent_session_id: str) -> int | None:
        if not session_id:
            return None  # Describe, or a Start that lets the server name it
        if self.name == "Start" and parent_session_id:
            root = request.metadata.get(ROOT_SESSION_KEY)
            if root:  # a child started without asking for its parent's context
                return trace_id_for(root)
        return trace_id_for(self.spans.session_key(session_id))

    def unary(self, inner: Any) -> Callable[[Any, Any], Awaitable[Any]]:
        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            span = self._start(request)
            # The context is current for the handler: a run the call starts inherits it.
            token = otel_context.attach(trace.set_span_in_context(span))
            caller = _CALLER.set(self.caller)
            code = grpc.StatusCode.OK  # unless it raises: grpc sets OK after the return
            try:
                return await inner(request, context)
            except BaseException as exc:
                code = _outcome(exc, context)
                raise
            finally:
                _CALLER.reset(caller)
                otel_context.detach(token)
                _end(span, code)

        return unary

    def stream(self, inner: Any) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            # Not made current: a generator's context is not its own across yields,
            # and a stream starts no call of its own.
            span = self._start(request)
            code = grpc.StatusCode.OK
            try:
                async for response in inner(request, context):
                    yield response
            except BaseException as exc:
                code = _outcome(exc, context)
                raise
            finally:
                _end(span, code)

        return stream


def _record_parent(request: Any, incoming: Context) -> None:
    """A root ``Start`` that asked for the caller's context as its parent: recorded
    with the session, for every run of it (see the module docstring)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=incoming)
    for key, value in carrier.items():
        request.metadata[key] = value
    request.metadata[TRACE_MODE_KEY] = PARENT


def _status_code(context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode | None:
    try:
        code = context.code()
    except Exception:  # pragma: no cover - grpc versions without code()
        return None
    if isinstance(code, grpc.StatusCode) or code is None:
        return code
    return next((c for c in grpc.StatusCode if c.value[0] == code), None)


def _outcome(exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode:
    """The status a handler that raised ``exc`` leaves with."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED  # the caller left
    return _status_code(context) or grpc.StatusCode.UNKNOWN


def _end(span: Span, code: grpc.StatusCode) -> None:
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    # OTel's rule for SERVER spans: only the server's faults are errors.
    if code in _SERVER_FAULTS:
        span.set_status(Status(StatusCode.ERROR, code.name))
    span.end()


_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def client_spans(tracer: trace.Tracer) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors of a service's channels: a CLIENT span around every call it
    makes within a trace (one object per call kind: grpc.aio files each interceptor
    under the first kind it is an instance of)."""
    return [_UnaryClientSpans(tracer), _StreamClientSpans(tracer)]


class _ClientSpans:
    """A CLIENT span, written into the call's ``traceparent`` with ``helix-trace:
    parent``: the child's SERVER span nests under it."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    async def _begin(
        self, details: grpc.aio.ClientCallDetails
    ) -> tuple[Span | None, grpc.aio.ClientCallDetails]:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        service, _, name = method.strip("/").rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        current = otel_context.get_current()
        trace_id: int | None = None
        if not trace.get_current_span(current).get_span_context().is_valid:
            load = on_behalf()
            session = await load() if load is not None else None
            if session is None:
                return None, details  # a session gone has no trace to join
            where = session_trace(session)
            current = where.parent or Context()
            trace_id = None if where.parent else trace_id_for(where.root_session_id)
            attributes["helix.session_id"] = session.session_id
        with forced_ids(trace_id=trace_id):
            span = self.tracer.start_span(
                f"{service}/{name}", context=current, kind=SpanKind.CLIENT, attributes=attributes
            )
        carrier: dict[str, str] = {TRACE_HEADER: PARENT}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        kept = [(k, v) for k, v in details.metadata or () if k not in carrier]
        metadata = grpc.aio.Metadata(*kept, *carrier.items())
        return span, grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def _intercept(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        try:
            span, details = await self._begin(client_call_details)
        except Exception:  # tracing must never fail a call
            logger.warning("no CLIENT span for %s", client_call_details.method, exc_info=True)
            span, details = None, client_call_details
        call = await continuation(details, request)
        if span is not None:
            call.add_done_callback(lambda done: _end_client(span, done))
        return call


class _UnaryClientSpans(_ClientSpans, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self._intercept(continuation, client_call_details, request)


class _StreamClientSpans(_ClientSpans, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self._intercept(continuation, client_call_details, request)


def _end_client(span: Span, call: Any) -> None:
    """Ends ``span`` with the call's status (done already: its code is at hand)."""

    async def end() -> None:
        try:
            code = await call.code()
        except BaseException:  # cancelled before it had one
            code = grpc.StatusCode.CANCELLED
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code is not grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, code.name))
        span.end()

    task = asyncio.ensure_future(end())
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


_PENDING: set[asyncio.Future[None]] = set()
"""Span ends under way (kept referenced until done)."""
