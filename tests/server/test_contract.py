"""The AgentService contract over real gRPC on 127.0.0.1, against every embedded store.

Interrupt contract: an ``Interrupt`` on a running session is recorded durably,
wakes the local run mid-step, ends the stream with an ``interrupted`` event and
sets the status to ``interrupted``; on a finished session it changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

import grpc
import pytest

from helix_transport import AgentClient, InvalidArgument, SessionExists, SessionNotFound
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.agent.scripted import ScriptedTurn, register_script
from tests.agents import counter, fixer, looper
from tests.conftest import Serve

T = TypeVar("T")


async def collect(
    client: AgentClient, session_id: str, from_sequence: int = 0
) -> list[pb.StreamEvent]:
    return [e async for e in client.stream(session_id, from_sequence=from_sequence)]


def kinds(events: list[pb.StreamEvent]) -> list[str]:
    return [e.WhichOneof("payload") or "" for e in events]


async def timed(call: Awaitable[T]) -> tuple[T, float]:
    """``call``'s result and the seconds it took."""
    started = asyncio.get_running_loop().time()
    result = await call
    return result, asyncio.get_running_loop().time() - started


async def test_session_runs_to_completion_with_gapless_sequences(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        started = await client.start(json.dumps({"steps": 3, "words": 4}), session_id="s1")
        assert started.created and started.agent_type == "counter"
        events = await collect(client, "s1")

    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert {e.session_id for e in events} == {"s1"} and {e.agent_type for e in events} == {
        "counter"
    }
    assert kinds(events)[0] == "run_started" and kinds(events)[-2:] == ["output", "completed"]
    assert kinds(events).count("step_started") == 4  # three ticks, then the finish step
    assert kinds(events).count("text_delta") == 12
    assert all(e.time.seconds > 0 for e in events)
    assert json.loads(events[-1].completed.output_json) == {"total": 3, "steps": 3}


async def test_stream_replays_from_start_middle_and_end(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 2}), session_id="s1")
        full = await collect(client, "s1")
        last = full[-1].sequence
        middle = await collect(client, "s1", from_sequence=5)
        at_end = await collect(client, "s1", from_sequence=last)
        beyond = await collect(client, "s1", from_sequence=last + 100)

    assert [e.sequence for e in middle] == list(range(6, last + 1))
    assert [e.SerializeToString() for e in middle] == [e.SerializeToString() for e in full[5:]]
    assert at_end == [] and beyond == []


async def test_batches_hold_the_same_events_one_message_at_a_time(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 3, "words": 4}), session_id="s1")
        events = await collect(client, "s1")
        stream = client.stream("s1")
        batches = [batch async for batch in stream.batches()]
        partial = client.stream("s1", from_sequence=2)
        async for event in partial:
            if event.sequence == 5:
                break

    flat = [e.SerializeToString() for batch in batches for e in batch]
    assert flat == [e.SerializeToString() for e in events]
    assert all(batches) and len(batches) < len(events)  # a finished log replays packed
    assert stream.last_sequence == events[-1].sequence
    assert partial.last_sequence == 5  # exact where the reader stopped, not the message's end


async def test_status_reports_output_counters_and_usage(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 2}), session_id="s1")
        events = await collect(client, "s1")
        status = await client.get_status("s1")

    assert status.status == pb.SESSION_STATUS_COMPLETED
    assert json.loads(status.output_json) == {"total": 2, "steps": 2}
    assert status.last_sequence == events[-1].sequence
    assert status.step_count == 3
    assert status.usage.total_tokens > 0
    assert status.usage.total_tokens == status.usage.prompt_tokens + status.usage.completion_tokens
    assert status.finished_at.ToNanoseconds() >= status.created_at.ToNanoseconds() > 0


async def test_status_with_a_wait_answers_when_the_session_ends(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")  # a run of about half a second
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 3, "words": 5}), session_id="s1")
        first = await client.get_status("s1")
        ended, waited = await timed(client.get_status("s1", wait=timedelta(seconds=30)))
        events = await collect(client, "s1")
        again, at_once = await timed(client.get_status("s1", wait=timedelta(seconds=30)))

    assert first.status == pb.SESSION_STATUS_RUNNING
    assert ended.status == pb.SESSION_STATUS_COMPLETED
    assert json.loads(ended.output_json) == {"total": 3, "steps": 3}
    assert ended.last_sequence == events[-1].sequence  # the end, as logged
    assert waited < 15  # woken by the end, not by the wait running out
    assert again.status == pb.SESSION_STATUS_COMPLETED and at_once < 5  # finished: no wait


async def test_status_with_a_wait_reports_a_running_session_when_the_wait_is_over(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "100")
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 20, "words": 10}), session_id="s1")
        status, waited = await timed(client.get_status("s1", wait=timedelta(seconds=0.4)))
        await client.interrupt("s1")
        stopped = await client.get_status("s1", wait=timedelta(seconds=30))

    assert status.status == pb.SESSION_STATUS_RUNNING and status.last_sequence > 0
    assert waited >= 0.39
    assert stopped.status == pb.SESSION_STATUS_INTERRUPTED


async def test_readers_at_once_and_mid_run_see_the_same_log(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "5")
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 4, "words": 5}), session_id="s1")
        first = asyncio.create_task(collect(client, "s1"))
        second = asyncio.create_task(collect(client, "s1"))
        seen: list[pb.StreamEvent] = []
        async for event in client.stream("s1"):
            seen.append(event)
            if len(seen) == 8:
                break  # this reader leaves; a new one joins mid-run from where it left
        late = await collect(client, "s1", from_sequence=seen[-1].sequence)
        a, b = await first, await second

    assert [e.sequence for e in a] == list(range(1, len(a) + 1))
    assert [e.SerializeToString() for e in a] == [e.SerializeToString() for e in b]
    assert [e.SerializeToString() for e in seen + late] == [e.SerializeToString() for e in a]


async def test_start_is_idempotent_and_conflicting_input_is_already_exists(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        first = await client.start('{"steps": 1, "words": 2}', session_id="s1")
        # Same JSON value, different spelling: still the same call.
        again = await client.start('{"words":2,"steps":1}', session_id="s1")
        events = await collect(client, "s1")
        with pytest.raises(SessionExists):
            await client.start('{"steps": 2}', session_id="s1")

    assert first.created and not again.created and again.session_id == "s1"
    assert kinds(events).count("run_started") == 1


async def test_an_empty_input_is_the_same_call_as_an_empty_object(serve: Serve) -> None:
    # The proto says "" stands for {}: it was stored as the model's defaults filled in,
    # so a retry spelling it {} was refused as a different input.
    async with serve(counter) as (_, client):
        first = await client.start("", session_id="e1")
        again = await client.start("{}", session_id="e1")
        events = await collect(client, "e1")
    assert first.created and not again.created
    assert events[0].run_started.input_json == "{}"


async def test_an_input_mentioning_nan_in_a_string_is_fine(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        started = await client.start('{"steps": 1, "note": "NaN and Infinity"}')
    assert started.created


async def test_concurrent_identical_starts_run_the_session_once(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        results = await asyncio.gather(
            *(client.start('{"steps": 1}', session_id="same") for _ in range(10))
        )
        events = await collect(client, "same")

    assert sum(r.created for r in results) == 1
    assert kinds(events).count("run_started") == 1


async def test_empty_session_id_is_generated(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        a = await client.start('{"steps": 1}')
        b = await client.start('{"steps": 1}')
    assert a.session_id and b.session_id and a.session_id != b.session_id


async def test_interrupt_mid_run_ends_stream_and_sets_status(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 20, "words": 10}), session_id="s1")
        events: list[pb.StreamEvent] = []
        async for event in client.stream("s1"):
            events.append(event)
            if event.WhichOneof("payload") == "text_delta" and len(events) == 5:
                loop = asyncio.get_running_loop()
                asked_at = loop.time()
                reply = await client.interrupt("s1", reason="user stop")
                assert reply.accepted
        stopped_after = loop.time() - asked_at
        status = await client.get_status("s1")
        again = await client.interrupt("s1", reason="twice")

    assert events[-1].WhichOneof("payload") == "interrupted"
    assert events[-1].interrupted.reason == "user stop"
    # Mid-step: the in-flight model call was cancelled, well before the 20-step run ends.
    assert stopped_after < 1.0
    assert "completed" not in kinds(events)
    assert status.status == pb.SESSION_STATUS_INTERRUPTED
    assert not again.accepted and again.status == pb.SESSION_STATUS_INTERRUPTED


async def test_interrupt_of_finished_session_changes_nothing(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        await client.start('{"steps": 1}', session_id="s1")
        before = await collect(client, "s1")
        reply = await client.interrupt("s1")
        after = await collect(client, "s1")
        status = await client.get_status("s1")

    assert not reply.accepted and reply.status == pb.SESSION_STATUS_COMPLETED
    assert len(after) == len(before) and status.status == pb.SESSION_STATUS_COMPLETED


async def test_max_steps_fails_clearly(serve: Serve) -> None:
    async with serve(looper) as (_, client):
        await client.start("{}", session_id="s1")
        events = await collect(client, "s1")
        status = await client.get_status("s1")

    assert events[-1].WhichOneof("payload") == "failed"
    assert events[-1].failed.failure_reason == "max_steps"
    assert status.status == pb.SESSION_STATUS_FAILED and status.failure_reason == "max_steps"
    assert "3 steps" in status.error


def _fails_with_unstorable_text(messages: list[dict[str, object]]) -> ScriptedTurn:
    raise ValueError("provider said: bad\x00byte and a lone \ud800 surrogate")


async def test_a_failure_message_no_store_can_hold_as_is_still_ends_the_run(
    serve: Serve,
) -> None:
    # PostgreSQL's text refuses NUL, and SQLite, Redis and protobuf lone surrogates: the
    # run's failure could not be written, so it never ended.
    agent = dataclasses.replace(
        counter, name="unstorable", model=register_script("unstorable", _fails_with_unstorable_text)
    )
    async with serve(agent) as (_, client):
        await client.start("{}", session_id="u1")
        async with asyncio.timeout(10):
            events = await collect(client, "u1")
        status = await client.get_status("u1")
    assert kinds(events)[-1] == "failed"
    assert status.status == pb.SESSION_STATUS_FAILED
    assert "bad\ufffdbyte and a lone \ufffd surrogate" in status.error
    assert status.error == events[-1].failed.error


async def test_invalid_output_goes_back_to_the_model(serve: Serve) -> None:
    async with serve(fixer) as (_, client):
        await client.start("{}", session_id="s1")
        events = await collect(client, "s1")

    errors = [e.error for e in events if e.WhichOneof("payload") == "error"]
    assert [e.code for e in errors] == ["invalid_output"] and "total" in errors[0].message
    ends = [e.tool_end for e in events if e.WhichOneof("payload") == "tool_end"]
    assert (
        ends[0].is_error
        and "invalid output" in ends[0].result_json
        and "total" in ends[0].result_json
    )
    assert json.loads(events[-1].completed.output_json) == {"total": 7, "steps": 1}


async def test_describe_returns_schemas(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        described = await client.describe()
    assert described.agent_type == "counter"
    assert json.loads(described.input_schema_json)["properties"]["steps"]["maximum"] == 50
    assert set(json.loads(described.output_schema_json)["required"]) == {"total", "steps"}
    assert list(described.tool_names) == ["tick"]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.StartRequest(input_json='{"steps": "many"}'), "input_json.steps"),
        (pb.StartRequest(input_json='{"steps": 0}'), "input_json.steps"),
        (pb.StartRequest(input_json="{not json"), "input_json"),
        (pb.StartRequest(input_json="[" * 100_000 + "]" * 100_000), "input_json"),
        (pb.StartRequest(input_json='"a string"'), "input_json"),
        # pydantic read these; JSON.parse, Go and serde cannot read the input handed on.
        (pb.StartRequest(input_json='{"steps": 1, "x": NaN}'), "input_json"),
        (pb.StartRequest(input_json='{"steps": 1, "x": [-Infinity]}'), "input_json"),
        (pb.StartRequest(input_json='{"steps": 1}', session_id="has space"), "session_id"),
        (pb.StartRequest(input_json='{"steps": 1}', session_id="x" * 600), "session_id"),
        (
            pb.StartRequest(input_json='{"steps": 1}', parent_session_id="bad/id"),
            "parent_session_id",
        ),
        (
            pb.StartRequest(input_json="{}", metadata={f"k{i}": "v" for i in range(65)}),
            "metadata",
        ),
    ],
)
async def test_bad_start_is_invalid_argument_naming_the_field(
    serve: Serve, request_: pb.StartRequest, field: str
) -> None:
    async with serve(counter) as (server, _), grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.AgentServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Start(request_, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(f"{field}:")


async def assert_not_found_on_every_rpc(client: AgentClient, session_id: str) -> None:
    with pytest.raises(SessionNotFound):
        await client.get_status(session_id)
    with pytest.raises(SessionNotFound):
        await client.interrupt(session_id)
    with pytest.raises(SessionNotFound):
        await collect(client, session_id)


async def test_unknown_session_is_not_found_on_every_rpc(serve: Serve) -> None:
    async with serve(counter) as (server, client):
        await assert_not_found_on_every_rpc(client, "missing")
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetStatus(pb.GetStatusRequest(session_id="missing"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_another_agent_types_session_is_not_found_on_a_shared_store(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two types' services on one store (as deploy/ runs them): each serves only its own
    # sessions, and an Interrupt sent to the wrong service records nothing.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    async with serve(counter) as (_, mine), serve(fixer) as (_, other):
        await mine.start(json.dumps({"steps": 3, "words": 2}), session_id="s1")
        await assert_not_found_on_every_rpc(other, "s1")
        status = await mine.get_status("s1", wait=timedelta(seconds=10))
    assert status.agent_type == counter.name
    assert status.status == pb.SESSION_STATUS_COMPLETED


async def test_bad_stream_and_status_requests_are_invalid_argument(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        await client.start('{"steps": 1}', session_id="s1")
        with pytest.raises(InvalidArgument) as negative:
            await collect(client, "s1", from_sequence=-1)
        with pytest.raises(InvalidArgument) as empty:
            await client.get_status("")
        with pytest.raises(InvalidArgument) as reason:
            await client.interrupt("s1", reason="x" * 10_000)
    assert negative.value.field == "from_sequence"
    assert empty.value.field == "session_id"
    assert reason.value.field == "reason"


async def test_health_and_reflection_are_served(serve: Serve) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with serve(counter) as (server, _), grpc.aio.insecure_channel(server.address) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="helix.agent.v1.AgentService"), timeout=5
        )
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        services = [s.name async for r in replies for s in r.list_services_response.service]
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert "helix.agent.v1.AgentService" in services


async def test_finished_sessions_leave_no_cached_tail_and_end_streams_at_once(serve: Serve) -> None:
    async with serve(counter) as (server, client):
        for i in range(5):
            await client.start('{"steps": 1}', session_id=f"s{i}")
            events = await collect(client, f"s{i}")  # a reader attached at the terminal event
        started = asyncio.get_running_loop().time()
        assert await collect(client, "s4", from_sequence=events[-1].sequence) == []
        elapsed = asyncio.get_running_loop().time() - started
        tails = server.hub.tails()
    assert tails == 0
    assert elapsed < 0.3  # not a poll interval
