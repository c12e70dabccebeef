"""What the contract fixes (terminal kinds, id patterns, ranges) and the kit's verdicts."""

from __future__ import annotations

import json
import re
from typing import Any

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._rich_status import read_details

TERMINAL_STATUS = {
    "completed": pb.SESSION_STATUS_COMPLETED,
    "failed": pb.SESSION_STATUS_FAILED,
    "interrupted": pb.SESSION_STATUS_INTERRUPTED,
    "terminated": pb.SESSION_STATUS_TERMINATED,
}
AGENT_TYPE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$")
MAX_WAIT_S = 60
"""The longest ``GetStatusRequest.wait`` the contract allows."""
INTERRUPT_REASON = "conformance: interrupted right after Start"
ABORT_REASON = "conformance: aborted right after Start"
CONTINUE = "continue"
LIST_SESSIONS = "list_sessions"
HUMAN_INPUT = "human_input"
ABORT = "abort"
LIMITS = "limits"
FOLLOW = "follow"
"""The optional parts of the contract, as ``DescribeResponse.capabilities`` names them."""
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
    "stream.follow",
    "session.completed",
    "status.finished",
    "status.wait_finished",
    "status.wait_running",
    "start.after_finish",
    "interrupt.finished",
    "interrupt.running",
)
"""The checks that need the kit's sessions (reported as not run when Start fails)."""


class Failed(Exception):
    """A check's verdict: the service broke the contract."""


class Skipped(Exception):
    """A check could not be run; not the service's fault."""


def require(condition: bool, detail: str) -> None:
    if not condition:
        raise Failed(detail)


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


def status_name(value: pb.SessionStatus.ValueType) -> str:
    try:
        return pb.SessionStatus.Name(value)
    except ValueError:
        return str(value)


def wire(events: list[pb.StreamEvent]) -> list[bytes]:
    return [e.SerializeToString(deterministic=True) for e in events]


def json_equal(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


def waiting(session_id: str, wait_s: float) -> pb.GetStatusRequest:
    request = pb.GetStatusRequest(session_id=session_id)
    request.wait.FromNanoseconds(round(wait_s * 1e9))
    return request


def gapless(events: list[pb.StreamEvent], *, first: int = 1) -> str:
    """Empty when ``events`` are numbered ``first, first + 1, ...``; else what is wrong."""
    expected = first
    for event in events:
        if event.sequence != expected:
            seen = [e.sequence for e in events][:50]
            return f"expected sequence {expected}, got {event.sequence} (sequences: {seen})"
        expected += 1
    return ""


def verdict(
    expected: grpc.StatusCode,
    got: grpc.StatusCode,
    details: str,
    field: str | None,
    trailer: Any = None,
) -> str:
    """``details`` when a call failed as expected (naming ``field`` first, with a
    ``BadRequest`` violation of it in the trailer); else fail."""
    require(got == expected, f"expected {expected.name}, got {got.name}: {details}")
    if field is not None:
        require(
            names_field(details, field),
            f"{expected.name} message {details!r} does not start with '{field}: <problem>'",
        )
        violations = read_details(got, trailer).violations
        require(
            any(names_field(f"{name}: {problem}", field) for name, problem in violations),
            f"{expected.name} {details!r} carries no google.rpc.BadRequest violation of "
            f"{field!r} in grpc-status-details-bin (found {violations or 'none'})",
        )
    return details


def names_field(details: str, field: str) -> bool:
    """True when ``details`` starts with ``field`` (or a path within it), a colon and a
    problem."""
    return re.match(rf"{re.escape(field)}([.\[][^:]*)?: \S", details) is not None
