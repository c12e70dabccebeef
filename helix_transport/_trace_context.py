"""W3C trace context on gRPC metadata, through OpenTelemetry's global propagator.

Every outgoing call of an ``AgentClient`` carries the caller's current context
(``traceparent``/``tracestate``, or whatever ``OTEL_PROPAGATORS`` configures), so
an application that traces with OpenTelemetry has its spans linked to the sessions
it starts, with nothing to set up. Only the OpenTelemetry *API* is loaded here: it
costs a context lookup per call, and no SDK is imported.

``TRACE_HEADER: parent`` asks the server to make the caller's context the parent of
its spans (see ``docs/tracing.md``); without it, the session's trace stays its own,
keyed on the root session id, and the caller's span becomes a link.
"""

from __future__ import annotations

from typing import Final

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
