"""The generic ``AgentService`` servicer: protobuf in, domain calls, protobuf out.

Each method validates its request, maps the caller's session id to the store's key
(``_ownership.storage_id``, here at the boundary and nowhere else) and hands over to
``Sessions``; errors are raised and mapped to statuses by the interceptor.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import grpc

from helix_transport._exceptions import InvalidArgument
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.log import follow
from helix_transport.server import _validation as check
from helix_transport.server._continue import TurnRequest
from helix_transport.server._encoding import MAX_RESPONSE_BYTES, encode_responses
from helix_transport.server._follow import FOLLOW_METHOD, details_of, follow_responses
from helix_transport.server._heartbeat import heartbeat
from helix_transport.server._identity import current_principal
from helix_transport.server._inputs import InputRouter
from helix_transport.server._listing import list_sessions
from helix_transport.server._logging import bind as bind_log_context
from helix_transport.server._ownership import parent_id, storage_id
from helix_transport.server._sessions import Sessions
from helix_transport.server.interceptors import public_status
from helix_transport.store import SessionRecord, input_fingerprint
from helix_transport.tree import token_usage

Context = grpc.aio.ServicerContext[Any, Any]


class AgentServicer(pb_grpc.AgentServiceServicer):
    """Serves one agent's ``sessions`` (its agent, store and limits are theirs)."""

    def __init__(
        self,
        sessions: Sessions,
        *,
        heartbeat_interval_s: float = 5.0,
        charge: Callable[[], None] = lambda: None,
    ) -> None:
        """``charge`` bills one more ``Stream`` to the caller's rate limit (each follow
        of a ``Follow`` call: the interceptor bills the call itself only)."""
        self.sessions = sessions
        self.charge = charge
        self.agent = sessions.agent
        self.store = sessions.store
        self.limits = sessions.limits
        self.heartbeat_interval_s = heartbeat_interval_s
        self.inputs = InputRouter(sessions)
        # A response must fit the server's own send limit (a reader given more would
        # fail at the same place on every reconnect): half of it, as one event may
        # take up that half (MAX_RESULT_BYTES).
        self._response_bytes = min(MAX_RESPONSE_BYTES, self.limits.max_message_bytes // 2)

    async def Start(self, request: pb.StartRequest, context: Context) -> pb.StartResponse:
        session_id = check.session_id(request.session_id, generate=True)
        if request.parent_session_id:
            parent_id(request.parent_session_id)
        check.agent_input(self.agent.input_model, request.input_json, limits=self.limits)
        metadata = check.start_metadata(request, session_id, agent=self.agent, limits=self.limits)
        # Called without a gRPC context (in-process callers, tests): no call deadline.
        remaining = None if context is None else context.time_remaining()
        bounds = check.start_limits(request, time_remaining=remaining, now=time.time())
        input_json = request.input_json or "{}"  # as the proto says: the same call as {}
        caller = current_principal()  # the new session's owner
        key = storage_id(caller, session_id)
        bind_log_context(session_id=key)  # this call's log lines name the session
        # Compare existing sessions on the raw input: an equal JSON value is the same call.
        record = SessionRecord(
            session_id=key,
            agent_type=self.agent.name,
            input_json=input_json,
            input_hash=input_fingerprint(input_json),
            parent_session_id=request.parent_session_id,
            metadata=metadata,
            principal=caller.name,
            tenant=caller.tenant,
            deadline=bounds.deadline,
            budget_tokens=bounds.budget_tokens,
            budget_usd=bounds.budget_usd,
        )
        existing, created = await self.sessions.start(record, session_id)
        return pb.StartResponse(
            session_id=session_id,
            created=created,
            status=existing.status.to_proto(),
            agent_type=existing.agent_type,
        )

    async def Stream(  # type: ignore[override]  # bytes: see add_agent_service
        self, request: pb.StreamRequest, context: Context
    ) -> AsyncIterator[pb.StreamResponse | bytes]:
        """Events as pre-encoded ``StreamResponse`` bytes; heartbeats as messages."""
        async for response in self._stream(request):
            yield response

    async def Follow(  # type: ignore[override]  # bytes: see add_agent_service
        self, request_iterator: AsyncIterator[pb.FollowRequest], context: Context
    ) -> AsyncIterator[bytes]:
        """Many ``Stream``s on one call, as pre-encoded ``FollowResponse`` bytes."""
        async for response in follow_responses(
            request_iterator,
            self._stream,
            charge=self.charge,
            ended=_ended,
            response_bytes=self._response_bytes,
        ):
            yield response

    async def _stream(self, request: pb.StreamRequest) -> AsyncIterator[pb.StreamResponse | bytes]:
        """What ``Stream`` answers ``request`` (also each follow of ``Follow``)."""
        session_id = check.session_id(request.session_id)
        from_sequence = check.from_sequence(request.from_sequence)
        key = (await self._record(session_id)).session_id
        async for batch in follow(
            self.store,
            self.sessions.hub,
            key,
            from_sequence=from_sequence,
            poll_interval_s=self.sessions.poll_interval_s,
            idle_s=self.heartbeat_interval_s,
        ):
            if not batch.encoded:  # quiet for a while: a sign of life, not an event
                yield pb.StreamResponse(heartbeat=await heartbeat(self.store, key))
                continue
            for response in encode_responses(batch.encoded, self._response_bytes):
                yield response

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: Context
    ) -> pb.GetStatusResponse:
        session_id = check.session_id(request.session_id)
        wait_s = check.wait(request.wait) if request.HasField("wait") else 0.0
        record, total = await self.sessions.status(
            _key(session_id),
            session_id,
            wait_s=wait_s,
            include_children=request.include_children,
        )
        response = pb.GetStatusResponse(
            session_id=session_id,
            agent_type=record.agent_type,
            status=record.status.to_proto(),
            output_json=record.output_json,
            error=record.error,
            failure_reason=record.failure_reason,
            last_sequence=record.last_sequence,
            step_count=record.step_count,
            usage=token_usage(record.usage),
            parent_session_id=record.parent_session_id,
            limits=record.limits.to_proto(),
            limit_exceeded=record.limit_exceeded,
        )
        if total is not None:
            response.total_usage.CopyFrom(token_usage(total))
        response.created_at.FromNanoseconds(int(record.created_at * 1e9))
        response.updated_at.FromNanoseconds(int(record.updated_at * 1e9))
        if record.finished_at is not None and record.status.is_terminal:  # not mid-turn
            response.finished_at.FromNanoseconds(int(record.finished_at * 1e9))
        return response

    async def Interrupt(
        self, request: pb.InterruptRequest, context: Context
    ) -> pb.InterruptResponse:
        session_id = check.session_id(request.session_id)
        reason = check.reason(request.reason)
        record, accepted = await self.sessions.interrupt(
            _key(session_id),
            session_id,
            reason,
            abort=request.abort,
            time_remaining=context.time_remaining,
        )
        return pb.InterruptResponse(status=record.status.to_proto(), accepted=accepted)

    async def Continue(self, request: pb.ContinueRequest, context: Context) -> pb.ContinueResponse:
        session_id = check.session_id(request.session_id)
        message = check.message(request.message, limits=self.limits)
        if request.fresh:  # a fresh turn starts from an input, held to what Start holds it to
            check.agent_input(self.agent.input_model, message, limits=self.limits, field="message")
        if request.turn < 2:
            raise InvalidArgument("turn", "must be at least 2 (turn 1 is the run Start began)")
        turn = await self.sessions.continue_turn(
            TurnRequest(
                key=_key(session_id),  # another owner's: not found
                session_id=session_id,
                turn=request.turn,
                message=message,
                fresh=request.fresh,
            )
        )
        return pb.ContinueResponse(
            session_id=session_id,
            turn=turn.turn,
            created=turn.created,
            status=turn.status.to_proto(),
            from_sequence=turn.from_sequence,
        )

    async def SubmitInput(
        self, request: pb.SubmitInputRequest, context: Context
    ) -> pb.SubmitInputResponse:
        session_id = check.session_id(request.session_id)
        check.submitted_input(request, limits=self.limits)
        return await self.inputs.submit(_key(session_id), session_id, request)

    CAPABILITIES: ClassVar[tuple[str, ...]] = (
        "continue",
        "list_sessions",
        "human_input",
        "abort",
        "limits",
        "follow",
    )
    """The optional parts of the contract served here (``DescribeResponse.capabilities``)."""

    async def Describe(self, request: pb.DescribeRequest, context: Context) -> pb.DescribeResponse:
        return pb.DescribeResponse(
            agent_type=self.agent.name,
            description=self.agent.description,
            input_schema_json=self.agent.input_schema_json(),
            output_schema_json=self.agent.output_schema_json(),
            tool_names=[t.name for t in self.agent.tools],
            capabilities=self.CAPABILITIES,
        )

    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        return await list_sessions(
            self.store, request, agent_type=self.agent.name, caller=current_principal()
        )

    async def _record(self, session_id: str) -> SessionRecord:
        """The caller's session ``session_id``; its ``session_id`` is the store's key."""
        return await self.sessions.get(_key(session_id), session_id)


def _ended(exc: Exception) -> tuple[int, str, bytes]:
    """A follow's error as ``Stream`` would have ended with it: code, message, details."""
    code, message, trailer = public_status(FOLLOW_METHOD, exc)
    return code.value[0], message, details_of(trailer)


def _key(session_id: str) -> str:
    """The store's key of the caller's session ``session_id`` (see _ownership); the
    call's log lines name it from here on, as the run's lines do."""
    key = storage_id(current_principal(), session_id)
    bind_log_context(session_id=key)
    return key
