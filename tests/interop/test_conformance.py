"""The conformance kit against every agent service we ship, and against broken ones.

The Python services run in-process (each on its own in-memory store); the Node.js
service runs as a real process. A kit that passes everything proves nothing, so
the last tests serve deliberately broken servicers and expect the matching check
to fail.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from helix_transport import Agent, create_server
from helix_transport._exceptions import InvalidArgument
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.registry import address_env_var
from helix_transport.server import app as server_app
from helix_transport.server._servicer import AgentServicer
from helix_transport.store import MemoryStore
from helix_transport.testing.conformance import CheckResult, format_results, run_conformance, timing
from services.orchestrator.agent import agent as orchestrator
from services.researcher.agent import agent as researcher
from services.summarizer.agent import agent as summarizer
from tests.agents import counter
from tests.helpers import ROOT, stream_response
from tests.interop.conftest import StartNode

RESEARCH = json.dumps({"topic": "event log replay", "max_sources": 2})
SUMMARY = json.dumps(
    {"text": "Streams resume. Nothing is lost. Nothing repeats. Readers agree.", "max_sentences": 2}
)
QUESTION = json.dumps({"question": "What is event sourcing and how does backoff work?"})
TRANSLATE = json.dumps({"text": "Hello world, the agent reads the event log and writes the text."})

EXPECTED_CHECKS = {
    "health",
    "describe",
    "start.generated_id",
    "start.idempotent",
    "start.conflict",
    "start.concurrent",
    "stream.concurrent_readers",
    "stream.gapless",
    "stream.ends_after_terminal",
    "stream.resume_mid_run",
    "stream.replay",
    "stream.beyond_the_end",
    "stream.follow",
    "session.completed",
    "status.finished",
    "status.wait_finished",
    "status.wait_running",
    "start.after_finish",
    "interrupt.finished",
    "interrupt.running",
    "errors.not_found",
    "errors.empty_session_id",
    "errors.from_sequence_out_of_range",
    "errors.wait_out_of_range",
    "errors.malformed_input",
    "errors.unparsable_request",
    "errors.schema_rejected_input",
    "input.errors",
    "input.suspended",
    "input.answered",
    "abort.running",
    "abort.suspended",
    "sessions.list",
    "continue.new_turn",
    "limits.invalid",
    "limits.kept",
}

HUMAN_INPUT_CHECKS = {"input.errors", "input.suspended", "input.answered", "abort.suspended"}
LIMITS_CHECKS = {"limits.invalid", "limits.kept"}
"""The checks of capability ``limits`` (deadlines and budgets)."""
"""The checks of capability ``human_input`` (``abort.suspended`` needs ``abort`` too)."""
NEEDS_INPUT_REQUIRED = {"input.suspended", "input.answered", "abort.suspended"}
"""The checks skipped without ``--input-required``."""


WAIT_CHECKS = {"status.wait_finished", "status.wait_running", "errors.wait_out_of_range"}
"""The checks of ``GetStatusRequest.wait``, the long poll."""


def assert_all_pass(results: list[CheckResult]) -> None:
    assert {r.name for r in results} == EXPECTED_CHECKS, format_results(results)
    failed = [r for r in results if not r.passed]
    assert not failed, format_results(results)
    skipped = {r.name for r in results if r.skipped}
    # Only a run that ends within three events may skip the mid-run reconnect, one
    # that ends before the kit polls it the running long poll; Continue, the long
    # poll, human input and abort are optional (the Node.js service implements none of
    # them), the suspension needs --input-required, and an abort may come too late
    # for a quick run.
    optional = {"continue.new_turn", "errors.wait_out_of_range", "sessions.list", "stream.follow"}
    optional |= HUMAN_INPUT_CHECKS | LIMITS_CHECKS | {"abort.running"}
    assert skipped <= {"stream.resume_mid_run", "status.wait_running"} | optional, format_results(
        results
    )


@pytest.fixture
def slow_scripted_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs last long enough for readers to join them live."""
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "3")


@pytest.mark.usefixtures("slow_scripted_model")
@pytest.mark.parametrize(
    ("agent", "input_json"),
    [(researcher, RESEARCH), (summarizer, SUMMARY)],
    ids=["researcher", "summarizer"],
)
async def test_python_services_conform(agent: Agent, input_json: str) -> None:
    async with await create_server(agent, MemoryStore(), allow_unauthenticated=True) as server:
        results = await run_conformance(server.address, input_json=input_json, timeout_s=60)
    assert_all_pass(results)
    by_name = {r.name: r for r in results}
    assert by_name["stream.resume_mid_run"].passed
    assert not by_name["stream.follow"].skipped
    assert not by_name["continue.new_turn"].skipped
    assert not by_name["sessions.list"].skipped
    assert not by_name["errors.wait_out_of_range"].skipped  # our server checks wait
    assert all(by_name[name].passed and not by_name[name].skipped for name in LIMITS_CHECKS)


@pytest.mark.usefixtures("slow_scripted_model")
async def test_orchestrator_with_its_children_conforms(monkeypatch: pytest.MonkeyPatch) -> None:
    async with (
        await create_server(researcher, MemoryStore(), allow_unauthenticated=True) as research,
        await create_server(summarizer, MemoryStore(), allow_unauthenticated=True) as summary,
    ):
        monkeypatch.setenv(address_env_var("researcher"), research.address)
        monkeypatch.setenv(address_env_var("summarizer"), summary.address)
        async with await create_server(
            orchestrator, MemoryStore(), allow_unauthenticated=True
        ) as server:
            results = await run_conformance(
                server.address, input_json=QUESTION, bad_input_json='{"question": ""}'
            )
    assert_all_pass(results)
    rejected = {r.name: r for r in results}["errors.schema_rejected_input"]
    assert "input_json.question" in rejected.detail


async def test_node_service_conforms(start_node: StartNode) -> None:
    async with start_node(delay_ms=10) as node:
        results = await run_conformance(node.address, input_json=TRANSLATE)
    assert_all_pass(results)
    by_name = {r.name: r for r in results}
    assert "translator-node" in by_name["describe"].detail
    assert "while the session ran" in by_name["stream.resume_mid_run"].detail
    assert "ended interrupted" in by_name["interrupt.running"].detail
    # It predates the long poll: it answers a running session at once, and accepts any wait.
    assert "does not implement wait" in by_name["status.wait_running"].detail
    assert by_name["errors.wait_out_of_range"].skipped
    assert "wait not implemented" in by_name["errors.wait_out_of_range"].detail
    assert by_name["sessions.list"].passed and not by_name["sessions.list"].skipped
    # Its Describe lists list_sessions alone: what it lacks is skipped, saying so.
    assert "capabilities ['list_sessions']" in by_name["describe"].detail
    for name, capability in [
        ("continue.new_turn", "continue"),
        *((name, "human_input") for name in sorted(HUMAN_INPUT_CHECKS - {"abort.suspended"})),
        ("abort.running", "abort"),
        ("abort.suspended", "abort"),
        *((name, "limits") for name in sorted(LIMITS_CHECKS)),
    ]:
        result = by_name[name]
        assert result.skipped, format_results(results)
        assert f"Describe does not list {capability!r}" in result.detail, result.detail


async def test_node_service_takes_an_abort_for_an_interrupt(start_node: StartNode) -> None:
    """It lists no ``abort``: an abort is a plain interrupt there, as by any service older
    than the field (never an error, which would leave a parent's child running)."""
    async with start_node(delay_ms=50) as node, grpc.aio.insecure_channel(node.address) as channel:
        stub = pb_grpc.AgentServiceStub(channel)
        started = await stub.Start(pb.StartRequest(input_json=TRANSLATE), timeout=10)
        reply = await stub.Interrupt(
            pb.InterruptRequest(session_id=started.session_id, reason="stop", abort=True),
            timeout=10,
        )
        assert reply.accepted
        final = None
        async for response in stub.Stream(
            pb.StreamRequest(session_id=started.session_id), timeout=60
        ):
            final = response.events[-1] if response.events else final
    assert final is not None and final.WhichOneof("payload") == "interrupted"
    assert final.interrupted.reason == "stop"


async def test_cli_prints_the_table_and_exits_zero(start_node: StartNode) -> None:
    async with start_node(delay_ms=1) as node:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "helix_transport.cli", "conformance", node.address,
            "--input", TRANSLATE, "--bad-input", '{"text": 42}',
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()
    assert "PASS  stream.gapless" in text
    assert "input_json.text: Input should be a valid string" in text
    # Skipped: what its Describe does not list, and the wait checks (a run this fast
    # may end before the kit polls it), none failed.
    assert re.search(r"\n36 checks: \d+ passed, 0 failed, \d+ skipped$", text.rstrip()), text


async def test_cli_exits_non_zero_when_nothing_listens() -> None:
    from tests.helpers import free_port

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "conformance", f"127.0.0.1:{free_port()}",
        "--input", "{}", "--timeout", "5",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 1
    assert "FAIL  describe" in out.decode() and "UNAVAILABLE" in out.decode()


# --- the kit can fail ------------------------------------------------------------------


class SkipsASequence(AgentServicer):
    """Drops event 3 from every stream: a gap."""

    async def Stream(self, request: pb.StreamRequest, context: Any) -> AsyncIterator[Any]:
        async for response in super().Stream(request, context):
            kept = [e for e in stream_response(response).events if e.sequence != 3]
            if kept:
                yield pb.StreamResponse(events=kept)


class NeverIdempotent(AgentServicer):
    """Claims every Start created its session."""

    async def Start(self, request: pb.StartRequest, context: Any) -> pb.StartResponse:
        response = await super().Start(request, context)
        response.created = True
        return response


class AcceptsFinishedInterrupts(AgentServicer):
    """Says an interrupt of a finished session was accepted."""

    async def Interrupt(self, request: pb.InterruptRequest, context: Any) -> pb.InterruptResponse:
        response = await super().Interrupt(request, context)
        response.accepted = True
        return response


class KeepsStreamsOpen(AgentServicer):
    """Does not end the stream after the terminal event."""

    async def Stream(self, request: pb.StreamRequest, context: Any) -> AsyncIterator[Any]:
        async for response in super().Stream(request, context):
            yield response
        await asyncio.sleep(3600)


class UnknownIsInternal(AgentServicer):
    """Answers an unknown session with a status of its own instead of NOT_FOUND."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        if await self.store.get_session(request.session_id) is None:
            raise RuntimeError("no such row")
        return await super().GetStatus(request, context)


class ContinueNotIdempotent(AgentServicer):
    """Claims every Continue started a new turn."""

    async def Continue(self, request: pb.ContinueRequest, context: Any) -> pb.ContinueResponse:
        response = await super().Continue(request, context)
        response.created = True
        return response


class ReplaysPastTheTurn(AgentServicer):
    """Runs a stream on past a turn's terminal event into the next turn (what our own
    server did until 372ec09, for a continued session's replay)."""

    async def Stream(self, request: pb.StreamRequest, context: Any) -> AsyncIterator[Any]:
        last = request.from_sequence
        async for response in super().Stream(request, context):
            yield response
            if events := stream_response(response).events:
                last = events[-1].sequence
        if more := await self.store.read(request.session_id, from_sequence=last):
            yield pb.StreamResponse(events=more)


class SitsOutTheWait(AgentServicer):
    """Implements a long poll as a sleep: sits out the whole wait, the session's end
    (or that it had ended already) notwithstanding."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        wait_s = request.wait.ToTimedelta().total_seconds()
        if request.HasField("wait") and 0 < wait_s <= 60:
            await asyncio.sleep(wait_s)
            request.ClearField("wait")
        return await super().GetStatus(request, context)


class AnswersAsItWas(AgentServicer):
    """Sits out the whole wait, then answers the session as it was when asked."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        wait_s = request.wait.ToTimedelta().total_seconds()
        request.ClearField("wait")
        response = await super().GetStatus(request, context)
        if 0 < wait_s <= 60:
            await asyncio.sleep(wait_s)
        return response


class ChecksOnlyNegativeWaits(AgentServicer):
    """Rejects a negative wait, but cuts one over 60 s down to 60 s."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        if request.HasField("wait") and request.wait.seconds > 60:
            request.wait.FromSeconds(60)
        return await super().GetStatus(request, context)


class NamesAnotherField(AgentServicer):
    """Rejects an out-of-range wait, naming a field the request does not have."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        if request.HasField("wait") and not 0 <= request.wait.seconds <= 60:
            raise InvalidArgument("timeout", "out of range")
        return await super().GetStatus(request, context)


class AcceptsAnyWait(AgentServicer):
    """Honours wait, but clamps it into 0..60 s instead of rejecting the rest."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        if request.HasField("wait"):
            seconds = min(max(request.wait.ToTimedelta().total_seconds(), 0.0), 60.0)
            request.wait.FromNanoseconds(round(seconds * 1e9))
        return await super().GetStatus(request, context)


class IgnoresWait(AgentServicer):
    """Predates the long poll: answers at once, whatever the wait (conformant)."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        request.ClearField("wait")
        return await super().GetStatus(request, context)


class ReportsTheEndEarly(AgentServicer):
    """Answers a running session's long poll at once, as COMPLETED."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        waited = request.HasField("wait")
        request.ClearField("wait")
        response = await super().GetStatus(request, context)
        if waited and response.status == pb.SESSION_STATUS_RUNNING:
            response.status = pb.SESSION_STATUS_COMPLETED
        return response


class StaysOpenPastTheEnd(AgentServicer):
    """Keeps a stream from past the end of the log open after the session ends."""

    async def Stream(self, request: pb.StreamRequest, context: Any) -> AsyncIterator[Any]:
        async for response in super().Stream(request, context):
            yield response
        if request.from_sequence > 1_000_000:
            await asyncio.sleep(3600)


class FollowsWithoutEnds(AgentServicer):
    """Follows as Stream does, but never says a follow ended (its call stays open)."""

    async def Follow(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for response in super().Follow(request_iterator, context):
            messages = pb.FollowResponse.FromString(response).messages
            kept = [m for m in messages if not m.HasField("end")]
            if kept:
                yield pb.FollowResponse(messages=kept)


class PlainInvalidArgument(AgentServicer):
    """Names the field in its message, but sends no BadRequest in the trailer."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        if not request.session_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id: required")
        return await super().GetStatus(request, context)


class ClampsFromSequence(AgentServicer):
    """Reads a from_sequence past 2^53 - 1 as the end of the log."""

    async def Stream(self, request: pb.StreamRequest, context: Any) -> AsyncIterator[Any]:
        request.from_sequence = min(request.from_sequence, 2**40)
        async for response in super().Stream(request, context):
            yield response


class ListsOldestFirst(AgentServicer):
    """Lists its sessions in the wrong order."""

    async def ListSessions(self, request: Any, context: Any) -> pb.ListSessionsResponse:
        response = await super().ListSessions(request, context)
        response.sessions.reverse()
        return response


class ListsEveryStatus(AgentServicer):
    """Ignores the status filter."""

    async def ListSessions(self, request: Any, context: Any) -> pb.ListSessionsResponse:
        request.ClearField("statuses")
        return await super().ListSessions(request, context)


class CannotStart(AgentServicer):
    """Fails every Start."""

    async def Start(self, request: pb.StartRequest, context: Any) -> pb.StartResponse:
        raise RuntimeError("the store is gone")


@pytest.mark.parametrize(
    ("servicer", "failing"),
    [
        (SkipsASequence, {"stream.gapless"}),
        (NeverIdempotent, {"start.idempotent", "start.concurrent", "start.after_finish"}),
        (AcceptsFinishedInterrupts, {"interrupt.finished", "interrupt.running"}),
        (KeepsStreamsOpen, {"stream.concurrent_readers"}),
        (UnknownIsInternal, {"errors.not_found"}),
        (CannotStart, {"start.generated_id", "stream.gapless", "interrupt.running"}),
        (StaysOpenPastTheEnd, {"stream.beyond_the_end"}),
        (FollowsWithoutEnds, {"stream.follow"}),
        (PlainInvalidArgument, {"errors.empty_session_id"}),
        (ClampsFromSequence, {"errors.from_sequence_out_of_range"}),
        (ContinueNotIdempotent, {"continue.new_turn"}),
        (ReplaysPastTheTurn, {"continue.new_turn"}),
        (SitsOutTheWait, {"status.wait_finished"}),
        (ChecksOnlyNegativeWaits, {"errors.wait_out_of_range"}),
        (NamesAnotherField, {"errors.wait_out_of_range"}),
        (ListsOldestFirst, {"sessions.list"}),
        (ListsEveryStatus, {"sessions.list"}),
    ],
    ids=[
        "gap",
        "not-idempotent",
        "interrupt-lies",
        "stream-stays-open",
        "internal-not-found",
        "cannot-start",
        "stays-open-past-the-end",
        "follows-without-ends",
        "no-bad-request",
        "clamps-from-sequence",
        "continue-not-idempotent",
        "replays-past-the-turn",
        "sits-out-the-wait",
        "checks-only-negative-waits",
        "names-another-field",
        "lists-oldest-first",
        "lists-every-status",
    ],
)
async def test_kit_fails_a_broken_server(
    monkeypatch: pytest.MonkeyPatch, servicer: type[AgentServicer], failing: set[str]
) -> None:
    monkeypatch.setattr(server_app, "AgentServicer", servicer)
    monkeypatch.setattr(timing, "END_GRACE_S", 0.5)  # KeepsStreamsOpen: fail fast
    monkeypatch.setattr(timing, "WAIT_PROMPT_S", 1.0)  # SitsOutTheWait too
    monkeypatch.setattr(timing, "WAIT_RUNNING_S", 1.0)
    async with await create_server(summarizer, MemoryStore(), allow_unauthenticated=True) as server:
        results = await run_conformance(server.address, input_json=SUMMARY, timeout_s=20)
    failed = {r.name for r in results if not r.passed}
    assert failing <= failed, format_results(results)
    assert {r.name for r in results} == EXPECTED_CHECKS  # the table is always complete
    assert "FAIL" in format_results(results)


@pytest.mark.parametrize(
    ("servicer", "wait_s", "failing"),
    [
        (AgentServicer, 1.0, set()),
        (IgnoresWait, 1.0, set()),
        (AcceptsAnyWait, 1.0, {"errors.wait_out_of_range"}),
        (ReportsTheEndEarly, 1.0, {"status.wait_running"}),
        # A wait the session ends well within, so sitting it out is late for its end.
        (SitsOutTheWait, 4.0, {"status.wait_finished", "status.wait_running"}),
        (AnswersAsItWas, 4.0, {"status.wait_finished", "status.wait_running"}),
    ],
    ids=[
        "honours-wait",
        "ignores-wait",
        "accepts-any-wait",
        "reports-the-end-early",
        "sits-out-the-wait",
        "answers-as-it-was",
    ],
)
async def test_kit_judges_the_long_poll_of_a_running_session(
    monkeypatch: pytest.MonkeyPatch,
    servicer: type[AgentServicer],
    wait_s: float,
    failing: set[str],
) -> None:
    """Runs slow enough (about 1.5 s) for the kit to poll the main session running."""
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "40")
    monkeypatch.setattr(server_app, "AgentServicer", servicer)
    monkeypatch.setattr(timing, "WAIT_RUNNING_S", wait_s)
    monkeypatch.setattr(timing, "WAIT_PROMPT_S", 1.0)
    monkeypatch.setattr(timing, "END_GRACE_S", 1.0)
    async with await create_server(summarizer, MemoryStore(), allow_unauthenticated=True) as server:
        results = await run_conformance(server.address, input_json=SUMMARY, timeout_s=30)
    by_name = {r.name: r for r in results}
    assert set(by_name) == EXPECTED_CHECKS
    # The wait checks alone: the tests above judge the rest.
    failed = {r.name for r in results if not r.passed and r.name in WAIT_CHECKS}
    assert failed == failing, format_results(results)
    assert not by_name["status.wait_running"].skipped, format_results(results)
    out_of_range = by_name["errors.wait_out_of_range"]
    if servicer in (AgentServicer, IgnoresWait):  # conformant: everything else passes too
        assert_all_pass(results)
    if servicer is IgnoresWait:
        assert "does not implement wait" in by_name["status.wait_running"].detail
        assert out_of_range.skipped and "wait not implemented" in out_of_range.detail
    elif servicer is AgentServicer:
        assert "at sequence" in by_name["status.wait_running"].detail
        assert out_of_range.passed and not out_of_range.skipped
    elif servicer is AcceptsAnyWait:
        assert "implements wait" in out_of_range.detail, format_results(results)


class IgnoresInterrupts(AgentServicer):
    """Says it recorded an interrupt of a running session, and lets it run on."""

    async def Interrupt(self, request: pb.InterruptRequest, context: Any) -> pb.InterruptResponse:
        record = await self._record(request.session_id)
        if record.status.is_terminal:
            return pb.InterruptResponse(status=record.status.to_proto(), accepted=False)
        return pb.InterruptResponse(status=pb.SESSION_STATUS_RUNNING, accepted=True)


async def test_kit_fails_a_server_whose_interrupt_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It passed: a run that went on for many steps and completed was taken as one that
    # had reached its end before its next safe point (a step boundary).
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")  # 10 steps, a run of about 1 s
    monkeypatch.setattr(server_app, "AgentServicer", IgnoresInterrupts)
    async with await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server:
        results = await run_conformance(
            server.address, input_json='{"steps": 10, "words": 2}', timeout_s=30
        )
    by_name = {r.name: r for r in results}
    assert not by_name["interrupt.running"].passed, format_results(results)
    assert "did not stop at its next safe point" in by_name["interrupt.running"].detail


# --- capabilities: what Describe lists decides what is checked ---------------------------


class PredatesCapabilities(AgentServicer):
    """Lists no capability, as a service from before ``DescribeResponse.capabilities``."""

    CAPABILITIES = ()


class ListsContinueWithoutIt(AgentServicer):
    """Lists ``continue``, but answers Continue UNIMPLEMENTED."""

    async def Continue(self, request: pb.ContinueRequest, context: Any) -> pb.ContinueResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        raise AssertionError("unreachable")


class ListsNeitherOptionalRpc(AgentServicer):
    """Implements Continue and ListSessions, but lists neither."""

    CAPABILITIES = ("human_input", "abort")


async def test_kit_probes_a_service_that_lists_no_capability(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty list is "unknown": Continue and ListSessions are probed as before, and
    the checks of human input and abort (newer than the list) are skipped, saying why."""
    monkeypatch.setattr(server_app, "AgentServicer", PredatesCapabilities)
    async with await create_server(summarizer, MemoryStore(), allow_unauthenticated=True) as server:
        results = await run_conformance(server.address, input_json=SUMMARY, timeout_s=30)
    assert_all_pass(results)
    by_name = {r.name: r for r in results}
    assert "capabilities none listed" in by_name["describe"].detail
    assert not by_name["continue.new_turn"].skipped, format_results(results)
    assert not by_name["sessions.list"].skipped, format_results(results)
    for name in HUMAN_INPUT_CHECKS | {"abort.running"}:
        assert by_name[name].skipped, format_results(results)
        assert "it lists none" in by_name[name].detail


@pytest.mark.parametrize(
    ("servicer", "judged"),
    [
        # Listed but UNIMPLEMENTED: Describe lies, a failure.
        (ListsContinueWithoutIt, {"continue.new_turn": "FAIL"}),
        # Not listed: skipped, even though the service would answer.
        (ListsNeitherOptionalRpc, {"continue.new_turn": "SKIP", "sessions.list": "SKIP"}),
    ],
    ids=["lists-continue-without-it", "lists-neither-optional-rpc"],
)
async def test_kit_takes_describe_at_its_word(
    monkeypatch: pytest.MonkeyPatch, servicer: type[AgentServicer], judged: dict[str, str]
) -> None:
    monkeypatch.setattr(server_app, "AgentServicer", servicer)
    async with await create_server(summarizer, MemoryStore(), allow_unauthenticated=True) as server:
        results = await run_conformance(server.address, input_json=SUMMARY, timeout_s=30)
    by_name = {r.name: r for r in results}
    assert set(by_name) == EXPECTED_CHECKS
    for name, verdict in judged.items():
        result = by_name[name]
        seen = "SKIP" if result.skipped else "PASS" if result.passed else "FAIL"
        assert seen == verdict, format_results(results)
    if servicer is ListsContinueWithoutIt:
        assert "Describe lists 'continue'" in by_name["continue.new_turn"].detail
    else:
        assert "Describe does not list 'list_sessions'" in by_name["sessions.list"].detail
