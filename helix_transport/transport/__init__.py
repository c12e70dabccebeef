"""Talking to agent services: the gRPC client and its resumable stream."""

from helix_transport.transport.client import AgentClient
from helix_transport.transport.stream import EventStream

__all__ = ["AgentClient", "EventStream"]
