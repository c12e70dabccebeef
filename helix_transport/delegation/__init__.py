"""Children of every kind: a remote agent as a tool, persistent companions, and
``run_subagent`` tasks; their ids, refs, spans, forwarding and the interrupt outbox."""

from __future__ import annotations

from helix_transport.agent.close_policy import ClosePolicy
from helix_transport.delegation.companions import PersistentChild, with_companions
from helix_transport.delegation.dispatch import SubagentType, VirtualTasks, with_dispatch
from helix_transport.delegation.remote import remote_agent_tool, remote_agent_tool_from_service

__all__ = [
    "ClosePolicy",
    "PersistentChild",
    "SubagentType",
    "VirtualTasks",
    "remote_agent_tool",
    "remote_agent_tool_from_service",
    "with_companions",
    "with_dispatch",
]
