"""The checks of input from people (capability ``human_input``): ``SubmitInput``'s errors,
and, given an input that makes the agent ask for an approval, a session that suspends
for it, takes its answer once and runs to its end."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance import timing
from helix_transport.testing.conformance._contract import (
    HUMAN_INPUT,
    TERMINAL_STATUS,
    Failed,
    Skipped,
    gapless,
    kind,
    require,
    status_name,
)
from helix_transport.testing.conformance._kit import Kit, Pending

APPROVE_REASON = "conformance: approved"


def unwrapped(event: pb.StreamEvent) -> pb.StreamEvent:
    """The event itself, or the sub-agent's event a ``child_event`` carries (at any depth)."""
    while kind(event) == "child_event":
        event = event.child_event.event
    return event


def require_input_required(kit: Kit) -> str:
    """The caller's ``--input-required``; skip the check without one."""
    kit.require_capability(HUMAN_INPUT)
    if kit.input_required_json is None:
        raise Skipped(
            "no --input-required given (an input that makes the agent ask for an "
            "approval): suspension and answers not checked"
        )
    return kit.input_required_json


async def suspend(kit: Kit, session_id: str) -> Pending:
    """Start ``session_id`` with ``--input-required`` and read it until it suspends."""
    input_json = require_input_required(kit)
    started = await kit.start(input_json, session_id)
    require(started.created, f"Start of a new session {session_id!r} returned created=false")

    def own_suspended(events: list[pb.StreamEvent]) -> bool:
        return any(kind(e) == "suspended" for e in events)

    read = await kit.read(session_id, leave_when=own_suspended)
    kinds = [kind(unwrapped(e)) for e in read.events]
    require(
        read.end == "left",
        f"the session never suspended: its stream {read.describe_end()} after "
        f"{len(read.events)} event(s) (last: {kinds[-5:]}) with no suspended event",
    )
    require(not (gap := gapless(read.events)), gap)
    at = next(i for i, e in enumerate(read.events) if kind(e) == "suspended")
    asked = [(unwrapped(e).session_id, unwrapped(e)) for e in read.events[:at]]
    requests = [(who, e.input_required) for who, e in asked if kind(e) == "input_required"]
    require(bool(requests), f"suspended with no input_required before it (events: {kinds})")
    (asked_by, first), *others = requests
    return Pending(
        session_id=session_id,
        request=first,
        asked_by=asked_by,
        others=tuple(r for _, r in others),
        suspended=read.events[at],
    )


async def status_suspended(kit: Kit, pending: Pending) -> pb.GetStatusResponse:
    """GetStatus of a session whose log ends ``suspended``: SUSPENDED at that sequence.

    The status may follow the event by a moment (another write), so it is polled
    for at most ``timing.END_GRACE_S``.
    """
    until = time.monotonic() + timing.END_GRACE_S
    while True:
        status = await kit.status(pending.session_id)
        if status.status == pb.SESSION_STATUS_SUSPENDED or time.monotonic() > until:
            break
        await asyncio.sleep(0.05)
    require(
        status.status == pb.SESSION_STATUS_SUSPENDED
        and status.last_sequence == pending.suspended.sequence,
        f"the log ends suspended at {pending.suspended.sequence}, but GetStatus says "
        f"{status_name(status.status)} at {status.last_sequence}",
    )
    return status


async def check_input_errors(kit: Kit) -> str:
    """``SubmitInput``'s bad requests: INVALID_ARGUMENT naming the field, NOT_FOUND."""
    kit.require_capability(HUMAN_INPUT)
    if not kit.main_session_id:
        raise Failed("not run: Start failed")
    invalid, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    approve = pb.Approval(approved=True, reason="conformance")
    unknown = f"{kit.prefix}-no-such-request"

    def submit(
        session_id: str, request_id: str, *, answer: bool = True
    ) -> Awaitable[pb.SubmitInputResponse]:
        request = pb.SubmitInputRequest(session_id=session_id, request_id=request_id)
        if answer:
            request.approval.CopyFrom(approve)
        return kit.submit(request)

    main = kit.main_session_id
    await kit.expect_error(invalid, submit("", unknown), field="session_id")
    await kit.expect_error(invalid, submit(main, ""), field="request_id")
    await kit.expect_error(invalid, submit(main, unknown, answer=False), field="answer")
    await kit.expect_error(missing, submit(f"{kit.prefix}-missing", unknown))
    await kit.expect_error(missing, submit(main, unknown))
    return (
        "empty session_id, empty request_id, no answer: INVALID_ARGUMENT naming each; "
        "an unknown session, an unknown request of the kit's session: NOT_FOUND"
    )


async def check_suspended(kit: Kit) -> str:
    """A session that asks for an approval suspends: its request, status and open stream."""
    pending = await suspend(kit, f"{kit.prefix}-input")
    request, session_id = pending.request, pending.session_id
    require(bool(request.request_id), "input_required.request_id is empty")
    require(
        request.kind == pb.INPUT_KIND_APPROVAL,
        f"input_required.kind is {pb.InputKind.Name(request.kind)}, not INPUT_KIND_APPROVAL "
        "(--input-required must make the agent ask for an approval)",
    )
    path = list(request.path)
    require(
        len(path) >= 1 and path[0] == session_id and path[-1] == pending.asked_by,
        f"input_required.path is {path}: it must run from the session streamed "
        f"({session_id!r}) to the one that asked ({pending.asked_by!r})",
    )
    require(bool(request.tool_name), "input_required.tool_name is empty")
    try:
        arguments = json.loads(request.arguments_json)
    except ValueError:
        arguments = None
    require(
        isinstance(arguments, dict),
        f"input_required.arguments_json {request.arguments_json!r} is not a JSON object",
    )
    suspended = pending.suspended.suspended
    if pending.asked_by == session_id:
        require(
            request.request_id in suspended.request_ids,
            f"suspended.request_ids {list(suspended.request_ids)} leaves out the "
            f"pending {request.request_id!r}",
        )
    else:
        require(
            suspended.suspended_children >= 1,
            "suspended.suspended_children is 0, but the request came from a sub-agent",
        )
    await status_suspended(kit, pending)
    # Suspended is not terminal: the stream stays open, quiet until an answer.
    after = pending.suspended.sequence
    quiet = await kit.read(session_id, after, limit_s=timing.SUSPENDED_OPEN_S)
    require(
        quiet.end == "timeout" and not quiet.events,
        f"a stream of the SUSPENDED session from {after} {quiet.describe_end()} with "
        f"{len(quiet.events)} event(s) within {timing.SUSPENDED_OPEN_S:g}s (it must stay "
        "open, with no event until an answer)",
    )
    kit.pending = pending
    return (
        f"{request.tool_name} asked for approval ({request.request_id!r}, path {path}); "
        f"suspended at {after}, GetStatus SUSPENDED, the stream stayed open"
    )


async def check_answered(kit: Kit) -> str:
    """The approval is applied once; a repeat changes nothing, another answer is refused."""
    pending = kit.pending
    if pending is None:
        require_input_required(kit)
        raise Failed("not run: no session suspended for an approval (see input.suspended)")
    session_id, request = pending.session_id, pending.request
    approve = pending.answer(request, approved=True, reason=APPROVE_REASON)
    first = await kit.submit(approve)
    require(first.applied, "the first SubmitInput of an approval returned applied=false")
    again = await kit.submit(approve)
    require(not again.applied, "the same SubmitInput again returned applied=true")
    deny = pending.answer(request, approved=False, reason="conformance: a different answer")
    await kit.expect_error(grpc.StatusCode.FAILED_PRECONDITION, kit.submit(deny))
    for other in pending.others:  # the session goes on once nothing is pending
        await kit.submit(pending.answer(other, approved=True, reason=APPROVE_REASON))
    after = pending.suspended.sequence
    read = await kit.read(session_id, after)
    read.require_complete("the answered session's stream")
    require(not (gap := gapless(read.events, first=after + 1)), gap)
    # Request ids are tool call ids, unique within the session that asked only.
    answered = [
        inner.input_answered
        for inner in map(unwrapped, read.events)
        if kind(inner) == "input_answered"
        and inner.session_id == pending.asked_by
        and inner.input_answered.request_id == request.request_id
    ]
    require(
        len(answered) == 1,
        f"the stream after the answer carries {len(answered)} input_answered event(s) "
        f"of {pending.asked_by!r} for {request.request_id!r} (expected one)",
    )
    require(
        answered[0].outcome == pb.INPUT_OUTCOME_APPROVED and answered[0].reason == APPROVE_REASON,
        f"input_answered says {pb.InputOutcome.Name(answered[0].outcome)} with reason "
        f"{answered[0].reason!r}, not INPUT_OUTCOME_APPROVED with {APPROVE_REASON!r}",
    )
    final = kind(read.events[-1])
    status = await kit.status(session_id)
    require(
        status.status == TERMINAL_STATUS[final]
        and status.last_sequence == read.events[-1].sequence,
        f"GetStatus says {status_name(status.status)} at {status.last_sequence}, but the "
        f"log ends {final} at {read.events[-1].sequence}",
    )
    return (
        f"approved: applied=true, again applied=false, a denial FAILED_PRECONDITION; "
        f"input_answered APPROVED, then the session ended {final}"
    )
