"""helix-mesh: AI agents served as gRPC services that delegate to each other.

The public API::

    from helix_transport import Agent, tool, ToolContext, AgentClient, create_server

Define an ``Agent`` (pydantic input/output models, tools, a litellm model), serve
it with ``create_server`` or ``helix-mesh serve module:agent``, and call it with
``AgentClient``. An agent delegates to other agent services with
``remote_agent_tool`` (one call, one child), ``with_companions`` (children it keeps,
``PersistentChild``) or ``with_dispatch`` (tasks to ``SubagentType`` children).
See README.md.

Importing the package is cheap: names load on first use, so a client-only
program (``helix-mesh status``) never imports litellm.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from helix_transport._config import (
        ClientConfig,
        ConnectionAge,
        Limits,
        RetryConfig,
        ServerConfig,
    )
    from helix_transport._events import SessionStatus, is_terminal
    from helix_transport._exceptions import (
        AgentRunError,
        ConnectError,
        DeadlineExceeded,
        HelixError,
        InvalidArgument,
        LeaseLost,
        MaxStepsExceeded,
        ModelAPIError,
        PermissionDenied,
        RemoteError,
        RequestNotFound,
        ResourceExhausted,
        RunInterrupted,
        SequenceConflict,
        SequenceGap,
        SessionExists,
        SessionExpired,
        SessionNotFound,
        SessionStateConflict,
        StoreError,
        StoreUnavailable,
        StreamInterrupted,
        ToolTimeoutError,
        TransportError,
        Unauthenticated,
        UsageError,
    )
    from helix_transport._limits import SessionLimits
    from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
    from helix_transport.agent.close_policy import ClosePolicy
    from helix_transport.agent.definition import Agent
    from helix_transport.agent.tools import Tool, ToolContext, client_tool, tool
    from helix_transport.delegation.companions import PersistentChild, with_companions
    from helix_transport.delegation.dispatch import SubagentType, VirtualTasks, with_dispatch
    from helix_transport.delegation.remote import remote_agent_tool, remote_agent_tool_from_service
    from helix_transport.metrics import MetricsConfig, start_metrics
    from helix_transport.server.app import AgentServer, create_server
    from helix_transport.server.auth import AuthConfig
    from helix_transport.store import Store, open_store
    from helix_transport.transport import AgentClient, ClientAuth, EventStream
    from helix_transport.tree import (
        PendingRequest,
        SessionTree,
        TreeNode,
        TreeUsage,
        fold_events,
    )

_LAZY = {
    "Agent": "helix_transport.agent.definition",
    "AgentClient": "helix_transport.transport",
    "AgentRunError": "helix_transport._exceptions",
    "AgentServer": "helix_transport.server.app",
    "AuthConfig": "helix_transport.server.auth",
    "ClientAuth": "helix_transport.transport",
    "ClientConfig": "helix_transport._config",
    "ClosePolicy": "helix_transport.agent.close_policy",
    "ConnectError": "helix_transport._exceptions",
    "ConnectionAge": "helix_transport._config",
    "DeadlineExceeded": "helix_transport._exceptions",
    "EventStream": "helix_transport.transport",
    "HelixError": "helix_transport._exceptions",
    "InvalidArgument": "helix_transport._exceptions",
    "LeaseLost": "helix_transport._exceptions",
    "Limits": "helix_transport._config",
    "MaxStepsExceeded": "helix_transport._exceptions",
    "MetricsConfig": "helix_transport.metrics",
    "ModelAPIError": "helix_transport._exceptions",
    "PendingRequest": "helix_transport.tree",
    "PersistentChild": "helix_transport.delegation.companions",
    "PermissionDenied": "helix_transport._exceptions",
    "RemoteError": "helix_transport._exceptions",
    "RequestNotFound": "helix_transport._exceptions",
    "ResourceExhausted": "helix_transport._exceptions",
    "RetryConfig": "helix_transport._config",
    "RunInterrupted": "helix_transport._exceptions",
    "SequenceConflict": "helix_transport._exceptions",
    "SequenceGap": "helix_transport._exceptions",
    "ServerConfig": "helix_transport._config",
    "SessionExists": "helix_transport._exceptions",
    "SessionExpired": "helix_transport._exceptions",
    "SessionNotFound": "helix_transport._exceptions",
    "SessionLimits": "helix_transport._limits",
    "SessionStateConflict": "helix_transport._exceptions",
    "SessionStatus": "helix_transport._events",
    "SessionTree": "helix_transport.tree",
    "Store": "helix_transport.store",
    "StoreError": "helix_transport._exceptions",
    "StoreUnavailable": "helix_transport._exceptions",
    "StreamEvent": "helix_transport._proto.helix.agent.v1.agent_pb2",
    "StreamInterrupted": "helix_transport._exceptions",
    "SubagentType": "helix_transport.delegation.dispatch",
    "VirtualTasks": "helix_transport.delegation.dispatch",
    "Tool": "helix_transport.agent.tools",
    "ToolContext": "helix_transport.agent.tools",
    "ToolTimeoutError": "helix_transport._exceptions",
    "TransportError": "helix_transport._exceptions",
    "TreeNode": "helix_transport.tree",
    "TreeUsage": "helix_transport.tree",
    "Unauthenticated": "helix_transport._exceptions",
    "UsageError": "helix_transport._exceptions",
    "client_tool": "helix_transport.agent.tools",
    "create_server": "helix_transport.server.app",
    "fold_events": "helix_transport.tree",
    "is_terminal": "helix_transport._events",
    "open_store": "helix_transport.store",
    "remote_agent_tool": "helix_transport.delegation.remote",
    "remote_agent_tool_from_service": "helix_transport.delegation.remote",
    "start_metrics": "helix_transport.metrics",
    "tool": "helix_transport.agent.tools",
    "with_companions": "helix_transport.delegation.companions",
    "with_dispatch": "helix_transport.delegation.dispatch",
}

__all__ = [
    "Agent",
    "AgentClient",
    "AgentRunError",
    "AgentServer",
    "AuthConfig",
    "ClientAuth",
    "ClientConfig",
    "ClosePolicy",
    "ConnectError",
    "ConnectionAge",
    "DeadlineExceeded",
    "EventStream",
    "HelixError",
    "InvalidArgument",
    "LeaseLost",
    "Limits",
    "MaxStepsExceeded",
    "MetricsConfig",
    "ModelAPIError",
    "PendingRequest",
    "PermissionDenied",
    "PersistentChild",
    "RemoteError",
    "RequestNotFound",
    "ResourceExhausted",
    "RetryConfig",
    "RunInterrupted",
    "SequenceConflict",
    "SequenceGap",
    "ServerConfig",
    "SessionExists",
    "SessionExpired",
    "SessionLimits",
    "SessionNotFound",
    "SessionStateConflict",
    "SessionStatus",
    "SessionTree",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StreamEvent",
    "StreamInterrupted",
    "SubagentType",
    "Tool",
    "ToolContext",
    "ToolTimeoutError",
    "TransportError",
    "TreeNode",
    "TreeUsage",
    "Unauthenticated",
    "UsageError",
    "VirtualTasks",
    "client_tool",
    "create_server",
    "fold_events",
    "is_terminal",
    "open_store",
    "remote_agent_tool",
    "remote_agent_tool_from_service",
    "start_metrics",
    "tool",
    "with_companions",
    "with_dispatch",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'helix_transport' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
