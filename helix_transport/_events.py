"""Events and sessions: ``EVENT_KINDS``, the one table of what each kind of event is
(whether it ends a session's stream, the status it puts its session in, its one-line
summary for people), how an event is stamped, and ``SessionStatus`` (the Python enum
and its protobuf twin).

Adding an event kind to ``StreamEvent.payload`` means a row in ``EVENT_KINDS`` (a test
fails until it has one); the CLI's printer, the tree fold and the inspector page read
it from there. Beyond the proto and this table, only the code that emits the event, and
a reader that does work of its own with it, names it.
"""

from __future__ import annotations

import enum
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb


def is_terminal(event: pb.StreamEvent) -> bool:
    """True for the events that end a session's stream."""
    return event.WhichOneof("payload") in TERMINAL_KINDS


_KIND = operator.methodcaller("WhichOneof", "payload")


def through_terminal(events: Sequence[pb.StreamEvent]) -> int:
    """How many of ``events`` one stream delivers: all, or up to and with the first
    terminal one (a continued session's log goes on after it with the next turn)."""
    if TERMINAL_KINDS.isdisjoint(map(_KIND, events[:-1])):  # the usual case, in C
        return len(events)
    return next(n for n, event in enumerate(events, 1) if is_terminal(event))


def stamp(event: pb.StreamEvent, *, session_id: str, agent_type: str, step: int) -> pb.StreamEvent:
    """Set what every logged event carries: session, agent type, time, and ``step``
    unless the event has one. Returns ``event``."""
    event.session_id = session_id
    event.agent_type = agent_type
    if not event.step:
        event.step = step
    # divmod beats Timestamp.FromNanoseconds, which is pure Python and per event; and
    # ``event.time`` read once: each read builds the sub-message's wrapper.
    clock = event.time
    clock.seconds, clock.nanos = divmod(time.time_ns(), 1_000_000_000)
    return event


class SessionStatus(enum.StrEnum):
    """Lifecycle of a session. Stored as its string value."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"
    SUSPENDED = "suspended"
    """Waiting for input from people (its own request or a child's); no process runs it."""

    @property
    def is_terminal(self) -> bool:
        """True once the session can no longer change on its own."""
        return self not in (SessionStatus.RUNNING, SessionStatus.SUSPENDED)

    def to_proto(self) -> pb.SessionStatus.ValueType:
        """The ``helix.agent.v1.SessionStatus`` value."""
        return _TO_PROTO[self]

    @classmethod
    def from_proto(cls, value: pb.SessionStatus.ValueType) -> SessionStatus:
        """The status for a ``helix.agent.v1.SessionStatus`` value.

        Raises:
            ValueError: for ``SESSION_STATUS_UNSPECIFIED`` or an unknown value.
        """
        try:
            return _FROM_PROTO[value]
        except KeyError:
            raise ValueError(f"unknown session status {value}") from None


_TO_PROTO = {
    SessionStatus.RUNNING: pb.SESSION_STATUS_RUNNING,
    SessionStatus.COMPLETED: pb.SESSION_STATUS_COMPLETED,
    SessionStatus.FAILED: pb.SESSION_STATUS_FAILED,
    SessionStatus.INTERRUPTED: pb.SESSION_STATUS_INTERRUPTED,
    SessionStatus.TERMINATED: pb.SESSION_STATUS_TERMINATED,
    SessionStatus.SUSPENDED: pb.SESSION_STATUS_SUSPENDED,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}


def status_name(value: pb.SessionStatus.ValueType) -> str:
    """``completed`` for ``SESSION_STATUS_COMPLETED`` (the number, for one unknown)."""
    return _STATUS_NAMES.get(value, str(value))


_STATUS_NAMES = {v: k.removeprefix("SESSION_STATUS_").lower() for k, v in pb.SessionStatus.items()}


class Tone(enum.StrEnum):
    """How a summary's ``lead`` stands out: the CLI colours it, the page styles it."""

    PLAIN = ""
    STRONG = "strong"
    """A beginning: a run, a turn."""
    GOOD = "good"
    BAD = "bad"
    """A failure, an error, a tool call that failed."""
    WARN = "warn"
    """Stopped by someone: interrupted, terminated."""
    NOTE = "note"
    """The run picked up again after its process stopped."""
    ASK = "ask"
    """People's part: a request for input, its answer, a suspension."""


@dataclass(frozen=True)
class Summary:
    """An event in one line, for people: ``lead`` (shown in its ``tone``), then ``rest``."""

    lead: str
    rest: str = ""
    tone: Tone = Tone.PLAIN

    def __str__(self) -> str:
        return self.lead + self.rest


@dataclass(frozen=True, kw_only=True)
class EventKind:
    """One payload of ``StreamEvent``: what every reader of a log needs to know of it."""

    name: str
    """The payload's field name (``WhichOneof("payload")``)."""
    terminal: bool = False
    """It ends the session's stream (and its turn); it carries the session's usage."""
    status: SessionStatus | None = None
    """The status its session is in once it logged the event, for the kinds that decide
    it on their own (``None``: it leaves the status as it was)."""
    summary: Callable[[pb.StreamEvent], Summary]
    """The event in one line (what ``helix-mesh call`` prints and the page shows)."""


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tool_end(event: pb.StreamEvent) -> Summary:
    end = event.tool_end
    rest = f" {end.tool_name}: {_short(end.result_json)}"
    return Summary("✗", rest, Tone.BAD) if end.is_error else Summary("←", rest)


def _input_required(event: pb.StreamEvent) -> Summary:
    asked = event.input_required
    wanted = "approval" if asked.kind == pb.INPUT_KIND_APPROVAL else "client result"
    call = f"{asked.tool_name}({_short(asked.arguments_json)})"
    return Summary(f"? {wanted} needed", f" for {call} [{asked.request_id}]", Tone.ASK)


_OUTCOMES = {
    pb.INPUT_OUTCOME_APPROVED: "approved",
    pb.INPUT_OUTCOME_DENIED: "denied",
    pb.INPUT_OUTCOME_RESULT: "result received",
    pb.INPUT_OUTCOME_ERROR: "client tool failed",
    pb.INPUT_OUTCOME_EXPIRED: "expired",
}


def _input_answered(event: pb.StreamEvent) -> Summary:
    answered = event.input_answered
    how = _OUTCOMES.get(answered.outcome, "answered")
    why = f": {answered.reason}" if answered.reason else ""
    return Summary(f"✓ {answered.request_id} {how}", why, Tone.ASK)


def _suspended(event: pb.StreamEvent) -> Summary:
    waits = event.suspended
    parts = [f"{len(waits.request_ids)} request(s)"] if waits.request_ids else []
    if waits.suspended_children:
        parts.append(f"{waits.suspended_children} suspended sub-agent(s)")
    return Summary("suspended", f": waiting for {' and '.join(parts) or 'input'}", Tone.ASK)


def _turn_started(event: pb.StreamEvent) -> Summary:
    turn = event.turn_started
    fresh = " (fresh)" if turn.fresh else ""
    return Summary(f"turn {turn.turn}{fresh}", f" message={_short(turn.message)}", Tone.STRONG)


_CLOSE_ACTIONS = {
    pb.CLOSE_ACTION_TERMINATED: ("terminated", Tone.WARN),
    pb.CLOSE_ACTION_WAITED: ("waited for", Tone.NOTE),
    pb.CLOSE_ACTION_ABANDONED: ("abandoned", Tone.WARN),
    pb.CLOSE_ACTION_ABORTED: ("aborted", Tone.WARN),
}


def _close_policy_applied(event: pb.StreamEvent) -> Summary:
    applied = event.close_policy_applied
    action, tone = _CLOSE_ACTIONS.get(applied.action, ("closed", Tone.NOTE))
    undelivered = applied.undelivered_messages
    dropped = f", {undelivered} queued message(s) not delivered" if undelivered else ""
    return Summary(
        f"⇠ {applied.child_agent_type} {action} by the close policy",
        f" ({applied.child_session_id}{dropped})",
        tone,
    )


_KINDS = (
    EventKind(
        name="run_started",
        status=SessionStatus.RUNNING,
        summary=lambda e: Summary(
            "started", f" {e.session_id} input={e.run_started.input_json}", Tone.STRONG
        ),
    ),
    EventKind(name="turn_started", status=SessionStatus.RUNNING, summary=_turn_started),
    EventKind(name="step_started", summary=lambda e: Summary(f"step {e.step}")),
    EventKind(name="text_delta", summary=lambda e: Summary(e.text_delta.text)),
    EventKind(
        name="tool_start",
        summary=lambda e: Summary(
            f"→ {e.tool_start.tool_name}({_short(e.tool_start.arguments_json)})"
        ),
    ),
    EventKind(name="tool_end", summary=_tool_end),
    EventKind(
        name="subagent_start",
        summary=lambda e: Summary(
            f"⇢ delegating to {e.subagent_start.child_agent_type}"
            f" ({e.subagent_start.child_session_id})"
        ),
    ),
    EventKind(
        name="subagent_end",
        summary=lambda e: Summary(
            f"⇠ {e.subagent_end.child_agent_type} {status_name(e.subagent_end.status)}"
        ),
    ),
    EventKind(name="output", summary=lambda e: Summary(f"output {e.output.output_json}")),
    EventKind(name="error", summary=lambda e: Summary(f"error: {e.error.message}", tone=Tone.BAD)),
    EventKind(
        name="completed",
        terminal=True,
        status=SessionStatus.COMPLETED,
        summary=lambda e: Summary(
            f"completed ({e.completed.limit_exceeded})"
            if e.completed.limit_exceeded
            else "completed",
            tone=Tone.GOOD,
        ),
    ),
    EventKind(
        name="failed",
        terminal=True,
        status=SessionStatus.FAILED,
        summary=lambda e: Summary(
            f"failed ({e.failed.failure_reason}): {e.failed.error}", tone=Tone.BAD
        ),
    ),
    EventKind(
        name="interrupted",
        terminal=True,
        status=SessionStatus.INTERRUPTED,
        summary=lambda e: Summary(
            f"interrupted: {e.interrupted.reason or '-'}"
            + (f" ({e.interrupted.limit_exceeded})" if e.interrupted.limit_exceeded else ""),
            tone=Tone.WARN,
        ),
    ),
    EventKind(
        name="terminated",
        terminal=True,
        status=SessionStatus.TERMINATED,
        summary=lambda e: Summary(f"terminated: {e.terminated.reason or '-'}", tone=Tone.WARN),
    ),
    EventKind(
        name="run_resumed",
        status=SessionStatus.RUNNING,
        summary=lambda e: Summary(
            f"resumed at step {e.run_resumed.step} ({e.run_resumed.reason})", tone=Tone.NOTE
        ),
    ),
    # A forwarded event is its child's: summarised as the child's own.
    EventKind(name="child_event", summary=lambda e: summarize(e.child_event.event)),
    EventKind(name="input_required", summary=_input_required),
    EventKind(name="input_answered", summary=_input_answered),
    EventKind(name="suspended", status=SessionStatus.SUSPENDED, summary=_suspended),
    EventKind(name="close_policy_applied", summary=_close_policy_applied),
)

EVENT_KINDS: Mapping[str, EventKind] = {kind.name: kind for kind in _KINDS}
"""Every payload of ``StreamEvent``, by field name, in the order the page lists them."""

UNKNOWN_KIND = EventKind(name="", summary=lambda e: Summary("(unknown event)"))
"""What a reader makes of a payload it does not know (a newer service's): nothing but
that it came. The contract says to ignore it."""

TERMINAL_KINDS = frozenset(kind.name for kind in _KINDS if kind.terminal)
"""The ``StreamEvent.payload`` kinds that end a session's stream (and its turn)."""


def event_kind(event: pb.StreamEvent) -> EventKind:
    """The row of ``event``'s payload (``UNKNOWN_KIND`` for one this code does not know)."""
    return EVENT_KINDS.get(event.WhichOneof("payload") or "", UNKNOWN_KIND)


def summarize(event: pb.StreamEvent) -> Summary:
    """``event`` in one line, for people."""
    return event_kind(event).summary(event)
