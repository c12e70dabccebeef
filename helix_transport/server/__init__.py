"""Serving one agent type as a gRPC ``AgentService``."""

from helix_transport._config import ServerConfig
from helix_transport.server.app import AgentServer, create_server, serve

__all__ = ["AgentServer", "ServerConfig", "create_server", "serve"]
