"""The checks of ``Start``: generated ids, idempotence, conflicts, concurrent Starts."""

from __future__ import annotations

import asyncio

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance._contract import (
    CONCURRENT_STARTS,
    INTERRUPT_REASON,
    SESSION_ID,
    Failed,
    Skipped,
    kind,
    require,
)
from helix_transport.testing.conformance._inputs import different, respelled
from helix_transport.testing.conformance._kit import Kit


async def check_start(kit: Kit) -> tuple[pb.StartResponse, pb.StartResponse] | None:
    """Start the two sessions every later check uses: one to read, one to interrupt."""
    sessions: list[pb.StartResponse] = []
    await kit.check("start.generated_id", lambda: _generated_id(kit, sessions))
    if not sessions:
        return None
    main, other = sessions
    await kit.check("start.idempotent", lambda: _idempotent(kit, main))
    await kit.check("start.conflict", lambda: _conflict(kit, main))
    await kit.check("start.concurrent", lambda: _concurrent(kit))
    return main, other


async def _generated_id(kit: Kit, sessions: list[pb.StartResponse]) -> str:
    main = await kit.start(kit.input_json)
    # The second session is interrupted at once, before anything reads the first.
    other = await kit.start(kit.input_json)
    sessions.extend([main, other])  # later checks use them, whatever the verdict
    try:
        kit.interrupt_reply = await kit.interrupt(other.session_id, INTERRUPT_REASON)
        if kit.interrupt_reply.accepted:
            kit.interrupted_at = (await kit.status(other.session_id)).last_sequence
    except grpc.aio.AioRpcError as exc:
        kit.interrupt_reply = exc  # reported by interrupt.running
    for reply in (main, other):
        require(reply.created, "Start with an empty session_id returned created=false")
        require(
            SESSION_ID.match(reply.session_id) is not None,
            f"generated session_id {reply.session_id!r} is not a valid session id",
        )
        require(
            reply.agent_type == kit.agent_type,
            f"StartResponse.agent_type {reply.agent_type!r} != Describe's {kit.agent_type!r}",
        )
        require(
            reply.status != pb.SESSION_STATUS_UNSPECIFIED,
            "StartResponse.status is UNSPECIFIED",
        )
    require(
        main.session_id != other.session_id,
        f"two Starts with an empty id both got {main.session_id!r}",
    )
    return f"generated {main.session_id!r} and {other.session_id!r}"


async def _idempotent(kit: Kit, main: pb.StartResponse) -> str:
    again = await kit.start(respelled(kit.input_json), main.session_id)
    require(
        not again.created,
        "Start with the same id and an equal input (respelled) returned created=true",
    )
    require(
        again.session_id == main.session_id,
        f"returned session_id {again.session_id!r}",
    )
    return "same id + equal JSON input (keys reordered, whitespace changed): created=false"


async def _conflict(kit: Kit, main: pb.StartResponse) -> str:
    other_input = different(kit.input_json)
    if other_input is None:
        raise Skipped("cannot derive a different input (the input has no string)")
    try:
        await kit.start(other_input, main.session_id)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
            return f"ALREADY_EXISTS: {exc.details()}"
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise Skipped(
                f"the derived different input {other_input} is not valid here "
                f"({exc.details()}); cannot check ALREADY_EXISTS"
            ) from None
        raise Failed(f"expected ALREADY_EXISTS, got {exc.code().name}") from None
    raise Failed("Start with an existing id and a different input succeeded")


async def _concurrent(kit: Kit) -> str:
    session_id = f"{kit.prefix}-concurrent"
    replies = await asyncio.gather(
        *(kit.start(kit.input_json, session_id) for _ in range(CONCURRENT_STARTS))
    )
    await kit.interrupt(session_id, "conformance: only its start matters")
    created = sum(r.created for r in replies)
    require(
        created == 1,
        f"{created} of {CONCURRENT_STARTS} concurrent identical Starts returned created=true",
    )
    read = await kit.read(session_id)
    read.require_complete("its stream")
    starts = [kind(e) for e in read.events].count("run_started")
    require(starts == 1, f"the session's log has {starts} run_started events")
    return f"{CONCURRENT_STARTS} identical Starts at once: one created, one run"
