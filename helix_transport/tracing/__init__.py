"""Tracing: OpenTelemetry/Langfuse spans on the run loop's lifecycle hooks.

The hooks themselves are ``helix_transport.agent.hooks`` (re-exported here).

``setup_tracing`` loads the OpenTelemetry SDK (``helix_transport.tracing.otel``)
only when ``LANGFUSE_PUBLIC_KEY``/``LANGFUSE_SECRET_KEY`` or an
``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` is set: without them tracing is off and
a run calls nothing but the no-op hooks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from helix_transport.agent.definition import HooksFactory
from helix_transport.agent.hooks import NO_HOOKS, FanOut, NoHooks, RunHooks

if TYPE_CHECKING:
    import grpc

    from helix_transport.agent.definition import Agent
    from helix_transport.store import SessionRecord

__all__ = [
    "NO_HOOKS",
    "FanOut",
    "HooksFactory",
    "NoHooks",
    "RunHooks",
    "TracingHandle",
    "setup_tracing",
    "tracing_configured",
]


class TracingHandle(Protocol):
    """A service's tracing, as the server uses it."""

    def hooks_for(self, agent: Agent, record: SessionRecord) -> RunHooks:
        """The hooks of one run (a ``HooksFactory``)."""
        ...

    def server_interceptor(self, session_key: Callable[[str], str]) -> grpc.aio.ServerInterceptor:
        """SERVER spans around the service's RPCs (``session_key``: a request's session
        id to the session's key)."""
        ...

    def client_interceptors(self) -> Sequence[grpc.aio.ClientInterceptor]:
        """CLIENT spans around the calls the service makes to its children."""
        ...

    def shutdown(self) -> None:
        """Flush every pending span and stop the exporters; never raises."""
        ...


def tracing_configured() -> bool:
    """True when the environment asks for Langfuse or OTLP traces."""
    env = os.environ
    return bool(
        (env.get("LANGFUSE_PUBLIC_KEY") and env.get("LANGFUSE_SECRET_KEY"))
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def setup_tracing(service_name: str) -> TracingHandle | None:
    """Tracing for the service ``service_name`` (its OTel ``service.name``), or ``None``
    when it is not configured (then nothing is loaded and nothing runs)."""
    if not tracing_configured():
        return None
    try:
        from helix_transport.tracing.otel import setup_otel

        return setup_otel(service_name)
    except Exception:  # a tracing misconfiguration must not keep the service down
        logging.getLogger("helix.tracing").warning("tracing is off", exc_info=True)
        return None
