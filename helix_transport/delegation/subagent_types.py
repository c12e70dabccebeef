"""What ``run_subagent`` may call and how a call is written: the declared types, the
virtual one-shot sub-agent, the tool's arguments and description, and the context a
task may inherit (``helix_transport.delegation.dispatch`` runs them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from helix_transport._exceptions import UsageError
from helix_transport.agent.close_policy import ChildDeclaration, ChildKind, ClosePolicy
from helix_transport.agent.definition import Agent

MAX_TASKS = 64
"""Tasks one call may dispatch."""

REASONING_KEYS = frozenset({"reasoning_content", "thinking_blocks", "reasoning"})
"""Where litellm's messages carry a model's reasoning: never passed to a child."""


@dataclass(frozen=True, kw_only=True)
class SubagentType:
    """An agent type ``run_subagent`` may dispatch to, by registry name."""

    agent_type: str
    input_field: str | None = "message"
    """A task's message becomes the child's input ``{input_field: message}``; with
    ``None`` the message must be the child's input JSON."""
    address: str | None = None
    """The child service's address; ``None`` looks it up at call time."""
    description: str = ""
    """What the type does, shown to the parent's model in the tool's description: the
    model picks a type by it."""
    close_policy: ClosePolicy = ClosePolicy.TERMINATE
    """What the parent's end does to this type's tasks still out (``dispatch``'s docstring)."""

    def __post_init__(self) -> None:
        self.declaration()  # a wrong policy fails at definition

    def declaration(self) -> ChildDeclaration:
        """The type's close policy, as the parent ``Agent`` declares it."""
        return ChildDeclaration(
            kind=ChildKind.TASK, agent_type=self.agent_type, close_policy=self.close_policy
        )


@dataclass(frozen=True, kw_only=True)
class VirtualTasks:
    """Tasks that name no agent: a one-shot child of the parent's own type, on the
    parent's own service, with its model and a subset of its tools (never
    ``run_subagent``: a virtual child dispatches nothing further)."""

    input_field: str | None = "message"
    """As ``SubagentType.input_field``, for the parent's own input model."""
    tools: Sequence[str] | None = None
    """The parent's tools the child may call, by name; ``None``: all the parent has when
    dispatch is attached, but ``run_subagent``."""
    address: str | None = None
    """The parent's own service; ``None`` looks its type up in the registry."""
    description: str = "a one-shot sub-agent like you: your model and tools"
    """How the tool's description presents it."""


class Task(BaseModel):
    agent: str | None = Field(
        default=None,
        description="The agent type to run the task; omit it for a one-shot sub-agent of "
        "your own kind (when offered), and when continuing a conversation by its key.",
    )
    message: str = Field(description="The task for that agent.")
    conversation_key: str | None = Field(
        default=None,
        description="A conversation_key an earlier run_subagent result gave: the task "
        "continues that sub-agent's conversation, which remembers the earlier ones.",
    )
    context: Literal["new", "inherit"] = Field(
        default="new",
        description="'inherit': the sub-agent also sees this conversation so far (for a "
        "new conversation only); 'new': only its message.",
    )

    @field_validator("message")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class DispatchArgs(BaseModel):
    tasks: list[Task] = Field(min_length=1, max_length=MAX_TASKS)


def tool_description(types: Mapping[str, SubagentType], virtual: VirtualTasks | None) -> str:
    """``run_subagent``'s description: how it works, and every callable type with what
    it does, so the model can choose."""
    lines = [
        "Run tasks on sub-agents in the background; returns task ids and conversation "
        "keys at once. Their results arrive together in one message when all are done; "
        "finish your current work meanwhile, or stop calling tools to wait. Pass a "
        "task's conversation_key in a later call to continue that conversation.",
        "Sub-agents (agent: what it does):",
    ]
    lines += [f"- {name}: {t.description or '(no description)'}" for name, t in types.items()]
    if virtual is not None:
        lines.append(f"- (no agent): {virtual.description}")
    return "\n".join(lines)


def inherited_context(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The parent's conversation as a child's model may be shown it: no system prompt
    (the child has its own), no reasoning, and no tool call without its result (the
    step dispatching the task is one: a provider refuses an unanswered call)."""
    kept = [dict(m) for m in messages if m.get("role") != "system"]
    answered = {m.get("tool_call_id") for m in kept if m.get("role") == "tool"}
    called: set[Any] = set()
    shown: list[dict[str, Any]] = []
    for message in kept:
        for key in REASONING_KEYS:
            message.pop(key, None)
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls:
            calls = [c for c in calls if c.get("id") in answered]
            called |= {c.get("id") for c in calls}
            if calls:
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls")
                if not message.get("content"):
                    continue
        if message.get("role") == "tool" and message.get("tool_call_id") not in called:
            continue
        shown.append(message)
    return shown


def virtual_tool_names(agent: Agent, virtual: VirtualTasks, tool_name: str) -> tuple[str, ...]:
    """A virtual child's tools, checked against the parent ``agent``."""
    have = [t.name for t in agent.tools if t.name != tool_name]
    chosen = have if virtual.tools is None else list(virtual.tools)
    missing = sorted(set(chosen) - set(have))
    if missing:
        raise UsageError(f"virtual tasks: {agent.name!r} has no tool(s) {missing} to give")
    fields = agent.input_model.model_fields
    if virtual.input_field is not None and virtual.input_field not in fields:
        raise UsageError(
            f"virtual tasks: {agent.name!r}'s input has no field {virtual.input_field!r}"
        )
    return tuple(chosen)
