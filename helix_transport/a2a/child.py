"""A2A agents as children: any agent that speaks A2A is a tool of a helix parent.

``await a2a_agent_tool(card_url_or_card)`` builds the tool from the agent's card (its
name, description and, when the card carries it, each skill's input schema). A call
of the tool is a child like a remote helix agent (``remote_agent_tool``), with the same
guarantees, as far as A2A lets them be kept (``docs/a2a-children.md``):

- one message per tool call: its id (``{child id}-message``) and its ``contextId``
  (the child id) are functions of the parent's session and tool call. The child's ref
  is saved before the message goes and, with the task's id in its address, as soon as
  the agent names the task, before anything of it is forwarded. A restarted parent
  rejoins that task (``SubscribeToTask``, or ``GetTask`` once it is over); a parent
  that died before the task's id was recorded finds it by its ``contextId``
  (``ListTasks``) and sends nothing again.
- the task's messages, artifacts and end are forwarded into the parent's log as
  ``ChildEvent``s, each once: after a break (of the stream, of either process) the
  task's snapshot is compared with what the parent's log holds (``_child_projection``).
- ``input-required`` (and ``auth-required``) is a request for input the helix root
  sees and answers like any other (``SubmitInput`` down the path); the answer is the
  follow-up message on the same task.
- the parent's interrupt or abort cancels the task (``CancelTask``, through the
  outbox), its trace context goes with every call (W3C ``traceparent`` header), and
  usage the agent reports in its task's metadata counts in the tree's total.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import httpx
from a2a.client import A2ACardResolver
from a2a.types import AgentCard
from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel

from helix_transport._exceptions import HelixError, UsageError
from helix_transport.a2a._child_call import A2AChildCall, child_session_id, first_message
from helix_transport.a2a._child_client import (
    ADDRESS_PREFIX,
    A2AChildClient,
    a2a_address,
    map_a2a_errors,
    remember_card,
    split_address,
)
from helix_transport.a2a.card import SCHEMA_EXTENSION
from helix_transport.agent.tools import Tool, ToolContext, ToolError
from helix_transport.registry import resolve_address

TEXT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "What to ask the agent."}},
    "required": ["message"],
}
"""The input of an agent whose card gives no schema: a text message."""

__all__ = [
    "ADDRESS_PREFIX",
    "SCHEMA_EXTENSION",
    "TEXT_SCHEMA",
    "A2AChildClient",
    "a2a_address",
    "a2a_agent_tool",
    "a2a_agent_tool_from_card",
    "child_session_id",
    "fetch_card",
]


async def fetch_card(url: str, *, timeout_s: float = 10.0) -> AgentCard:
    """The Agent Card the agent at ``url`` serves (``/.well-known/agent-card.json``).

    Raises:
        ConnectError: it could not be fetched.
    """
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        with map_a2a_errors(url):
            return await A2ACardResolver(http, url).get_agent_card()


def a2a_agent_tool(
    card_url_or_card: str | AgentCard | None = None,
    *,
    agent_type: str | None = None,
    name: str | None = None,
    skill: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    input_model: type[BaseModel] | None = None,
    timeout_s: float | None = None,
) -> Tool:
    """A tool that delegates to an A2A agent, as ``remote_agent_tool`` does to a helix one.

    Args:
        card_url_or_card: the agent's ``AgentCard`` (its schema and description are the
            tool's), or its base URL (``http://host:port``, or ``a2a:http://host:port``;
            its card is fetched at the first call); ``None``: look ``agent_type`` up in
            the mesh registry at call time, like ``remote_agent_tool`` (an entry
            ``HELIX_AGENT_ADDRESS_<TYPE>=a2a:http://host:port``).
        agent_type: what the parent's tree calls the agent (default: the card's name).
        name: the tool name the parent's model sees (default: from the card's name).
        skill: the skill whose input schema is the tool's (default: the card's first).
        description: what the model is told (default: the card's and skill's).
        parameters: the input JSON schema, overriding the card's. Without one, the
            input is ``{"message": string}``, sent as a text part; with one, the
            arguments are sent as one data part.
        input_model: the input as a pydantic model, overriding both.
        timeout_s: give up on the task after this long, canceling it.

    The tool returns the task's output (its artifacts' one data part, or their text);
    a task that fails, is canceled or rejected becomes ``{"error": ...}`` for the model.

    Raises:
        UsageError: neither an agent nor an ``agent_type``, or a card with no interface.
    """
    url, card = "", None
    if isinstance(card_url_or_card, AgentCard):
        card = card_url_or_card
        if not card.supported_interfaces:
            raise UsageError(f"A2A agent card {card.name!r} names no interface")
        url = card.supported_interfaces[0].url
        remember_card(url, card)
    elif card_url_or_card:
        url = _url_of(card_url_or_card)
    elif not agent_type:
        raise UsageError("a2a_agent_tool needs a card, its URL, or an agent_type")
    chosen = None
    if card is not None:
        chosen = next((s for s in card.skills if s.id == skill), None) if skill else None
        if skill and chosen is None:
            raise UsageError(f"A2A agent {card.name!r} has no skill {skill!r}")
        chosen = chosen or (card.skills[0] if card.skills else None)
    schema = parameters or (_card_schema(card, chosen.id if chosen else "") if card else None)
    about = description or " ".join(
        d for d in (card.description if card else "", chosen.description if chosen else "") if d
    )
    label = agent_type or (card.name if card else "") or url
    return Tool(
        name=name or _tool_name(label),
        description=about or f"Delegate to the A2A agent {label}.",
        args_model=input_model,
        parameters=None if input_model else (schema or TEXT_SCHEMA),
        fn=_A2ADelegation(
            url=url,
            agent_type=label,
            text_only=input_model is None and not schema,
            timeout_s=timeout_s,
        ),
    )


async def a2a_agent_tool_from_card(
    url: str, *, timeout_s: float | None = None, **options: Any
) -> Tool:
    """``a2a_agent_tool`` for the agent at ``url``, its card fetched now (so the model
    sees its schema and description from the start). ``options``: as ``a2a_agent_tool``.

    Raises:
        ConnectError: the card could not be fetched.
    """
    return a2a_agent_tool(await fetch_card(_url_of(url)), timeout_s=timeout_s, **options)


def _url_of(target: str) -> str:
    return split_address(target)[0] if target.startswith(ADDRESS_PREFIX) else target


def _registry_url(agent_type: str) -> str:
    target = resolve_address(agent_type)
    if not target.startswith(ADDRESS_PREFIX):
        raise UsageError(
            f"the registry's entry for {agent_type!r} ({target}) is not an A2A agent: "
            f"write it {ADDRESS_PREFIX}http://host:port"
        )
    return _url_of(target)


def _card_schema(card: AgentCard, skill_id: str) -> dict[str, Any] | None:
    """The skill's input schema, from the card's ``SCHEMA_EXTENSION`` (a helix
    service's card has it, any other agent's may: A2A's skill has no schema field)."""
    for extension in card.capabilities.extensions:
        if extension.uri == SCHEMA_EXTENSION:
            schemas = MessageToDict(extension.params)
            entry = schemas.get(skill_id) or next(iter(schemas.values()), None)
            schema = entry.get("input_schema") if isinstance(entry, dict) else None
            if isinstance(schema, dict) and schema:
                return schema
    return None


def _tool_name(card_name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]+", "_", card_name).strip("_")[:64] or "a2a_agent"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _A2ADelegation:
    url: str
    agent_type: str
    text_only: bool
    timeout_s: float | None

    async def __call__(self, ctx: ToolContext, args: Any) -> Any:
        arguments = args.model_dump(mode="json") if isinstance(args, BaseModel) else args
        try:
            url = self.url or _registry_url(self.agent_type)
            client = await ctx.run.clients.get(a2a_address(url))
        except HelixError as exc:
            raise ToolError(f"{self.agent_type}: {exc.message}") from exc
        if not isinstance(client, A2AChildClient):  # the pool's scheme, registered on import
            raise ToolError(f"{self.agent_type}: {url} is not reached as an A2A agent")
        call = A2AChildCall(ctx, client, agent_type=self.agent_type)
        message = first_message(call.child_id, arguments, text_only=self.text_only)
        return await call.run(message, timeout_s=self.timeout_s)
