"""The Prometheus endpoint: OpenTelemetry's metrics SDK read by its Prometheus exporter.

``start_metrics`` makes a ``MeterProvider`` whose only reader is a
``PrometheusMetricReader``, installs the library's instruments on it, and serves
``/metrics`` from ``prometheus_client``'s HTTP server (a daemon thread: a scrape
never waits for the event loop, nor the loop for a scrape). One per process: the
instruments are process-wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from helix_transport._exceptions import UsageError
from helix_transport._optional import requires
from helix_transport.metrics.instruments import SCOPE, install, metrics_enabled

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from opentelemetry.sdk.metrics import MeterProvider

__all__ = ["MetricsConfig", "MetricsEndpoint", "start_metrics"]


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """Where a service exposes its metrics for Prometheus."""

    host: str = "127.0.0.1"
    """Interface to bind; ``0.0.0.0`` in a container (``serve`` uses ``--host``)."""
    port: int | None = None
    """Serve ``/metrics`` on this port (0 picks one); ``None``: no metrics at all
    (``serve``: ``--metrics-port``, else ``HELIX_METRICS_PORT``)."""
    service_name: str = "helix-mesh"
    """The OpenTelemetry ``service.name`` (in ``target_info``); ``serve`` sets the agent's."""

    default: ClassVar[MetricsConfig]

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port <= 65535:
            raise UsageError(f"metrics port must be 0-65535, not {self.port}")


MetricsConfig.default = MetricsConfig()


class MetricsEndpoint:
    """A running ``/metrics`` endpoint; ``shutdown()`` stops it and the instruments."""

    def __init__(self, provider: MeterProvider, server: WSGIServer, host: str) -> None:
        self._provider = provider
        self._server = server
        self.host = host
        self.port: int = server.server_port
        """The port it listens on (the one picked, for port 0)."""

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        return f"http://{self.host}:{self.port}/metrics"

    def shutdown(self) -> None:
        """Stop serving and go back to the no-op instruments. Idempotent."""
        if metrics_enabled():
            install(None)
        self._server.shutdown()
        self._server.server_close()
        self._provider.shutdown()


def start_metrics(config: MetricsConfig) -> MetricsEndpoint:
    """Serve ``/metrics`` on ``config.port`` and record the library's instruments.

    Call it before creating servers: a server wires its RPCs, runs and store only
    when metrics are on as it is made (``metrics_enabled()``).

    Raises:
        UsageError: no port configured, metrics already started in this process, or
            the port cannot be bound.
    """
    if config.port is None:
        raise UsageError("start_metrics: no metrics port configured")
    if metrics_enabled():
        raise UsageError("metrics are already served by this process")
    # Imported here: a process without metrics never loads the SDK's metrics side.
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from opentelemetry.sdk.resources import Resource

    with requires("metrics", "the Prometheus endpoint (--metrics-port)"):
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.process_collector import ProcessCollector

    # A registry of our own: the library's metrics and the process's CPU, memory and
    # file descriptors, nothing another library registered globally.
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    # Scope labels (otel_scope_name...) would repeat one constant on every series.
    reader = PrometheusMetricReader(scope_info_enabled=False, registry=registry)
    resource = Resource.create({"service.name": config.service_name})
    # No exemplars: the text format we serve drops them, and sampling them costs every
    # record a look at the current span.
    provider = MeterProvider(
        metric_readers=[reader], resource=resource, exemplar_filter=AlwaysOffExemplarFilter()
    )
    try:
        server, _thread = start_http_server(config.port, addr=config.host, registry=registry)
    except OSError as exc:
        provider.shutdown()
        raise UsageError(
            f"cannot serve metrics on {config.host}:{config.port} ({exc.strerror or exc})"
        ) from exc
    install(provider.get_meter(SCOPE))
    return MetricsEndpoint(provider, server, config.host)
