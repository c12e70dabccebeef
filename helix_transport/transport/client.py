"""The gRPC client for one agent service (its resumable stream is in ``stream.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
from google.protobuf.message import Message

from helix_transport._config import ClientConfig, RetryConfig
from helix_transport._events import SessionStatus
from helix_transport._exceptions import InvalidArgument, ResourceExhausted, UsageError
from helix_transport._limits import SessionLimits
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport._trace_context import outgoing
from helix_transport.transport._auth import ClientAuth
from helix_transport.transport._errors import RESUMABLE, map_grpc_errors, to_helix_error
from helix_transport.transport._follows import SharedStreams
from helix_transport.transport._listing import list_request, summaries
from helix_transport.transport.stream import EventStream, StreamSource


class _State(enum.Enum):
    OPENED = "opened"
    CLOSED = "closed"


_Reply = TypeVar("_Reply")


class AgentClient:
    """A client for one agent service address; one channel, reused by every call.

    Build it with ``await AgentClient.connect("127.0.0.1:50051")`` (or
    ``dns:///name:port`` to balance over every resolved address) and close it with
    ``aclose()`` or ``async with``.

    ``EventStream`` uses three lower-level methods (its ``StreamSource``):
    ``stream_call``, ``status_call`` and ``reconnected``. They raise grpc's errors as
    they are, for a caller with its own retry loop; the methods above map them.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        address: str,
        config: ClientConfig = ClientConfig.default,
        auth: ClientAuth | None = None,
        join_trace: bool = False,
    ) -> None:
        self._channel = channel
        self._auth = auth
        self._join_trace = join_trace
        self._stub = pb_grpc.AgentServiceStub(channel)
        # Stream with the responses left as bytes (see stream_call).
        self._stream_bytes: grpc.aio.UnaryStreamMultiCallable[pb.StreamRequest, bytes]
        self._stream_bytes = channel.unary_stream(
            "/helix.agent.v1.AgentService/Stream",
            request_serializer=pb.StreamRequest.SerializeToString,
        )
        self._shared: SharedStreams | None = None
        self._state = _State.OPENED
        self.address = address
        self.config = config

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        config: ClientConfig = ClientConfig.default,
        credentials: grpc.ChannelCredentials | None = None,
        call_credentials: grpc.CallCredentials | None = None,
        auth: ClientAuth | None = None,
        join_trace: bool = False,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> AgentClient:
        """Open a channel to ``address``. Connection happens lazily, on the first call.

        Args:
            credentials: TLS channel credentials; plaintext when ``None``.
            call_credentials: per-call credentials (e.g. a bearer token); need TLS,
                or ``grpc.local_channel_credentials()`` on loopback.
            auth: a bearer token and/or TLS client certificate sent with every call
                (``ClientAuth``); its TLS settings apply when ``credentials`` is None.
            join_trace: the sessions this client starts nest under the caller's current
                OpenTelemetry span (their trace becomes the caller's) instead of keeping
                a trace of their own that links to it; see docs/tracing.md.
            interceptors: grpc.aio client interceptors of the channel (a service's
                tracing adds its CLIENT spans so).
        """
        if not address:
            raise UsageError("an agent service address is required (host:port or dns:///name:port)")
        options = config.channel_options()
        if auth is not None:
            credentials = credentials or auth.channel_credentials()
            options = [*options, *auth.channel_options()]
        if call_credentials is not None:
            credentials = grpc.composite_channel_credentials(
                credentials or grpc.local_channel_credentials(), call_credentials
            )
        chain = list(interceptors) or None
        if credentials is None:
            channel = grpc.aio.insecure_channel(address, options=options, interceptors=chain)
        else:
            channel = grpc.aio.secure_channel(
                address, credentials, options=options, interceptors=chain
            )
        return cls(channel, address=address, config=config, auth=auth, join_trace=join_trace)

    async def reconnected(self, *, within_s: float) -> None:
        """Wait ``within_s``, or only until the channel is connected again if it drops.

        A stream broken by its server going away resumes as soon as grpc reaches the
        server again (grpc retries the connection on its own backoff), not at our next
        retry. A channel that stays connected all along gets the whole wait: that break
        was the server's doing (a drain, say), and retrying at once could spin.
        """
        channel = self._channel
        ready = grpc.ChannelConnectivity.READY
        started = time.monotonic()
        dropped = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                state = channel.get_state(try_to_connect=True)
                while not (dropped and state is ready):
                    dropped = dropped or state is not ready
                    await channel.wait_for_state_change(state)
                    state = channel.get_state(try_to_connect=True)
                # A server that accepts connections and drops them at once cannot make
                # a client spin either.
                floor = min(within_s, _RECONNECT_FLOOR_S)
                await asyncio.sleep(floor - (time.monotonic() - started))

    def stream_call(
        self, request: pb.StreamRequest, *, encoded: bool = False
    ) -> grpc.aio.UnaryStreamCall[pb.StreamRequest, Any]:
        """One ``Stream`` call with this client's credentials, not resumed: it yields
        ``StreamResponse`` messages, or with ``encoded`` their bytes as the server sent
        them. Cancel it when done."""
        call: grpc.aio.UnaryStreamCall[pb.StreamRequest, Any] = (
            self._stream_bytes if encoded else self._stub.Stream
        )(request, metadata=self._metadata())
        return call

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise UsageError(f"client for {self.address} is closed")

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        """Per-call credentials and the caller's trace context, read in the calling
        task (a forwarding parent presents the token of the RPC it is serving)."""
        entries = (*self._credentials(), *outgoing(parent=self._join_trace))
        return entries or None

    def _credentials(self) -> tuple[tuple[str, str], ...]:
        """The credentials a call presents, read in the calling task."""
        return self._auth.metadata() if self._auth is not None else ()

    @property
    def _timeout(self) -> float:
        return self.config.rpc_timeout.total_seconds()

    async def start(
        self,
        input_json: str,
        *,
        session_id: str = "",
        parent_session_id: str = "",
        metadata: Mapping[str, str] | None = None,
        retry: RetryConfig | None = None,
        delegation_path: Sequence[str] = (),
        subagent: pb.SubagentOptions | None = None,
        limits: SessionLimits = SessionLimits.none,
    ) -> pb.StartResponse:
        """Start a session (idempotent on ``session_id``).

        Retries while the service is unavailable, refuses with a retry hint (rate
        limited, at capacity: after the hinted delay) or does not answer within
        ``rpc_timeout`` (a queued, overloaded service), within the reconnect deadline:
        ``Start`` is idempotent, so a retry can never run the session twice. Past the
        deadline the last error is raised (``ResourceExhausted`` with ``retry_after_s``,
        ``DeadlineExceeded``, ``ConnectError``). ``retry`` replaces the client's
        ``config.reconnect`` for this call (``until_cancelled()``: no deadline).

        ``delegation_path``: for a child, the agent types from the root down to its
        parent (``ToolContext.child_delegation_path``); the server bounds trees by it.
        ``subagent``: how a ``run_subagent`` child's run differs (a virtual child, the
        parent's context), stored with the session.

        ``limits``: the session's deadline and budget (``StartRequest.limits``), for it
        and its subtree. Always sent, so this client's own ``rpc_timeout`` never becomes
        the session's deadline.
        """
        self._check_open()
        # Name the session here, not on the server: then every Start is idempotent and
        # safe to retry, even when a reply is lost after the session was created.
        session_id = session_id or uuid.uuid4().hex
        request = pb.StartRequest(
            session_id=session_id,
            input_json=input_json,
            parent_session_id=parent_session_id,
            metadata=dict(metadata or {}),
            delegation_path=delegation_path,
            subagent=subagent,
            limits=limits.to_proto(),
        )
        return await self._idempotent(self._stub.Start, request, session_id, retry=retry)

    async def continue_session(
        self,
        session_id: str,
        message: str,
        *,
        turn: int,
        fresh: bool = False,
        retry: RetryConfig | None = None,
    ) -> pb.ContinueResponse:
        """Start turn ``turn`` of a finished session with ``message`` (idempotent on the turn).

        Follow the turn with ``stream(session_id, from_sequence=reply.from_sequence)``.
        Retries while the service is unavailable, like ``start``: the named turn makes a
        retry safe.

        Raises:
            SessionStateConflict: the session is running, or ``turn`` is not the next turn.
            SessionExists: the turn was started with another message.
        """
        self._check_open()
        request = pb.ContinueRequest(session_id=session_id, message=message, turn=turn, fresh=fresh)
        return await self._idempotent(self._stub.Continue, request, session_id, retry=retry)

    async def submit_input(
        self,
        session_id: str,
        request_id: str,
        *,
        path: Sequence[str] = (),
        approved: bool | None = None,
        reason: str = "",
        result_json: str | None = None,
        error: str | None = None,
        retry: RetryConfig | None = None,
    ) -> pb.SubmitInputResponse:
        """Answer a request for input waiting in the tree of ``session_id`` (``SubmitInput``).

        Give exactly one answer: ``approved`` (with an optional ``reason``) for an
        approval, ``result_json`` for a client tool's result, or ``error`` for a client
        tool that failed (given with ``result_json``, the error wins, as on the wire). ``path`` is the request's ``InputRequired.path`` (the session
        ids from ``session_id`` down to the session that asked; empty when it asked
        itself). Retries while the service is unavailable, like ``start``: the answer is
        idempotent per request, so a retry applies it at most once (``applied=false``
        then).

        Raises:
            UsageError: no answer, or an approval together with a result.
            RequestNotFound: no such request waits in the tree (or ``path`` leaves it).
            SessionNotFound: no such session.
            SessionStateConflict: the request was answered differently, or the session
                that asked has ended.
            InvalidArgument: an answer of the wrong kind, or ``result_json`` not JSON.
        """
        self._check_open()
        result = result_json is not None or error is not None
        if (approved is None) == (not result):
            raise UsageError(
                "submit_input needs exactly one answer: approved=, or result_json= or error="
            )
        request = pb.SubmitInputRequest(session_id=session_id, request_id=request_id, path=path)
        if approved is not None:
            request.approval.CopyFrom(pb.Approval(approved=approved, reason=reason))
        elif error is not None:  # as on the wire: an error wins over a result
            request.result.CopyFrom(pb.ClientResult(error=error))
        else:
            request.result.CopyFrom(pb.ClientResult(result_json=result_json or ""))
        return await self._idempotent(
            self._stub.SubmitInput, request, session_id, retry=retry, request_id=request_id
        )

    async def _idempotent(
        self,
        rpc: Callable[..., Awaitable[_Reply]],
        request: Message,
        session_id: str,
        *,
        retry: RetryConfig | None = None,
        request_id: str = "",
    ) -> _Reply:
        """Call ``rpc``, retrying while the service is unavailable (from when the
        channel reconnects) or refuses with a retry hint (after it), within the
        reconnect deadline; then the last error as a helix error. Only for calls a
        retry cannot repeat (``Start`` and ``Continue`` name what they create,
        ``SubmitInput`` answers a request once)."""
        retry = retry or self.config.reconnect
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return await rpc(request, timeout=self._timeout, metadata=self._metadata())
            except grpc.aio.AioRpcError as exc:
                delay = _retry_delay(exc, retry, attempt, address=self.address)
                if delay is None or retry.expired(started, time.monotonic()):
                    raise to_helix_error(
                        exc, address=self.address, session_id=session_id, request_id=request_id
                    ) from exc
                unavailable = exc.code() == grpc.StatusCode.UNAVAILABLE
            if unavailable:
                await self.reconnected(within_s=delay)
            else:
                await asyncio.sleep(delay)  # as the server's retry hint says, or backing off
            attempt += 1

    def stream(
        self,
        session_id: str,
        *,
        from_sequence: int = 0,
        retry: RetryConfig | None = None,
        shared: bool = False,
    ) -> EventStream:
        """The session's events after ``from_sequence``; see ``EventStream``.

        ``retry`` replaces the client's ``config.reconnect`` for this stream
        (``until_cancelled()``: resume after any outage, however long).

        ``shared``: follow it on one ``Follow`` call with this client's other shared
        streams (a parent following many children of one service holds one call, not
        one each); the same events, the same resumption. A service without ``Follow``
        is streamed with ``Stream``.
        """
        self._check_open()
        source: StreamSource = self
        if shared:
            if self._shared is None:
                self._shared = SharedStreams(
                    self._channel, client=self, credentials=self._credentials
                )
            source = self._shared
        return EventStream(source, session_id, from_sequence=from_sequence, retry=retry)

    async def get_status(
        self,
        session_id: str,
        *,
        include_children: bool = False,
        wait: timedelta | None = None,
    ) -> pb.GetStatusResponse:
        """The session's status, output and counters.

        With ``include_children`` the reply's ``total_usage`` adds the usage of every
        sub-agent session below this one (remote ones asked of their services).
        With ``wait`` (at most 60 s) the call is a long poll: a running session's reply
        comes when it ends, or after ``wait`` with it still running. A service that
        does not implement the wait answers at once.
        """
        self._check_open()
        with map_grpc_errors(self.address, session_id):
            return await self.status_call(session_id, include_children=include_children, wait=wait)

    async def status_call(
        self, session_id: str, *, include_children: bool = False, wait: timedelta | None = None
    ) -> pb.GetStatusResponse:
        """One ``GetStatus`` call, its deadline stretched by the wait; grpc's errors as
        they are (``get_status`` maps them)."""
        request = pb.GetStatusRequest(session_id=session_id, include_children=include_children)
        timeout = self._timeout
        if wait is not None:
            request.wait.FromTimedelta(wait)
            timeout += max(wait.total_seconds(), 0.0)
        return await self._stub.GetStatus(request, timeout=timeout, metadata=self._metadata())

    async def wait(
        self, session_id: str, *, from_sequence: int = 0, retry: RetryConfig | None = None
    ) -> pb.GetStatusResponse:
        """The session's status once it has ended (or is suspended, waiting for
        input from people: ``SESSION_STATUS_SUSPENDED``), like ``Popen.wait``.

        Ended means a terminal status whose ``last_sequence`` is past ``from_sequence``
        (give a continued session's turn start, ``ContinueResponse.from_sequence``, to
        wait for that turn, not the one before). Each ask is a long poll of
        ``LONG_POLL``, so the reply comes as the session ends and none of its events
        cross the wire. A service that answers a running session at once (it does not
        implement the wait) is asked every ``PACE_S``; one that refuses the wait is
        asked without it. A service that cannot be reached is asked again with backoff,
        as a stream resumes, until the reconnect deadline passes without an answer:
        then the last error, as a ``HelixError``. ``retry`` replaces the client's
        ``config.reconnect`` (``until_cancelled()``: no deadline).
        """
        self._check_open()
        retry = retry or self.config.reconnect
        wait: timedelta | None = LONG_POLL
        broken_since: float | None = None
        attempt = 0
        while True:
            asked = time.monotonic()
            try:
                status = await self.status_call(session_id, wait=wait)
            except grpc.aio.AioRpcError as exc:
                error = to_helix_error(exc, address=self.address, session_id=session_id)
                if (
                    wait is not None
                    and isinstance(error, InvalidArgument)
                    and error.field == "wait"
                ):
                    wait = None  # a service whose limit is below ours: ask without it
                    continue
                # A read repeats safely: a break a stream would resume from is retried too.
                delay = (
                    retry.backoff_s(attempt)
                    if exc.code() in RESUMABLE
                    else _retry_delay(exc, retry, attempt, address=self.address)
                )
                now = time.monotonic()
                broken_since = broken_since or now
                if delay is None or retry.expired(broken_since, now):
                    raise error from exc
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    await self.reconnected(within_s=delay)
                else:
                    await asyncio.sleep(delay)
                attempt += 1
                continue
            broken_since, attempt = None, 0
            if (
                status.status not in (pb.SESSION_STATUS_UNSPECIFIED, pb.SESSION_STATUS_RUNNING)
                and status.last_sequence > from_sequence
            ):
                return status
            if wait is None or time.monotonic() - asked < wait.total_seconds() / 2:
                await asyncio.sleep(PACE_S)  # answered at once: pace the asks

    async def interrupt(
        self, session_id: str, *, reason: str = "", abort: bool = False
    ) -> pb.InterruptResponse:
        """Ask a running or suspended session to stop (durable; a finished one is left
        as it is). An interrupted session can be resumed with ``continue_session``.

        With ``abort`` the session and every sub-agent below it end TERMINATED instead,
        their pending requests for input cancelled, never to be resumed (a service
        without the ``abort`` capability refuses it).
        """
        self._check_open()
        with map_grpc_errors(self.address, session_id):
            return await self._stub.Interrupt(
                pb.InterruptRequest(session_id=session_id, reason=reason, abort=abort),
                timeout=self._timeout,
                metadata=self._metadata(),
            )

    async def describe(self) -> pb.DescribeResponse:
        """The agent's type, description and input/output schemas."""
        self._check_open()
        with map_grpc_errors(self.address):
            return await self._stub.Describe(
                pb.DescribeRequest(), timeout=self._timeout, metadata=self._metadata()
            )

    async def list_sessions(
        self,
        *,
        statuses: Sequence[SessionStatus] = (),
        agent_type: str = "",
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        roots_only: bool = False,
        page_size: int = 0,
        page_token: str = "",
    ) -> pb.ListSessionsResponse:
        """One page of the caller's sessions, newest first (``ListSessions``).

        Pass the reply's ``next_page_token`` back as ``page_token``, with the same
        filters, for the next page (``iter_sessions`` does it for you). Datetimes
        must be aware. A service without the RPC raises ``RemoteError``
        (``UNIMPLEMENTED``).
        """
        self._check_open()
        request = list_request(
            statuses=statuses,
            agent_type=agent_type,
            created_after=created_after,
            created_before=created_before,
            roots_only=roots_only,
            page_size=page_size,
            page_token=page_token,
        )
        with map_grpc_errors(self.address):
            return await self._stub.ListSessions(
                request, timeout=self._timeout, metadata=self._metadata()
            )

    def iter_sessions(
        self,
        *,
        statuses: Sequence[SessionStatus] = (),
        agent_type: str = "",
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        roots_only: bool = False,
        page_size: int = 0,
        limit: int | None = None,
    ) -> AsyncIterator[pb.SessionSummary]:
        """The caller's sessions matching the filters, newest first, page after page
        (at most ``limit``); each page is asked for when the previous one is used up."""

        def page(token: str) -> Awaitable[pb.ListSessionsResponse]:
            size = page_size or (min(limit, _MAX_PAGE) if limit else 0)
            return self.list_sessions(
                statuses=statuses,
                agent_type=agent_type,
                created_after=created_after,
                created_before=created_before,
                roots_only=roots_only,
                page_size=size,
                page_token=token,
            )

        return summaries(page, limit=limit)

    async def aclose(self) -> None:
        """Close the channel. Idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        if self._shared is not None:
            self._shared.close()
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


LONG_POLL = timedelta(seconds=20)
"""How long each ``GetStatus`` of ``AgentClient.wait`` waits for the session's end."""
PACE_S = 0.25
"""Between the asks of ``AgentClient.wait`` to a service that does not long-poll."""

_MAX_PAGE = 500
"""The largest page ``ListSessions`` serves; ``iter_sessions`` asks no more of it."""

_RECONNECT_FLOOR_S = 0.05
"""The shortest wait before a retry, even when the channel reconnects sooner."""


_BACK_OFF = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
"""What an idempotent unary call backs off and retries after (``_retry_delay``)."""


def _retry_delay(
    exc: grpc.aio.AioRpcError, retry: RetryConfig, attempt: int, *, address: str
) -> float | None:
    """Seconds to wait before retrying an idempotent unary call; None: do not retry.

    UNAVAILABLE, DEADLINE_EXCEEDED and CANCELLED back off; RESOURCE_EXHAUSTED waits as
    the server's RetryInfo says (and is not retried without one: a message too large
    stays too large). A timed-out attempt may have created its session anyway: the retry,
    naming the same session, then gets it back (``created=false``) instead of a second
    one. CANCELLED is the same overload seen from the other side (an AioRpcError, so
    not this caller's own cancellation): a server whose queue held the call past its
    deadline, or one shutting down, cancels it (a 1,000-child fan-out on a loaded host
    lost 2-15 of its children's ``Start``s so).
    """
    if exc.code() in _BACK_OFF:
        return retry.backoff_s(attempt)
    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        error = to_helix_error(exc, address=address)
        if isinstance(error, ResourceExhausted) and error.retry_after_s is not None:
            return max(error.retry_after_s, retry.backoff_s(attempt))
    return None
