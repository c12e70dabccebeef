"""A service's sessions as another protocol's edge sees them (A2A): the servicer's own
calls, made as the edge's authenticated caller.

There is one run path: an edge starts, follows, interrupts and answers sessions
through the same ``AgentServicer`` methods (validation, ownership keys, admission,
the outbox's cascade) the gRPC contract uses, with the caller's ``Principal`` set as
the authentication interceptor sets it. The same principal owns a session through
either protocol; another's session is not found through either.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.log import follow
from helix_transport.server import _validation as check
from helix_transport.server._authenticators import ChainAuthenticator, Presented
from helix_transport.server._identity import ANONYMOUS, Principal, current_principal, set_principal
from helix_transport.server._ownership import storage_id
from helix_transport.server._servicer import AgentServicer
from helix_transport.store import READ_LIMIT
from helix_transport.transport import set_bearer_token

__all__ = ["ANONYMOUS", "Principal", "SessionsEdge"]


class _EdgeContext:
    """The little of a ``ServicerContext`` the servicer's unary methods read."""

    def time_remaining(self) -> float | None:
        return None  # an edge call has no gRPC deadline; Interrupt caps its own wait


_CONTEXT: Any = _EdgeContext()


class SessionsEdge:
    """The sessions of one ``AgentServer``, for a protocol edge in the same process."""

    def __init__(self, servicer: AgentServicer, authenticator: ChainAuthenticator | None) -> None:
        self._servicer = servicer
        self._authenticator = authenticator
        self.agent: Agent = servicer.agent
        self.heartbeat_interval_s = servicer.heartbeat_interval_s

    @property
    def authenticates(self) -> bool:
        """False for a service run with ``--allow-unauthenticated``."""
        return self._authenticator is not None

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller of an ``authorization`` header value, as the gRPC service would
        see it (``ANONYMOUS`` on a service without authentication).

        Raises:
            Unauthenticated: no credential, or one that is not valid.
        """
        if self._authenticator is None:
            return ANONYMOUS
        bearer: str | None = None
        if authorization is not None:
            scheme, _, token = authorization.partition(" ")
            bearer = token.strip() if scheme.lower() == "bearer" else ""
        return self._authenticator.authenticate(Presented(bearer=bearer))

    @staticmethod
    @contextlib.contextmanager
    def acting_as(principal: Principal, bearer: str | None = None) -> Iterator[None]:
        """Run the block as ``principal`` (and its bearer token, forwarded to children
        as a gRPC call's is)."""
        set_principal(principal)
        set_bearer_token(bearer)
        yield

    def describe(self) -> pb.DescribeResponse:
        """What ``Describe`` answers."""
        servicer = self._servicer
        return pb.DescribeResponse(
            agent_type=self.agent.name,
            description=self.agent.description,
            input_schema_json=self.agent.input_schema_json(),
            output_schema_json=self.agent.output_schema_json(),
            tool_names=[t.name for t in self.agent.tools],
            capabilities=servicer.CAPABILITIES,
        )

    async def start(self, request: pb.StartRequest) -> pb.StartResponse:
        """``Start`` as the current principal."""
        return await self._servicer.Start(request, _CONTEXT)

    async def status(self, session_id: str, *, wait_s: float = 0.0) -> pb.GetStatusResponse:
        """``GetStatus`` of the current principal's session ``session_id``."""
        request = pb.GetStatusRequest(session_id=session_id)
        if wait_s > 0:
            request.wait.FromMilliseconds(int(wait_s * 1000))
        return await self._servicer.GetStatus(request, _CONTEXT)

    async def interrupt(self, request: pb.InterruptRequest) -> pb.InterruptResponse:
        """``Interrupt`` (the whole tree, through the outbox)."""
        return await self._servicer.Interrupt(request, _CONTEXT)

    async def continue_turn(self, request: pb.ContinueRequest) -> pb.ContinueResponse:
        """``Continue``."""
        return await self._servicer.Continue(request, _CONTEXT)

    async def submit_input(self, request: pb.SubmitInputRequest) -> pb.SubmitInputResponse:
        """``SubmitInput`` (routed down the tree to the session that asked)."""
        return await self._servicer.SubmitInput(request, _CONTEXT)

    async def list_sessions(self, request: pb.ListSessionsRequest) -> pb.ListSessionsResponse:
        """``ListSessions`` of the current principal."""
        return await self._servicer.ListSessions(request, _CONTEXT)

    async def read(self, session_id: str, *, from_sequence: int = 0) -> list[pb.StreamEvent]:
        """The log of the current principal's session after ``from_sequence``, as it is
        now (every page; the session's own turns included)."""
        key = await self._key(session_id)
        events: list[pb.StreamEvent] = []
        while True:
            page = await self._servicer.store.read(
                key, from_sequence=from_sequence, limit=READ_LIMIT
            )
            if not page:
                return events
            events += page
            from_sequence = page[-1].sequence

    async def follow(
        self, session_id: str, *, from_sequence: int = 0
    ) -> AsyncIterator[list[pb.StreamEvent]]:
        """The events of the current principal's session after ``from_sequence`` until
        the end of its turn, as ``Stream`` gives them: replayed from the store, then
        live. An empty batch now and then: quiet for the heartbeat interval.

        Raises:
            SessionNotFound: not the caller's session (before the first batch).
        """
        check.from_sequence(from_sequence)
        key = await self._key(session_id)
        sessions = self._servicer.sessions
        async for batch in follow(
            self._servicer.store,
            sessions.hub,
            key,
            from_sequence=from_sequence,
            poll_interval_s=sessions.poll_interval_s,
            idle_s=self.heartbeat_interval_s,
        ):
            yield [pb.StreamEvent.FromString(data) for data in batch.encoded]

    async def _key(self, session_id: str) -> str:
        """The store's key of the caller's session ``session_id`` (not found otherwise)."""
        check.session_id(session_id)
        key = storage_id(current_principal(), session_id)
        return (await self._servicer.sessions.get(key, session_id)).session_id
