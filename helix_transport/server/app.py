"""Building and running an agent server: ports, health, reflection, graceful stop."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import importlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Self

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from helix_transport._config import ServerConfig
from helix_transport._exceptions import UsageError
from helix_transport._proto.helix.admin.v1 import admin_pb2_grpc
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.litellm import load as load_litellm
from helix_transport.agent.litellm import warm_up
from helix_transport.agent.loop import MAX_RESULT_BYTES
from helix_transport.agent.model_config import ModelConfig
from helix_transport.config import Environment, warn_unknown
from helix_transport.log import EventHub
from helix_transport.metrics import metrics_enabled, watch_running
from helix_transport.metrics.hooks import metered_hooks
from helix_transport.metrics.store import metered_store
from helix_transport.server import _logging
from helix_transport.server._admin import SERVICE_NAME as ADMIN_SERVICE
from helix_transport.server._admin import AdminServicer
from helix_transport.server._encoding import add_agent_service
from helix_transport.server._expiry import retention_store, sweep_periodically
from helix_transport.server._identity import current_principal
from helix_transport.server._ownership import storage_id
from helix_transport.server._rpc_metrics import RpcMetricsInterceptor
from helix_transport.server._runner import SessionRunner
from helix_transport.server._servicer import AgentServicer
from helix_transport.server._sessions import Sessions
from helix_transport.server.auth import AuthConfig, AuthInterceptor, ClientTokenReload, ServerAuth
from helix_transport.server.interceptors import ErrorMappingInterceptor
from helix_transport.server.limits import LimitsInterceptor
from helix_transport.store import Store, open_store
from helix_transport.tracing import HooksFactory, TracingHandle, setup_tracing
from helix_transport.transport import ClientAuth, ClientPool

if TYPE_CHECKING:
    from helix_transport.a2a.server import A2AEndpoint

logger = logging.getLogger("helix.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
MODEL_READY = "helix.model"
"""A health check name ``serve`` turns SERVING once litellm is loaded and warm (after the
service itself serves): a readiness probe that must not route calls to a replica still
loading it asks for this name."""


class AgentServer:
    """One agent type served over gRPC on one store.

    Use ``await create_server(agent, store, auth=...)`` then ``async with server:`` (or
    ``await server.start()`` / ``await server.shutdown()``).
    """

    def __init__(
        self,
        agent: Agent,
        store: Store,
        config: ServerConfig,
        *,
        auth: ServerAuth,
        client_auth: ClientAuth | None = None,
        hooks: HooksFactory | None = None,
        tracing: TracingHandle | None = None,
    ) -> None:
        if metrics_enabled():  # one seam each: every store call, every run's hooks
            store, hooks = metered_store(store), metered_hooks(hooks)
        self.agent = agent
        self.store = store
        self.config = config
        if config.retention_s is not None:
            retention_store(store)  # refused here, not at the first sweep
        self.auth = auth
        options = [
            *config.limits.grpc_options(),
            *config.connection_age.grpc_options(),
            ("grpc.so_reuseport", 0),
        ]
        self._server, self.port, limiter = _listening_server(config, auth, options, tracing)
        self.hub = EventHub()
        replica_id = config.replica_id or f"{socket.gethostname()}:{self.port}"
        self.clients = ClientPool(
            config=config.client,
            auth=client_auth,
            interceptors=tracing.client_interceptors() if tracing is not None else (),
        )
        if hooks is None and tracing is not None:
            hooks = tracing.hooks_for
        self._client_reload = (
            ClientTokenReload(self.clients, client_auth, interval_s=auth.reload_interval_s)
            if client_auth is not None and client_auth.token_file and auth.reload_interval_s > 0
            else None
        )
        self.runner = SessionRunner(
            agent,
            store,
            self.hub,
            owner=replica_id,
            lease_ttl_s=config.lease_ttl_s,
            clients=self.clients,
            hooks=hooks,
            interrupt_poll_s=config.poll_interval_s,
            # Half a message: room for the wrapping of every parent that forwards it.
            max_result_bytes=min(MAX_RESULT_BYTES, config.limits.max_message_bytes // 2),
        )
        watch_running(self.runner)  # helix.sessions.running reads its count at each scrape
        self.sessions = Sessions(
            agent,
            store,
            self.hub,
            self.runner,
            clients=self.clients,
            poll_interval_s=config.poll_interval_s,
            limits=config.limits,
        )
        self.servicer = AgentServicer(
            self.sessions, heartbeat_interval_s=config.heartbeat_interval_s, charge=limiter.charge
        )
        add_agent_service(self.servicer, self._server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(store, config.admins), self._server
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self._health_server, self.health_port = _health_listener(config, self.health, options)
        self.a2a = _a2a_endpoint(self.servicer, auth, config)  # None without config.a2a_port
        if config.reflection:
            names = (SERVICE_NAME, ADMIN_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
            reflection.enable_server_reflection(names, self._server)
        self._stopped = asyncio.Event()
        self._orphan_watch: asyncio.Task[None] | None = None
        self._outbox: asyncio.Task[None] | None = None
        self._retention: asyncio.Task[None] | None = None
        self._credential_watches: list[asyncio.Task[None]] = []

    @property
    def address(self) -> str:
        """``host:port`` clients can dial."""
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        """Start serving, then resume sessions left running by a previous process."""
        await self._server.start()
        if self._health_server is not None:
            await self._health_server.start()
        if self.a2a is not None:
            await self.a2a.start()
        resumed = await self.runner.resume_orphans()
        self._orphan_watch = asyncio.create_task(self.runner.watch_orphans(), name="orphan-watch")
        # Interrupts for children left undelivered, by this process or one that died.
        self._outbox = asyncio.create_task(self.runner.cascade.run(), name="outbox")
        if self.config.retention_s is not None:
            retention = timedelta(seconds=self.config.retention_s)
            sweeping = sweep_periodically(self.store, retention)
            self._retention = asyncio.create_task(sweeping, name="retention")
        for reload in (self.auth.reload, self._client_reload):
            if reload is not None:
                watch = asyncio.create_task(reload.watch(), name="credential-watch")
                self._credential_watches.append(watch)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        logger.info(
            "serving agent %r on %s (resumed %d session(s))", self.agent.name, self.address, resumed
        )

    async def shutdown(self, grace_s: float | None = None) -> None:
        """Stop taking sessions, drain or checkpoint running ones, then stop. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.config.graceful_shutdown_timeout_s if grace_s is None else grace_s
        self.sessions.accepting = False
        await self.health.enter_graceful_shutdown()
        for watch in (self._orphan_watch, self._outbox, self._retention, *self._credential_watches):
            if watch is not None:
                watch.cancel()
        await self.runner.shutdown(grace_s=grace)
        # Runs are done or checkpointed; give open streams a moment to send the rest.
        if self.a2a is not None:  # its streams follow the runs' logs, which now end
            await self.a2a.shutdown()
        if self._health_server is not None:  # before the main server: wait_closed returns then
            await self._health_server.stop(0)
        await self._server.stop(min(grace, 1.0))
        await self.clients.aclose()

    async def wait_closed(self) -> None:
        """Wait until ``shutdown`` has been called and finished."""
        await self._stopped.wait()
        await self._server.wait_for_termination()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()


def _listening_server(
    config: ServerConfig,
    auth: ServerAuth,
    options: list[tuple[str, int]],
    tracing: TracingHandle | None = None,
) -> tuple[grpc.aio.Server, int, LimitsInterceptor]:
    """The agent's gRPC server with its interceptors, bound to ``config``'s address, and
    its rate limiter (which ``Follow`` charges for each follow too)."""
    # Metrics outermost of all: they see every answer, authentication's refusals too.
    # Then authentication: the principal is set before anything else runs; then the
    # SERVER span (it keys a session's trace on the caller's namespace, and sees the
    # status the error mapping sets); then error mapping, so a limit's refusal leaves
    # with its details; then the limits, which charge the authenticated principal.
    interceptors: list[grpc.aio.ServerInterceptor] = (
        [RpcMetricsInterceptor()] if metrics_enabled() else []
    )
    if auth.authenticator is not None:
        interceptors.append(AuthInterceptor(auth.authenticator))
    if tracing is not None:
        interceptors.append(tracing.server_interceptor(_session_key))
    limiter = LimitsInterceptor(config.limits)
    interceptors += [ErrorMappingInterceptor(), limiter]
    server = grpc.aio.server(interceptors=interceptors, options=options)
    bind = f"{config.host}:{config.port}"
    try:
        if auth.server_credentials is not None:
            port = server.add_secure_port(bind, auth.server_credentials)
        else:
            port = server.add_insecure_port(bind)
    except RuntimeError:  # grpc's "Failed to bind", with a hint about its debug logs
        port = 0
    if port == 0:
        raise UsageError(
            f"cannot listen on {bind}: the port is in use (another server?) "
            "or the host is not an address of this machine"
        )
    return server, port, limiter


def _a2a_endpoint(
    servicer: AgentServicer, auth: ServerAuth, config: ServerConfig
) -> A2AEndpoint | None:
    """The A2A endpoint on ``config.a2a_port`` over ``servicer``'s sessions, or None."""
    if config.a2a_port is None:
        return None
    # Imported here: a service without an A2A port never loads the SDK's server.
    from helix_transport.a2a.server import A2AEndpoint
    from helix_transport.a2a.signing import read_card_key
    from helix_transport.server.edge import SessionsEdge

    edge = SessionsEdge(servicer, auth.authenticator)
    return A2AEndpoint(
        edge,
        host=config.host,
        port=config.a2a_port,
        public_url=config.a2a_url,
        grpc_port=config.a2a_grpc_port,
        card_key=read_card_key(config.a2a_card_key) if config.a2a_card_key else None,
    )


def _session_key(session_id: str) -> str:
    """The key of the caller's session ``session_id`` (its trace is derived from it)."""
    return storage_id(current_principal(), session_id)


def _health_listener(
    config: ServerConfig, servicer: health.aio.HealthServicer, options: list[tuple[str, int]]
) -> tuple[grpc.aio.Server | None, int | None]:
    """The health-only server on ``config.health_port`` and its port (None, None without)."""
    if config.health_port is None:
        return None, None
    # Error mapping here too: a probe's undecodable request is INVALID_ARGUMENT,
    # not a traceback in the log.
    server = grpc.aio.server(interceptors=[ErrorMappingInterceptor()], options=options)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    try:  # grpc raises RuntimeError or returns 0, depending on the version
        port = server.add_insecure_port(f"{config.host}:{config.health_port}")
    except RuntimeError:
        port = 0
    if port == 0:
        raise UsageError(f"cannot bind {config.host}:{config.health_port} (health port)")
    return server, port


async def create_server(
    agent: Agent,
    store: Store,
    config: ServerConfig | None = None,
    *,
    auth: AuthConfig | ServerAuth | None = None,
    allow_unauthenticated: bool = False,
    client_auth: ClientAuth | None = None,
    hooks: HooksFactory | None = None,
    tracing: TracingHandle | None = None,
) -> AgentServer:
    """Bind an ``AgentServer`` for ``agent`` (not started yet).

    Args:
        auth: how callers authenticate (token file, JWT, mutual TLS; see
            ``helix_transport.server.auth``).
        allow_unauthenticated: serve without authentication, every caller being
            ``anonymous``; one of ``auth`` or this is required (fail closed).
        client_auth: the credentials this server presents to the agent services it
            delegates to (substitute or forward identity).
        hooks: makes the lifecycle hooks of each run (default: ``tracing``'s).
        tracing: a service's tracing (``setup_tracing(...)``): run spans, SERVER spans
            for its RPCs and CLIENT spans for its calls to children.

    Raises:
        UsageError: neither ``auth`` nor ``allow_unauthenticated``, a bad auth file, or
            a ``HELIX_LLM_*`` variable for this agent that is not a number.
    """
    # A HELIX_LLM_* value that is not a number stops the server now, not each run later.
    ModelConfig().with_settings(Environment().model(agent.name), agent_type=agent.name)
    if auth is None:
        auth = AuthConfig(allow_unauthenticated=allow_unauthenticated)
    if isinstance(auth, AuthConfig):
        auth = await asyncio.to_thread(auth.load)  # reads key and token files
    return AgentServer(
        agent,
        store,
        config or ServerConfig.default,
        auth=auth,
        client_auth=client_auth,
        hooks=hooks,
        tracing=tracing,
    )


def load_agent(reference: str) -> Agent:
    """Import ``module:attr`` (like uvicorn's app reference) and check it is an ``Agent``."""
    module_name, _, attr = reference.partition(":")
    attr = attr or "agent"
    # Like uvicorn: resolve the reference from the working directory too, so
    # `helix-mesh serve services.researcher:agent` works from a checkout.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from exc
    agent = getattr(module, attr, None)
    if not isinstance(agent, Agent):
        raise UsageError(f"{reference!r} is not an Agent (got {type(agent).__name__})")
    return agent


async def serve(
    agent: Agent,
    *,
    store_url: str,
    config: ServerConfig,
    auth: AuthConfig,
    client_auth: ClientAuth | None = None,
    shutdown_hooks: Sequence[Callable[[], object]] = (),
) -> None:
    """Serve ``agent`` until SIGTERM or SIGINT, then shut down gracefully.

    ``auth`` is checked before anything else: without a way to authenticate callers
    (or an explicit ``allow_unauthenticated``) the service refuses to start.

    Traces go to Langfuse / OTLP when configured (``LANGFUSE_*``,
    ``OTEL_EXPORTER_OTLP_ENDPOINT``), and are flushed on the way out; then each of
    ``shutdown_hooks`` runs (in a thread; what one raises is logged): a meter
    provider's ``shutdown``, say, so its last values are exported too.
    """
    server_auth = await asyncio.to_thread(auth.load)  # fail closed before touching the store
    _logging.bind_service(agent_type=agent.name)
    warn_unknown()  # a mistyped HELIX_* variable is otherwise silently ignored
    tracing = setup_tracing(agent.name)
    store = await open_store(store_url, allow_volatile=config.allow_volatile_store)
    try:
        server = await create_server(
            agent, store, config, auth=server_auth, client_auth=client_auth, tracing=tracing
        )
        await server.health.set(MODEL_READY, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        _freeze_imported()
        # SERVING now; litellm (2 s of CPU to import, its first call 0.4 s more) loads
        # after, in a thread: a model call that comes first waits for it.
        warming = asyncio.create_task(_warm_up(server), name="warm-up")
        _logging.announce(
            f"agent {agent.name!r} listening on {server.address}", address=server.address
        )
        if server.health_port is not None:
            health = f"{config.host}:{server.health_port}"
            _logging.announce(f"health on {health}", health_address=health)
        if server.a2a is not None:
            _logging.announce(f"A2A on {server.a2a.url}", a2a_url=server.a2a.url)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(server.shutdown()))
        await server.wait_closed()
        warming.cancel()
    finally:
        await store.aclose()
        if tracing is not None:  # after the runs ended: their spans are all queued
            await asyncio.to_thread(tracing.shutdown)
        for hook in shutdown_hooks:
            try:
                await asyncio.to_thread(hook)
            except Exception:
                logger.warning("shutdown hook %r failed", hook, exc_info=True)


def _freeze_imported() -> None:
    """Move what is loaded now out of the collector's reach: it lives for the whole
    process (litellm alone is ~400k objects), and full collections over it were 100-300
    ms pauses in the middle of streams."""
    gc.collect()
    gc.freeze()


async def _warm_up(server: AgentServer) -> None:
    """Import litellm in a thread, make one scripted call (its own lazy imports), freeze
    what they loaded, then say ``MODEL_READY``. A failure is logged (``MODEL_READY`` stays
    NOT_SERVING): the first model call tries again."""
    try:
        await load_litellm()
        await warm_up()
    except Exception:
        logger.warning("warming up litellm failed", exc_info=True)
        return
    # Without the full collection first: over litellm's objects that is the very
    # 100-300 ms pause this avoids, now while the service serves. What is frozen with
    # them is the import's little garbage.
    gc.freeze()
    _trim_malloc()
    # Ignored once a drain began (the health servicer's graceful shutdown).
    await server.health.set(MODEL_READY, health_pb2.HealthCheckResponse.SERVING)


def _trim_malloc() -> None:
    """Hand the pages glibc's malloc holds free back to the kernel (~0.2 ms): litellm's
    import and first call leave 1-2 MiB free that an idle service otherwise keeps."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc's own: absent on musl and macOS
    except (OSError, AttributeError):
        return
    trim(0)


def announce(message: str, **fields: object) -> None:
    """Print ``message`` on stdout, as one JSON line under ``--log-format json``."""
    _logging.announce(message, **fields)


def configure_logging(log_format: str | None = None) -> None:
    """Service logging: ``log_format`` ``text`` or ``json`` (default ``$HELIX_LOG_FORMAT``,
    else text) at ``$HELIX_LOG_LEVEL``; see ``server._logging``."""
    env = Environment()
    _logging.configure_logging(log_format or env.log_format(), level=env.log_level())
