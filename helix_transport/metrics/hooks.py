"""Metrics of a run, taken from the run loop's lifecycle hooks (``RunHooks``).

The hooks already mark every point worth measuring (a model call, a tool call, a
delegation, the run's end), for tracing; metrics observe the same points, so the loop
has no second set of calls. One ``MetricsHooks`` per run, beside the tracing hooks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from helix_transport._events import SessionStatus
from helix_transport.agent.definition import Agent, HooksFactory
from helix_transport.agent.hooks import FanOut, RunHooks
from helix_transport.agent.tools import FINISH_TOOL
from helix_transport.metrics.instruments import instruments
from helix_transport.store import SessionRecord, Usage

if TYPE_CHECKING:
    from helix_transport.agent.model import ModelResponse

__all__ = ["MetricsHooks", "metered_hooks"]

_WAKE_REASONS = frozenset({"input", "interrupt", "deadline", "child"})
"""Why a suspended session runs again: the values of ``helix.resume.reason`` from
``on_resumed`` (anything else is counted as "other": a label's values stay few)."""

_UNKNOWN_TOOL = "unknown"
"""The label of a tool the model named but the agent does not have (the model's
output must not choose label values)."""


def metered_hooks(inner: HooksFactory | None) -> HooksFactory:
    """``inner``'s hooks (tracing, say) with a ``MetricsHooks`` beside them."""

    def hooks_for(agent: Agent, record: SessionRecord) -> RunHooks:
        mine = MetricsHooks(agent)
        return mine if inner is None else FanOut(inner(agent, record), mine)

    return hooks_for


def _provider(model: str) -> dict[str, str]:
    """litellm's ``provider/model`` prefix as ``gen_ai.provider.name``, when there is one."""
    provider, slash, _ = model.partition("/")
    return {"gen_ai.provider.name": provider} if slash else {}


class MetricsHooks:
    """Records one run's steps, model calls, tool calls, delegations and end."""

    def __init__(self, agent: Agent) -> None:
        self._agent_type = {"helix.agent_type": agent.name}
        self._tools = frozenset([*(t.name for t in agent.tools), FINISH_TOOL])
        self._step_started: float | None = None
        self._tool_started: dict[str, float] = {}
        self._child_started: dict[tuple[str, str], tuple[float, str]] = {}

    def _end_step(self) -> None:
        if self._step_started is not None:
            elapsed = time.monotonic() - self._step_started
            instruments().step_duration.record(elapsed, self._agent_type)
            self._step_started = None

    def on_run_start(self, *, resumed: bool, step: int) -> None:
        pass  # resumes are counted by the runner, which knows why (restart, takeover)

    def on_turn_start(self, *, turn: int, message: str, fresh: bool) -> None:
        pass

    def on_run_end(self, *, status: SessionStatus, usage: Usage, error: str) -> None:
        if status is SessionStatus.RUNNING:
            return  # stopped, not ended (a drain, a lost lease): it resumes, maybe elsewhere
        self._end_step()
        if status is SessionStatus.SUSPENDED:
            return  # waits for people, not ended: counted by on_suspended
        attributes = {**self._agent_type, "helix.session.status": status.value}
        instruments().sessions_ended.add(1, attributes)

    def on_generation_start(self, *, model: str, messages: Sequence[Mapping[str, Any]]) -> None:
        # A step runs from its model call to the next one (its tool calls, its
        # checkpoint and the interrupt check between), or to the run's end.
        self._end_step()
        self._step_started = time.monotonic()

    def on_generation_end(
        self, *, model: str, output: ModelResponse | None, latency_s: float
    ) -> None:
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
        attributes.update(_provider(model))
        record = instruments()
        if output is None:
            record.model_duration.record(latency_s, {**attributes, "error.type": "error"})
            return
        record.model_duration.record(latency_s, attributes)
        for kind, tokens in (
            ("input", output.usage.prompt_tokens),
            ("output", output.usage.completion_tokens),
        ):
            record.token_usage.record(tokens, {**attributes, "gen_ai.token.type": kind})

    def on_tool_start(self, *, name: str, tool_call_id: str, arguments_json: str) -> None:
        self._tool_started[tool_call_id] = time.monotonic()

    def on_tool_end(
        self, *, name: str, tool_call_id: str, result_json: str, is_error: bool
    ) -> None:
        started = self._tool_started.pop(tool_call_id, None)
        if started is None:
            return
        attributes = {"gen_ai.tool.name": name if name in self._tools else _UNKNOWN_TOOL}
        if is_error:
            attributes["error.type"] = "tool_error"
        instruments().tool_duration.record(time.monotonic() - started, attributes)

    def on_delegation_start(
        self, *, tool_call_id: str, child_session_id: str, agent_type: str
    ) -> Mapping[str, str]:
        self._child_started[tool_call_id, child_session_id] = (time.monotonic(), agent_type)
        return {}

    def on_delegation_end(
        self, *, tool_call_id: str, child_session_id: str, status: SessionStatus, error: str
    ) -> None:
        started = self._child_started.pop((tool_call_id, child_session_id), None)
        if started is None:
            return
        at, agent_type = started
        attributes = {"helix.child.agent_type": agent_type, "helix.session.status": status.value}
        instruments().child_duration.record(time.monotonic() - at, attributes)

    def on_input_required(self, *, request_id: str, tool_name: str, kind: str) -> None:
        pass

    def on_suspended(self, *, request_ids: Sequence[str], suspended_children: int) -> None:
        instruments().sessions_suspended.add(1, self._agent_type)

    def on_resumed(self, *, reason: str, suspended_at: float) -> None:
        # The counter crash recovery counts on (restart, takeover), by the other reasons.
        label = reason if reason in _WAKE_REASONS else "other"
        attributes = {**self._agent_type, "helix.resume.reason": label}
        instruments().sessions_resumed.add(1, attributes)
