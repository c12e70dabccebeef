"""The check of ``Continue`` (optional): a fresh turn on the finished main session.

It runs last, since it adds a turn to the main session.
"""

from __future__ import annotations

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance._contract import (
    CONTINUE,
    TERMINAL_STATUS,
    Skipped,
    gapless,
    kind,
    require,
    status_name,
)
from helix_transport.testing.conformance._kit import Kit


async def check_continue(kit: Kit) -> str:
    """``Continue`` (optional): a fresh turn on the finished main session, idempotent."""
    declared = kit.declares(CONTINUE)
    if declared is False:
        kit.require_capability(CONTINUE)
    session_id = kit.main_session_id
    before = await kit.status(session_id)
    request = pb.ContinueRequest(session_id=session_id, message=kit.input_json, turn=2, fresh=True)
    try:
        reply = await kit.stub.Continue(request, timeout=kit.rpc_timeout_s)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        require(declared is None, f"Describe lists {CONTINUE!r}, but Continue is UNIMPLEMENTED")
        raise Skipped(
            "Continue is optional; the service answers UNIMPLEMENTED (and Describe lists "
            "no capabilities)"
        ) from None
    require(
        reply.created and reply.turn == 2 and reply.from_sequence == before.last_sequence,
        f"Continue of a finished session: created={reply.created}, turn={reply.turn}, "
        f"from_sequence={reply.from_sequence} (the log ended at {before.last_sequence})",
    )
    again = await kit.stub.Continue(request, timeout=kit.rpc_timeout_s)
    require(
        not again.created and again.from_sequence == reply.from_sequence,
        f"a retried Continue: created={again.created}, from_sequence={again.from_sequence}",
    )
    final = await _new_turn(kit, reply.from_sequence)
    await _out_of_turn(kit)
    return (
        f"turn 2 ran after sequence {reply.from_sequence} and ended {final}; a replay "
        "from 0 ended at turn 1's end; a retry was created=false; another message "
        "ALREADY_EXISTS; turn 4 FAILED_PRECONDITION"
    )


async def _new_turn(kit: Kit, from_sequence: int) -> str:
    """Turn 2 streams on its own after ``from_sequence``; returns how it ended."""
    session_id = kit.main_session_id
    read = await kit.read(session_id, from_sequence)
    read.require_complete("the new turn's stream")
    require(not (gap := gapless(read.events, first=from_sequence + 1)), gap)
    first = read.events[0]
    require(
        kind(first) == "turn_started" and first.turn_started.turn == 2,
        f"the new turn begins with {kind(first)}, not turn_started{{turn: 2}}",
    )
    # A replay of the whole log is turn 1 alone: its stream ends at turn 1's
    # terminal event even though the log goes on with turn 2.
    whole = await kit.read(session_id, 0)
    whole.require_complete("a replay from 0 of the continued session")
    require(
        whole.events[-1].sequence == from_sequence,
        f"a replay from 0 of the continued session ended at sequence "
        f"{whole.events[-1].sequence}, not at turn 1's terminal event ({from_sequence})",
    )
    after = await kit.status(session_id)
    final = kind(read.events[-1])
    require(
        after.status == TERMINAL_STATUS[final] and after.last_sequence == read.events[-1].sequence,
        f"after the turn GetStatus says {status_name(after.status)} at "
        f"{after.last_sequence}, but the log ends {final} at {read.events[-1].sequence}",
    )
    return final


async def _out_of_turn(kit: Kit) -> None:
    """Another message for turn 2 is ALREADY_EXISTS, a turn out of order FAILED_PRECONDITION."""
    session_id = kit.main_session_id
    other = pb.ContinueRequest(
        session_id=session_id, message=kit.input_json + " ", turn=2, fresh=False
    )
    await kit.expect_error(
        grpc.StatusCode.ALREADY_EXISTS, kit.stub.Continue(other, timeout=kit.rpc_timeout_s)
    )
    # A valid input: a fresh turn's message is one, and is checked as one first.
    skip = pb.ContinueRequest(session_id=session_id, message=kit.input_json, turn=4, fresh=True)
    await kit.expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        kit.stub.Continue(skip, timeout=kit.rpc_timeout_s),
    )
