"""Delegation spans of children a tool starts and leaves running: dispatched tasks
(``run_subagent``) and companions.

The remote-agent tool follows its child to its end within one tool call, so a
resumed parent re-running that call opens its span again. These children outlive
the call that started them: the span is opened before the child's ``Start`` (its
trace context goes into the child's metadata), ended when the parent records how
the child ended, steps or runs later, and kept meanwhile in the run's state, which
is checkpointed.

A stopped run exports none of its open delegation spans (``SpanHooks.on_run_end``),
so the resumed run opens each again, with the same id (``span_id_for`` the child
session id), at its first step (``reopen_delegations``), and each is exported once.
Not opened again: a span whose child's ref already records an end (the run that
recorded it ended the span, even if it stopped before a checkpoint could say so),
nor one of an earlier turn (that turn's run ended, and cut it off).

Without tracing (``NO_HOOKS``) nothing is kept and nothing is read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from helix_transport._events import SessionStatus
from helix_transport._exceptions import HelixError
from helix_transport.agent.hooks import NO_HOOKS
from helix_transport.agent.state import OpenSpan
from helix_transport.agent.tools import ToolContext

logger = logging.getLogger("helix.tracing")


def _opened(ctx: ToolContext) -> set[str]:
    return ctx.run.cache.spans_opened


def _turn(ctx: ToolContext) -> int:
    return ctx.run.state.turns.turn


def open_delegation(
    ctx: ToolContext, *, child_session_id: str, agent_type: str
) -> Mapping[str, str]:
    """Open the span of a child the tool call ``ctx`` starts; returns its trace context,
    for ``child_metadata``."""
    if ctx.run.hooks is NO_HOOKS:
        return {}
    ctx.run.state.delegations.open[child_session_id] = OpenSpan(
        tool_call_id=ctx.tool_call_id, agent_type=agent_type, turn=_turn(ctx)
    )
    _opened(ctx).add(child_session_id)
    return ctx.run.hooks.on_delegation_start(
        tool_call_id=ctx.tool_call_id, child_session_id=child_session_id, agent_type=agent_type
    )


def end_delegation(
    ctx: ToolContext, *, child_session_id: str, status: SessionStatus, error: str = ""
) -> None:
    """End the child's span with how it ended; nothing when it is not open (ended
    already, or cut off with an earlier turn's run)."""
    span = ctx.run.state.delegations.open.pop(child_session_id, None)
    if span is None:
        return
    ctx.run.hooks.on_delegation_end(
        tool_call_id=span.tool_call_id,
        child_session_id=child_session_id,
        status=status,
        error=error,
    )


async def reopen_delegations(ctx: ToolContext) -> None:
    """At a run's first step: open again the spans an earlier run of this turn left
    open (see the module docstring). One read of the refs, and only when there are any."""
    if ctx.run.cache.spans_reopened or ctx.run.hooks is NO_HOOKS:
        return
    ctx.run.cache.spans_reopened = True
    spans, turn, opened = ctx.run.state.delegations.open, _turn(ctx), _opened(ctx)
    if not spans:
        return
    for child_id in [c for c, span in spans.items() if span.turn != turn]:
        del spans[child_id]
    left = [c for c in spans if c not in opened]
    if not left:
        return
    try:
        listed = await ctx.run.store.list_subsession_refs(ctx.session_id)
    except HelixError:  # only traces would miss them: lost, never exported twice
        logger.warning("session %s: delegation spans not reopened", ctx.session_id)
        return
    refs = {r.child_session_id: r for r in listed}
    for child_id in left:
        ref = refs.get(child_id)
        if ref is None or ref.status is not SessionStatus.RUNNING:
            del spans[child_id]
            continue
        span = spans[child_id]
        opened.add(child_id)
        ctx.run.hooks.on_delegation_start(
            tool_call_id=span.tool_call_id,
            child_session_id=child_id,
            agent_type=span.agent_type,
        )
