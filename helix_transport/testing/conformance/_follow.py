"""The check of ``Follow`` (optional): several follows on one call, each exactly what its
``Stream`` sends, each ended by a ``FollowEnd``, the call ended once the reader is done."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance import timing
from helix_transport.testing.conformance._contract import FOLLOW, Failed, Skipped, require, wire
from helix_transport.testing.conformance._kit import Kit

_UNKNOWN = "conformance-follow-unknown"
"""A session id no service has (the kit's own sessions have uuid-based ids)."""


async def check_follow(kit: Kit, log: list[pb.StreamEvent], session_id: str) -> str:
    """Three follows of one call: the finished main session from 0 and from its middle,
    and an unknown session. Skipped for a service whose ``Describe`` does not list
    ``follow`` (or, listing no capabilities, that answers UNIMPLEMENTED)."""
    declared = kit.declares(FOLLOW)
    if declared is False:
        kit.require_capability(FOLLOW)
    middle = log[-1].sequence // 2
    requests = [
        pb.FollowRequest(follow_id=1, stream=pb.StreamRequest(session_id=session_id)),
        pb.FollowRequest(
            follow_id=2, stream=pb.StreamRequest(session_id=session_id, from_sequence=middle)
        ),
        pb.FollowRequest(follow_id=3, stream=pb.StreamRequest(session_id=_UNKNOWN)),
    ]
    done = asyncio.Event()

    async def send() -> AsyncIterator[pb.FollowRequest]:
        for request in requests:
            yield request
        await done.wait()  # half-close only once every follow has ended

    # A finished session's follows end as promptly as its streams must.
    limit_s = 2 * timing.END_GRACE_S
    call = kit.stub.Follow(send(), timeout=limit_s)
    events: dict[int, list[pb.StreamEvent]] = {1: [], 2: [], 3: []}
    ends: dict[int, pb.FollowEnd] = {}
    try:
        async for response in call:
            require(bool(response.messages), "an empty FollowResponse")
            for message in response.messages:
                _take(message, events, ends)
            if len(ends) == len(events):
                done.set()
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
            require(declared is None, f"Describe lists {FOLLOW!r}, but Follow is UNIMPLEMENTED")
            raise Skipped(
                "Follow is optional; the service answers UNIMPLEMENTED (and Describe lists "
                "no capabilities)"
            ) from None
        if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
            still = sorted(set(events) - set(ends))
            raise Failed(
                f"follows {still} of a finished session still open after {limit_s:g}s"
            ) from None
        raise Failed(f"the call failed: {exc.code().name}: {exc.details()}") from None
    finally:
        done.set()
        call.cancel()
    require(len(ends) == 3, f"the call ended with follows {sorted(set(events) - set(ends))} open")
    for follow_id, expected in ((1, log), (2, log[middle:])):
        require(
            ends[follow_id].code == 0,
            f"follow {follow_id} ended with code {ends[follow_id].code}: {ends[follow_id].message}",
        )
        require(
            wire(events[follow_id]) == wire(expected),
            f"follow {follow_id} sent {[e.sequence for e in events[follow_id]][:20]}, not what "
            f"Stream sends ({expected[0].sequence}..{expected[-1].sequence})",
        )
    not_found = grpc.StatusCode.NOT_FOUND.value[0]
    require(
        ends[3].code == not_found and not events[3],
        f"the follow of an unknown session ended with code {ends[3].code} after "
        f"{len(events[3])} event(s), not NOT_FOUND ({not_found}) with none",
    )
    return (
        f"3 follows on one call: from 0 and from {middle}, what Stream sends, ended OK; "
        "an unknown session ended NOT_FOUND"
    )


def _take(
    message: pb.FollowMessage,
    events: dict[int, list[pb.StreamEvent]],
    ends: dict[int, pb.FollowEnd],
) -> None:
    """Note one follow's message; fail one for a follow never opened or already ended."""
    follow_id = message.follow_id
    require(follow_id in events, f"a message for follow_id {follow_id}, never opened")
    require(follow_id not in ends, f"follow {follow_id} got a message after its FollowEnd")
    if message.HasField("end"):
        ends[follow_id] = message.end
    else:
        events[follow_id] += message.response.events
