"""A2A at the edge, both ways, on ``a2a-sdk``.

- serving: an agent service is also an A2A server (``A2AEndpoint``; ``--a2a-port``),
  mapped onto the same sessions layer the gRPC servicer uses.
- ``mapping``: the one table between sessions and tasks (states, events, input-required).
"""

from __future__ import annotations

__all__: list[str] = []
