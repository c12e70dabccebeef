"""Client and server configuration: frozen, keyword-only, with shared defaults.

``ServerConfig``'s durations stay float seconds (``lease_ttl_s``...): they are its
public fields, used by the CLI and callers; ``timedelta`` would change that API."""

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
                            for method in (
                                "Start",
                                "GetStatus",
                                "Interrupt",
                                "Describe",
                                "ListSessions",
                                "SubmitInput",
                            )
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

    def grpc_options(self) -> list[tuple[str, int]]:
        """Server options enforcing the message size and the clients' ping policy."""
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", int(self.min_ping_interval_s * 1000)),
        ]


Limits.default = Limits()


@dataclass(frozen=True, kw_only=True)
class ConnectionAge:
    """How long a client connection may live, so clients spread over replicas added later.

    gRPC keeps one HTTP/2 connection per resolved address for as long as it works: a
    parent's channel never learns of a pod an autoscaler adds. Past ``max_age_s``
    (jittered by grpc, +-10%) the server sends GOAWAY; the client re-resolves its
    ``dns:///`` name and opens new connections for new calls, while calls in flight
    keep the old one for up to ``grace_s`` more. A stream still open then is cut and
    resumes from its ``last_sequence`` (``EventStream``), over a new connection.
    """

    max_age_s: float = 300.0
    """Seconds a connection may serve new calls; 0: forever (grpc's default)."""
    grace_s: float = 600.0
    """Seconds calls in flight may go on after GOAWAY before the connection is closed
    (long streams: a session streamed for longer resumes on a new connection)."""

    default: ClassVar[ConnectionAge]

    def __post_init__(self) -> None:
        for name in ("max_age_s", "grace_s"):
            value = getattr(self, name)
            if not 0 <= value < 2**31 / 1000:  # grpc takes an int32 of milliseconds
                raise UsageError(f"ConnectionAge.{name} must be 0 to {2**31 // 1000} s")

    def grpc_options(self) -> list[tuple[str, int]]:
        """Server options; none when ``max_age_s`` is 0 (grpc's default: no age)."""
        if self.max_age_s == 0:
            return []
        return [
            ("grpc.max_connection_age_ms", int(self.max_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(self.grace_s * 1000)),
        ]


ConnectionAge.default = ConnectionAge()


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """How an agent server listens and behaves."""

    host: str = "127.0.0.1"
    """Interface to bind; ``0.0.0.0`` in a container."""
    port: int = 0
    """Port to bind; 0 picks a free one (see ``AgentServer.port``)."""
    replica_id: str = ""
    """This process's identity for session leases; default ``hostname:port``.
    A restarted process with the same id reclaims its sessions at once; any other
    process waits for their leases to lapse."""
    lease_ttl_s: float = 5.0
    """How long a session's lease lasts without renewal."""
    graceful_shutdown_timeout_s: float = 10.0
    """On shutdown, how long running sessions may finish before they are checkpointed
    and left for the next process to resume."""
    poll_interval_s: float = 0.5
    """How often an idle stream re-checks the store for writers in other processes."""
    heartbeat_interval_s: float = 5.0
    """A ``Stream`` quiet this long sends a ``heartbeat`` (not logged) while the session
    runs, e.g. while it waits for its sub-agents, so idle connections stay up."""
    limits: Limits = Limits.default
    """Message and input sizes, running sessions, per-principal rate (``config.Environment().limits()``)."""
    connection_age: ConnectionAge = ConnectionAge.default
    """Maximum connection age and grace (``config.Environment().connection_age()``): clients re-resolve
    and reach replicas added after they connected."""
    reflection: bool = True
    """Serve gRPC server reflection (it needs credentials like every RPC but health)."""
    health_port: int | None = None
    """Also serve ``grpc.health.v1`` alone, in plaintext, on this port (0 picks one):
    for Kubernetes probes, which cannot do TLS, when the main port does."""
    a2a_port: int | None = None
    """Also serve the agent as an A2A server (JSON-RPC, HTTP+JSON; ``docs/a2a.md``) on this
    port (0 picks one); ``None``: no A2A endpoint."""
    a2a_grpc_port: int | None = None
    """Also serve A2A's gRPC binding on this port (0 picks one; needs ``a2a_port``, whose
    card lists it); ``None``: none."""
    a2a_url: str | None = None
    """The base URL the Agent Card names (behind a proxy or ingress); default the
    endpoint's own ``http://host:port``."""
    a2a_card_key: str | None = None
    """A PEM private key file (RSA, EC, Ed25519) that signs the Agent Card (a JWS,
    ``docs/a2a.md``; needs ``a2a_port``); ``None``: the card is unsigned."""
    client: ClientConfig = ClientConfig.default
    """How this server's agents call other agent services (remote sub-agents)."""
    allow_volatile_store: bool | None = None
    """``serve``: accept a Redis store that keeps nothing on disk (no AOF, no save
    rules), which a Redis restart empties; ``None``: ``HELIX_ALLOW_VOLATILE_STORE=1``
    decides. Refused by default, naming the fix."""
    admins: tuple[str, ...] = ()
    """Principals (of no tenant) allowed to call ``helix.admin.v1.AdminService``
    (``helix-mesh gc ADDRESS``); none by default, and never ``anonymous``."""
    retention_s: float | None = None
    """Remove sessions finished this many seconds ago (with their tree's root, when it is in the
    same store), sweeping in the background; ``None`` keeps them forever."""

    default: ClassVar[ServerConfig]

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"port must be 0-65535, not {self.port}")
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise UsageError(f"health_port must be 0-65535, not {self.health_port}")
        if self.a2a_port is not None and not 0 <= self.a2a_port <= 65535:
            raise UsageError(f"a2a_port must be 0-65535, not {self.a2a_port}")
        if self.a2a_grpc_port is not None and (
            self.a2a_port is None or not 0 <= self.a2a_grpc_port <= 65535
        ):
            raise UsageError("a2a_grpc_port must be 0-65535, with an a2a_port")
        if self.a2a_card_key and self.a2a_port is None:
            raise UsageError("a2a_card_key signs the A2A card: it needs an a2a_port")
        if self.lease_ttl_s <= 0 or self.graceful_shutdown_timeout_s < 0:
            raise UsageError("lease_ttl_s must be positive and graceful_shutdown_timeout_s >= 0")
        if self.retention_s is not None and not self.retention_s > 0:
            raise UsageError(f"retention_s must be positive, not {self.retention_s}")


ServerConfig.default = ServerConfig()
