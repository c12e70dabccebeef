"""The model seam: what the run loop asks of a model, and what it gets back.

``Model`` has one method, ``complete``, and a name; ``helix_transport.agent.litellm.LitellmModel``
is the default implementation (any litellm model name, the scripted offline models
included), and ``Agent(model=...)`` takes any other. Nothing here imports litellm: the loop, tracing and the hooks see
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
    """A model the run loop can call: one streamed completion per step.

    ``Agent(model=...)`` takes one (a test double, a cached or a recorded model); a model
    *name* there means ``LitellmModel(name)``, the default. ``settings`` carries the
    agent's ``model_settings`` and litellm's retries, timeout and fallbacks: a model that
    is not litellm's may ignore what it does not know.
    """

    @property
    def model_name(self) -> str:
        """The model's name, as tracing (``gen_ai.request.model``), metrics and errors
        report it."""
        ...

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


def model_name(model: str | Model) -> str:
    """The name of ``model``: itself for a litellm model name, else its ``model_name``."""
    return model if isinstance(model, str) else model.model_name


def new_tool_call_id() -> str:
    """A tool call id of our own, for a call the provider sent without one (or with one
    it had used before): short, and in every provider's id alphabet."""
    return f"call_{uuid.uuid4().hex[:16]}"
