"""Talking to agent services: the gRPC client and its resumable stream, the pool of
clients a server keeps, and the credentials a client presents."""

from helix_transport.transport._auth import (
    FORWARD,
    SUBSTITUTE,
    ClientAuth,
    open_channel,
    read_token_file,
    set_bearer_token,
)
from helix_transport.transport._errors import map_grpc_errors
from helix_transport.transport._pool import ClientFactory, ClientPool, register_address_scheme
from helix_transport.transport.client import AgentClient
from helix_transport.transport.stream import EventStream

__all__ = [
    "FORWARD",
    "SUBSTITUTE",
    "AgentClient",
    "ClientAuth",
    "ClientFactory",
    "ClientPool",
    "EventStream",
    "map_grpc_errors",
    "open_channel",
    "read_token_file",
    "register_address_scheme",
    "set_bearer_token",
]
