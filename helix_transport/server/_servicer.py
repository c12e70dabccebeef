"""The generic ``AgentService`` servicer: protobuf in, domain calls, protobuf out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from helix_transport._exceptions import (
    HelixError,
    ResourceExhausted,
    ServerUnavailable,
    SessionExists,
    SessionNotFound,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.definition import Agent
from helix_transport.delegation.cascade import CASCADE_TIMEOUT_S
from helix_transport.log import EventHub, follow
from helix_transport.server import _validation as check
from helix_transport.server._continue import continue_session
from helix_transport.server._encoding import MAX_RESPONSE_BYTES, encode_responses
from helix_transport.server._heartbeat import heartbeat
from helix_transport.server._identity import current_principal
from helix_transport.server._ownership import parent_id, storage_id, visible
from helix_transport.server._runner import SessionRunner
from helix_transport.server._shield import outlive_caller
from helix_transport.server.limits import Limits, check_capacity
from helix_transport.store import SessionRecord, Store, Usage, input_fingerprint
from helix_transport.transport import ClientPool

logger = logging.getLogger("helix.server")

Context = grpc.aio.ServicerContext[Any, Any]


class AgentServicer(pb_grpc.AgentServiceServicer):
    """Serves one agent over one store. Errors are raised and mapped by the interceptor."""

    def __init__(
        self,
        agent: Agent,
        store: Store,
        hub: EventHub,
        runner: SessionRunner,
        *,
        clients: ClientPool,
        poll_interval_s: float = 0.5,
        heartbeat_interval_s: float = 5.0,
        limits: Limits = Limits.default,
    ) -> None:
        self.agent = agent
        self.store = store
        self.hub = hub
        self.runner = runner
        self.clients = clients
        self.poll_interval_s = poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.limits = limits
        # A response must fit the server's own send limit (a reader given more would
        # fail at the same place on every reconnect): half of it, as one event may
        # take up that half (MAX_RESULT_BYTES).
        self._response_bytes = min(MAX_RESPONSE_BYTES, limits.max_message_bytes // 2)
        self.accepting = True
        self._starting = 0  # Starts between the capacity check and their run starting

    async def Start(self, request: pb.StartRequest, context: Context) -> pb.StartResponse:
        session_id = check.session_id(request.session_id, generate=True)
        if request.parent_session_id:
            parent_id(request.parent_session_id)
        check.agent_input(self.agent.input_model, request.input_json, limits=self.limits)
        metadata = check.start_metadata(request, session_id, agent=self.agent, limits=self.limits)
        input_json = request.input_json or "{}"  # as the proto says: the same call as {}
        caller = current_principal()  # the new session's owner
        # Compare existing sessions on the raw input: an equal JSON value is the same call.
        record = SessionRecord(
            session_id=storage_id(caller, session_id),
            agent_type=self.agent.name,
            input_json=input_json,
            input_hash=input_fingerprint(input_json),
            parent_session_id=request.parent_session_id,
            metadata=metadata,
            principal=caller.name,
            tenant=caller.tenant,
        )
        existing, created = await self._create(record, session_id)
        return pb.StartResponse(
            session_id=session_id,
            created=created,
            status=existing.status.to_proto(),
            agent_type=existing.agent_type,
        )

    async def _create(self, record: SessionRecord, session_id: str) -> tuple[SessionRecord, bool]:
        """Create and start ``record``'s session (the caller's ``session_id``), or get
        the existing one back.

        Refused while draining or at capacity, except as the replay of an existing
        session. Once the store has the session its run starts, even when the
        caller's deadline passes meanwhile: a created session never waits unrun.
        """
        refusal: Exception | None = None
        if not self.accepting:
            refusal = ServerUnavailable("server is shutting down; not starting new sessions")
        else:
            try:
                check_capacity(self.runner.running + self._starting, self.limits)
            except ResourceExhausted as exc:
                refusal = exc
        if refusal is not None:
            found = await self.store.get_session(record.session_id)
            if found is None:
                raise refusal
            existing, created = found, False
        else:
            self._starting += 1  # released by _create_and_run once its run is counted
            existing, created = await outlive_caller(
                self._create_and_run(record), what=f"starting session {session_id}"
            )
        # A pre-namespace session of another principal under a bare id (see _ownership).
        if (
            not visible(existing)
            or existing.input_hash != record.input_hash
            or existing.agent_type != self.agent.name
        ):
            raise SessionExists(session_id)
        return existing, created

    async def _create_and_run(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        try:
            # One atomic round trip: create (leased to us), or get the existing session back.
            return await self.runner.create_and_start(record)
        finally:
            self._starting -= 1  # in the same step the run joined runner.running

    async def Stream(  # type: ignore[override]  # bytes: see add_agent_service
        self, request: pb.StreamRequest, context: Context
    ) -> AsyncIterator[pb.StreamResponse | bytes]:
        """Events as pre-encoded ``StreamResponse`` bytes; heartbeats as messages."""
        session_id = check.session_id(request.session_id)
        from_sequence = check.from_sequence(request.from_sequence)
        key = (await self._record(session_id)).session_id
        async for batch in follow(
            self.store,
            self.hub,
            key,
            from_sequence=from_sequence,
            poll_interval_s=self.poll_interval_s,
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
        record = await self._record(session_id)
        if wait_s > 0 and not record.status.is_terminal:
            record = await self._until_end(record, session_id, wait_s)
        response = pb.GetStatusResponse(
            session_id=session_id,
            agent_type=record.agent_type,
            status=record.status.to_proto(),
            output_json=record.output_json,
            error=record.error,
            failure_reason=record.failure_reason,
            last_sequence=record.last_sequence,
            step_count=record.step_count,
            usage=_token_usage(record.usage),
            parent_session_id=record.parent_session_id,
        )
        if request.include_children:
            total = await self._total_usage(record, seen={record.session_id})
            response.total_usage.CopyFrom(_token_usage(total))
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
        record = await self._record(session_id)
        if record.status.is_terminal:
            return pb.InterruptResponse(status=record.status.to_proto(), accepted=False)
        # Durable first, the children's interrupts (in the outbox) before the session's
        # own (a run in another process sees it at its next step); then wake a local
        # run so it stops mid-step, then ask the children (each child's service
        # cascades to its own), so the whole tree stops.
        key = record.session_id
        cascade = self.runner.cascade
        commands = await cascade.record(await self.store.list_subsession_refs(key), reason=reason)
        await self.store.set_interrupt(key, reason)
        self.runner.signal_interrupt(key)
        # Within the caller's deadline: every interrupt is already durable, and children
        # not reached by then are asked again by the outbox until they are.
        remaining = context.time_remaining()
        budget = CASCADE_TIMEOUT_S if remaining is None else min(CASCADE_TIMEOUT_S, remaining)
        try:
            async with asyncio.timeout(max(budget - 0.05, 0.0)):
                await cascade.deliver(commands)
        except TimeoutError:
            logger.warning("session %s: still asking its children to stop", session_id)
        return pb.InterruptResponse(status=record.status.to_proto(), accepted=True)

    async def Continue(self, request: pb.ContinueRequest, context: Context) -> pb.ContinueResponse:
        return await continue_session(
            request,
            store=self.store,
            runner=self.runner,
            admit=self._admit_turn,
            limits=self.limits,
        )

    @contextlib.contextmanager
    def _admit_turn(self) -> Iterator[None]:
        """A new turn is a run: refused while draining or at capacity, and counted as
        starting until its run is (as for ``Start``). A replayed turn is not asked."""
        if not self.accepting:
            raise ServerUnavailable("server is shutting down; not starting new turns")
        check_capacity(self.runner.running + self._starting, self.limits)
        self._starting += 1
        try:
            yield
        finally:
            self._starting -= 1

    async def Describe(self, request: pb.DescribeRequest, context: Context) -> pb.DescribeResponse:
        return pb.DescribeResponse(
            agent_type=self.agent.name,
            description=self.agent.description,
            input_schema_json=self.agent.input_schema_json(),
            output_schema_json=self.agent.output_schema_json(),
            tool_names=[t.name for t in self.agent.tools],
        )

    async def _total_usage(self, record: SessionRecord, *, seen: set[str]) -> Usage:
        """``record``'s usage plus every sub-session's below it, each counted once.

        A remote child reports its own subtree (``include_children`` on its service);
        a child in this store is summed here. An unreachable child service fails the
        call rather than report a short total. A child the caller may not see counts
        nothing, local or remote (there its service answers ``NOT_FOUND``, as it does
        for a child whose ``Start`` never landed): a total shows only what its caller
        could read session by session.
        """
        total = record.usage
        for ref in await self.store.list_subsession_refs(record.session_id):
            if ref.child_session_id in seen:
                continue
            seen.add(ref.child_session_id)
            if ref.address:
                client = await self.clients.get(ref.address)
                try:
                    status = await client.get_status(ref.child_session_id, include_children=True)
                except SessionNotFound:
                    continue  # its Start never landed (refused, or still on its way): no usage
                except HelixError as exc:
                    # The child's service's trouble, not the caller's: retryable, and
                    # without its address or its error's detail (that goes to the log).
                    logger.warning(
                        "session %s: usage of child %s at %s: %s",
                        record.session_id,
                        ref.child_session_id,
                        ref.address,
                        exc.message,
                    )
                    raise ServerUnavailable(
                        f"could not read the usage of child session {ref.child_session_id!r} "
                        f"({type(exc).__name__}); retry later"
                    ) from exc
                usage = status.total_usage
                total = total + Usage(
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    total_tokens=usage.total_tokens,
                )
            else:
                child = await self.store.get_session(ref.child_session_id)
                if child is not None and visible(child):
                    total = total + await self._total_usage(child, seen=seen)
        return total

    async def _until_end(
        self, record: SessionRecord, session_id: str, wait_s: float
    ) -> SessionRecord:
        """The session once its terminal event is in the log, or as it is after ``wait_s``.

        Follows the log as ``Stream`` does (this process's writer, else the store), so
        a caller waiting for a child's end makes one call, not one per poll.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                async for _ in follow(
                    self.store,
                    self.hub,
                    record.session_id,
                    from_sequence=record.last_sequence,
                    poll_interval_s=self.poll_interval_s,
                ):
                    pass  # follow ends after the terminal event
        return await self._record(session_id)

    async def _record(self, session_id: str) -> SessionRecord:
        """The caller's session ``session_id``; its ``session_id`` is the store's key.

        Another owner's session is under another key: not found, by the same lookup
        as an unknown id (see _ownership).
        """
        record = await self.store.get_session(storage_id(current_principal(), session_id))
        # Another agent type's on a shared store: as if it did not exist, as for
        # Continue. A session is its own type's service's to serve, whether or not the
        # deployment happens to share a store between types.
        if record is None or record.agent_type != self.agent.name or not visible(record):
            raise SessionNotFound(session_id)
        return record


def _token_usage(usage: Usage) -> pb.TokenUsage:
    return pb.TokenUsage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
    )
