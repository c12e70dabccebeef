"""Serving one agent type as a gRPC ``AgentService``."""

from helix_transport.server.app import AgentServer, ServerConfig, create_server, serve

__all__ = ["AgentServer", "ServerConfig", "create_server", "serve"]
