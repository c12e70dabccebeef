"""What an agent is: a name, schemas, a prompt, tools and a model."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from helix_transport._exceptions import UsageError
from helix_transport.agent.close_policy import (
    ChildDeclaration,
    ChildKind,
    ClosePolicy,
    child_kind,
    declared_policies,
)
from helix_transport.agent.hooks import RunHooks
from helix_transport.agent.model import Model, model_name
from helix_transport.agent.model_config import ModelConfig, type_env_suffix
from helix_transport.agent.tools import (
    FINISH_TOOL,
    MAX_LIVE_CHILDREN,
    Tool,
    ToolContext,
    is_library_tool,
    reserved_tool_name,
)
from helix_transport.config import Environment
from helix_transport.store import SessionRecord

StepHook = Callable[[ToolContext, list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]]
"""Runs before each model call of a fresh step with the conversation so far (read-only);
returns messages to add first. It may wait (the run is parked; an interrupt still stops
it) and may raise ``AgentRunError`` to fail the run."""

FinishHook = Callable[[ToolContext, list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]]
"""Runs when the model's ``__finish__`` would complete the run, with the conversation
so far (read-only). Returning messages holds the finish: they join the conversation
and the run goes on with one more pass (a ``WAIT`` close policy: the results of the
tasks it waited for). It may wait (an interrupt still stops it)."""

HooksFactory = Callable[["Agent", SessionRecord], RunHooks]
"""Makes the hooks of one run (a server calls it once per run it starts or resumes)."""

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


@dataclass(frozen=True, kw_only=True)
class Agent:
    """An agent type. One service hosts one agent.

    Example::

        agent = Agent(
            name="summarizer",
            description="Summarizes text.",
            input_model=SummarizeInput,
            output_model=Summary,
            system_prompt="Summarize the user's text.",
            model="openai/gpt-4o-mini",
        )
    """

    name: str
    """The agent type: lower-case letters, digits, ``-`` and ``_``."""
    description: str
    input_model: type[BaseModel]
    """Schema of the session input (``StartRequest.input_json``)."""
    output_model: type[BaseModel]
    """Schema of the output the run must produce through ``__finish__``."""
    system_prompt: str = ""
    tools: Sequence[Tool] = ()
    model: str | Model = ""
    """A litellm model name (e.g. ``openai/gpt-4o-mini``, ``scripted/researcher``),
    which ``HELIX_MODEL_<TYPE>``, then ``HELIX_MODEL``, replace (``model_config``); or a
    ``Model`` to call instead of litellm (the environment does not replace it)."""
    model_num_retries: int | None = None
    """Further attempts after a failed model call (litellm's ``num_retries``)."""
    model_timeout_s: float | None = None
    """Seconds a model call may take (litellm's ``timeout``)."""
    model_fallbacks: Sequence[str] = ()
    """Models litellm tries in order when a call fails after its retries."""
    max_steps: int = 10
    """Model turns allowed before the run fails with ``max_steps``."""
    model_settings: dict[str, Any] = field(default_factory=dict)
    """Extra litellm completion arguments (``temperature``...)."""
    step_hooks: Sequence[StepHook] = ()
    """Called at the start of each fresh step, before the model call (not when a
    resumed step re-runs checkpointed tool calls); the messages they return join the
    conversation and are checkpointed with it. The companion tools deliver the
    outcomes of finished children this way (``helix_transport.delegation.companions``)."""
    recursive: bool = False
    """Whether a session of this type may be started below another of its type (a
    delegation path that holds it already: ``a > b > a``). Off, such a ``Start`` is
    refused, so a cycle of agents cannot recurse without end; on, only the server's
    maximum delegation depth (``Limits.max_delegation_depth``) bounds it."""
    max_live_children: int = MAX_LIVE_CHILDREN
    """Children (remote calls, companions, ``run_subagent`` tasks) one session may have
    running at once; a call that would start more gets an error result. 0: no limit."""

    children: Sequence[ChildDeclaration] = ()
    """The close policy of each kind and type of child the agent may have (``with_dispatch``
    and ``with_companions`` add theirs; a remote agent tool's is its ``Tool.child``). A
    child not declared is terminated when the parent's turn ends."""
    finish_hooks: Sequence[FinishHook] = ()
    """Called, in order, when a ``__finish__`` would complete the run; the first that
    returns messages holds it (see ``FinishHook``)."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise UsageError(f"agent name {self.name!r} must match {_NAME.pattern}")
        try:
            self._defined_model_config()
        except UsageError as exc:
            raise UsageError(f"agent {self.name!r}: {exc}") from None
        if self.max_steps < 1:
            raise UsageError(f"agent {self.name!r}: max_steps must be at least 1")
        if self.max_live_children < 0:
            raise UsageError(f"agent {self.name!r}: max_live_children must not be negative")
        names = [t.name for t in self.tools]
        if FINISH_TOOL in names or len(set(names)) != len(names):
            raise UsageError(
                f"agent {self.name!r}: tool names must be unique and not {FINISH_TOOL}"
            )
        for t in self.tools:
            # The companions' tools and the like pass: the library marked them its own.
            if reserved_tool_name(t.name) and not is_library_tool(t):
                raise UsageError(
                    f"agent {self.name!r}: tool name {t.name!r} is reserved (names starting "
                    "with '__' or 'companion__' are the library's own tools)"
                )
        try:
            self._close_policies  # noqa: B018 (validated at definition, then cached)
        except UsageError as exc:
            raise UsageError(f"agent {self.name!r}: {exc}") from None

    @functools.cached_property
    def _close_policies(self) -> dict[tuple[ChildKind, str], ClosePolicy]:
        tools = [t.child for t in self.tools if t.child is not None]
        return declared_policies([*self.children, *tools])

    def close_policy(self, kind: ChildKind | None, agent_type: str) -> ClosePolicy:
        """The declared close policy of a child of ``kind`` and ``agent_type``
        (``TERMINATE`` when none is declared)."""
        if kind is None:
            return ClosePolicy.TERMINATE
        return self._close_policies.get((kind, agent_type), ClosePolicy.TERMINATE)

    def close_policy_of(
        self, parent_session_id: str, child_session_id: str, agent_type: str
    ) -> ClosePolicy:
        """The close policy of a recorded child (its kind read from its id)."""
        return self.close_policy(child_kind(parent_session_id, child_session_id), agent_type)

    def _defined_model_config(self) -> ModelConfig:
        return ModelConfig(
            model=model_name(self.model),
            num_retries=self.model_num_retries,
            timeout_s=self.model_timeout_s,
            fallbacks=tuple(self.model_fallbacks),
        )

    def model_config(self) -> ModelConfig:
        """The model and litellm's retries, timeout and fallbacks for this agent type:
        its ``HELIX_MODEL_<TYPE>``/``HELIX_LLM_*_<TYPE>`` variables, then the
        process-wide ones, then the definition (``helix_transport.agent.model_config``).

        Raises:
            UsageError: no model anywhere, or a variable that is not a number.
        """
        env = Environment().model(self.name)
        config = self._defined_model_config().with_settings(env, agent_type=self.name)
        if not isinstance(self.model, str):  # a model object is the one called, whatever the env
            config = replace(config, model=self.model.model_name)
        if not config.model:
            raise UsageError(
                f"agent {self.name!r} has no model; set Agent.model, HELIX_MODEL or "
                f"HELIX_MODEL_{type_env_suffix(self.name)}"
            )
        return config

    def resolved_model(self) -> str:
        """The name of the model this agent type calls now (``model_config().model``)."""
        return self.model_config().model

    def plugged_model(self) -> Model | None:
        """The ``Model`` given as ``model``; ``None`` for a litellm model name."""
        return None if isinstance(self.model, str) else self.model

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name``, if the agent has it."""
        return next((t for t in self.tools if t.name == name), None)

    @functools.cached_property
    def _schemas(self) -> list[dict[str, Any]]:
        return self._build_tool_schemas()

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Schemas of every tool, ``__finish__`` last, as litellm expects them (cached)."""
        return self._schemas

    def _build_tool_schemas(self) -> list[dict[str, Any]]:
        finish = {
            "type": "function",
            "function": {
                "name": FINISH_TOOL,
                "description": "Finish the task: call this with the final output.",
                "parameters": self.output_model.model_json_schema(),
            },
        }
        return [*(t.schema() for t in self.tools), finish]

    def input_schema_json(self) -> str:
        """The input JSON schema, as ``Describe`` returns it."""
        return json.dumps(self.input_model.model_json_schema())

    def output_schema_json(self) -> str:
        """The output JSON schema, as ``Describe`` returns it."""
        return json.dumps(self.output_model.model_json_schema())
