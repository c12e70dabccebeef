"""Metrics: OpenTelemetry instruments, exposed for Prometheus on a port of their own.

``start_metrics(MetricsConfig(port=...))`` (``helix-mesh serve --metrics-port``)
serves ``/metrics`` and makes the instruments (``instruments``) record; servers made
afterwards time their RPCs (outermost interceptor), their runs (``metered_hooks``,
beside tracing's hooks) and their store (``metered_store``, one wrapper whatever the
backend), and report their running sessions (``watch_running``). Without it every
instrument is the OpenTelemetry API's no-op and nothing is wrapped.

The list of metrics, their labels and queries to read them: docs/operating.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from helix_transport.metrics.endpoint import (
    MetricsConfig,
    MetricsEndpoint,
    start_metrics,
)
from helix_transport.metrics.instruments import (
    Instruments,
    instruments,
    metrics_enabled,
    watch_running,
)

if TYPE_CHECKING:
    from helix_transport.metrics.hooks import MetricsHooks, metered_hooks
    from helix_transport.metrics.store import MeteredStore, metered_store

__all__ = [
    "Instruments",
    "MeteredStore",
    "MetricsConfig",
    "MetricsEndpoint",
    "MetricsHooks",
    "instruments",
    "metered_hooks",
    "metered_store",
    "metrics_enabled",
    "start_metrics",
    "watch_running",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the modules that record (the log's writer, the runner)
    # import ``instruments`` through this package, and these import the agent and
    # the store, which import them.
    if name in ("MetricsHooks", "metered_hooks"):
        from helix_transport.metrics import hooks

        return getattr(hooks, name)
    if name in ("MeteredStore", "metered_store"):
        from helix_transport.metrics import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
