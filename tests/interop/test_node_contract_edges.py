"""The Node.js service at the edges of the contract (proto/helix/agent/v1/agent.proto).

Each test holds the Node service to a rule the Python servers already keep:

- a stream started past the end of a running session ends when the session ends;
- INVALID_ARGUMENT carries a google.rpc ``BadRequest`` in ``grpc-status-details-bin``;
- input keys inherited by every JS object (``constructor``, ``__proto__``) are extra;
- ``from_sequence`` above 2^53 - 1 is INVALID_ARGUMENT;
- a string field that is not UTF-8, or bytes that are no request at all, are
  INVALID_ARGUMENT naming the field (or ``request``), not INTERNAL;
- lengths are counted in characters (code points), not UTF-16 code units.

Requests the generated stubs cannot express are sent as raw bytes through a
method without a serializer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc
from helix_transport._rich_status import read_details
from tests.interop.conftest import StartNode

SERVICE = "/helix.agent.v1.AgentService"
TEXT = json.dumps(
    {"text": "the agent reads the event log and writes the text", "words_per_step": 1}
)
EMOJI = "\N{GRINNING FACE}"  # one character, two UTF-16 code units


@asynccontextmanager
async def channel_to(address: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(address) as channel:
        yield channel


def raw_call(channel: grpc.aio.Channel, method: str, raw: bytes) -> Any:
    """``method`` called with ``raw`` as the request's bytes (no serializer)."""
    path = f"{SERVICE}/{method}"
    multi: Any = channel.unary_stream(path) if method == "Stream" else channel.unary_unary(path)
    return multi(raw)


async def invalid_argument(call: object) -> grpc.aio.AioRpcError:
    """The error ``call`` (an awaitable RPC) failed with; it must be INVALID_ARGUMENT."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call, timeout=10)  # type: ignore[arg-type]
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    return error


async def read_stream(
    call: grpc.aio.UnaryStreamCall[Any, Any], within_s: float
) -> list[pb.StreamEvent]:
    async def read() -> list[pb.StreamEvent]:
        return [event async for response in call for event in response.events]

    return await asyncio.wait_for(read(), timeout=within_s)


# --- 4. Stream past the end of a running session -----------------------------------------


async def test_stream_past_the_end_of_a_running_session_ends_when_the_session_ends(
    start_node: StartNode,
) -> None:
    async with start_node(delay_ms=20) as node, channel_to(node.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        await stub.Start(pb.StartRequest(session_id="past-end", input_json=TEXT))
        stream = stub.Stream(pb.StreamRequest(session_id="past-end", from_sequence=1000))
        status = await stub.GetStatus(pb.GetStatusRequest(session_id="past-end"))
        assert status.status == pb.SESSION_STATUS_RUNNING  # the stream opened on a running session

        events = await read_stream(stream, within_s=15)  # hung forever before the fix

        assert events == []
        assert await stream.code() == grpc.StatusCode.OK
        status = await stub.GetStatus(pb.GetStatusRequest(session_id="past-end"))
        assert status.status == pb.SESSION_STATUS_COMPLETED
        assert status.last_sequence < 1000


# --- 5. INVALID_ARGUMENT carries a google.rpc.BadRequest ---------------------------------


async def test_invalid_argument_carries_a_bad_request_naming_the_field(
    start_node: StartNode,
) -> None:
    async with start_node() as node, channel_to(node.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        cases = [
            (stub.Start(pb.StartRequest(input_json="{")), "input_json"),
            (stub.Start(pb.StartRequest(input_json='{"text": ""}')), "input_json.text"),
            (stub.Start(pb.StartRequest(session_id="-bad")), "session_id"),
            (stub.GetStatus(pb.GetStatusRequest()), "session_id"),
            (stub.Interrupt(pb.InterruptRequest(session_id="x", reason="r" * 4097)), "reason"),
            (stub.Stream(pb.StreamRequest(session_id="x", from_sequence=-1)), "from_sequence"),
        ]
        for call, field in cases:
            if isinstance(call, grpc.aio.UnaryStreamCall):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await read_stream(call, within_s=10)
                error = caught.value
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            else:
                error = await invalid_argument(call)
            details = error.details() or ""
            violations = read_details(error.code(), error.trailing_metadata()).violations
            assert len(violations) == 1, (field, details, error.trailing_metadata())
            assert violations[0][0] == field, (field, violations)
            assert details == f"{violations[0][0]}: {violations[0][1]}"


# --- 6. keys every JS object has are extra inputs ----------------------------------------


async def test_input_keys_of_object_prototype_are_extra_inputs(start_node: StartNode) -> None:
    async with start_node() as node, channel_to(node.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        for key in ("constructor", "__proto__", "toString", "hasOwnProperty"):
            input_json = json.dumps({"text": "hello", key: 1})
            error = await invalid_argument(stub.Start(pb.StartRequest(input_json=input_json)))
            assert error.details() == f"input_json.{key}: Extra inputs are not permitted"
        # `text` must be the input's own key, not one it inherits.
        error = await invalid_argument(stub.Start(pb.StartRequest(input_json='{"target": "de"}')))
        assert error.details() == "input_json.text: Field required"


# --- 7. from_sequence above 2^53 - 1 --------------------------------------------------------


async def test_from_sequence_above_2_to_the_53_minus_1_is_invalid(start_node: StartNode) -> None:
    async with start_node() as node, channel_to(node.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        await stub.Start(pb.StartRequest(session_id="far", input_json=TEXT))
        status = await stub.GetStatus(
            pb.GetStatusRequest(session_id="far", wait=Duration(seconds=10))
        )
        for _ in range(100):  # this server answers `wait` at once: poll to the end
            if status.status != pb.SESSION_STATUS_RUNNING:
                break
            await asyncio.sleep(0.05)
            status = await stub.GetStatus(pb.GetStatusRequest(session_id="far"))
        assert status.status == pb.SESSION_STATUS_COMPLETED

        for too_far in (2**53, 2**53 + 1, 2**62, 2**63 - 1):
            stream = stub.Stream(pb.StreamRequest(session_id="far", from_sequence=too_far))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await read_stream(stream, within_s=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, too_far
            assert (caught.value.details() or "").startswith("from_sequence: "), too_far

        # The largest allowed position is past this log's end: no event, and the end.
        stream = stub.Stream(pb.StreamRequest(session_id="far", from_sequence=2**53 - 1))
        assert await read_stream(stream, within_s=10) == []
        assert await stream.code() == grpc.StatusCode.OK


# --- 8. strings that are not UTF-8 ------------------------------------------------------------


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (payloads here are shorter than 128 bytes)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


async def test_a_string_field_that_is_not_utf8_is_invalid_naming_it(start_node: StartNode) -> None:
    bad_json = b'{"text": "hello \xff world"}'
    async with start_node() as node, channel_to(node.address) as channel:
        cases = [
            (
                "Start",
                pb.StartRequest(session_id="u1").SerializeToString() + field(2, bad_json),
                "input_json",
            ),
            ("Start", field(1, b"u\xc3"), "session_id"),
            (
                "Start",
                field(4, field(1, b"k") + field(2, b"\xed\xa0\x80")),
                "metadata",
            ),  # a surrogate
            ("Stream", field(1, b"\xc0\xaf"), "session_id"),  # an overlong encoding
            ("Interrupt", field(1, b"s") + field(2, b"stop \xfe"), "reason"),
        ]
        for method, raw, name in cases:
            if method == "Stream":
                call = raw_call(channel, method, raw)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await asyncio.wait_for(call.read(), timeout=10)
                error = caught.value
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
            else:
                error = await invalid_argument(raw_call(channel, method, raw))
            assert error.details() == f"{name}: not valid UTF-8", (method, raw)
            violations = read_details(error.code(), error.trailing_metadata()).violations
            assert violations == ((name, "not valid UTF-8"),)

        # No session was created by the rejected Start.
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetStatus(pb.GetStatusRequest(session_id="u1"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        # Valid UTF-8 beyond ASCII still goes through.
        ok = pb.StartRequest(
            session_id="u2", input_json=json.dumps({"text": "héllo wörld"}, ensure_ascii=False)
        )
        response = await raw_call(channel, "Start", ok.SerializeToString())
        assert pb.StartResponse.FromString(response).created


# --- 9. bytes that are no request ------------------------------------------------------------


async def test_bytes_that_are_no_request_are_invalid_argument(start_node: StartNode) -> None:
    async with start_node() as node, channel_to(node.address) as channel:
        for method, type_name in (("Start", "StartRequest"), ("GetStatus", "GetStatusRequest")):
            for raw in (b"\x0f", b"\x0a\x05ab"):  # a bad wire type; a string cut short
                error = await invalid_argument(raw_call(channel, method, raw))
                expected = f"request: cannot be parsed as a helix.agent.v1.{type_name}"
                assert (error.details() or "").startswith(expected), error.details()
                violations = read_details(error.code(), error.trailing_metadata()).violations
                assert [v[0] for v in violations] == ["request"]
        stream = raw_call(channel, "Stream", b"\x0f")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(stream.read(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (caught.value.details() or "").startswith(
            "request: cannot be parsed as a helix.agent.v1.StreamRequest"
        )


# --- 10. lengths in characters ------------------------------------------------------------------


async def test_lengths_are_counted_in_characters(start_node: StartNode) -> None:
    async with start_node(delay_ms=200) as node, channel_to(node.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        metadata = {EMOJI * 128: EMOJI * 4096}  # at the limits in characters, twice them in UTF-16
        text = json.dumps({"text": EMOJI * 10000})
        started = await stub.Start(
            pb.StartRequest(session_id="chars", input_json=text, metadata=metadata)
        )
        assert started.created
        reason = EMOJI * 4096
        interrupted = await stub.Interrupt(pb.InterruptRequest(session_id="chars", reason=reason))
        assert interrupted.accepted
        events = await read_stream(stub.Stream(pb.StreamRequest(session_id="chars")), within_s=15)
        assert events[0].run_started.metadata == metadata
        assert events[-1].WhichOneof("payload") == "interrupted"
        assert events[-1].interrupted.reason == reason

        # One character over each limit is still refused.
        too_long = [
            (pb.StartRequest(input_json=TEXT, metadata={EMOJI * 129: "v"}), "metadata"),
            (pb.StartRequest(input_json=TEXT, metadata={"k": EMOJI * 4097}), "metadata[k]"),
            (pb.StartRequest(input_json=json.dumps({"text": EMOJI * 10001})), "input_json.text"),
        ]
        for request, name in too_long:
            error = await invalid_argument(stub.Start(request))
            assert (error.details() or "").startswith(f"{name}: "), error.details()
        error = await invalid_argument(
            stub.Interrupt(pb.InterruptRequest(session_id="chars", reason=EMOJI * 4097))
        )
        assert (error.details() or "").startswith("reason: ")
