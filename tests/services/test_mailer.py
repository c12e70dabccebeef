"""The mailer (``services/mailer``) and the orchestrator's email step: its script, its
input, and a real approval or denial over gRPC (the mailer served in-process, its
outbox a file): approved, the email is in the outbox once; denied, nothing is sent and
the mailer says why."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from helix_transport import AgentClient, AgentServer, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import MemoryStore
from services.mailer import agent as mailer
from services.mailer.agent import OUTBOX_ENV, MailRequest, email_of
from services.mailer.agent import script as mailer_script
from services.orchestrator.agent import script as orchestrator_script
from tests.services.test_agents import conversation, finished_with


def test_a_request_in_words_becomes_an_email_to_the_address_it_names() -> None:
    email = email_of(MailRequest(request="Tell ana@example.com the build is green."))
    assert email.to == "ana@example.com" and email.body.startswith("Tell ana@")
    assert email.subject


def test_the_input_is_an_email_or_a_request() -> None:
    with pytest.raises(ValidationError, match="give to and body"):
        MailRequest.model_validate({"subject": "hi"})
    assert MailRequest.model_validate({"to": "a@b.c", "body": "x"}).to == "a@b.c"


def test_the_script_sends_then_says_whether_it_went() -> None:
    email = {"to": "a@example.com", "subject": "s", "body": "b"}
    (send,) = mailer_script(conversation(email)).tool_calls
    assert (send.name, send.arguments) == ("send_email", email)
    sent = conversation(email, [("send_email", {"sent": True, "message_id": "<m1>"})])
    assert finished_with(mailer_script(sent)) == {
        "sent": True,
        "message_id": "<m1>",
        "detail": "sent to a@example.com",
    }
    denied = conversation(email, [("send_email", {"error": "denied: not today"})])
    output = finished_with(mailer_script(denied))
    assert output["sent"] is False and "not today" in output["detail"]


def test_the_orchestrator_emails_its_answer_only_when_asked() -> None:
    asked = {"question": "Why?", "email_to": "team@example.com"}
    steps: list[list[tuple[str, Any]]] = [
        [("plan", {"sub_questions": ["Why?"]})],
        [("research", {"findings": ["Because."]})],
        [("summarize", {"summary": "Because."})],
    ]
    (email,) = orchestrator_script(conversation(asked, *steps)).tool_calls
    assert email.name == "email"
    assert email.arguments == {"to": "team@example.com", "subject": "Why?", "body": "Because."}
    mailed = [("email", {"sent": True, "message_id": "<m>", "detail": "sent to team@example.com"})]
    output = finished_with(orchestrator_script(conversation(asked, *steps, mailed)))
    assert output == {
        "answer": "Because.",
        "findings": ["Because."],
        "email": "sent to team@example.com",
    }
    unasked = orchestrator_script(conversation({"question": "Why?"}, *steps))
    assert "email" not in finished_with(unasked)


@pytest.fixture
async def serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AgentClient, Path]]:
    outbox = tmp_path / "outbox.jsonl"
    monkeypatch.setenv(OUTBOX_ENV, str(outbox))
    server: AgentServer = await create_server(mailer, MemoryStore(), allow_unauthenticated=True)
    async with server, await AgentClient.connect(server.address) as client:
        yield client, outbox


async def _request(client: AgentClient, session_id: str) -> pb.InputRequired:
    """The session's request for input, once it has suspended on it."""
    asked: list[pb.InputRequired] = []
    async with asyncio.timeout(30):
        async for event in client.stream(session_id):
            if event.WhichOneof("payload") == "input_required":
                asked.append(event.input_required)
            if event.WhichOneof("payload") == "suspended":
                break
    (request,) = asked
    return request


@pytest.mark.parametrize("approved", [True, False])
async def test_send_email_waits_for_a_person(
    serving: tuple[AgentClient, Path], approved: bool
) -> None:
    client, outbox = serving
    email = {"to": "ana@example.com", "subject": "Hello", "body": "The build is green."}
    await client.start(json.dumps(email), session_id="m1")
    request = await _request(client, "m1")
    assert request.tool_name == "send_email" and request.kind == pb.INPUT_KIND_APPROVAL
    assert json.loads(request.arguments_json) == email and list(request.path) == ["m1"]
    assert not outbox.exists()  # nothing goes out before the answer

    await client.submit_input(
        "m1", request.request_id, path=request.path, approved=approved, reason="checked"
    )
    status = await client.get_status("m1", wait=timedelta(seconds=30))
    assert status.status == pb.SESSION_STATUS_COMPLETED, status.error
    output = json.loads(status.output_json)
    if approved:
        (line,) = outbox.read_text().splitlines()
        sent = json.loads(line)
        assert {k: sent[k] for k in email} == email and sent["session_id"] == "m1"
        assert output == {
            "sent": True,
            "message_id": sent["message_id"],
            "detail": "sent to ana@example.com",
        }
    else:
        assert not outbox.exists()
        assert output["sent"] is False and "checked" in output["detail"]
