"""A2A at the edge, both ways, on ``a2a-sdk``.

- serving (``A2AEndpoint``, ``serve --a2a-port``): an agent service is also an A2A
  server, mapped onto the same sessions layer the gRPC servicer uses.
- ``mapping``: the one table between sessions and tasks (states, events, input-required).

The serving side is imported when asked for: the child direction (imported by
delegation) never loads the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from helix_transport.a2a.server import A2AEndpoint, create_app

__all__ = ["A2AEndpoint", "create_app"]


def __getattr__(name: str) -> Any:
    if name in ("A2AEndpoint", "create_app"):
        from helix_transport.a2a import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
