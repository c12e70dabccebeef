"""What one replica accepts: message and input sizes, running sessions, request rate.

``Limits`` is the configuration (``helix-mesh serve`` flags, ``HELIX_*`` variables);
``RateLimiter`` is a token bucket per principal; ``LimitsInterceptor`` charges every
``AgentService`` call to its caller's bucket. A refused call is ``RESOURCE_EXHAUSTED``
with a google.rpc ``RetryInfo`` saying when to try again.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import grpc

from helix_transport._exceptions import ResourceExhausted, UsageError
from helix_transport.server._handlers import wrap_handler
from helix_transport.server._identity import current_principal

SERVICE_PREFIX = "/helix.agent.v1.AgentService/"

CAPACITY_RETRY_S = 1.0
"""The retry hint when a replica runs its maximum of sessions (runs take seconds)."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Per-replica limits. Zero turns a count or rate limit off."""

    max_message_bytes: int = 4 << 20
    """Largest gRPC message received or sent (grpc answers RESOURCE_EXHAUSTED above it)."""
    max_input_bytes: int = 1 << 20
    """Largest ``StartRequest.input_json``, in UTF-8 bytes (INVALID_ARGUMENT above it)."""
    max_json_depth: int = 64
    """Deepest nesting of arrays and objects in ``input_json``, checked before parsing."""
    max_running_sessions: int = 1000
    """Sessions this replica runs at once; a ``Start`` that would create one more is
    RESOURCE_EXHAUSTED (resumed and taken-over sessions always run)."""
    max_delegation_depth: int = 8
    """Levels a delegation tree may have, its root included: a ``Start`` whose
    ``delegation_path`` already holds this many agent types (its session would be one
    level more) is FAILED_PRECONDITION, so even a recursive agent's tree ends. 0: no
    limit but the recursion rule (``Agent.recursive``). A flag only (``serve
    --max-delegation-depth``), no environment variable."""
    rate_per_s: float = 500.0
    """Sustained ``AgentService`` calls per second per principal (a ``Stream`` counts once)."""
    rate_burst: int = 1000
    """Calls a principal may make at once before the rate applies."""
    min_ping_interval_s: float = 10.0
    """How often a client may send HTTP/2 keepalive pings, calls in flight or not. helix
    clients ping every 20 s (``ClientConfig.keepalive_time``); gRPC's own server
    default (one ping per 5 min, none without calls) answers them with GOAWAY
    ``too_many_pings`` and drops the connection."""

    default: ClassVar[Limits]

    ENV: ClassVar[Mapping[str, str]] = {
        "max_message_bytes": "HELIX_MAX_MESSAGE_BYTES",
        "max_input_bytes": "HELIX_MAX_INPUT_BYTES",
        "max_json_depth": "HELIX_MAX_JSON_DEPTH",
        "max_running_sessions": "HELIX_MAX_RUNNING_SESSIONS",
        "rate_per_s": "HELIX_RATE_LIMIT",
        "rate_burst": "HELIX_RATE_BURST",
    }
    """The environment variable of each field."""

    def __post_init__(self) -> None:
        if self.max_message_bytes < 64 << 10:
            raise UsageError("max_message_bytes must be at least 64 KiB")
        if not 0 < self.max_input_bytes < self.max_message_bytes:
            raise UsageError("max_input_bytes must be positive and below max_message_bytes")
        if self.max_json_depth < 1 or self.max_running_sessions < 0:
            raise UsageError("max_json_depth must be >= 1 and max_running_sessions >= 0")
        if self.max_delegation_depth < 0:
            raise UsageError("max_delegation_depth must be >= 0")
        if self.rate_per_s < 0 or (self.rate_per_s > 0 and self.rate_burst < 1):
            raise UsageError("rate_per_s must be >= 0, and rate_burst >= 1 when it is set")
        if self.min_ping_interval_s <= 0:
            raise UsageError("min_ping_interval_s must be positive")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Limits:
        """Defaults, then ``HELIX_*`` variables, then ``overrides`` (e.g. CLI flags; None is unset)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in fields(cls):
            env = cls.ENV.get(field.name, "")  # some limits are flags only
            kind = float if field.name == "rate_per_s" else int
            raw = environ.get(env, "") if env else ""
            if raw:
                try:
                    values[field.name] = kind(raw)
                except ValueError:
                    raise UsageError(f"{env}={raw!r} is not a number") from None
            if overrides.get(field.name) is not None:
                values[field.name] = overrides[field.name]
        return cls(**values)

    def grpc_options(self) -> list[tuple[str, int]]:
        """Server options enforcing the message size and the clients' ping policy."""
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", int(self.min_ping_interval_s * 1000)),
        ]


Limits.default = Limits()


class RateLimiter:
    """A token bucket per principal key: ``burst`` at once, then ``rate_per_s``.

    Holds at most ``max_keys`` buckets; the least recently used goes first, which only
    forgets a bucket that has had time to refill for most callers.
    """

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> tokens, at

    def acquire(self, key: str) -> float | None:
        """Take one token; None when granted, else seconds until one is available."""
        if self.rate_per_s <= 0:
            return None
        now = self._clock()
        tokens, at = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
        granted = tokens >= 1.0
        if granted:
            tokens -= 1.0
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return None if granted else (1.0 - tokens) / self.rate_per_s


def check_capacity(running: int, limits: Limits) -> None:
    """Refuse one more session when the replica already runs its maximum."""
    if limits.max_running_sessions and running >= limits.max_running_sessions:
        raise ResourceExhausted(
            "running_sessions",
            f"this replica already runs its maximum of {limits.max_running_sessions} sessions",
            retry_after_s=CAPACITY_RETRY_S,
        )


class LimitsInterceptor(grpc.aio.ServerInterceptor):
    """Charges each ``AgentService`` call to its principal's rate limit.

    Install it after the error-mapping interceptor (so its refusal is mapped to a
    status with details) and after authentication (so the principal is known).
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.limiter = RateLimiter(limits.rate_per_s, limits.rate_burst)

    def _charge(self) -> None:
        wait = self.limiter.acquire(current_principal().key)
        if wait is not None:
            raise ResourceExhausted(
                "rate_limit",
                f"rate limit of {self.limits.rate_per_s:g} calls/s for "
                f"{current_principal().name!r} exceeded",
                retry_after_s=wait,
            )

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or self.limits.rate_per_s <= 0
            or not handler_call_details.method.startswith(SERVICE_PREFIX)
        ):
            return handler

        async def before(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self._charge()
            return request

        return wrap_handler(handler, before=before)
