"""The conformance kit: the ``AgentService`` contract checked against any running service.

``helix-mesh conformance ADDRESS --input JSON [--bad-input JSON]`` runs it from the
command line; ``await run_conformance(address, input_json=...)`` from Python. The
service may be written in any language: the kit speaks only the wire, through the
raw generated stub (never ``AgentClient``, whose reconnects and duplicate filtering
would hide a server's mistakes), and checks what ``proto/helix/agent/v1/agent.proto``
promises:

- ``Start`` generates an id when none is given, is idempotent (the same id with an
  equal JSON input is ``created=false`` and never runs twice), and answers a
  different input under an existing id with ``ALREADY_EXISTS``;
- the log is gapless from 1, begins with ``run_started`` and ends with exactly one
  terminal event, after which the stream ends; two readers at once, a reader that
  leaves mid-run and comes back from its last sequence, and replays from the start,
  the middle and the end all see the same events;
- ``GetStatus`` agrees with the log; ``Interrupt`` of a finished session changes
  nothing and says so, and of a running one is reported truthfully;
- ``NOT_FOUND`` for unknown sessions and ``INVALID_ARGUMENT`` (``field: problem``)
  for bad requests, with no session created by a rejected ``Start``.
- ``Continue`` (optional: ``UNIMPLEMENTED`` makes it a skip) starts a fresh second
  turn on the finished main session once, even when retried; the turn's stream
  begins with ``turn_started`` right after the old terminal event and ends at its
  own, and a replay from 0 still ends at the first turn's terminal event; another
  message for that turn is ``ALREADY_EXISTS``, a turn out of order
  ``FAILED_PRECONDITION``. It runs last, since it adds to the main session.
- ``GetStatus`` with ``wait`` (the optional long poll): of a finished session it
  answers at once (within ``WAIT_PROMPT_S`` of a ``WAIT_FINISHED_S`` wait) with the
  log's end, whether the service implements ``wait`` or not. Of the main session while
  it runs, it answers the log's terminal status and sequence when the session ends,
  RUNNING once the wait has passed, or RUNNING at once (within half the wait: ``wait``
  not implemented); never a terminal reply the log disagrees with, RUNNING after the
  log's end reached a reader, or a reply later than the end or the wait by more than
  ``END_GRACE_S`` (a skip when the session had ended before the kit could poll it).
  A wait below 0 or over 60 s is ``INVALID_ARGUMENT`` (``field: wait``); rejecting
  one but not the other fails. A service that ignores ``wait`` accepts both, so
  accepting both is a skip when the kit saw the service answer the running session
  at once, or could not tell (the session ended first; a slower run tells), and a
  failure when it saw the service hold that reply for half the wait or more (the
  line ``dispatch`` draws too): a service that implements ``wait`` must check it.

The caller gives a valid input; an input the schema rejects is derived from
``Describe`` when not given. Each session the kit starts uses that input, so a
service whose runs are slow makes the kit slow, not wrong; a run slowed down (e.g.
``HELIX_SCRIPTED_DELAY_MS``) exercises the live tail more.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport._rich_status import read_details
from helix_transport.transport._auth import ClientAuth, open_channel

__all__ = ["CheckResult", "format_results", "run_conformance"]

TERMINAL_PAYLOADS = ("completed", "failed", "interrupted", "terminated")
TERMINAL_STATUS = {
    "completed": pb.SESSION_STATUS_COMPLETED,
    "failed": pb.SESSION_STATUS_FAILED,
    "interrupted": pb.SESSION_STATUS_INTERRUPTED,
    "terminated": pb.SESSION_STATUS_TERMINATED,
}
AGENT_TYPE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")
END_GRACE_S = 5.0
"""How long a stream may stay open after its terminal event before it counts as not ending
(and how late a long poll may answer after the session's end or its wait)."""
MAX_WAIT_S = 60
"""The longest ``GetStatusRequest.wait`` the contract allows."""
WAIT_FINISHED_S = 10.0
"""The long poll the kit asks of a finished session, which must not wait at all."""
WAIT_PROMPT_S = 5.0
"""How soon that long poll of a finished session must answer."""
WAIT_RUNNING_S = 5.0
"""The long poll the kit asks of its main session while it runs; a RUNNING reply within
half of it means the service does not implement ``wait``."""
INTERRUPT_REASON = "conformance: interrupted right after Start"
MAX_SEQUENCE = 2**53 - 1
"""The largest ``from_sequence`` the contract allows (JSON and JavaScript numbers)."""
BEYOND_THE_END = 10**9
"""A ``from_sequence`` far past any log the kit's sessions write."""
CONCURRENT_STARTS = 5
SESSION_CHECKS = (
    "start.idempotent",
    "start.conflict",
    "start.concurrent",
    "stream.concurrent_readers",
    "stream.gapless",
    "stream.ends_after_terminal",
    "stream.resume_mid_run",
    "stream.replay",
    "stream.beyond_the_end",
    "session.completed",
    "status.finished",
    "status.wait_finished",
    "status.wait_running",
    "start.after_finish",
    "interrupt.finished",
    "interrupt.running",
)
"""The checks that need the kit's sessions (reported as not run when Start fails)."""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one contract check."""

    name: str
    """Dotted, stable name, e.g. ``stream.gapless``."""
    passed: bool
    """False when the service broke the contract (a skipped check counts as passed)."""
    detail: str = ""
    """What was seen: the evidence for a failure, the facts behind a pass."""
    skipped: bool = False
    """True when the kit could not run the check (the detail says why)."""


class _Failed(Exception):
    """A check's verdict: the service broke the contract."""


class _Skipped(Exception):
    """A check could not be run; not the service's fault."""


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise _Failed(detail)


def _kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


def _is_terminal(event: pb.StreamEvent) -> bool:
    return _kind(event) in TERMINAL_PAYLOADS


def _status_name(value: pb.SessionStatus.ValueType) -> str:
    try:
        return pb.SessionStatus.Name(value)
    except ValueError:
        return str(value)


def _wire(events: list[pb.StreamEvent]) -> list[bytes]:
    return [e.SerializeToString(deterministic=True) for e in events]


def _json_equal(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


@dataclass
class _Read:
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
        return self.events[-1] if self.events and _is_terminal(self.events[-1]) else None

    def describe_end(self) -> str:
        if self.end == "error":
            name = self.code.name if self.code is not None else "?"
            return f"ended with {name}: {self.details}"
        if self.end == "timeout":
            return "was still open"
        return "ended cleanly" if self.end == "ok" else "was left by the reader"

    def require_complete(self, what: str) -> None:
        """The read ended cleanly right after one terminal event, with nothing after it."""
        _require(
            self.terminal is not None,
            f"{what}: {self.describe_end()} after {len(self.events)} event(s) and no terminal event",
        )
        _require(
            not self.after_terminal,
            f"{what}: {len(self.after_terminal)} event(s) sent after the terminal event",
        )
        _require(
            self.end == "ok",
            f"{what}: the stream {self.describe_end()} after the terminal event "
            f"(it must end with OK right after it)",
        )


@dataclass
class _LongPoll:
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


def _waiting(session_id: str, wait_s: float) -> pb.GetStatusRequest:
    request = pb.GetStatusRequest(session_id=session_id)
    request.wait.FromNanoseconds(round(wait_s * 1e9))
    return request


def _gapless(events: list[pb.StreamEvent], *, first: int = 1) -> str:
    """Empty when ``events`` are numbered ``first, first + 1, ...``; else what is wrong."""
    expected = first
    for event in events:
        if event.sequence != expected:
            seen = [e.sequence for e in events][:50]
            return f"expected sequence {expected}, got {event.sequence} (sequences: {seen})"
        expected += 1
    return ""


def _verdict(
    expected: grpc.StatusCode,
    got: grpc.StatusCode,
    details: str,
    field: str | None,
    trailer: Any = None,
) -> str:
    """``details`` when a call failed as expected (naming ``field`` first, with a
    ``BadRequest`` violation of it in the trailer); else fail."""
    _require(got == expected, f"expected {expected.name}, got {got.name}: {details}")
    if field is not None:
        _require(
            _names_field(details, field),
            f"{expected.name} message {details!r} does not start with '{field}: <problem>'",
        )
        violations = read_details(got, trailer).violations
        _require(
            any(_names_field(f"{name}: {problem}", field) for name, problem in violations),
            f"{expected.name} {details!r} carries no google.rpc.BadRequest violation of "
            f"{field!r} in grpc-status-details-bin (found {violations or 'none'})",
        )
    return details


def _names_field(details: str, field: str) -> bool:
    """True when ``details`` starts with ``field`` (or a path within it), a colon and a
    problem."""
    return re.match(rf"{re.escape(field)}([.\[][^:]*)?: \S", details) is not None


def _respelled(input_json: str) -> str:
    """The same JSON value spelled differently: keys reversed, other whitespace."""

    def reverse(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: reverse(v) for k, v in reversed(list(value.items()))}
        if isinstance(value, list):
            return [reverse(v) for v in value]
        return value

    return json.dumps(reverse(json.loads(input_json)), indent=1, ensure_ascii=True)


def _different(input_json: str) -> str | None:
    """A different input of the same shape (its first string changed), or None."""
    value = json.loads(input_json)

    def change(node: Any) -> tuple[Any, bool]:
        if isinstance(node, str):
            return node + " (conformance)", True
        if isinstance(node, dict):
            out = dict(node)
            for key, item in node.items():
                out[key], done = change(item)
                if done:
                    return out, True
            return node, False
        if isinstance(node, list):
            items = list(node)
            for index, item in enumerate(node):
                items[index], done = change(item)
                if done:
                    return items, True
            return node, False
        return node, False

    changed, done = change(value)
    return json.dumps(changed) if done else None


def _rejected_input(schema: Any) -> tuple[str, str] | None:
    """An input any validator of ``schema`` rejects, and why; None when none is certain."""
    if not isinstance(schema, dict):
        return None
    required = schema.get("required")
    if isinstance(required, list) and required:
        return "{}", f"misses the required {required[0]!r}"
    if schema.get("type") == "object":
        return "[]", "is an array where the schema wants an object"
    return None


class _Kit:
    def __init__(
        self,
        stub: pb_grpc.AgentServiceAsyncStub,
        channel: grpc.aio.Channel,
        *,
        input_json: str,
        bad_input_json: str | None,
        timeout_s: float,
    ) -> None:
        self.stub = stub
        self.channel = channel
        self.input_json = input_json
        self.bad_input_json = bad_input_json
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.rpc_timeout_s = min(10.0, timeout_s)
        self.results: list[CheckResult] = []
        self.prefix = f"conformance-{uuid.uuid4().hex[:10]}"
        self.agent_type = ""
        self.input_schema: Any = None
        self.main_session_id = ""
        self.interrupt_reply: pb.InterruptResponse | grpc.aio.AioRpcError | None = None
        self.interrupted_at: int | None = None
        """The interrupted session's last sequence just after an accepted Interrupt."""
        self.wait_honoured: bool | None = None
        """Seen to hold a running session's long poll (True), to answer it at once (False)."""
        self.wait_evidence = ""

    # --- plumbing -----------------------------------------------------------------

    async def check(self, name: str, body: Callable[[], Awaitable[str]]) -> bool:
        """Run one check; record its verdict. True when it passed (or was skipped)."""
        try:
            detail = await body()
        except _Failed as exc:
            self.results.append(CheckResult(name, False, str(exc)))
            return False
        except _Skipped as exc:
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

    async def long_poll(self, session_id: str, wait_s: float) -> _LongPoll:
        """A plain ``GetStatus``, then, if it said RUNNING, one with ``wait_s``."""
        try:
            before = await self.status(session_id)
        except grpc.aio.AioRpcError as exc:
            return _LongPoll(running=False, error=exc)
        poll = _LongPoll(running=before.status == pb.SESSION_STATUS_RUNNING, wait_s=wait_s)
        if poll.running:
            poll.sent = time.monotonic()
            try:
                poll.reply = await self.stub.GetStatus(
                    _waiting(session_id, wait_s), timeout=wait_s + END_GRACE_S
                )
            except grpc.aio.AioRpcError as exc:
                poll.error = exc
            poll.answered = time.monotonic()
        return poll

    async def interrupt(self, session_id: str, reason: str = "") -> pb.InterruptResponse:
        return await self.stub.Interrupt(
            pb.InterruptRequest(session_id=session_id, reason=reason), timeout=self.rpc_timeout_s
        )

    async def read(
        self,
        session_id: str,
        from_sequence: int = 0,
        *,
        leave_after: int | None = None,
        limit_s: float | None = None,
    ) -> _Read:
        """One ``Stream`` call, read to its end (or until ``leave_after`` events).

        Waits for events until the kit's deadline (or ``limit_s``), and at most
        ``END_GRACE_S`` for the stream to end after its terminal event.
        """
        deadline = self.deadline if limit_s is None else time.monotonic() + limit_s
        result = _Read()
        call = self.stub.Stream(
            pb.StreamRequest(session_id=session_id, from_sequence=from_sequence)
        )
        try:
            while True:
                done = result.terminal is not None
                wait = END_GRACE_S if done else deadline - time.monotonic()
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
                        if _is_terminal(event):
                            result.terminal_at = time.monotonic()
                if (
                    leave_after is not None
                    and result.terminal is None
                    and len(result.events) >= leave_after
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
            return _verdict(code, exc.code(), exc.details() or "", field, exc.trailing_metadata())
        raise _Failed(f"expected {code.name}, but the call succeeded")

    async def expect_stream_error(
        self, code: grpc.StatusCode, request: pb.StreamRequest, *, field: str | None = None
    ) -> str:
        """``Stream(request)`` must fail with ``code`` before sending any event."""
        read = await self.read(
            request.session_id, request.from_sequence, limit_s=self.rpc_timeout_s
        )
        _require(
            read.end == "error" and not read.events,
            f"expected {code.name} before any event; the stream sent {len(read.events)} "
            f"event(s) and {read.describe_end()}",
        )
        return _verdict(
            code, read.code or grpc.StatusCode.UNKNOWN, read.details, field, read.trailer
        )

    # --- the checks -----------------------------------------------------------------

    async def run(self) -> list[CheckResult]:
        await self.check("health", self.check_health)
        described = await self.check("describe", self.check_describe)
        if not described and self.results[-1].detail.startswith("unexpected UNAVAILABLE"):
            return self.results  # nothing listens there: every other check would say so
        sessions = await self.check_start()
        if sessions is not None:
            main, other = sessions
            self.main_session_id = main.session_id
            await self.check_streams(main)
            await self.check("interrupt.running", lambda: self.check_interrupt_running(other))
        else:
            for name in SESSION_CHECKS:
                self.results.append(CheckResult(name, False, "not run: Start failed"))
        await self.check("errors.not_found", self.check_not_found)
        await self.check("errors.empty_session_id", self.check_empty_session_id)
        await self.check("errors.from_sequence_out_of_range", self.check_from_sequence_range)
        await self.check("errors.wait_out_of_range", self.check_wait_out_of_range)
        await self.check("errors.malformed_input", self.check_malformed_input)
        await self.check("errors.unparsable_request", self.check_unparsable_request)
        await self.check("errors.schema_rejected_input", self.check_rejected_input)
        if sessions is not None:  # last: it adds a turn to the main session
            await self.check("continue.new_turn", self.check_continue)
        else:
            self.results.append(CheckResult("continue.new_turn", False, "not run: Start failed"))
        return self.results

    async def check_health(self) -> str:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self.channel)
        for service in ("", pb.DESCRIPTOR.services_by_name["AgentService"].full_name):
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.rpc_timeout_s
            )
            _require(
                reply.status == health_pb2.HealthCheckResponse.SERVING,
                f"grpc.health.v1 Check({service!r}) is "
                f"{health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}, not SERVING",
            )
        return "grpc.health.v1: SERVING"

    async def check_describe(self) -> str:
        described = await self.stub.Describe(pb.DescribeRequest(), timeout=self.rpc_timeout_s)
        self.agent_type = described.agent_type
        _require(
            AGENT_TYPE.match(described.agent_type) is not None,
            f"agent_type {described.agent_type!r} does not match {AGENT_TYPE.pattern}",
        )
        try:
            self.input_schema = json.loads(described.input_schema_json)
            output_schema = json.loads(described.output_schema_json)
        except ValueError as exc:
            raise _Failed(f"a schema is not valid JSON: {exc}") from None
        _require(
            isinstance(self.input_schema, dict) and isinstance(output_schema, dict),
            "input_schema_json and output_schema_json must be JSON Schema objects",
        )
        return f"agent {described.agent_type!r}, tools {list(described.tool_names)}"

    async def check_start(self) -> tuple[pb.StartResponse, pb.StartResponse] | None:
        """Start the two sessions every later check uses: one to read, one to interrupt."""
        sessions: list[pb.StartResponse] = []

        async def generated_id() -> str:
            main = await self.start(self.input_json)
            # The second session is interrupted at once, before anything reads the first.
            other = await self.start(self.input_json)
            sessions.extend([main, other])  # later checks use them, whatever the verdict
            try:
                self.interrupt_reply = await self.interrupt(other.session_id, INTERRUPT_REASON)
                if self.interrupt_reply.accepted:
                    self.interrupted_at = (await self.status(other.session_id)).last_sequence
            except grpc.aio.AioRpcError as exc:
                self.interrupt_reply = exc  # reported by interrupt.running
            for reply in (main, other):
                _require(reply.created, "Start with an empty session_id returned created=false")
                _require(
                    SESSION_ID.match(reply.session_id) is not None,
                    f"generated session_id {reply.session_id!r} is not a valid session id",
                )
                _require(
                    reply.agent_type == self.agent_type,
                    f"StartResponse.agent_type {reply.agent_type!r} != Describe's "
                    f"{self.agent_type!r}",
                )
                _require(
                    reply.status != pb.SESSION_STATUS_UNSPECIFIED,
                    "StartResponse.status is UNSPECIFIED",
                )
            _require(
                main.session_id != other.session_id,
                f"two Starts with an empty id both got {main.session_id!r}",
            )
            return f"generated {main.session_id!r} and {other.session_id!r}"

        await self.check("start.generated_id", generated_id)
        if not sessions:
            return None
        main, other = sessions

        async def idempotent() -> str:
            again = await self.start(_respelled(self.input_json), main.session_id)
            _require(
                not again.created,
                "Start with the same id and an equal input (respelled) returned created=true",
            )
            _require(
                again.session_id == main.session_id,
                f"returned session_id {again.session_id!r}",
            )
            return "same id + equal JSON input (keys reordered, whitespace changed): created=false"

        async def conflict() -> str:
            different = _different(self.input_json)
            if different is None:
                raise _Skipped("cannot derive a different input (the input has no string)")
            try:
                await self.start(different, main.session_id)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                    return f"ALREADY_EXISTS: {exc.details()}"
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise _Skipped(
                        f"the derived different input {different} is not valid here "
                        f"({exc.details()}); cannot check ALREADY_EXISTS"
                    ) from None
                raise _Failed(f"expected ALREADY_EXISTS, got {exc.code().name}") from None
            raise _Failed("Start with an existing id and a different input succeeded")

        async def concurrent() -> str:
            session_id = f"{self.prefix}-concurrent"
            replies = await asyncio.gather(
                *(self.start(self.input_json, session_id) for _ in range(CONCURRENT_STARTS))
            )
            await self.interrupt(session_id, "conformance: only its start matters")
            created = sum(r.created for r in replies)
            _require(
                created == 1,
                f"{created} of {CONCURRENT_STARTS} concurrent identical Starts returned created=true",
            )
            read = await self.read(session_id)
            read.require_complete("its stream")
            starts = [_kind(e) for e in read.events].count("run_started")
            _require(starts == 1, f"the session's log has {starts} run_started events")
            return f"{CONCURRENT_STARTS} identical Starts at once: one created, one run"

        await self.check("start.idempotent", idempotent)
        await self.check("start.conflict", conflict)
        await self.check("start.concurrent", concurrent)
        return main, other

    async def check_streams(self, main: pb.StartResponse) -> None:
        session_id = main.session_id
        # A long poll of the session while it runs (when it still does), two readers
        # from the start, and one that leaves after a few events and comes back from
        # its last sequence (mid-run when the run is slow enough).
        poll_task = asyncio.create_task(self.long_poll(session_id, WAIT_RUNNING_S))
        # Past the end of the log while it grows: must end when the session does.
        beyond_task = asyncio.create_task(self.read(session_id, BEYOND_THE_END))
        first_task = asyncio.create_task(self.read(session_id))
        second_task = asyncio.create_task(self.read(session_id))
        partial = await self.read(session_id, leave_after=3)
        running_at_return = False
        if partial.end == "left":
            running_at_return = (await self.status(session_id)).status == pb.SESSION_STATUS_RUNNING
            last = partial.events[-1].sequence
            rest = await self.read(session_id, last)
        else:
            rest = _Read()
        first, second = await first_task, await second_task
        log = first.events

        async def readers() -> str:
            first.require_complete("first reader")
            second.require_complete("second reader")
            _require(
                _wire(first.events) == _wire(second.events),
                f"two readers at once saw different logs ({len(first.events)} and "
                f"{len(second.events)} events)",
            )
            return f"two concurrent readers from 0 saw the same {len(log)} events"

        if not await self.check("stream.concurrent_readers", readers):
            poll_task.cancel()
            beyond_task.cancel()
            # Every later check of this session needs its complete log.
            skipped = SESSION_CHECKS[SESSION_CHECKS.index("stream.gapless") : -1]
            for name in skipped:
                self.results.append(
                    CheckResult(name, False, "not run: no complete log (see concurrent_readers)")
                )
            return

        async def gapless() -> str:
            _require(not (gap := _gapless(log)), gap)
            kinds = [_kind(e) for e in log]
            _require(kinds[0] == "run_started", f"the first event is {kinds[0]!r}, not run_started")
            _require(kinds.count("run_started") == 1, "run_started appears more than once")
            terminals = [k for k in kinds if k in TERMINAL_PAYLOADS]
            _require(len(terminals) == 1, f"{len(terminals)} terminal events: {terminals}")
            for event in log:
                _require(
                    event.session_id == session_id and event.agent_type == self.agent_type,
                    f"event {event.sequence} carries session_id {event.session_id!r} and "
                    f"agent_type {event.agent_type!r}",
                )
                _require(event.time.seconds > 0, f"event {event.sequence} has no time")
                _require(event.step >= 0, f"event {event.sequence} has step {event.step}")
            _require(
                _json_equal(log[0].run_started.input_json, self.input_json),
                f"run_started.input_json {log[0].run_started.input_json!r} is not the input",
            )
            return f"sequences 1..{len(log)}, run_started first, {kinds[-1]} last"

        async def ends() -> str:
            return f"ended cleanly right after the {_kind(log[-1])} event"

        async def resume() -> str:
            if partial.end != "left":
                partial.require_complete("the leaving reader")
                raise _Skipped(
                    f"the session ended within {len(partial.events)} event(s); no mid-run reconnect"
                )
            rest.require_complete("the returning reader")
            _require(
                _wire(partial.events + rest.events) == _wire(log),
                f"left after sequence {partial.events[-1].sequence}, came back with "
                f"from_sequence={partial.events[-1].sequence} and got "
                f"{[e.sequence for e in rest.events][:20]}...: not the rest of the log",
            )
            when = "while the session ran" if running_at_return else "after the session ended"
            return (
                f"left after {len(partial.events)} events, resumed {when}, nothing lost or repeated"
            )

        async def replay() -> str:
            last = log[-1].sequence
            middle = last // 2
            whole = await self.read(session_id, 0)
            whole.require_complete("replay from 0")
            _require(_wire(whole.events) == _wire(log), "replay from 0 differs from the live log")
            half = await self.read(session_id, middle)
            half.require_complete(f"replay from {middle}")
            _require(
                _wire(half.events) == _wire(log[middle:]),
                f"replay from {middle} sent {[e.sequence for e in half.events][:20]}, "
                f"not {middle + 1}..{last}",
            )
            slowest = 0.0
            for position in (last, last + 10):
                started = time.monotonic()
                tail = await self.read(session_id, position)
                slowest = max(slowest, time.monotonic() - started)
                _require(
                    not tail.events and tail.end == "ok",
                    f"from_sequence={position} on the finished session: "
                    f"{len(tail.events)} event(s), and the stream {tail.describe_end()} "
                    "(it must end, promptly, with none)",
                )
            return (
                f"from 0, {middle} and {last}: the same log; at/past the end: no event, "
                f"ended within {slowest:.2f}s"
            )

        await self.check("stream.gapless", gapless)
        await self.check("stream.ends_after_terminal", ends)
        await self.check("stream.resume_mid_run", resume)

        async def beyond() -> str:
            try:
                far = await asyncio.wait_for(asyncio.shield(beyond_task), END_GRACE_S)
            except TimeoutError:
                beyond_task.cancel()
                raise _Failed(
                    f"a stream from from_sequence={BEYOND_THE_END}, opened as the session "
                    f"ran, was still open {END_GRACE_S:g}s after the session ended (it must "
                    "end when the session does)"
                ) from None
            _require(
                not far.events and far.end == "ok",
                f"a stream from from_sequence={BEYOND_THE_END}: {len(far.events)} event(s), "
                f"and it {far.describe_end()} (it must end with none)",
            )
            return f"from_sequence={BEYOND_THE_END}, opened as the session ran: ended with it"

        await self.check("stream.replay", replay)
        await self.check("stream.beyond_the_end", beyond)
        terminal = log[-1]

        async def completed() -> str:
            _require(
                _kind(terminal) == "completed",
                f"the valid input ended {_kind(terminal)}: "
                f"{terminal.failed.error if _kind(terminal) == 'failed' else ''}",
            )
            outputs = [e for e in log if _kind(e) == "output"]
            if outputs:
                _require(
                    _json_equal(outputs[-1].output.output_json, terminal.completed.output_json),
                    "the output event and completed.output_json differ",
                )
            return f"completed with output {terminal.completed.output_json[:80]}"

        async def status() -> str:
            reply = await self.status(session_id)
            expected = TERMINAL_STATUS[_kind(terminal)]
            _require(reply.session_id == session_id, f"session_id {reply.session_id!r}")
            _require(reply.agent_type == self.agent_type, f"agent_type {reply.agent_type!r}")
            _require(
                reply.status == expected,
                f"status {_status_name(reply.status)}, but the log ends {_kind(terminal)}",
            )
            _require(
                reply.last_sequence == terminal.sequence,
                f"last_sequence {reply.last_sequence}, but the terminal event is "
                f"{terminal.sequence}",
            )
            if expected == pb.SESSION_STATUS_COMPLETED:
                _require(
                    _json_equal(reply.output_json, terminal.completed.output_json),
                    f"output_json {reply.output_json!r} is not completed.output_json",
                )
            if expected == pb.SESSION_STATUS_FAILED:
                _require(bool(reply.error), "a failed session's status has no error")
            created, updated = reply.created_at.ToNanoseconds(), reply.updated_at.ToNanoseconds()
            finished = reply.finished_at.ToNanoseconds()
            _require(created > 0, "created_at is not set")
            _require(updated >= created, "updated_at is not set or before created_at")
            _require(finished >= created, "finished_at is not set (or before created_at)")
            _require(reply.parent_session_id == "", "a root session has a parent_session_id")
            usage = reply.usage
            _require(
                usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
                "usage.total_tokens != prompt_tokens + completion_tokens",
            )
            return (
                f"{_status_name(reply.status)}, last_sequence {reply.last_sequence}, "
                f"step_count {reply.step_count}, timestamps set"
            )

        def agrees(reply: pb.GetStatusResponse) -> bool:
            return (
                reply.status == TERMINAL_STATUS[_kind(terminal)]
                and reply.last_sequence == terminal.sequence
            )

        def disagreement(what: str, reply: pb.GetStatusResponse) -> str:
            return (
                f"{what} answered {_status_name(reply.status)} at sequence "
                f"{reply.last_sequence}, but the log ends {_kind(terminal)} at {terminal.sequence}"
            )

        async def wait_finished() -> str:
            # Whether the service implements wait or not, a finished session's long
            # poll has nothing to wait for.
            what = f"GetStatus with wait={WAIT_FINISHED_S:g}s of the finished session"
            started = time.monotonic()
            try:
                reply = await self.stub.GetStatus(
                    _waiting(session_id, WAIT_FINISHED_S), timeout=WAIT_PROMPT_S
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
                raise _Failed(
                    f"{what} did not answer within {WAIT_PROMPT_S:g}s (it must answer at once)"
                ) from None
            took = time.monotonic() - started
            _require(agrees(reply), disagreement(what, reply))
            return (
                f"wait={WAIT_FINISHED_S:g}s: {_status_name(reply.status)} at sequence "
                f"{reply.last_sequence}, answered in {took:.2f}s"
            )

        async def wait_running() -> str:
            poll = await poll_task
            wait_s = poll.wait_s
            what = f"GetStatus with wait={wait_s:g}s of the running session"
            if poll.error is not None:
                if poll.running and poll.error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise _Failed(
                        f"{what} did not answer within {wait_s + END_GRACE_S:g}s "
                        "(the wait plus END_GRACE_S)"
                    )
                raise poll.error
            if not poll.running or poll.reply is None:
                raise _Skipped("the session had ended before the kit could poll it running")
            reply, took = poll.reply, poll.took
            # When the log's end reached a reader; the server logged it no later.
            ended = min(t for t in (first.terminal_at, second.terminal_at) if t is not None)
            late = poll.answered - ended
            if reply.status != pb.SESSION_STATUS_RUNNING:
                _require(agrees(reply), disagreement(what, reply))
                _require(
                    poll.answered <= min(poll.sent + wait_s, ended) + END_GRACE_S,
                    f"{what} answered {_status_name(reply.status)} after {took:.2f}s, "
                    f"{late:.2f}s after the log's terminal event reached a reader (it must "
                    "answer when the session ends or the wait has passed)",
                )
                if took >= wait_s / 2:
                    self.wait_honoured = True
                    self.wait_evidence = f"held a running session's reply {took:.2f}s"
                return (
                    f"answered {_status_name(reply.status)} at sequence {reply.last_sequence} "
                    f"(the log's end) after {took:.2f}s"
                )
            _require(
                reply.last_sequence <= terminal.sequence,
                f"{what} answered RUNNING at sequence {reply.last_sequence}, past the log's "
                f"terminal event {terminal.sequence}",
            )
            _require(
                late <= END_GRACE_S,
                f"{what} answered RUNNING after {took:.2f}s, {late:.2f}s after the log's "
                "terminal event reached a reader (the session had ended)",
            )
            if took < wait_s / 2:
                self.wait_honoured = False
                self.wait_evidence = f"answered a running session RUNNING after {took:.2f}s"
                return (
                    f"answered RUNNING at once ({took:.2f}s): the service does not implement "
                    "wait (its callers must pace their polls)"
                )
            _require(
                took >= wait_s * 0.9,
                f"{what} answered RUNNING after {took:.2f}s: neither at once (wait not "
                "implemented) nor once the wait had passed",
            )
            self.wait_honoured = True
            self.wait_evidence = f"held a running session's reply {took:.2f}s"
            return (
                f"held the reply {took:.2f}s, then answered RUNNING at sequence "
                f"{reply.last_sequence}; the session ended later"
            )

        async def again() -> str:
            reply = await self.start(self.input_json, session_id)
            _require(not reply.created, "Start of a finished session returned created=true")
            _require(
                reply.status == TERMINAL_STATUS[_kind(terminal)],
                f"Start of a finished session says {_status_name(reply.status)}",
            )
            after = await self.status(session_id)
            _require(
                after.last_sequence == terminal.sequence,
                f"the log grew to {after.last_sequence} events: the session ran again",
            )
            return "created=false, status terminal, the log unchanged"

        async def finished_interrupt() -> str:
            reply = await self.interrupt(session_id, "conformance: already finished")
            expected = TERMINAL_STATUS[_kind(terminal)]
            _require(not reply.accepted, "Interrupt of a finished session returned accepted=true")
            _require(
                reply.status == expected,
                f"Interrupt of a finished session says {_status_name(reply.status)}, "
                f"not {_status_name(expected)}",
            )
            after = await self.status(session_id)
            _require(after.status == expected, f"the status became {_status_name(after.status)}")
            replay = await self.read(session_id, 0)
            _require(
                _wire(replay.events) == _wire(log),
                "the log changed after interrupting the finished session",
            )
            return f"accepted=false, status stays {_status_name(expected)}, the log unchanged"

        await self.check("session.completed", completed)
        await self.check("status.finished", status)
        await self.check("status.wait_finished", wait_finished)
        await self.check("status.wait_running", wait_running)
        await self.check("start.after_finish", again)
        await self.check("interrupt.finished", finished_interrupt)

    async def check_interrupt_running(self, other: pb.StartResponse) -> str:
        """The second session was interrupted right after its Start: told truthfully?"""
        reply = self.interrupt_reply
        if isinstance(reply, grpc.aio.AioRpcError):
            raise _Failed(
                f"Interrupt of a running session failed: {reply.code().name}: {reply.details()}"
            )
        assert reply is not None
        read = await self.read(other.session_id)
        read.require_complete("the interrupted session's stream")
        _require(not (gap := _gapless(read.events)), gap)
        final = _kind(read.events[-1])
        status = await self.status(other.session_id)
        _require(
            status.status == TERMINAL_STATUS[final],
            f"GetStatus says {_status_name(status.status)}, but the log ends {final}",
        )
        if reply.accepted:
            _require(
                reply.status == pb.SESSION_STATUS_RUNNING,
                f"accepted=true with status {_status_name(reply.status)} (must be RUNNING)",
            )
            _require(
                final in ("interrupted", "completed"),
                f"accepted=true, but the session ended {final}",
            )
            if final == "interrupted":
                _require(
                    read.events[-1].interrupted.reason == INTERRUPT_REASON,
                    f"interrupted.reason is {read.events[-1].interrupted.reason!r}, "
                    f"not the request's {INTERRUPT_REASON!r}",
                )
                outcome = "accepted=true; the run ended interrupted, with the request's reason"
            else:
                outcome = "accepted=true; the run completed before its next safe point"
            if self.interrupted_at is not None:
                # One step may start as the interrupt is delivered (from another
                # replica, through the store); more means the run did not stop.
                steps = sum(
                    1
                    for e in read.events
                    if e.sequence > self.interrupted_at and _kind(e) == "step_started"
                )
                _require(
                    steps <= 1,
                    f"accepted=true, but the run started {steps} more steps and ended "
                    f"{final}: it did not stop at its next safe point",
                )
        else:
            _require(
                reply.status == TERMINAL_STATUS[final],
                f"accepted=false with status {_status_name(reply.status)}, but the "
                f"session ended {final}",
            )
            _require(final != "interrupted", "accepted=false, but the session was interrupted")
            outcome = f"accepted=false; it had already ended {final}"
        again = await self.interrupt(other.session_id, "conformance: twice")
        _require(
            not again.accepted and again.status == status.status,
            f"a second Interrupt after the end: accepted={again.accepted}, "
            f"status {_status_name(again.status)}",
        )
        return outcome

    async def check_continue(self) -> str:
        """``Continue`` (optional): a fresh turn on the finished main session, idempotent."""
        session_id = self.main_session_id
        before = await self.status(session_id)
        request = pb.ContinueRequest(
            session_id=session_id, message=self.input_json, turn=2, fresh=True
        )
        try:
            reply = await self.stub.Continue(request, timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise _Skipped("Continue is optional; the service answers UNIMPLEMENTED") from None
            raise
        _require(
            reply.created and reply.turn == 2 and reply.from_sequence == before.last_sequence,
            f"Continue of a finished session: created={reply.created}, turn={reply.turn}, "
            f"from_sequence={reply.from_sequence} (the log ended at {before.last_sequence})",
        )
        again = await self.stub.Continue(request, timeout=self.rpc_timeout_s)
        _require(
            not again.created and again.from_sequence == reply.from_sequence,
            f"a retried Continue: created={again.created}, from_sequence={again.from_sequence}",
        )
        read = await self.read(session_id, reply.from_sequence)
        read.require_complete("the new turn's stream")
        _require(not (gap := _gapless(read.events, first=reply.from_sequence + 1)), gap)
        first = read.events[0]
        _require(
            _kind(first) == "turn_started" and first.turn_started.turn == 2,
            f"the new turn begins with {_kind(first)}, not turn_started{{turn: 2}}",
        )
        # A replay of the whole log is turn 1 alone: its stream ends at turn 1's
        # terminal event even though the log goes on with turn 2.
        whole = await self.read(session_id, 0)
        whole.require_complete("a replay from 0 of the continued session")
        _require(
            whole.events[-1].sequence == reply.from_sequence,
            f"a replay from 0 of the continued session ended at sequence "
            f"{whole.events[-1].sequence}, not at turn 1's terminal event "
            f"({reply.from_sequence})",
        )
        after = await self.status(session_id)
        final = _kind(read.events[-1])
        _require(
            after.status == TERMINAL_STATUS[final]
            and after.last_sequence == read.events[-1].sequence,
            f"after the turn GetStatus says {_status_name(after.status)} at "
            f"{after.last_sequence}, but the log ends {final} at {read.events[-1].sequence}",
        )
        other = pb.ContinueRequest(
            session_id=session_id, message=self.input_json + " ", turn=2, fresh=False
        )
        await self.expect_error(
            grpc.StatusCode.ALREADY_EXISTS, self.stub.Continue(other, timeout=self.rpc_timeout_s)
        )
        # A valid input: a fresh turn's message is one, and is checked as one first.
        skip = pb.ContinueRequest(
            session_id=session_id, message=self.input_json, turn=4, fresh=True
        )
        await self.expect_error(
            grpc.StatusCode.FAILED_PRECONDITION,
            self.stub.Continue(skip, timeout=self.rpc_timeout_s),
        )
        return (
            f"turn 2 ran after sequence {reply.from_sequence} and ended {final}; a replay "
            "from 0 ended at turn 1's end; a retry was created=false; another message "
            "ALREADY_EXISTS; turn 4 FAILED_PRECONDITION"
        )

    async def check_not_found(self) -> str:
        missing = f"{self.prefix}-missing"
        await self.expect_error(grpc.StatusCode.NOT_FOUND, self.status(missing))
        await self.expect_error(grpc.StatusCode.NOT_FOUND, self.interrupt(missing))
        await self.expect_stream_error(
            grpc.StatusCode.NOT_FOUND, pb.StreamRequest(session_id=missing)
        )
        return "GetStatus, Interrupt and Stream of an unknown session: NOT_FOUND"

    async def check_empty_session_id(self) -> str:
        await self.expect_error(
            grpc.StatusCode.INVALID_ARGUMENT, self.status(""), field="session_id"
        )
        await self.expect_error(
            grpc.StatusCode.INVALID_ARGUMENT, self.interrupt(""), field="session_id"
        )
        await self.expect_stream_error(
            grpc.StatusCode.INVALID_ARGUMENT, pb.StreamRequest(session_id=""), field="session_id"
        )
        return "GetStatus, Interrupt and Stream with an empty session_id: INVALID_ARGUMENT"

    async def check_from_sequence_range(self) -> str:
        if not self.main_session_id:
            raise _Skipped("needs a session (Start failed)")
        shown = []
        for position in (-1, MAX_SEQUENCE + 1):  # beyond 2^53 - 1 JavaScript loses it
            details = await self.expect_stream_error(
                grpc.StatusCode.INVALID_ARGUMENT,
                pb.StreamRequest(session_id=self.main_session_id, from_sequence=position),
                field="from_sequence",
            )
            shown.append(f"{position}: INVALID_ARGUMENT {details!r}")
        return "; ".join(shown)

    async def check_unparsable_request(self) -> str:
        session_id = f"{self.prefix}-not-utf8"
        start: grpc.aio.UnaryUnaryMultiCallable[bytes, pb.StartResponse] = self.channel.unary_unary(
            "/helix.agent.v1.AgentService/Start",
            request_serializer=None,
            response_deserializer=pb.StartResponse.FromString,
        )
        shown = []
        not_utf8 = b'{"text": "caf\xe9"}'  # Latin-1, not UTF-8
        for what, raw in (
            ("bytes that are no StartRequest", b"\x0f"),
            (
                "input_json that is not UTF-8",
                pb.StartRequest(session_id=session_id).SerializeToString()
                + b"\x12"
                + bytes([len(not_utf8)])
                + not_utf8,
            ),
        ):
            try:
                await start(raw, timeout=self.rpc_timeout_s)
            except grpc.aio.AioRpcError as exc:
                details = exc.details() or ""
                field = "input_json" if details.startswith("input_json") else "request"
                _verdict(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    exc.code(),
                    details,
                    field,
                    exc.trailing_metadata(),
                )
                shown.append(f"{what}: INVALID_ARGUMENT {details!r}")
            else:
                raise _Failed(f"{what} were accepted (the service read something else)")
        await self.expect_error(grpc.StatusCode.NOT_FOUND, self.status(session_id))
        return "; ".join(shown) + "; no session created"

    async def check_wait_out_of_range(self) -> str:
        if not self.main_session_id:
            raise _Skipped("needs a session (Start failed)")
        rejected: dict[float, str] = {}
        accepted: list[float] = []
        for wait_s in (-1.0, MAX_WAIT_S + 1.0):
            try:
                await self.stub.GetStatus(
                    _waiting(self.main_session_id, wait_s), timeout=self.rpc_timeout_s
                )
            except grpc.aio.AioRpcError as exc:
                rejected[wait_s] = _verdict(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    exc.code(),
                    exc.details() or "",
                    "wait",
                    exc.trailing_metadata(),
                )
            else:
                accepted.append(wait_s)
        shown = " and ".join(f"wait={w:g}s" for w in accepted)
        if not accepted:
            return "; ".join(f"wait={w:g}s: INVALID_ARGUMENT {d!r}" for w, d in rejected.items())
        if rejected:
            refused = " and ".join(f"wait={w:g}s" for w in rejected)
            raise _Failed(
                f"{shown} accepted, but {refused} INVALID_ARGUMENT (a service that checks "
                "wait must reject both)"
            )
        _require(
            self.wait_honoured is not True,
            f"{shown} accepted, though the service implements wait (it {self.wait_evidence}); "
            f"a wait below 0 or over {MAX_WAIT_S}s must be INVALID_ARGUMENT",
        )
        if self.wait_honoured is False:
            raise _Skipped(
                f"wait not implemented: {shown} accepted, and the service "
                f"{self.wait_evidence} (what a service that ignores wait does)"
            )
        raise _Skipped(
            f"{shown} accepted, which only a service that ignores wait may do; the kit "
            "could not tell whether it does (no long poll of a running session was "
            "answered at once or held; a slower run lets it tell)"
        )

    async def _rejected(self, input_json: str, suffix: str) -> str:
        session_id = f"{self.prefix}-{suffix}"
        details = await self.expect_error(
            grpc.StatusCode.INVALID_ARGUMENT,
            self.start(input_json, session_id),
            field="input_json",
        )
        await self.expect_error(grpc.StatusCode.NOT_FOUND, self.status(session_id))
        return details

    async def check_malformed_input(self) -> str:
        details = await self._rejected("{not json", "malformed")
        return f"INVALID_ARGUMENT {details!r}; no session created"

    async def check_rejected_input(self) -> str:
        bad, why = self.bad_input_json, "given by the caller"
        if bad is None:
            derived = _rejected_input(self.input_schema)
            if derived is None:
                raise _Skipped("no --bad-input given and none derivable from the input schema")
            bad, why = derived
        details = await self._rejected(bad, "rejected")
        return f"{bad} ({why}): INVALID_ARGUMENT {details!r}; no session created"


async def run_conformance(
    address: str,
    *,
    input_json: str,
    bad_input_json: str | None = None,
    timeout_s: float = 60,
    auth: ClientAuth | None = None,
) -> list[CheckResult]:
    """Run every contract check against the agent service at ``address``.

    Args:
        address: ``host:port`` (plaintext gRPC unless ``auth`` configures TLS).
        input_json: a valid input for the agent; every session the kit starts uses it.
        bad_input_json: an input the agent's schema rejects; derived from ``Describe``
            when ``None`` (``{}`` when the schema has required fields).
        timeout_s: how long the whole run may take; sessions still running then fail.
        auth: the credentials to present (a bearer token, TLS, a client certificate).

    Returns one ``CheckResult`` per check, in the order they ran. The kit leaves the
    sessions it started in the service (ids start with ``conformance-`` or are generated).

    Raises:
        ValueError: ``input_json`` is not JSON.
    """
    try:
        json.loads(input_json)
    except ValueError as exc:
        raise ValueError(f"input_json is not valid JSON: {exc}") from None
    async with open_channel(address, auth) as channel:
        kit = _Kit(
            pb_grpc.AgentServiceStub(channel),
            channel,
            input_json=input_json,
            bad_input_json=bad_input_json,
            timeout_s=timeout_s,
        )
        return await kit.run()


def format_results(results: list[CheckResult]) -> str:
    """A pass/fail table, one check per line, and a summary line."""
    width = max((len(r.name) for r in results), default=0)
    lines = []
    for result in results:
        mark = "SKIP" if result.skipped else "PASS" if result.passed else "FAIL"
        lines.append(f"{mark}  {result.name.ljust(width)}  {result.detail}")
    failed = sum(not r.passed for r in results)
    skipped = sum(r.skipped for r in results)
    passed = len(results) - failed - skipped
    lines.append(f"{len(results)} checks: {passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)
