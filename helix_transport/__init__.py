"""helix-mesh: AI agents served as gRPC services that delegate to each other.

The public API::

    from helix_transport import Agent, tool, ToolContext, AgentClient, create_server

Define an ``Agent`` (pydantic input/output models, tools, a litellm model), serve
it with ``create_server`` or ``helix-mesh serve module:agent``, and call it with
``AgentClient``. See README.md.
"""

from helix_transport import agent as _agent  # noqa: F401  (sets litellm's offline env first)
from helix_transport._config import ClientConfig, RetryConfig
from helix_transport._eventlog import is_terminal
from helix_transport._exceptions import (
    AgentRunError,
    ConnectError,
    DeadlineExceeded,
    HelixError,
    InvalidArgument,
    LeaseLost,
    MaxStepsExceeded,
    ModelAPIError,
    RemoteError,
    RunInterrupted,
    SequenceConflict,
    SequenceGap,
    SessionExists,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    StreamInterrupted,
    ToolTimeoutError,
    TransportError,
    UsageError,
)
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport._status import SessionStatus
from helix_transport.agent.definition import Agent
from helix_transport.agent.tools import Tool, ToolContext, tool
from helix_transport.server.app import AgentServer, ServerConfig, create_server
from helix_transport.store import Store, open_store
from helix_transport.transport import AgentClient, EventStream

__all__ = [
    "Agent",
    "AgentClient",
    "AgentRunError",
    "AgentServer",
    "ClientConfig",
    "ConnectError",
    "DeadlineExceeded",
    "EventStream",
    "HelixError",
    "InvalidArgument",
    "LeaseLost",
    "MaxStepsExceeded",
    "ModelAPIError",
    "RemoteError",
    "RetryConfig",
    "RunInterrupted",
    "SequenceConflict",
    "SequenceGap",
    "ServerConfig",
    "SessionExists",
    "SessionNotFound",
    "SessionStatus",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StreamEvent",
    "StreamInterrupted",
    "Tool",
    "ToolContext",
    "ToolTimeoutError",
    "TransportError",
    "UsageError",
    "create_server",
    "is_terminal",
    "open_store",
    "tool",
]
