"""Remote sub-agents: a child agent in another service, seen by its parent as a tool.

A call of the tool starts (or rejoins) the child session
``{parent_session_id}-remote-{tool_call_id}-{scope}`` over the child's ``AgentService``
(``scope``: a digest of the parent's agent type and owner, see ``child_scope``)
and forwards every child event into the parent's log, in this order::

    tool_start (parent) · subagent_start · child_event… · subagent_end · tool_end (parent)

Because the child id is a function of the parent's tool call, and the parent
checkpoints its tool calls before running them, a resumed parent calls the same
child again: ``Start`` is idempotent, so the child never runs twice, and the
parent continues the child's stream right after the last child event its own
log holds (nothing lost, nothing duplicated). A child that finished meanwhile
simply replays its remaining events and its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from typing import Any

from pydantic import BaseModel

from helix_transport._config import RetryConfig
from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    HelixError,
    LeaseLost,
    SequenceConflict,
    SessionExists,
    StoreUnavailable,
)
from helix_transport._limits import SessionLimits
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.close_policy import ChildDeclaration, ChildKind, ClosePolicy
from helix_transport.agent.tools import (
    Tool,
    ToolContext,
    ToolError,
    derived_session_id,
    reserve_children,
)
from helix_transport.delegation.cascade import Cascade
from helix_transport.delegation.child_records import (
    child_metadata,
    record_child_end,
    subagent_started,
)
from helix_transport.delegation.forwarding import forward_child, forwarded_so_far, new_child
from helix_transport.delegation.starts import start_window
from helix_transport.log.children import Logged
from helix_transport.registry import resolve_address
from helix_transport.store import SubSessionRef
from helix_transport.transport import AgentClient, ClientAuth

logger = logging.getLogger(__name__)


def child_session_id(parent_session_id: str, tool_call_id: str, scope: str) -> str:
    """The deterministic id of the child a tool call starts.

    ``scope`` is the parent's ``ToolContext.child_scope`` (its agent type and owner).
    """
    return derived_session_id(parent_session_id, "remote", tool_call_id, scope)


def remote_agent_tool(
    name: str,
    *,
    agent_type: str,
    address: str | None = None,
    input_model: type[BaseModel] | None = None,
    parameters: dict[str, Any] | None = None,
    description: str = "",
    timeout_s: float | None = None,
    close_policy: ClosePolicy = ClosePolicy.TERMINATE,
    budget_tokens: int | None = None,
    budget_usd: float | None = None,
) -> Tool:
    """A tool that delegates to the agent service for ``agent_type``.

    Args:
        name: the tool name the parent's model sees.
        agent_type: the child's agent type.
        address: the child service (``host:port``, ``dns:///name:port``); when
            ``None`` it is looked up in the mesh registry at call time
            (``HELIX_AGENT_ADDRESS_<TYPE>``).
        input_model: the child's input schema, validated before the call.
        parameters: the child's input as a JSON schema, when there is no model
            (see ``remote_agent_tool_from_service``).
        description: what the parent's model is told the tool does.
        timeout_s: give up on the child after this long, interrupting it.
        close_policy: what the parent's end (a failure, an interrupt: a call waits
            for its child otherwise) does to the child: ``TERMINATE`` or ``ABANDON``.
        timeout_s: give up on the child after this long, interrupting it; also the
            child's deadline (``StartRequest.limits``), within the parent's own.
        budget_tokens: the tokens the child's subtree may use, within what the
            parent has left of its own budget.
        budget_usd: likewise, in US dollars.

    The tool returns the child's output JSON; a child that fails, times out or
    cannot be reached becomes ``{"error": ...}`` for the model.
    """
    delegate = _RemoteDelegation(
        agent_type=agent_type,
        address=address,
        timeout_s=timeout_s,
        budget=SessionLimits(budget_tokens=budget_tokens, budget_usd=budget_usd),
    )
    return Tool(
        name=name,
        description=description or f"Delegate to the {agent_type} agent.",
        args_model=input_model,
        parameters=parameters,
        fn=delegate,
        child=ChildDeclaration(
            kind=ChildKind.REMOTE, agent_type=agent_type, close_policy=close_policy
        ),
    )


async def remote_agent_tool_from_service(
    name: str,
    *,
    address: str,
    client: AgentClient | None = None,
    timeout_s: float | None = None,
    auth: ClientAuth | None = None,
) -> Tool:
    """Build the tool from the child service's ``Describe`` answer alone.

    ``auth`` is what to present to ``Describe`` when no ``client`` is given; the
    tool's calls go through the parent service's pool and its credentials.
    """
    owned = client is None
    client = client or await AgentClient.connect(address, auth=auth)
    try:
        described = await client.describe()
    finally:
        if owned:
            await client.aclose()
    return remote_agent_tool(
        name,
        agent_type=described.agent_type,
        address=address,
        parameters=json.loads(described.input_schema_json),
        description=described.description,
        timeout_s=timeout_s,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _RemoteDelegation:
    agent_type: str
    address: str | None
    timeout_s: float | None
    budget: SessionLimits = SessionLimits.none

    async def __call__(self, ctx: ToolContext, args: Any) -> Any:
        input_json = args.model_dump_json() if isinstance(args, BaseModel) else json.dumps(args)
        try:
            address = self.address or resolve_address(self.agent_type)
            client = await ctx.run.clients.get(address)
        except HelixError as exc:
            raise ToolError(f"{self.agent_type}: {exc.message}") from exc
        call = _ChildCall(
            ctx, client, agent_type=self.agent_type, address=address, budget=self.budget
        )
        return await call.run(input_json, timeout_s=self.timeout_s)


class _ChildCall:
    """One delegation: start or rejoin the child, forward its events, return its output."""

    def __init__(
        self,
        ctx: ToolContext,
        client: AgentClient,
        *,
        agent_type: str,
        address: str,
        budget: SessionLimits = SessionLimits.none,
    ) -> None:
        self.ctx = ctx
        self.budget = budget
        self.client = client
        self.agent_type = agent_type
        self.address = address
        self.child_id = child_session_id(ctx.session_id, ctx.tool_call_id, ctx.child_scope)
        self.ref = SubSessionRef(
            parent_session_id=ctx.session_id,
            child_session_id=self.child_id,
            agent_type=agent_type,
            tool_call_id=ctx.tool_call_id,
            address=address,
        )

    async def run(self, input_json: str, *, timeout_s: float | None = None) -> Any:
        ctx = self.ctx
        await reserve_children(ctx, [self.child_id])
        existing = await ctx.run.store.get_subsession_ref(ctx.session_id, self.child_id)
        logged = Logged()
        if existing is not None:  # a resumed parent rejoining its child
            self.ref = dataclasses.replace(existing, address=self.address)
            logged = await forwarded_so_far(ctx).logged(ctx.tool_call_id)
            if logged.end is not None:  # its end is in the log: the call is over
                return await self._ended_before(logged.end)
        else:
            new_child(ctx, self.child_id)
        # The ref before anything else (a rejoined child's with this process's address):
        # an interrupt cascading while the Start is in flight finds the child (see
        # Cascade), and a parent resumed after its subagent_start reached the log rejoins
        # (the log is read only then).
        await self._save()
        if self.child_id not in logged.started:
            ctx.emit(
                subagent_started(
                    tool_call_id=ctx.tool_call_id,
                    child_id=self.child_id,
                    agent_type=self.agent_type,
                    address=self.address,
                )
            )
        # The trace context of this delegation (W3C `traceparent`), for the child's spans.
        trace_context = ctx.run.hooks.on_delegation_start(
            tool_call_id=ctx.tool_call_id,
            child_session_id=self.child_id,
            agent_type=self.agent_type,
        )
        metadata = child_metadata(ctx, trace_context)
        # An unreachable child is not a failed child: Start and the stream retry without
        # a deadline, so only the tool's timeout, the parent's interrupt (cancellation)
        # or a definitive answer from the child's service ends the wait.
        retry = self.client.config.reconnect.until_cancelled()
        started = False
        try:
            # The timeout covers the child's work, not the recording of its end: expiring
            # there would end one call twice (a second subagent_end, a completed child
            # reported timed out).
            async with asyncio.timeout(timeout_s):
                await self._start(input_json, metadata, retry, timeout_s)
                started = True
                final = await self._forward(retry, rejoining=existing is not None)
                final = final or await self._final_from_status()
        except TimeoutError:
            await self.give_up(f"timed out after {timeout_s:g}s")
            raise ToolError(f"{self.agent_type} timed out after {timeout_s:g}s") from None
        except SessionExists as exc:
            return await self._end(
                SessionStatus.FAILED, error=f"{exc.message} (a different call owns it)"
            )
        except (StoreUnavailable, SequenceConflict, LeaseLost):
            # The parent's own log or ref could not be written: the run pauses (or this
            # replica lost it) and a resumed parent rejoins the child, which runs on.
            raise
        except HelixError as exc:
            # A definitive answer (the child is gone, its log is broken, the call was
            # refused): no retry changes it.
            if started:
                await self._stop(f"parent {ctx.session_id} lost its stream")
            return await self._end(SessionStatus.FAILED, error=f"{self.agent_type}: {exc.message}")
        kind = final.WhichOneof("payload")
        if kind == "completed":
            return await self._end(SessionStatus.COMPLETED, output_json=final.completed.output_json)
        if kind == "failed":
            return await self._end(SessionStatus.FAILED, error=final.failed.error)
        status = SessionStatus.INTERRUPTED if kind == "interrupted" else SessionStatus.TERMINATED
        limit = final.interrupted.limit_exceeded if kind == "interrupted" else ""
        if limit:  # what the parent's model is told: why, so it can answer without it
            return await self._end(status, error=f"{self.agent_type} stopped: {limit}")
        return await self._end(status, error=f"{self.agent_type} was {status.value}")

    async def _start(
        self,
        input_json: str,
        metadata: dict[str, str],
        retry: RetryConfig,
        timeout_s: float | None,
    ) -> None:
        ctx = self.ctx
        async with start_window(self.client):  # a fan-out's Starts a window at a time
            await self.client.start(
                input_json,
                session_id=self.child_id,
                parent_session_id=ctx.session_id,
                metadata=metadata,
                retry=retry,
                delegation_path=ctx.child_delegation_path,
                limits=ctx.child_limits(self.own_limits(timeout_s)),
            )

    def own_limits(self, timeout_s: float | None) -> SessionLimits:
        """The child's own limits: the tool's budget, and its timeout as a deadline."""
        if timeout_s is None:
            return self.budget
        return dataclasses.replace(self.budget, deadline=time.time() + timeout_s)

    async def _ended_before(self, end: pb.SubagentEnd) -> Any:
        """The call's result as the ``subagent_end`` already in the log records it (a run
        that stopped after writing it, before its checkpoint held the result)."""
        status = SessionStatus.from_proto(end.status)
        if self.ref.status is SessionStatus.RUNNING:  # the ref's end may not have landed
            await self._save(
                status=status,
                output_json=end.output_json,
                error=end.error,
                completed_at=time.time(),
            )
        if status is not SessionStatus.COMPLETED:
            raise ToolError(end.error)
        return json.loads(end.output_json)

    async def _forward(self, retry: RetryConfig, *, rejoining: bool) -> pb.StreamEvent | None:
        """Forward the child's events the parent's log lacks; return the terminal one.

        ``None`` when the parent's log already held every event of the finished child.
        """
        return await forward_child(
            self.ctx,
            child_id=self.child_id,
            tool_call_id=self.ctx.tool_call_id,
            client=self.client,
            retry=retry,
            rejoining=rejoining,
        )

    async def _final_from_status(self) -> pb.StreamEvent:
        """The child's outcome as a terminal event, read from its status."""
        status = await self.client.get_status(self.child_id)
        if status.status == pb.SESSION_STATUS_COMPLETED:
            return pb.StreamEvent(completed=pb.Completed(output_json=status.output_json))
        if status.status == pb.SESSION_STATUS_FAILED:
            return pb.StreamEvent(
                failed=pb.Failed(error=status.error, failure_reason=status.failure_reason)
            )
        if status.status == pb.SESSION_STATUS_INTERRUPTED:
            return pb.StreamEvent(interrupted=pb.Interrupted(limit_exceeded=status.limit_exceeded))
        return pb.StreamEvent(terminated=pb.Terminated())

    async def _end(self, status: SessionStatus, *, output_json: str = "", error: str = "") -> Any:
        self.ref = await record_child_end(
            self.ctx, self.ref, status=status, output_json=output_json, error=error
        )
        if status is not SessionStatus.COMPLETED:
            raise ToolError(error)
        return json.loads(output_json)

    async def _save(self, **changes: Any) -> None:
        self.ref = dataclasses.replace(self.ref, **changes)
        await self.ctx.run.store.put_subsession_ref(self.ref)

    async def _stop(self, reason: str) -> None:
        """Ask the child to stop: a child the parent no longer follows must not run on
        unseen, its ref failed and out of any later cascade's reach."""
        cascade = Cascade(self.ctx.run.store, self.ctx.run.clients)
        await cascade.interrupt_refs([self.ref], reason=reason)  # running: saved before Start

    async def give_up(self, reason: str) -> None:
        """Interrupt the child and record the call as failed.

        Asked as a cascade asks (see ``Cascade``): a child whose ``Start`` is still on
        its way when the call gives up is asked again until it exists, in the
        background; asked once, it would run to its end unseen, its ref failed.
        """
        await self._stop(reason)
        with contextlib.suppress(ToolError):
            await self._end(SessionStatus.FAILED, error=f"{self.agent_type} {reason}")
