"""The checks of bad requests: NOT_FOUND, INVALID_ARGUMENT naming the field (with its
``BadRequest``), out-of-range positions and waits, no session from a rejected Start."""

from __future__ import annotations

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance._contract import (
    MAX_SEQUENCE,
    MAX_WAIT_S,
    Failed,
    Skipped,
    require,
    verdict,
    waiting,
)
from helix_transport.testing.conformance._inputs import rejected_input
from helix_transport.testing.conformance._kit import Kit


async def check_errors(kit: Kit) -> None:
    await kit.check("errors.not_found", lambda: _not_found(kit))
    await kit.check("errors.empty_session_id", lambda: _empty_session_id(kit))
    await kit.check("errors.from_sequence_out_of_range", lambda: _from_sequence_range(kit))
    await kit.check("errors.wait_out_of_range", lambda: _wait_out_of_range(kit))
    await kit.check("errors.malformed_input", lambda: _malformed_input(kit))
    await kit.check("errors.unparsable_request", lambda: _unparsable_request(kit))
    await kit.check("errors.schema_rejected_input", lambda: _rejected_input(kit))


async def _not_found(kit: Kit) -> str:
    missing = f"{kit.prefix}-missing"
    await kit.expect_error(grpc.StatusCode.NOT_FOUND, kit.status(missing))
    await kit.expect_error(grpc.StatusCode.NOT_FOUND, kit.interrupt(missing))
    await kit.expect_stream_error(grpc.StatusCode.NOT_FOUND, pb.StreamRequest(session_id=missing))
    return "GetStatus, Interrupt and Stream of an unknown session: NOT_FOUND"


async def _empty_session_id(kit: Kit) -> str:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await kit.expect_error(invalid, kit.status(""), field="session_id")
    await kit.expect_error(invalid, kit.interrupt(""), field="session_id")
    await kit.expect_stream_error(invalid, pb.StreamRequest(session_id=""), field="session_id")
    return "GetStatus, Interrupt and Stream with an empty session_id: INVALID_ARGUMENT"


async def _from_sequence_range(kit: Kit) -> str:
    if not kit.main_session_id:
        raise Skipped("needs a session (Start failed)")
    shown = []
    for position in (-1, MAX_SEQUENCE + 1):  # beyond 2^53 - 1 JavaScript loses it
        details = await kit.expect_stream_error(
            grpc.StatusCode.INVALID_ARGUMENT,
            pb.StreamRequest(session_id=kit.main_session_id, from_sequence=position),
            field="from_sequence",
        )
        shown.append(f"{position}: INVALID_ARGUMENT {details!r}")
    return "; ".join(shown)


async def _unparsable_request(kit: Kit) -> str:
    session_id = f"{kit.prefix}-not-utf8"
    start: grpc.aio.UnaryUnaryMultiCallable[bytes, pb.StartResponse] = kit.channel.unary_unary(
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
            await start(raw, timeout=kit.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or ""
            field = "input_json" if details.startswith("input_json") else "request"
            verdict(
                grpc.StatusCode.INVALID_ARGUMENT,
                exc.code(),
                details,
                field,
                exc.trailing_metadata(),
            )
            shown.append(f"{what}: INVALID_ARGUMENT {details!r}")
        else:
            raise Failed(f"{what} were accepted (the service read something else)")
    await kit.expect_error(grpc.StatusCode.NOT_FOUND, kit.status(session_id))
    return "; ".join(shown) + "; no session created"


async def _wait_out_of_range(kit: Kit) -> str:
    if not kit.main_session_id:
        raise Skipped("needs a session (Start failed)")
    rejected: dict[float, str] = {}
    accepted: list[float] = []
    for wait_s in (-1.0, MAX_WAIT_S + 1.0):
        try:
            await kit.stub.GetStatus(
                waiting(kit.main_session_id, wait_s), timeout=kit.rpc_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            rejected[wait_s] = verdict(
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
        raise Failed(
            f"{shown} accepted, but {refused} INVALID_ARGUMENT (a service that checks "
            "wait must reject both)"
        )
    require(
        kit.wait_honoured is not True,
        f"{shown} accepted, though the service implements wait (it {kit.wait_evidence}); "
        f"a wait below 0 or over {MAX_WAIT_S}s must be INVALID_ARGUMENT",
    )
    if kit.wait_honoured is False:
        raise Skipped(
            f"wait not implemented: {shown} accepted, and the service "
            f"{kit.wait_evidence} (what a service that ignores wait does)"
        )
    raise Skipped(
        f"{shown} accepted, which only a service that ignores wait may do; the kit "
        "could not tell whether it does (no long poll of a running session was "
        "answered at once or held; a slower run lets it tell)"
    )


async def _start_rejected(kit: Kit, input_json: str, suffix: str) -> str:
    """A Start with ``input_json`` is INVALID_ARGUMENT naming it, and creates no session."""
    session_id = f"{kit.prefix}-{suffix}"
    details = await kit.expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        kit.start(input_json, session_id),
        field="input_json",
    )
    await kit.expect_error(grpc.StatusCode.NOT_FOUND, kit.status(session_id))
    return details


async def _malformed_input(kit: Kit) -> str:
    details = await _start_rejected(kit, "{not json", "malformed")
    return f"INVALID_ARGUMENT {details!r}; no session created"


async def _rejected_input(kit: Kit) -> str:
    bad, why = kit.bad_input_json, "given by the caller"
    if bad is None:
        derived = rejected_input(kit.input_schema)
        if derived is None:
            raise Skipped("no --bad-input given and none derivable from the input schema")
        bad, why = derived
    details = await _start_rejected(kit, bad, "rejected")
    return f"{bad} ({why}): INVALID_ARGUMENT {details!r}; no session created"
