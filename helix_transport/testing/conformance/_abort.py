"""The checks of ``Interrupt`` with ``abort`` (capability ``abort``): a running session,
and a suspended one, end TERMINATED, for good."""

from __future__ import annotations

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance import timing
from helix_transport.testing.conformance._contract import (
    ABORT,
    ABORT_REASON,
    CONTINUE,
    TERMINAL_STATUS,
    Skipped,
    gapless,
    kind,
    require,
    status_name,
)
from helix_transport.testing.conformance._human_input import suspend, unwrapped
from helix_transport.testing.conformance._kit import Kit, Read


async def check_abort_running(kit: Kit) -> str:
    """A session aborted right after its Start ends ``terminated``, and stays so."""
    kit.require_capability(ABORT)
    session_id = f"{kit.prefix}-abort"
    await kit.start(kit.input_json, session_id)
    reply = await kit.interrupt(session_id, ABORT_REASON, abort=True)
    aborted_at = (await kit.status(session_id)).last_sequence if reply.accepted else None
    read = await kit.read(session_id)
    final = await _ended(kit, session_id, read, "the aborted session's stream")
    require(not (gap := gapless(read.events)), gap)
    if not reply.accepted:
        require(
            reply.status == TERMINAL_STATUS[final] and final != "terminated",
            f"accepted=false with status {status_name(reply.status)}, but the session "
            f"ended {final}",
        )
        raise Skipped(
            f"the session had ended {final} before the abort reached it (accepted=false, "
            "truthfully); a slower --input lets the kit abort a running session"
        )
    require(
        reply.status == pb.SESSION_STATUS_RUNNING,
        f"accepted=true with status {status_name(reply.status)} (must be RUNNING)",
    )
    if final == "completed":
        raise Skipped(
            "accepted=true, but the run completed before its next safe point; a slower "
            "--input lets the kit see it terminated"
        )
    require(final == "terminated", f"accepted=true, but the session ended {final}")
    terminated = read.events[-1].terminated
    require(
        terminated.reason == ABORT_REASON,
        f"terminated.reason is {terminated.reason!r}, not the request's {ABORT_REASON!r}",
    )
    assert aborted_at is not None
    # One step may start as the abort is delivered; more means the run did not stop.
    steps = sum(1 for e in read.events if e.sequence > aborted_at and kind(e) == "step_started")
    require(steps <= 1, f"the run started {steps} more steps after the abort")
    await _for_good(kit, session_id)
    return "accepted=true; the run ended terminated, with the request's reason, for good"


async def check_abort_suspended(kit: Kit) -> str:
    """A session suspended for an approval, aborted: TERMINATED, its request cancelled."""
    kit.require_capability(ABORT)
    pending = await suspend(kit, f"{kit.prefix}-abort-suspended")
    session_id = pending.session_id
    reply = await kit.interrupt(session_id, ABORT_REASON, abort=True)
    require(
        reply.accepted,
        f"an abort of a SUSPENDED session: accepted=false, status {status_name(reply.status)}",
    )
    after = pending.suspended.sequence
    # It runs nothing: the abort has no step to wait for (and must not take the
    # rest of the kit's time when it never ends the session).
    read = await kit.read(session_id, after, limit_s=timing.ABORT_SUSPENDED_S)
    require(
        read.end != "timeout",
        f"an accepted abort of the SUSPENDED session: its stream was still open "
        f"{timing.ABORT_SUSPENDED_S:g}s later, after {len(read.events)} event(s) and no "
        "terminal event (it must end terminated at once: nothing runs)",
    )
    final = await _ended(kit, session_id, read, "the aborted suspended session's stream")
    require(not (gap := gapless(read.events, first=after + 1)), gap)
    require(final == "terminated", f"the aborted suspended session ended {final}")
    answered = [unwrapped(e) for e in read.events if kind(unwrapped(e)) == "input_answered"]
    require(
        all(e.input_answered.outcome != pb.INPUT_OUTCOME_APPROVED for e in answered),
        "the aborted session logged an approval nobody gave",
    )
    approve = pending.answer(pending.request, approved=True, reason="conformance: too late")
    await kit.expect_error(grpc.StatusCode.FAILED_PRECONDITION, kit.submit(approve))
    await _for_good(kit, session_id)
    return (
        "accepted=true; the session ended terminated; an answer to its request then "
        "FAILED_PRECONDITION"
    )


async def _ended(kit: Kit, session_id: str, read: Read, what: str) -> str:
    """The read ended at a terminal event GetStatus agrees with; returns its kind."""
    read.require_complete(what)
    final = kind(read.events[-1])
    status = await kit.status(session_id)
    require(
        status.status == TERMINAL_STATUS[final],
        f"GetStatus says {status_name(status.status)}, but the log ends {final}",
    )
    return final


async def _for_good(kit: Kit, session_id: str) -> None:
    """A terminated session is not interrupted again, nor continued with its memory."""
    again = await kit.interrupt(session_id, "conformance: after the abort")
    require(
        not again.accepted and again.status == pb.SESSION_STATUS_TERMINATED,
        f"an Interrupt after the abort: accepted={again.accepted}, status "
        f"{status_name(again.status)} (must be false, TERMINATED)",
    )
    if kit.declares(CONTINUE):
        resume = pb.ContinueRequest(
            session_id=session_id, message=kit.input_json, turn=2, fresh=False
        )
        await kit.expect_error(
            grpc.StatusCode.FAILED_PRECONDITION,
            kit.stub.Continue(resume, timeout=kit.rpc_timeout_s),
        )
