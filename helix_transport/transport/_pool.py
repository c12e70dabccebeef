"""One ``AgentClient`` (one channel) per target address, shared by every caller."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import grpc

from helix_transport._config import ClientConfig
from helix_transport._exceptions import UsageError
from helix_transport.transport._auth import ClientAuth
from helix_transport.transport.client import AgentClient

ClientFactory = Callable[[str, "ClientPool"], Awaitable[AgentClient]]
"""Makes the client for an address of another protocol (``register_address_scheme``)."""

_SCHEMES: dict[str, ClientFactory] = {}


def register_address_scheme(prefix: str, factory: ClientFactory) -> None:
    """Let every pool reach addresses starting with ``prefix`` through ``factory``.

    A child of another protocol (an A2A agent, ``helix_transport.a2a``) is a child ref
    like any other: the outbox's interrupts, answers passed down and status probes get
    its client from the pool by the ref's address, and the factory gives one that
    speaks that protocol. The mesh itself depends on no such protocol.
    """
    _SCHEMES[prefix] = factory


class ClientPool:
    """Reuses one client per address: gRPC channels multiplex calls over HTTP/2,
    so a parent fanning out to many children on one service needs one connection."""

    def __init__(
        self,
        *,
        config: ClientConfig = ClientConfig.default,
        credentials: grpc.ChannelCredentials | None = None,
        call_credentials: grpc.CallCredentials | None = None,
        auth: ClientAuth | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> None:
        self.config = config
        self.auth = auth
        self._interceptors = tuple(interceptors)  # every channel's (a service's CLIENT spans)
        self._credentials = credentials
        self._call_credentials = call_credentials
        self._clients: dict[str, AgentClient] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    async def get(self, address: str) -> AgentClient:
        """The client for ``address``, connecting on first use.

        Raises:
            UsageError: the pool is closed (a late caller, such as a background
                interrupt still retrying after shutdown, would leak a new channel).
        """
        client = self._clients.get(address)
        if client is not None:
            return client
        async with self._lock:
            if self._closed:
                raise UsageError(f"the client pool is closed; not connecting to {address}")
            client = self._clients.get(address)
            factory = next((f for p, f in _SCHEMES.items() if address.startswith(p)), None)
            if client is None and factory is not None:
                client = self._clients[address] = await factory(address, self)
            if client is None:
                client = await AgentClient.connect(
                    address,
                    config=self.config,
                    credentials=self._credentials,
                    call_credentials=self._call_credentials,
                    auth=self.auth,
                    interceptors=self._interceptors,
                )
                self._clients[address] = client
            return client

    def use_auth(self, auth: ClientAuth) -> None:
        """Present ``auth``'s token on every later call (a rotated token); its TLS
        settings must be those the open channels were made with."""
        self.auth = auth
        for client in self._clients.values():
            client._auth = auth

    def addresses(self) -> list[str]:
        """The addresses with an open client."""
        return list(self._clients)

    async def aclose(self) -> None:
        """Close every client. Idempotent."""
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
