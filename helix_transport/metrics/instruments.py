"""Every instrument the library records, declared once, with its bounded labels.

Names follow OpenTelemetry's semantic conventions where one exists
(``rpc.server.call.duration``, ``gen_ai.client.*``) and are ``helix.*`` otherwise.
No label ever holds a session id, a principal or anything else a caller chooses:
each label's values come from a small set the deployment fixes (method names,
statuses, model names, tool names, store backends and operations).

Until ``install`` is called (``start_metrics`` does) the instruments come from the
OpenTelemetry API's no-op meter: recording is an empty method call, so a process
without ``--metrics-port`` pays next to nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Protocol

from opentelemetry.metrics import (
    CallbackOptions,
    Histogram,
    Meter,
    NoOpMeterProvider,
    Observation,
)

__all__ = [
    "DURATION_BUCKETS_S",
    "STORE_BUCKETS_S",
    "TOKEN_BUCKETS",
    "Instruments",
    "RunCounter",
    "Tally",
    "install",
    "instruments",
    "metrics_enabled",
    "watch_running",
]

SCOPE = "helix_transport"

DURATION_BUCKETS_S: Sequence[float] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640,
)  # fmt: skip
"""Seconds: an RPC, step, model, tool or child call (milliseconds to minutes)."""
STORE_BUCKETS_S: Sequence[float] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
)  # fmt: skip
"""Seconds: one store call (an embedded SQLite write is ~100 µs, a remote one ms)."""
TOKEN_BUCKETS: Sequence[float] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
)  # fmt: skip
"""Tokens per model call: the semantic conventions' advised boundaries."""


class RunCounter(Protocol):
    """Anything that knows how many sessions it runs now (``SessionRunner``)."""

    @property
    def running(self) -> int: ...


_running_sources: list[weakref.ref[RunCounter]] = []
"""Runners of this process, read at each scrape (kept weakly: a server dropped is gone).
A list copied whole (atomic under the GIL): the scrape runs on the endpoint's thread."""


def watch_running(source: RunCounter) -> None:
    """Count ``source``'s runs in ``helix.sessions.running`` (at each scrape).

    Read, not incremented: the gauge is the runner's own count (the one capacity is
    checked against), so it cannot drift however a run ends.
    """
    _running_sources[:] = [ref for ref in _running_sources if ref() is not None]
    _running_sources.append(weakref.ref(source))


def _observe_running(options: CallbackOptions) -> Iterable[Observation]:
    sources = (ref() for ref in tuple(_running_sources))
    yield Observation(sum(source.running for source in sources if source is not None))


class Tally:
    """A counter kept as a plain int and read at each scrape (an observable counter).

    For the hot path: ``add`` is one integer addition (~0.1 µs) where the SDK's
    ``Counter.add`` measured 10-20 µs a call on the loaded bench machine, once per
    store write of the log.
    """

    def __init__(self) -> None:
        self.total = 0

    def add(self, amount: int) -> None:
        """Count ``amount`` more."""
        self.total += amount

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.total)


class Instruments:
    """The library's instruments, made from one ``Meter``."""

    def __init__(self, meter: Meter) -> None:
        self.rpc_duration = meter.create_histogram(
            "rpc.server.call.duration",
            unit="s",
            description="Duration of incoming RPCs (a Stream: until its last event).",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        """Labels: ``rpc.system``, ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``."""
        self.refusals = meter.create_counter(
            "helix.refusals",
            unit="{call}",
            description="Calls refused before any work, by reason.",
        )
        """Labels: ``helix.refusal.reason`` (auth, rate_limit, capacity, bad_input,
        resource), ``rpc.method``."""
        self.stream_readers = meter.create_up_down_counter(
            "helix.stream.readers",
            unit="{stream}",
            description="Stream calls being served now.",
        )
        self.sessions_started = meter.create_counter(
            "helix.sessions.started",
            unit="{session}",
            description="Sessions created by Start on this replica.",
        )
        """Labels: ``helix.agent_type``."""
        self.sessions_ended = meter.create_counter(
            "helix.sessions.ended",
            unit="{session}",
            description="Runs that ended their session, by final status.",
        )
        """Labels: ``helix.agent_type``, ``helix.session.status`` (completed, failed,
        interrupted)."""
        self.sessions_resumed = meter.create_counter(
            "helix.sessions.resumed",
            unit="{session}",
            description="Sessions picked up from their checkpoint (after a crash, or woken).",
        )
        """Labels: ``helix.agent_type``, ``helix.resume.reason`` (restart: this
        replica's own; takeover: another replica's, whose lease lapsed; input,
        interrupt, deadline: a suspended session woken, see ``sessions_suspended``)."""
        self.sessions_suspended = meter.create_counter(
            "helix.sessions.suspended",
            unit="{session}",
            description="Runs that suspended their session to wait for input from people.",
        )
        """Labels: ``helix.agent_type``."""
        self.sessions_running = meter.create_observable_up_down_counter(
            "helix.sessions.running",
            callbacks=[_observe_running],
            unit="{session}",
            description="Sessions running on this replica now (the autoscaling signal).",
        )
        self.events_appended = Tally()
        meter.create_observable_counter(
            "helix.events.appended",
            callbacks=[self.events_appended.observe],
            unit="{event}",
            description="Events appended to session logs by this replica's writers.",
        )
        self._durations(meter)

    def _durations(self, meter: Meter) -> None:
        """The work's own instruments: steps, tool, child and model calls, tokens, store."""
        self.step_duration = _histogram(meter, "helix.step.duration", "One step of a run.")
        """Labels: ``helix.agent_type``."""
        self.tool_duration = _histogram(meter, "helix.tool.duration", "One tool call.")
        """Labels: ``gen_ai.tool.name``, ``error.type`` (``tool_error`` when the result
        the model sees is an error)."""
        self.child_duration = _histogram(
            meter, "helix.child.duration", "A delegation to a remote child, start to end."
        )
        """Labels: ``helix.child.agent_type``, ``helix.session.status`` (the child's)."""
        self.model_duration = _histogram(
            meter, "gen_ai.client.operation.duration", "One model call, streamed to its end."
        )
        """Labels: ``gen_ai.operation.name``, ``gen_ai.request.model``,
        ``gen_ai.provider.name``, ``error.type`` (a failed call)."""
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens per model call, input and output.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        """Labels: as ``model_duration``, plus ``gen_ai.token.type`` (input, output)."""
        self.store_duration = meter.create_histogram(
            "helix.store.operation.duration",
            unit="s",
            description="One call to the session store.",
            explicit_bucket_boundaries_advisory=STORE_BUCKETS_S,
        )
        """Labels: ``helix.store.backend``, ``helix.store.operation`` (the ``Store``
        method), ``error.type`` (the exception's class, on failure)."""


def _histogram(meter: Meter, name: str, description: str) -> Histogram:
    """A duration in seconds, on the shared boundaries."""
    return meter.create_histogram(
        name,
        unit="s",
        description=description,
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
    )


_current = Instruments(NoOpMeterProvider().get_meter(SCOPE))
_enabled = False


def instruments() -> Instruments:
    """The instruments to record on: no-ops until ``install``."""
    return _current


def metrics_enabled() -> bool:
    """True once ``install`` has run: servers then wire their RPCs, runs and store."""
    return _enabled


def install(meter: Meter | None) -> Instruments:
    """Record on ``meter`` from now on (what was recorded before is not carried over);
    ``None`` goes back to the no-op instruments."""
    global _current, _enabled
    _enabled = meter is not None
    _current = Instruments(meter or NoOpMeterProvider().get_meter(SCOPE))
    return _current
