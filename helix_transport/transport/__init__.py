"""Talking to agent services: the gRPC client and its resumable stream."""

from helix_transport.transport.grpc import AgentClient, EventStream

__all__ = ["AgentClient", "EventStream"]
