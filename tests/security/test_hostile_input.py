"""Hostile and malformed requests over real gRPC on 127.0.0.1: each one a clear error.

Every refusal is INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for an over-size message)
with the field named in the message *and* in google.rpc ``BadRequest`` field
violations; nothing is UNKNOWN or INTERNAL, and the server serves on afterwards.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from pydantic import BaseModel

from helix_transport import Agent, AgentClient, InvalidArgument, Limits, ToolContext, tool
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.scripted import ScriptedTurn, finish, register_script, steps_taken
from helix_transport.agent.scripted import call as scripted_call
from helix_transport.server._validation import MAX_SEQUENCE, json_depth_exceeds
from tests.agents import counter
from tests.agents.hostile import echo
from tests.conftest import Serve
from tests.security.servers import ServeSqlite, details

SERVICE = "/helix.agent.v1.AgentService/"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


BAD_REQUESTS: list[tuple[str, Message | bytes, str]] = [
    ("Start", pb.StartRequest(input_json='{"topic": '), "input_json"),
    ("Start", pb.StartRequest(input_json="[1, 2"), "input_json"),
    ("Start", pb.StartRequest(input_json='{"topic": 7}'), "input_json.topic"),
    ("Start", pb.StartRequest(input_json='{"topic": "t", "items": [{"name": ""}]}'), "input_json.items[0].name"),
    ("Start", pb.StartRequest(input_json='{"topic": "t", "items": "many"}'), "input_json.items"),
    ("Start", pb.StartRequest(input_json=json.dumps({"topic": "x" * 20_000})), "input_json.topic"),
    ("Start", pb.StartRequest(input_json=json.dumps({"topic": "x" * (2 << 20)})), "input_json"),
    ("Start", pb.StartRequest(input_json=f'{{"topic": "t", "tags": {nested(200)}}}'), "input_json"),
    ("Start", pb.StartRequest(input_json=f'{{"topic": {"[" * 100_000}'), "input_json"),
    ("Start", pb.StartRequest(session_id="x" * 513, input_json='{"topic": "t"}'), "session_id"),
    ("Start", pb.StartRequest(session_id="-x", input_json='{"topic": "t"}'), "session_id"),
    ("Start", pb.StartRequest(session_id="a\x00b", input_json='{"topic": "t"}'), "session_id"),
    ("Start", pb.StartRequest(parent_session_id="p q", input_json='{"topic": "t"}'), "parent_session_id"),
    ("Start", pb.StartRequest(input_json='{"topic": "t"}', metadata={"k": "v\x00"}), "metadata[k]"),
    ("Start", pb.StartRequest(input_json='{"topic": "t"}', metadata={"k\x00": "v"}), "metadata"),
    ("Start", pb.StartRequest(input_json='{"topic": "t"}', metadata={"": "v"}), "metadata"),
    ("Start", pb.StartRequest(input_json='{"topic": "t"}', metadata={"k": "v" * 5000}), "metadata[k]"),
    ("Start", pb.StartRequest(input_json='{"topic": "t"}', metadata={str(i): "" for i in range(65)}), "metadata"),
    ("Stream", pb.StreamRequest(session_id=""), "session_id"),
    ("Stream", pb.StreamRequest(session_id="s", from_sequence=-1), "from_sequence"),
    ("Stream", pb.StreamRequest(session_id="s", from_sequence=-(1 << 63)), "from_sequence"),
    ("Stream", pb.StreamRequest(session_id="s", from_sequence=MAX_SEQUENCE + 1), "from_sequence"),
    ("GetStatus", pb.GetStatusRequest(session_id=""), "session_id"),
    ("GetStatus", pb.GetStatusRequest(session_id="é"), "session_id"),
    ("GetStatus", pb.GetStatusRequest(session_id="s", wait=Duration(seconds=-1)), "wait"),
    ("GetStatus", pb.GetStatusRequest(session_id="s", wait=Duration(seconds=61)), "wait"),
    ("GetStatus", pb.GetStatusRequest(session_id="s", wait=Duration(seconds=1, nanos=-1)), "wait"),
    ("GetStatus", pb.GetStatusRequest(session_id="s", wait=Duration(nanos=10**9)), "wait"),
    ("Interrupt", pb.InterruptRequest(session_id="x" * 10_000), "session_id"),
    ("Interrupt", pb.InterruptRequest(session_id="s\n"), "session_id"),  # `$` let it through
    ("Start", pb.StartRequest(session_id="t\n", input_json='{"topic": "t"}'), "session_id"),
    ("Interrupt", pb.InterruptRequest(session_id="s", reason="x" * 5000), "reason"),
    ("Interrupt", pb.InterruptRequest(session_id="s", reason="stop\x00"), "reason"),
    ("Continue", pb.ContinueRequest(session_id="", message="m", turn=2), "session_id"),
    ("Continue", pb.ContinueRequest(session_id="s", message=" ", turn=2), "message"),
    ("Continue", pb.ContinueRequest(session_id="s", message="m" * (2 << 20), turn=2), "message"),
    ("Continue", pb.ContinueRequest(session_id="s", message="m", turn=-(1 << 31)), "turn"),
    # A fresh turn's message is its input: checked as Start checks one (it was not).
    ("Continue", pb.ContinueRequest(session_id="s", message='{"topic": 5}', turn=2, fresh=True), "message.topic"),
    ("Continue", pb.ContinueRequest(session_id="s", message="[" * 100 + "]" * 100, turn=2, fresh=True), "message"),
    # An unclosed string of escaped quotes: the depth check was quadratic in it (40 KB
    # held the event loop 7 s), and this one would have held it for hours.
    ("Start", pb.StartRequest(input_json="[" * 65 + '"' + '\\"' * 300_000 + "\\"), "input_json"),
    # A key from the input is part of the field's path, cut so the trailer fits (a 20 KB
    # key made the status RESOURCE_EXHAUSTED: gRPC's 16 KiB cap on metadata).
    ("Start", pb.StartRequest(input_json=json.dumps({"topic": "t", "tags": {"k" + "x" * 20_000: 1}})), "input_json.tags.k" + "x" * 62 + "…"),
    ("Start", pb.StartRequest(input_json=json.dumps({"topic": "t", "tags": {f"{i}" + "x" * 1_000: 1 for i in range(40)}})), "input_json.tags.0" + "x" * 62 + "…"),
]  # fmt: skip


def serialize(request: Message | bytes) -> bytes:
    """Raw bytes go out as they are: they are the malformed part."""
    return request if isinstance(request, bytes) else request.SerializeToString()


async def call(
    channel: grpc.aio.Channel, method: str, request: Message | bytes, deadline_s: float = 10
) -> list[bytes]:
    """Invoke ``method`` with ``request`` (a message or raw bytes); the raw replies."""
    if method == "Stream":
        stream: grpc.aio.UnaryStreamMultiCallable[Message | bytes, bytes] = channel.unary_stream(
            SERVICE + method, request_serializer=serialize
        )
        return [reply async for reply in stream(request, timeout=deadline_s)]
    unary: grpc.aio.UnaryUnaryMultiCallable[Message | bytes, bytes] = channel.unary_unary(
        SERVICE + method, request_serializer=serialize
    )
    return [await unary(request, timeout=deadline_s)]


async def test_each_bad_request_is_invalid_argument_naming_its_field(
    serve_sqlite: ServeSqlite,
) -> None:
    async with serve_sqlite(echo) as server, grpc.aio.insecure_channel(server.address) as channel:
        await AgentClient(channel, address=server.address).start('{"topic": "t"}', session_id="s")
        for method, request, field in BAD_REQUESTS:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(channel, method, request)
            error = info.value
            where = f"{method} {str(request)[:80]!r}"
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (where, error.details())
            assert (error.details() or "").startswith(f"{field}:"), (where, error.details())
            assert details(error).violations[0][0] == field, where
            assert "Traceback" not in (error.details() or "")
        status = await pb_grpc.AgentServiceStub(channel).GetStatus(
            pb.GetStatusRequest(session_id="s"), timeout=5
        )
    assert status.session_id == "s"  # still serving, and nothing else was created


async def test_every_schema_violation_is_a_field_violation(serve_sqlite: ServeSqlite) -> None:
    bad = {"topic": "", "items": [{"name": "ok"}, {"name": "", "count": -1}], "tags": {"a": 1}}
    async with serve_sqlite(echo) as server, await AgentClient.connect(server.address) as client:
        with pytest.raises(InvalidArgument) as info:
            await client.start(json.dumps(bad))
    fields = [field for field, _ in info.value.violations]
    assert fields == [
        "input_json.topic",
        "input_json.items[1].name",
        "input_json.items[1].count",
        "input_json.tags.a",
    ]
    assert info.value.field == "input_json.topic"
    assert str(info.value).startswith("input_json.topic:") and "(and 3 more)" in str(info.value)


@pytest.mark.parametrize("method", ["Start", "Stream", "GetStatus", "Interrupt", "Continue"])
async def test_invalid_utf8_is_invalid_argument_not_unknown(
    serve_sqlite: ServeSqlite, method: str
) -> None:
    # Field 1 (session_id) of every request, as two bytes that are not UTF-8.
    async with serve_sqlite(echo) as server, grpc.aio.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(channel, method, b"\x0a\x02\xff\xfe")
        with pytest.raises(grpc.aio.AioRpcError) as garbage:
            await call(channel, method, b"\xff\xff\xff\xff")
        described = await pb_grpc.AgentServiceStub(channel).Describe(
            pb.DescribeRequest(), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "session_id: not valid UTF-8"
    assert details(info.value).violations == (("session_id", "not valid UTF-8"),)
    assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (garbage.value.details() or "").startswith("request: cannot be parsed")
    assert "DecodeError" not in (garbage.value.details() or "")
    assert described.agent_type == "echo"


async def test_invalid_utf8_in_input_and_metadata_names_the_field(
    serve_sqlite: ServeSqlite,
) -> None:
    input_json = b"\x12\x03\x22\xc3\x28"  # field 2: '"', then an invalid 2-byte sequence
    entry = b"\x0a\x01k\x12\x01\x80"  # key "k", value 0x80
    metadata = b"\x22" + bytes([len(entry)]) + entry  # field 4, a map entry
    async with serve_sqlite(echo) as server, grpc.aio.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as bad_input:
            await call(channel, "Start", input_json)
        with pytest.raises(grpc.aio.AioRpcError) as bad_metadata:
            await call(channel, "Start", metadata)
    assert bad_input.value.details() == "input_json: not valid UTF-8"
    assert bad_metadata.value.details() == "metadata: not valid UTF-8"


async def test_oversized_message_is_resource_exhausted_and_the_server_serves_on(
    serve_sqlite: ServeSqlite,
) -> None:
    limits = Limits(max_message_bytes=256 << 10, max_input_bytes=64 << 10)
    async with (
        serve_sqlite(echo, limits=limits) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        huge = pb.StartRequest(input_json=json.dumps({"topic": "x" * (300 << 10)}))
        with pytest.raises(grpc.aio.AioRpcError) as too_big:
            await call(channel, "Start", huge)
        with pytest.raises(grpc.aio.AioRpcError) as over_input:
            await call(
                channel,
                "Start",
                pb.StartRequest(input_json=json.dumps({"topic": "x" * (100 << 10)})),
            )
        with pytest.raises(grpc.aio.AioRpcError) as over_message:  # the limit, not 1 MiB
            await call(
                channel,
                "Continue",
                pb.ContinueRequest(session_id="s", message="m" * (100 << 10), turn=2),
            )
        ok = await call(channel, "Start", pb.StartRequest(input_json='{"topic": "t"}'))
    assert over_message.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert over_message.value.details() == f"message: larger than {64 << 10} bytes"
    assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert over_input.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        over_input.value.details()
        == f"input_json: larger than {64 << 10} bytes ({(100 << 10) + 13})"
    )
    assert ok


async def test_nul_in_metadata_and_reason_never_reaches_the_store(serve: Serve) -> None:
    # PostgreSQL refuses NUL in text and jsonb: it must be refused before the store sees it.
    async with serve(counter) as (server, client):
        with pytest.raises(InvalidArgument) as metadata:
            await client.start('{"steps": 1}', session_id="s", metadata={"trace": "a\x00b"})
        with pytest.raises(InvalidArgument) as reason:
            await client.interrupt("missing", reason="\x00")
        assert await server.store.get_session("s") is None
        # An escaped NUL inside the JSON input is valid JSON and stored as text as is.
        started = await client.start('{"steps": 1, "note": "a\\u0000b"}', session_id="s")
        events = [e async for e in client.stream("s")]
    assert metadata.value.field == "metadata[trace]" and reason.value.field == "reason"
    assert started.created and events[-1].WhichOneof("payload") == "completed"


async def test_stream_honours_the_client_deadline_and_leaves_no_reader(
    serve_sqlite: ServeSqlite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "50")
    async with (
        serve_sqlite(counter) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)
        await stub.Start(pb.StartRequest(session_id="slow", input_json='{"steps": 20}'), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Stream(pb.StreamRequest(session_id="slow"), timeout=0.5):
                pass
        for _ in range(50):  # the server side notices the cancellation at once
            if not server.hub._readers:
                break
            await asyncio.sleep(0.02)
        readers = dict(server.hub._readers)
        await stub.Interrupt(pb.InterruptRequest(session_id="slow"), timeout=5)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert readers == {}


async def test_a_start_past_its_deadline_runs_the_created_session_or_none(
    serve_sqlite: ServeSqlite,
) -> None:
    """The contract: a Start cut off by its deadline either created nothing or created a
    session that runs to its end (that deadline is the session's too, so the end may be
    the deadline's); a retry returns it (created=false)."""
    async with (
        serve_sqlite(counter) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)
        for i in range(20):
            request = pb.StartRequest(session_id=f"d{i}", input_json='{"steps": 1}')
            try:
                await stub.Start(request, timeout=0.001 * (i % 5))
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for i in range(20):
            record = await server.store.get_session(f"d{i}")
            if record is None:
                continue
            events = [
                e
                async for r in stub.Stream(pb.StreamRequest(session_id=f"d{i}"), timeout=10)
                for e in r.events
            ]
            # The call's deadline is the session's own (no `limits` given): the session ran
            # to an end, completed or stopped by that deadline, never left half-made.
            last = events[-1]
            kind = last.WhichOneof("payload")
            assert kind in ("completed", "interrupted"), f"d{i}: {kind}"
            if kind == "interrupted":
                assert last.interrupted.limit_exceeded == "deadline_exceeded", f"d{i}"


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@pytest.mark.parametrize(
    "value",
    [
        [],
        {"a": [[{"b": "]]]]}}}}"}]]},
        {"k": '\\"[[[[[[[[[[[[[['},
        [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]],
        [{"a": [{"b": [{"c": [{}]}]}]}],
        {"x": [1, [2, [3, [4, [5, [6]]]]]], "y": {"z": {"w": {}}}},
    ],
)
def test_json_depth_matches_the_parsed_depth(value: object) -> None:
    text = json.dumps(value)
    depth = _depth(value)
    for limit in range(1, depth + 3):
        assert json_depth_exceeds(text, limit) == (depth > limit), (text, limit)


@pytest.mark.timeout(60)  # the quadratic check of the unclosed strings took hours
def test_json_depth_check_is_fast_on_a_megabyte() -> None:
    import time

    worst = "[" * (1 << 19) + "]" * (1 << 19)
    strings = json.dumps(["[" * 100] * 10_000)
    unclosed = "[" * 65 + '"' + '\\"' * (1 << 19)
    started = time.perf_counter()
    assert json_depth_exceeds(worst, 64)
    assert not json_depth_exceeds(strings, 64)
    # Unbalanced, so left to the parser: what matters is that the check ends.
    assert not json_depth_exceeds(unclosed, 64)
    assert not json_depth_exceeds(unclosed + "\\", 64)
    elapsed = time.perf_counter() - started
    print(f"depth checks of 2 x ~1 MiB: {elapsed * 1000:.1f} ms")


class _FetchArgs(BaseModel):
    size: int


@tool
async def fetch_blob(ctx: ToolContext, args: _FetchArgs) -> str:
    """Return a blob of ``size`` characters (a web page, a file)."""
    return "x" * args.size


class _Ok(BaseModel):
    ok: bool


def _fetch_script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(scripted_call("fetch_blob", size=5_000_000),))
    return finish(ok=True)


async def test_a_tool_result_too_large_for_one_message_is_refused_and_the_log_stays_readable(
    serve: Serve,
) -> None:
    # Before, the 5 MB result was logged as one event that no Stream could send (over
    # the 4 MiB message limit): every reader failed at it, so none reached the end.
    fetcher = Agent(
        name="fetcher",
        description="fetches blobs",
        input_model=_FetchArgs,
        output_model=_Ok,
        tools=[fetch_blob],
        model=register_script("fetcher", _fetch_script),
    )
    async with serve(fetcher) as (_, client):
        await client.start('{"size": 1}', session_id="big")
        events = [e async for e in client.stream("big")]
    assert events[-1].WhichOneof("payload") == "completed"
    (end,) = [e.tool_end for e in events if e.tool_end.tool_name == "fetch_blob"]
    assert end.is_error
    assert "result is 5000002 bytes, over the 1048576 bytes one event may carry" in end.result_json
