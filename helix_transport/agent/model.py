"""The model seam: what the run loop asks of a model, and what it gets back.

``Model`` has one method, ``complete``; ``helix_transport.agent.litellm.LitellmModel``
is the implementation every agent uses (any litellm model name, the scripted offline
models included). Nothing here imports litellm: the loop, tracing and the hooks see
only these types.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from helix_transport.store import Usage


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """A tool call the model asked for."""

    id: str
    name: str
    arguments_json: str


@dataclass(frozen=True, kw_only=True)
class ModelResponse:
    """One complete model turn."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    provider: str = ""
    """The provider that answered, as litellm names it (``openai``, ``scripted``)."""
    response_model: str = ""
    """The model the provider says answered (may differ from the one asked for)."""
    finish_reasons: tuple[str, ...] = ()
    """Why the generation stopped (``stop``, ``tool_calls``, ``length``...)."""
    cost_usd: float | None = None
    """What the call cost, when litellm's cost map knows the model."""

    def to_message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json},
                }
                for c in self.tool_calls
            ]
        return message


class Model(Protocol):
    """A model the run loop can call: one streamed completion per step."""

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]],
        on_text: Callable[[str], None],
        settings: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ModelResponse:
        """Complete ``messages`` (calling ``on_text`` for every text delta as it arrives).

        Raises:
            ModelAPIError: the provider failed (network, auth, bad request, bad stream).
        """
        ...


def new_tool_call_id() -> str:
    """A tool call id of our own, for a call the provider sent without one (or with one
    it had used before): short, and in every provider's id alphabet."""
    return f"call_{uuid.uuid4().hex[:16]}"
