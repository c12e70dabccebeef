"""What one replica accepts: message and input sizes, running sessions, request rate.

``Limits`` is the configuration (``helix-mesh serve`` flags, ``HELIX_*`` variables;
it lives in ``helix_transport._config`` with the rest and is re-exported here);
``RateLimiter`` is a token bucket per principal; ``LimitsInterceptor`` charges every
``AgentService`` call to its caller's bucket. A refused call is ``RESOURCE_EXHAUSTED``
with a google.rpc ``RetryInfo`` saying when to try again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from helix_transport._config import Limits
from helix_transport._exceptions import ResourceExhausted
from helix_transport.server._handlers import wrap_handler
from helix_transport.server._identity import current_principal

__all__ = [
    "CAPACITY_RETRY_S",
    "SERVICE_PREFIX",
    "Limits",
    "LimitsInterceptor",
    "RateLimiter",
    "check_capacity",
]

SERVICE_PREFIX = "/helix.agent.v1.AgentService/"

CAPACITY_RETRY_S = 1.0
"""The retry hint when a replica runs its maximum of sessions (runs take seconds)."""


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

    def charge(self) -> None:
        """Bill one call to the current principal; ``ResourceExhausted`` when over."""
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
            self.charge()
            return request

        return wrap_handler(handler, before=before)
