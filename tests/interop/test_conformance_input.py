"""The conformance kit's checks of input from people and abort, against our Python
service with an approval tool, and against servers broken in each way they judge.

The approving agent (``tests.agents.kit_approvals``) ticks ``ticks`` steps and then, when
asked to, calls ``send``, which waits for a person's approval: the kit's ``--input``
finishes without asking, its ``--input-required`` asks once.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from helix_transport import Agent, create_server
from helix_transport._events import SessionStatus
from helix_transport._exceptions import SessionNotFound
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from helix_transport.server import app as server_app
from helix_transport.server._servicer import AgentServicer
from helix_transport.store import MemoryStore
from helix_transport.testing.conformance import CheckResult, format_results, run_conformance, timing
from tests.agents.kit_approvals import approving, relaying, unasking
from tests.helpers import ROOT, stream_response
from tests.interop.test_conformance import EXPECTED_CHECKS, assert_all_pass

PLAIN = json.dumps({"to": "ops@example.com", "ask": False, "ticks": 3})
ASKING = json.dumps({"to": "ops@example.com"})
NEW_CHECKS = {
    "input.errors",
    "input.suspended",
    "input.answered",
    "abort.running",
    "abort.suspended",
}


async def _run(agent: Agent, *, input_required: str | None = ASKING) -> list[CheckResult]:
    async with await create_server(agent, MemoryStore(), allow_unauthenticated=True) as server:
        return await run_conformance(
            server.address, input_json=PLAIN, input_required_json=input_required, timeout_s=30
        )


@pytest.fixture(autouse=True)
def slow_scripted_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs long enough (a few steps of 3 ms chunks) for an abort to find them running."""
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "3")


def _judge_all_passed(results: list[CheckResult]) -> dict[str, CheckResult]:
    assert_all_pass(results)
    by_name = {r.name: r for r in results}
    for name in NEW_CHECKS:
        assert by_name[name].passed and not by_name[name].skipped, format_results(results)
    assert "send asked for approval" in by_name["input.suspended"].detail
    assert "ended completed" in by_name["input.answered"].detail
    return by_name


async def test_python_service_passes_the_human_input_checks() -> None:
    by_name = _judge_all_passed(await _run(approving))
    assert "path ['conformance-" in by_name["input.suspended"].detail


async def test_a_request_from_a_remote_child_passes_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request comes up wrapped in a ``child_event`` with a path of two sessions; the
    answer goes to the root, which passes it down."""
    async with await create_server(approving, MemoryStore(), allow_unauthenticated=True) as child:
        monkeypatch.setenv(address_env_var("approving"), child.address)
        by_name = _judge_all_passed(await _run(relaying))
    path = re.search(r"path (\[.*?\])", by_name["input.suspended"].detail)
    assert path is not None and path.group(1).count("conformance-") == 2, by_name


async def test_without_input_required_the_suspension_is_skipped() -> None:
    results = await _run(approving, input_required=None)
    assert_all_pass(results)
    by_name = {r.name: r for r in results}
    assert by_name["input.errors"].passed and not by_name["input.errors"].skipped
    for name in ("input.suspended", "input.answered", "abort.suspended"):
        assert by_name[name].skipped, format_results(results)
        assert "no --input-required given" in by_name[name].detail


# --- the kit can fail ------------------------------------------------------------------


class EndsStreamsWhenSuspended(AgentServicer):
    """Takes SUSPENDED for an end: a stream stops at the session's ``suspended`` event."""

    async def Stream(self, request: pb.StreamRequest, context: Any) -> AsyncIterator[Any]:
        record = await self._record(request.session_id)
        caught_up = request.from_sequence >= record.last_sequence
        if record.status is SessionStatus.SUSPENDED and caught_up:
            return
        async for response in super().Stream(request, context):
            yield response
            events = stream_response(response).events
            if any(e.WhichOneof("payload") == "suspended" for e in events):
                return


class HidesTheSuspension(AgentServicer):
    """Reports a SUSPENDED session as RUNNING."""

    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        response = await super().GetStatus(request, context)
        if response.status == pb.SESSION_STATUS_SUSPENDED:
            response.status = pb.SESSION_STATUS_RUNNING
        return response


class AlwaysApplied(AgentServicer):
    """Says every SubmitInput recorded its answer, a repeat too."""

    async def SubmitInput(
        self, request: pb.SubmitInputRequest, context: Any
    ) -> pb.SubmitInputResponse:
        response = await super().SubmitInput(request, context)
        response.applied = True
        return response


class ShrugsAtUnknownRequests(AgentServicer):
    """Answers a request it does not know with applied=false instead of NOT_FOUND."""

    async def SubmitInput(
        self, request: pb.SubmitInputRequest, context: Any
    ) -> pb.SubmitInputResponse:
        try:
            return await super().SubmitInput(request, context)
        except SessionNotFound:
            return pb.SubmitInputResponse(status=pb.SESSION_STATUS_COMPLETED, applied=False)


class AbortIsAnInterrupt(AgentServicer):
    """Lists ``abort``, but takes it for a plain interrupt."""

    async def Interrupt(self, request: pb.InterruptRequest, context: Any) -> pb.InterruptResponse:
        request.abort = False
        return await super().Interrupt(request, context)


@pytest.mark.parametrize(
    ("servicer", "failing"),
    [
        (EndsStreamsWhenSuspended, {"input.suspended", "input.answered"}),
        (HidesTheSuspension, {"input.suspended", "input.answered"}),
        (AlwaysApplied, {"input.answered"}),
        (ShrugsAtUnknownRequests, {"input.errors"}),
        (AbortIsAnInterrupt, {"abort.running", "abort.suspended"}),
    ],
    ids=[
        "ends-streams-when-suspended",
        "hides-the-suspension",
        "always-applied",
        "shrugs-at-unknown-requests",
        "abort-is-an-interrupt",
    ],
)
async def test_kit_fails_a_broken_server(
    monkeypatch: pytest.MonkeyPatch, servicer: type[AgentServicer], failing: set[str]
) -> None:
    monkeypatch.setattr(server_app, "AgentServicer", servicer)
    monkeypatch.setattr(timing, "END_GRACE_S", 1.0)
    monkeypatch.setattr(timing, "SUSPENDED_OPEN_S", 1.0)
    results = await _run(approving)
    by_name = {r.name: r for r in results}
    assert set(by_name) == EXPECTED_CHECKS  # the table is always complete
    # Judged: the checks of the area it breaks (input or abort); a server that ends
    # streams at a suspension may, by a race, break abort.suspended too.
    area = {name for name in NEW_CHECKS if name.split(".")[0] == next(iter(failing)).split(".")[0]}
    failed = {r.name for r in results if not r.passed and r.name in area}
    assert failed == failing, format_results(results)


async def test_kit_fails_a_service_that_never_suspends() -> None:
    """Its ``send`` runs without asking: the session the kit expects to suspend completes."""
    results = await _run(unasking)
    by_name = {r.name: r for r in results}
    failed = {r.name for r in results if not r.passed and r.name != "abort.running"}
    assert failed == {"input.suspended", "input.answered", "abort.suspended"}, format_results(
        results
    )
    assert "never suspended" in by_name["input.suspended"].detail
    assert "ended cleanly" in by_name["input.suspended"].detail


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "helix_transport.cli", "conformance", *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_takes_input_required() -> None:
    async with await create_server(approving, MemoryStore(), allow_unauthenticated=True) as server:
        code, out, err = await _cli(server.address, "--input", PLAIN, "--input-required", ASKING)
        assert code == 0, out + err
        assert "PASS  input.suspended" in out and "PASS  input.answered" in out
        code, out, err = await _cli(server.address, "--input", PLAIN, "--input-required", "{no")
    assert code == 2 and err.startswith("helix-mesh: --input-required: "), err
