"""Client configuration: frozen, keyword-only, with shared defaults."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import ClassVar

from helix_transport._exceptions import UsageError


@dataclass(frozen=True, kw_only=True)
class RetryConfig:
    """Exponential backoff with full jitter, bounded by a total deadline."""

    initial_backoff: timedelta = timedelta(milliseconds=50)
    """Delay before the first retry."""
    max_backoff: timedelta = timedelta(seconds=1)
    """Largest delay between two attempts. A stream whose server went away does not
    wait it out: it retries once grpc has connected to the server again."""
    multiplier: float = 2.0
    """Growth of the delay per failed attempt."""
    deadline: timedelta | None = timedelta(seconds=30)
    """Give up once this long has passed since the first failure; ``None``: never give
    up (only the caller's cancellation or timeout, or a definitive answer, ends it).
    Delegation waits on its children this way (``until_cancelled``): an unreachable
    child is not a failed child."""

    default: ClassVar[RetryConfig]

    def __post_init__(self) -> None:
        if self.initial_backoff <= timedelta(0) or self.max_backoff < self.initial_backoff:
            raise UsageError("RetryConfig: need 0 < initial_backoff <= max_backoff")
        if self.multiplier < 1 or (self.deadline is not None and self.deadline < timedelta(0)):
            raise UsageError("RetryConfig: need multiplier >= 1 and deadline >= 0")

    def until_cancelled(self) -> RetryConfig:
        """The same backoff without a deadline."""
        return replace(self, deadline=None)

    def expired(self, first_failure: float, now: float) -> bool:
        """True once the deadline has passed since ``first_failure`` (monotonic seconds)."""
        return self.deadline is not None and now - first_failure >= self.deadline.total_seconds()

    def backoff_s(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based), jittered."""
        cap = min(
            self.max_backoff.total_seconds(),
            self.initial_backoff.total_seconds() * self.multiplier**attempt,
        )
        # Full jitter: spreads reconnecting clients so a restarted server isn't stampeded.
        return random.uniform(cap / 2, cap)


RetryConfig.default = RetryConfig()


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """How a client talks to one agent service."""

    rpc_timeout: timedelta = timedelta(seconds=10)
    """Deadline of each unary call (Start, GetStatus, Interrupt, Describe)."""
    reconnect: RetryConfig = RetryConfig.default
    """Backoff and deadline for resuming a broken stream (and retrying unary calls)."""
    keepalive_time: timedelta = timedelta(seconds=20)
    """HTTP/2 ping interval on an idle connection, to notice dead peers."""
    keepalive_timeout: timedelta = timedelta(seconds=10)
    """How long a ping may go unanswered before the connection is dropped."""
    max_message_bytes: int = 4 << 20
    """Largest gRPC message sent or received."""

    default: ClassVar[ClientConfig]

    def service_config(self) -> str:
        """The gRPC service config: round-robin balancing, and a retry policy for the
        unary RPCs (all idempotent: the client always names the session it starts)."""
        retry = self.reconnect
        return json.dumps(
            {
                "loadBalancingConfig": [{"round_robin": {}}],
                "methodConfig": [
                    {
                        "name": [
                            {"service": "helix.agent.v1.AgentService", "method": method}
                            for method in ("Start", "GetStatus", "Interrupt", "Describe")
                        ],
                        "retryPolicy": {
                            "maxAttempts": 4,
                            "initialBackoff": f"{retry.initial_backoff.total_seconds():g}s",
                            "maxBackoff": f"{retry.max_backoff.total_seconds():g}s",
                            "backoffMultiplier": retry.multiplier,
                            "retryableStatusCodes": ["UNAVAILABLE"],
                        },
                    }
                ],
            }
        )

    def channel_options(self) -> list[tuple[str, int | str]]:
        """grpc channel options for this config."""
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive_time.total_seconds() * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout.total_seconds() * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            # Round-robin over every resolved address, and retries for unary calls.
            ("grpc.service_config", self.service_config()),
            ("grpc.enable_retries", 1),
            # Re-resolve dns:/// names soon after pods change (the default waits 30 s).
            ("grpc.dns_min_time_between_resolutions_ms", 5000),
            # Reconnect quickly after a server restart instead of grpc's 1s+ default.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]


ClientConfig.default = ClientConfig()
