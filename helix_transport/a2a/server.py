"""The A2A endpoint of an agent service: a2a-sdk's JSON-RPC and HTTP+JSON routes and
its Agent Card route, over ``HelixRequestHandler``, on a port of its own; optionally
its gRPC binding (``grpc_binding``) on a second port.

Authentication runs first, in the ASGI app, before a byte of the request body is
read: the service's own authenticators (its token file, its JWT key), the same
principal as over gRPC. Only the Agent Card is public, as A2A expects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Any

import grpc
import uvicorn
from a2a.server.context import ServerCallContext
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from helix_transport._exceptions import Unauthenticated, UsageError
from helix_transport.a2a.card import JSONRPC_PATH, REST_PATH, agent_card
from helix_transport.a2a.grpc_binding import grpc_server
from helix_transport.a2a.handler import BEARER, PRINCIPAL, HelixRequestHandler
from helix_transport.a2a.signing import CardKey, sign_card
from helix_transport.server.edge import SessionsEdge

logger = logging.getLogger("helix.a2a")

_PRINCIPAL_SCOPE = "helix.principal"


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's context, with the caller the middleware authenticated."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        principal, bearer = request.scope.get(_PRINCIPAL_SCOPE, (None, None))
        if principal is not None:
            context.state[PRINCIPAL] = principal
            context.state[BEARER] = bearer
        headers = context.state.get("headers", {})
        headers.pop("authorization", None)  # the credential stays out of the state
        return context


class _Authenticate:
    """Refuses an unauthenticated call (401) before its body is read."""

    def __init__(self, app: ASGIApp, edge: SessionsEdge) -> None:
        self.app = app
        self.edge = edge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == AGENT_CARD_WELL_KNOWN_PATH:
            await self.app(scope, receive, send)
            return
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
        try:
            principal = self.edge.authenticate(authorization)
        except Unauthenticated as exc:
            logger.info("refused A2A %s from %s: %s", scope["path"], scope.get("client"), exc)
            await _refuse(send, exc.message)
            return
        bearer = authorization.partition(" ")[2].strip() if authorization else None
        scope[_PRINCIPAL_SCOPE] = (principal, bearer)
        await self.app(scope, receive, send)


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"error": {"code": 401, "message": message}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"www-authenticate", b'Bearer realm="helix-mesh"'),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(
    edge: SessionsEdge,
    *,
    base_url: str,
    grpc_target: str | None = None,
    handler: HelixRequestHandler | None = None,
    card_key: CardKey | None = None,
) -> ASGIApp:
    """The ASGI app of ``edge``'s A2A endpoint, its card naming ``base_url`` (and
    ``grpc_target``, the gRPC binding's ``host:port``, when there is one), signed by
    ``card_key`` when given."""
    handler = handler or HelixRequestHandler(edge)
    card = agent_card(
        edge.describe(),
        base_url=base_url,
        authenticates=edge.authenticates,
        grpc_target=grpc_target,
    )
    if card_key is not None:
        card = sign_card(card, card_key)  # last: the signature covers every field
        logger.info("Agent Card signed (%s, key id %s)", card_key.algorithm, card_key.key_id)
    builder = _ContextBuilder()
    routes: list[Any] = [
        *create_agent_card_routes(card),
        *create_jsonrpc_routes(handler, JSONRPC_PATH, context_builder=builder),
        # Mounted rather than prefixed: the SDK puts its tenant routes at
        # /{tenant}<prefix>/..., while its client sends <interface url>/{tenant}/...
        Mount(REST_PATH, routes=create_rest_routes(handler, context_builder=builder)),
    ]
    return _Authenticate(Starlette(routes=routes), edge)


class A2AEndpoint:
    """An agent service's A2A endpoint on ``host:port`` (0 picks a port), and its gRPC
    binding on ``grpc_port`` when given (0 picks one); its card signed by ``card_key``.

    The ports are bound here (a port in use fails now, with the gRPC port's message);
    ``start()`` serves, ``shutdown()`` closes open streams and stops.
    """

    def __init__(
        self,
        edge: SessionsEdge,
        *,
        host: str,
        port: int,
        public_url: str | None = None,
        grpc_port: int | None = None,
        card_key: CardKey | None = None,
    ) -> None:
        self._socket = _bind(host, port)
        self.port: int = self._socket.getsockname()[1]
        self.host = host
        self.url = public_url or f"http://{_url_host(host)}:{self.port}"
        """The base URL the card names (``public_url`` behind a proxy or ingress)."""
        handler = HelixRequestHandler(edge)
        self._grpc: grpc.aio.Server | None = None
        self.grpc_port: int | None = None
        """The gRPC binding's port (None without one)."""
        if grpc_port is not None:
            self._grpc, self.grpc_port = grpc_server(edge, handler, host=host, port=grpc_port)
        self.grpc_target = (
            f"{_url_host(host)}:{self.grpc_port}" if self.grpc_port is not None else None
        )
        """The ``host:port`` the card names for the gRPC binding."""
        self.app = create_app(
            edge,
            base_url=self.url,
            grpc_target=self.grpc_target,
            handler=handler,
            card_key=card_key,
        )
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve in the background until ``shutdown``."""
        if self._grpc is not None:
            await self._grpc.start()
        self._task = asyncio.create_task(
            self._server.serve(sockets=[self._socket]), name="a2a-endpoint"
        )
        while not self._server.started:
            if self._task.done():
                await self._task  # raises what stopped it
                raise UsageError(f"A2A endpoint on port {self.port} did not start")
            await asyncio.sleep(0.01)

    async def shutdown(self) -> None:
        """Stop serving (open streams end; their clients resubscribe elsewhere)."""
        if self._grpc is not None:
            await self._grpc.stop(grace=None)  # streams follow live sessions: no grace
        if self._task is None:
            self._socket.close()
            return
        self._server.should_exit = True
        self._server.force_exit = True  # streams follow live sessions: do not wait them out
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._socket.close()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port} (A2A port): {exc.strerror}") from exc
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host
