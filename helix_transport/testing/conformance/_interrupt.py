"""The check of ``Interrupt`` of a running session (the one interrupted right after Start)."""

from __future__ import annotations

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance._contract import (
    INTERRUPT_REASON,
    TERMINAL_STATUS,
    Failed,
    gapless,
    kind,
    require,
    status_name,
)
from helix_transport.testing.conformance._kit import Kit, Read


async def check_interrupt_running(kit: Kit, other: pb.StartResponse) -> str:
    """The second session was interrupted right after its Start: told truthfully?"""
    reply = kit.interrupt_reply
    if isinstance(reply, grpc.aio.AioRpcError):
        raise Failed(
            f"Interrupt of a running session failed: {reply.code().name}: {reply.details()}"
        )
    assert reply is not None
    read = await kit.read(other.session_id)
    read.require_complete("the interrupted session's stream")
    require(not (gap := gapless(read.events)), gap)
    final = kind(read.events[-1])
    status = await kit.status(other.session_id)
    require(
        status.status == TERMINAL_STATUS[final],
        f"GetStatus says {status_name(status.status)}, but the log ends {final}",
    )
    if reply.accepted:
        outcome = _accepted(kit, reply, read, final)
    else:
        require(
            reply.status == TERMINAL_STATUS[final],
            f"accepted=false with status {status_name(reply.status)}, but the "
            f"session ended {final}",
        )
        require(final != "interrupted", "accepted=false, but the session was interrupted")
        outcome = f"accepted=false; it had already ended {final}"
    again = await kit.interrupt(other.session_id, "conformance: twice")
    require(
        not again.accepted and again.status == status.status,
        f"a second Interrupt after the end: accepted={again.accepted}, "
        f"status {status_name(again.status)}",
    )
    return outcome


def _accepted(kit: Kit, reply: pb.InterruptResponse, read: Read, final: str) -> str:
    """An accepted Interrupt: the run stopped at its next safe point, or had completed."""
    require(
        reply.status == pb.SESSION_STATUS_RUNNING,
        f"accepted=true with status {status_name(reply.status)} (must be RUNNING)",
    )
    require(
        final in ("interrupted", "completed"),
        f"accepted=true, but the session ended {final}",
    )
    if final == "interrupted":
        require(
            read.events[-1].interrupted.reason == INTERRUPT_REASON,
            f"interrupted.reason is {read.events[-1].interrupted.reason!r}, "
            f"not the request's {INTERRUPT_REASON!r}",
        )
        outcome = "accepted=true; the run ended interrupted, with the request's reason"
    else:
        outcome = "accepted=true; the run completed before its next safe point"
    if kit.interrupted_at is not None:
        # One step may start as the interrupt is delivered (from another
        # replica, through the store); more means the run did not stop.
        steps = sum(
            1 for e in read.events if e.sequence > kit.interrupted_at and kind(e) == "step_started"
        )
        require(
            steps <= 1,
            f"accepted=true, but the run started {steps} more steps and ended "
            f"{final}: it did not stop at its next safe point",
        )
    return outcome
