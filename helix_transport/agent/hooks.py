"""Lifecycle hooks of a run: what tracing (or anything else) observes of the loop.

``RunLoop`` calls one ``RunHooks`` object per run, at fixed points: run start
(fresh or resumed; then the turn, in a continued session) and end, each model
generation, each tool call, each remote delegation (from the remote-agent
tool, the dispatch tool and the companion tools), and the waits for people: a
request for input, the suspension, the wake-up. Every agent, root or child,
fires its own hooks in its own process.

Hooks observe, they never steer: whatever a hook raises is logged and
swallowed (``guarded``), so a broken exporter can never fail or stop a run.

They live in ``agent/`` (not ``tracing/``) because the loop and the tools call them:
``tracing`` implements them and imports them from here. ``HooksFactory`` is in
``agent.definition``, beside ``Agent`` (here it would import ``definition``, which
imports ``tools``, which imports this module).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from helix_transport._events import SessionStatus
from helix_transport.store import Usage

if TYPE_CHECKING:
    from helix_transport.agent.model import ModelResponse

logger = logging.getLogger("helix.hooks")


class RunHooks(Protocol):
    """Called by the run loop of one session. Implementations must be cheap and non-blocking."""

    def on_run_start(self, *, resumed: bool, step: int) -> None:
        """The run starts (``resumed``: from a checkpoint); ``step`` is the next step."""

    def on_turn_start(self, *, turn: int, message: str, fresh: bool) -> None:
        """The run is in turn ``turn`` (2 or more) of a continued session, begun with
        ``message`` (the turn's input itself when ``fresh``); called right after
        ``on_run_start``. Not called in turn 1, whose input is the session record's.

        Optional: hooks written before it existed need not define it.
        """

    def on_run_end(self, *, status: SessionStatus, usage: Usage, error: str) -> None:
        """The run ends. ``RUNNING`` means it stopped without ending the session
        (process shutdown, lost lease): it will be resumed, possibly elsewhere."""

    def on_generation_start(self, *, model: str, messages: Sequence[Mapping[str, Any]]) -> None:
        """A model call starts with ``messages`` (do not keep or mutate them)."""

    def on_generation_end(
        self, *, model: str, output: ModelResponse | None, latency_s: float
    ) -> None:
        """The model call ended; ``output`` is ``None`` when it failed or was cancelled."""

    def on_tool_start(self, *, name: str, tool_call_id: str, arguments_json: str) -> None:
        """A tool call starts (tool calls of one step run concurrently)."""

    def on_tool_end(
        self, *, name: str, tool_call_id: str, result_json: str, is_error: bool
    ) -> None:
        """A tool call ended with ``result_json`` (what the model sees)."""

    def on_delegation_start(
        self, *, tool_call_id: str, child_session_id: str, agent_type: str
    ) -> Mapping[str, str]:
        """A remote delegation starts, within the tool call ``tool_call_id`` (which may
        start several: ``child_session_id`` tells them apart).

        Returns entries to add to the child's ``StartRequest.metadata`` (W3C
        ``traceparent``/``tracestate``), so the child's spans nest under this one.
        """
        return {}

    def on_delegation_end(
        self, *, tool_call_id: str, child_session_id: str, status: SessionStatus, error: str
    ) -> None:
        """The delegation ended with the child's ``status``."""

    def on_input_required(self, *, request_id: str, tool_name: str, kind: str) -> None:
        """The run asked people for input: ``request_id`` (the tool call's id) waits
        for an approval (``kind`` "approval") or a client tool's result ("client_result").

        Optional, like the two below: hooks written before them need not define them.
        """

    def on_suspended(self, *, request_ids: Sequence[str], suspended_children: int) -> None:
        """The run has nothing left to do but wait: its own ``request_ids`` still
        unanswered, and ``suspended_children`` sub-agents suspended themselves. The
        run ends next (``on_run_end`` with ``SUSPENDED``); no process holds it after."""

    def on_resumed(self, *, reason: str, suspended_at: float) -> None:
        """A run woke the suspended session (``reason``: "input", "interrupt" or
        "deadline"); it had been suspended since ``suspended_at`` (epoch seconds,
        as recorded by whichever process suspended it). Called after ``on_run_start``."""


class NoHooks:
    """Does nothing: the default, and what a run costs without tracing."""

    def on_run_start(self, *, resumed: bool, step: int) -> None:
        pass

    def on_turn_start(self, *, turn: int, message: str, fresh: bool) -> None:
        pass

    def on_run_end(self, *, status: SessionStatus, usage: Usage, error: str) -> None:
        pass

    def on_generation_start(self, *, model: str, messages: Sequence[Mapping[str, Any]]) -> None:
        pass

    def on_generation_end(
        self, *, model: str, output: ModelResponse | None, latency_s: float
    ) -> None:
        pass

    def on_tool_start(self, *, name: str, tool_call_id: str, arguments_json: str) -> None:
        pass

    def on_tool_end(
        self, *, name: str, tool_call_id: str, result_json: str, is_error: bool
    ) -> None:
        pass

    def on_delegation_start(
        self, *, tool_call_id: str, child_session_id: str, agent_type: str
    ) -> Mapping[str, str]:
        return {}

    def on_delegation_end(
        self, *, tool_call_id: str, child_session_id: str, status: SessionStatus, error: str
    ) -> None:
        pass

    def on_input_required(self, *, request_id: str, tool_name: str, kind: str) -> None:
        pass

    def on_suspended(self, *, request_ids: Sequence[str], suspended_children: int) -> None:
        pass

    def on_resumed(self, *, reason: str, suspended_at: float) -> None:
        pass


NO_HOOKS: Final[RunHooks] = NoHooks()


class FanOut:
    """Calls several hooks in order; logs and swallows whatever any of them raises."""

    def __init__(self, *hooks: RunHooks) -> None:
        self.hooks = hooks

    def _each(self, method: str, *, optional: bool = False, **kwargs: Any) -> list[Any]:
        results = []
        for hook in self.hooks:
            if optional and not hasattr(hook, method):
                continue  # a hook written before the method was added to RunHooks
            try:
                results.append(getattr(hook, method)(**kwargs))
            except Exception:
                logger.warning("run hook %s.%s failed", type(hook).__name__, method, exc_info=True)
        return results

    def on_run_start(self, *, resumed: bool, step: int) -> None:
        self._each("on_run_start", resumed=resumed, step=step)

    def on_turn_start(self, *, turn: int, message: str, fresh: bool) -> None:
        self._each("on_turn_start", optional=True, turn=turn, message=message, fresh=fresh)

    def on_run_end(self, *, status: SessionStatus, usage: Usage, error: str) -> None:
        self._each("on_run_end", status=status, usage=usage, error=error)

    def on_generation_start(self, *, model: str, messages: Sequence[Mapping[str, Any]]) -> None:
        self._each("on_generation_start", model=model, messages=messages)

    def on_generation_end(
        self, *, model: str, output: ModelResponse | None, latency_s: float
    ) -> None:
        self._each("on_generation_end", model=model, output=output, latency_s=latency_s)

    def on_tool_start(self, *, name: str, tool_call_id: str, arguments_json: str) -> None:
        self._each(
            "on_tool_start", name=name, tool_call_id=tool_call_id, arguments_json=arguments_json
        )

    def on_tool_end(
        self, *, name: str, tool_call_id: str, result_json: str, is_error: bool
    ) -> None:
        self._each(
            "on_tool_end",
            name=name,
            tool_call_id=tool_call_id,
            result_json=result_json,
            is_error=is_error,
        )

    def on_delegation_start(
        self, *, tool_call_id: str, child_session_id: str, agent_type: str
    ) -> Mapping[str, str]:
        merged: dict[str, str] = {}
        for result in self._each(
            "on_delegation_start",
            tool_call_id=tool_call_id,
            child_session_id=child_session_id,
            agent_type=agent_type,
        ):
            try:
                merged.update({str(k): str(v) for k, v in dict(result or {}).items()})
            except Exception:
                logger.warning("run hook returned bad delegation metadata", exc_info=True)
        return merged

    def on_delegation_end(
        self, *, tool_call_id: str, child_session_id: str, status: SessionStatus, error: str
    ) -> None:
        self._each(
            "on_delegation_end",
            tool_call_id=tool_call_id,
            child_session_id=child_session_id,
            status=status,
            error=error,
        )

    def on_input_required(self, *, request_id: str, tool_name: str, kind: str) -> None:
        self._each(
            "on_input_required",
            optional=True,
            request_id=request_id,
            tool_name=tool_name,
            kind=kind,
        )

    def on_suspended(self, *, request_ids: Sequence[str], suspended_children: int) -> None:
        self._each(
            "on_suspended",
            optional=True,
            request_ids=request_ids,
            suspended_children=suspended_children,
        )

    def on_resumed(self, *, reason: str, suspended_at: float) -> None:
        self._each("on_resumed", optional=True, reason=reason, suspended_at=suspended_at)


def guarded(hooks: RunHooks | None) -> RunHooks:
    """``hooks`` made safe to call from the loop (``NO_HOOKS`` stays as it is, free)."""
    if hooks is None:
        return NO_HOOKS
    if type(hooks) in (NoHooks, FanOut):
        return hooks
    return FanOut(hooks)
