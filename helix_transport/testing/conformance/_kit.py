"""The kit's plumbing: its state, one check's run and verdict, and the raw calls it makes.

It speaks only the wire, through the raw generated stub (never ``AgentClient``, whose
reconnects and duplicate filtering would hide a server's mistakes).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from helix_transport._events import is_terminal
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.testing.conformance import timing
from helix_transport.testing.conformance._contract import (
    Failed,
    Skipped,
    require,
    verdict,
    waiting,
)
from helix_transport.testing.conformance.report import CheckResult


@dataclass
class Read:
    """What one ``Stream`` call delivered and how it ended."""

    events: list[pb.StreamEvent] = field(default_factory=list)
    after_terminal: list[pb.StreamEvent] = field(default_factory=list)
    end: str = "ok"
    """``ok`` (clean end), ``error`` (a status), ``timeout`` (still open) or ``left`` (we left)."""
    code: grpc.StatusCode | None = None
    details: str = ""
    trailer: Any = None
    """The failed call's trailing metadata (its rich error details)."""
    terminal_at: float | None = None
    """When (``time.monotonic()``) the terminal event arrived."""

    @property
    def terminal(self) -> pb.StreamEvent | None:
        return self.events[-1] if self.events and is_terminal(self.events[-1]) else None

    def describe_end(self) -> str:
        if self.end == "error":
            name = self.code.name if self.code is not None else "?"
            return f"ended with {name}: {self.details}"
        if self.end == "timeout":
            return "was still open"
        return "ended cleanly" if self.end == "ok" else "was left by the reader"

    def require_complete(self, what: str) -> None:
        """The read ended cleanly right after one terminal event, with nothing after it."""
        require(
            self.terminal is not None,
            f"{what}: {self.describe_end()} after {len(self.events)} event(s) and no terminal event",
        )
        require(
            not self.after_terminal,
            f"{what}: {len(self.after_terminal)} event(s) sent after the terminal event",
        )
        require(
            self.end == "ok",
            f"{what}: the stream {self.describe_end()} after the terminal event "
            f"(it must end with OK right after it)",
        )


@dataclass
class LongPoll:
    """A ``GetStatus`` with ``wait`` of a session a plain ``GetStatus`` just saw running."""

    running: bool
    """The plain ``GetStatus`` said RUNNING (else the long poll was not sent)."""
    wait_s: float = 0.0
    sent: float = 0.0
    answered: float = 0.0
    reply: pb.GetStatusResponse | None = None
    error: grpc.aio.AioRpcError | None = None

    @property
    def took(self) -> float:
        return self.answered - self.sent


@dataclass(frozen=True)
class Pending:
    """A session of the kit suspended for an approval, as its stream showed it."""

    session_id: str
    request: pb.InputRequired
    """The first request for input its stream carried."""
    asked_by: str
    """The session that logged that request (the kit's session, or one below it)."""
    others: tuple[pb.InputRequired, ...]
    """Further requests logged before the session suspended."""
    suspended: pb.StreamEvent
    """The session's own ``suspended`` event."""

    def answer(
        self, request: pb.InputRequired, *, approved: bool, reason: str
    ) -> pb.SubmitInputRequest:
        """A ``SubmitInput`` of ``request`` at this session, with an approval or a denial."""
        return pb.SubmitInputRequest(
            session_id=self.session_id,
            request_id=request.request_id,
            path=request.path,
            approval=pb.Approval(approved=approved, reason=reason),
        )


class Kit:
    """One run of the kit against one service: what it learnt so far and its verdicts."""

    def __init__(
        self,
        stub: pb_grpc.AgentServiceAsyncStub,
        channel: grpc.aio.Channel,
        *,
        input_json: str,
        bad_input_json: str | None,
        timeout_s: float,
        input_required_json: str | None = None,
    ) -> None:
        self.stub = stub
        self.channel = channel
        self.input_json = input_json
        self.bad_input_json = bad_input_json
        self.input_required_json = input_required_json
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.rpc_timeout_s = min(10.0, timeout_s)
        self.results: list[CheckResult] = []
        self.prefix = f"conformance-{uuid.uuid4().hex[:10]}"
        self.agent_type = ""
        self.input_schema: Any = None
        self.capabilities: frozenset[str] = frozenset()
        """What ``Describe`` lists (none: a service from before capabilities, or no Describe)."""
        self.main_session_id = ""
        self.interrupt_reply: pb.InterruptResponse | grpc.aio.AioRpcError | None = None
        self.interrupted_at: int | None = None
        """The interrupted session's last sequence just after an accepted Interrupt."""
        self.wait_honoured: bool | None = None
        """Seen to hold a running session's long poll (True), to answer it at once (False)."""
        self.wait_evidence = ""
        self.pending: Pending | None = None
        """The session ``input.suspended`` saw suspend, for ``input.answered`` to answer."""

    def declares(self, capability: str) -> bool | None:
        """Whether ``Describe`` lists ``capability``; None when it lists none at all (a
        service from before capabilities: only a probe can tell)."""
        if not self.capabilities:
            return None
        return capability in self.capabilities

    def require_capability(self, capability: str) -> None:
        """Skip the check unless ``Describe`` lists ``capability``."""
        if self.declares(capability):
            return
        listed = sorted(self.capabilities)
        raise Skipped(
            f"Describe does not list {capability!r} among its capabilities "
            f"({', '.join(listed) if listed else 'it lists none'}): not implemented"
        )

    def not_run(self, names: tuple[str, ...] | list[str], why: str) -> None:
        """Record ``names`` as failed without running them (what they need is missing)."""
        for name in names:
            self.results.append(CheckResult(name, False, f"not run: {why}"))

    async def check(self, name: str, body: Callable[[], Awaitable[str]]) -> bool:
        """Run one check; record its verdict. True when it passed (or was skipped)."""
        try:
            detail = await body()
        except Failed as exc:
            self.results.append(CheckResult(name, False, str(exc)))
            return False
        except Skipped as exc:
            self.results.append(CheckResult(name, True, str(exc), skipped=True))
            return True
        except grpc.aio.AioRpcError as exc:
            detail = f"unexpected {exc.code().name}: {exc.details()}"
            self.results.append(CheckResult(name, False, detail))
            return False
        except TimeoutError:
            self.results.append(CheckResult(name, False, "timed out"))
            return False
        except Exception as exc:  # an answer the kit did not foresee is a failure, not a crash
            self.results.append(CheckResult(name, False, f"{type(exc).__name__}: {exc}"))
            return False
        self.results.append(CheckResult(name, True, detail))
        return True

    async def start(self, input_json: str, session_id: str = "") -> pb.StartResponse:
        return await self.stub.Start(
            pb.StartRequest(session_id=session_id, input_json=input_json),
            timeout=self.rpc_timeout_s,
        )

    async def status(self, session_id: str) -> pb.GetStatusResponse:
        return await self.stub.GetStatus(
            pb.GetStatusRequest(session_id=session_id), timeout=self.rpc_timeout_s
        )

    async def long_poll(self, session_id: str, wait_s: float) -> LongPoll:
        """A plain ``GetStatus``, then, if it said RUNNING, one with ``wait_s``."""
        try:
            before = await self.status(session_id)
        except grpc.aio.AioRpcError as exc:
            return LongPoll(running=False, error=exc)
        poll = LongPoll(running=before.status == pb.SESSION_STATUS_RUNNING, wait_s=wait_s)
        if poll.running:
            poll.sent = time.monotonic()
            try:
                poll.reply = await self.stub.GetStatus(
                    waiting(session_id, wait_s), timeout=wait_s + timing.END_GRACE_S
                )
            except grpc.aio.AioRpcError as exc:
                poll.error = exc
            poll.answered = time.monotonic()
        return poll

    async def interrupt(
        self, session_id: str, reason: str = "", *, abort: bool = False
    ) -> pb.InterruptResponse:
        return await self.stub.Interrupt(
            pb.InterruptRequest(session_id=session_id, reason=reason, abort=abort),
            timeout=self.rpc_timeout_s,
        )

    async def submit(self, request: pb.SubmitInputRequest) -> pb.SubmitInputResponse:
        return await self.stub.SubmitInput(request, timeout=self.rpc_timeout_s)

    async def read(
        self,
        session_id: str,
        from_sequence: int = 0,
        *,
        leave_after: int | None = None,
        leave_when: Callable[[list[pb.StreamEvent]], bool] | None = None,
        limit_s: float | None = None,
    ) -> Read:
        """One ``Stream`` call, read to its end (or until ``leave_after`` events, or
        until ``leave_when`` holds of the events so far).

        Waits for events until the kit's deadline (or ``limit_s``), and at most
        ``timing.END_GRACE_S`` for the stream to end after its terminal event.
        """
        deadline = self.deadline if limit_s is None else time.monotonic() + limit_s
        result = Read()
        call = self.stub.Stream(
            pb.StreamRequest(session_id=session_id, from_sequence=from_sequence)
        )
        try:
            while True:
                done = result.terminal is not None
                wait = timing.END_GRACE_S if done else deadline - time.monotonic()
                if wait <= 0:
                    result.end = "timeout"
                    return result
                try:
                    message = await asyncio.wait_for(call.read(), wait)
                except TimeoutError:
                    result.end = "timeout"
                    return result
                if not isinstance(message, pb.StreamResponse):
                    result.end = "ok"  # grpc.aio.EOF: the server ended the stream
                    return result
                for event in message.events:
                    if result.terminal is not None:
                        result.after_terminal.append(event)
                    else:
                        result.events.append(event)
                        if is_terminal(event):
                            result.terminal_at = time.monotonic()
                if result.terminal is None and (
                    (leave_after is not None and len(result.events) >= leave_after)
                    or (leave_when is not None and leave_when(result.events))
                ):
                    result.end = "left"
                    return result
        except grpc.aio.AioRpcError as exc:
            result.end, result.code, result.details = "error", exc.code(), exc.details() or ""
            result.trailer = exc.trailing_metadata()
            return result
        finally:
            call.cancel()

    async def expect_error(
        self, code: grpc.StatusCode, call: Awaitable[object], *, field: str | None = None
    ) -> str:
        """Await ``call``; it must fail with ``code`` (and a message naming ``field``)."""
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            return verdict(code, exc.code(), exc.details() or "", field, exc.trailing_metadata())
        raise Failed(f"expected {code.name}, but the call succeeded")

    async def expect_stream_error(
        self, code: grpc.StatusCode, request: pb.StreamRequest, *, field: str | None = None
    ) -> str:
        """``Stream(request)`` must fail with ``code`` before sending any event."""
        read = await self.read(
            request.session_id, request.from_sequence, limit_s=self.rpc_timeout_s
        )
        require(
            read.end == "error" and not read.events,
            f"expected {code.name} before any event; the stream sent {len(read.events)} "
            f"event(s) and {read.describe_end()}",
        )
        return verdict(
            code, read.code or grpc.StatusCode.UNKNOWN, read.details, field, read.trailer
        )
