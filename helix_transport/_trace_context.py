"""W3C trace context on gRPC metadata, through OpenTelemetry's global propagator.

Every outgoing call of an ``AgentClient`` carries the caller's current context
(``traceparent``/``tracestate``, or whatever ``OTEL_PROPAGATORS`` configures), so
an application that traces with OpenTelemetry has its spans linked to the sessions
it starts, with nothing to set up. Only the OpenTelemetry *API* is loaded here: it
costs a context lookup per call, and no SDK is imported.

``TRACE_HEADER: parent`` asks the server to make the caller's context the parent of
its spans (see ``docs/tracing.md``); without it, the session's trace stays its own,
keyed on the root session id, and the caller's span becomes a link.

A call a service makes for one of its sessions outside any span (the outbox's
interrupts) names that session (``on_behalf_of``): its CLIENT span goes in the
session's trace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final, Protocol

from opentelemetry import propagate

TRACE_HEADER: Final = "helix-trace"
"""gRPC metadata key: ``parent`` nests the server's spans under the caller's context;
anything else (or nothing) links them to it."""

PARENT: Final = "parent"
"""``TRACE_HEADER``'s value that asks for the caller's context as the parent."""


def outgoing(*, parent: bool = False) -> list[tuple[str, str]]:
    """The current context as gRPC metadata entries (none outside of any span)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    entries = list(carrier.items())
    if entries and parent:
        entries.append((TRACE_HEADER, PARENT))
    return entries


class TracedSession(Protocol):
    """What a session's trace follows from (a ``SessionRecord`` is one)."""

    @property
    def session_id(self) -> str: ...

    @property
    def parent_session_id(self) -> str: ...

    @property
    def metadata(self) -> Mapping[str, str]: ...


SessionLoader = Callable[[], Awaitable[TracedSession | None]]
"""Reads a session from its store (``None``: gone)."""

_ON_BEHALF: ContextVar[SessionLoader | None] = ContextVar("helix_on_behalf", default=None)


@contextmanager
def on_behalf_of(load: SessionLoader) -> Iterator[None]:
    """Calls made within are made for the session ``load`` reads, outside any of its
    runs (the outbox's interrupts): a traced service's CLIENT span puts them in that
    session's trace. ``load`` is awaited only then, so an untraced service reads nothing."""
    token = _ON_BEHALF.set(load)
    try:
        yield
    finally:
        _ON_BEHALF.reset(token)


def on_behalf() -> SessionLoader | None:
    """The session the calls of the current context are made for (``on_behalf_of``)."""
    return _ON_BEHALF.get()
