"""The A2A endpoint of one service, in process, with the official a2a-sdk client: the
card, a streamed run with the helix sequence in every event's metadata, GetTask,
ListTasks, a contextId continuing the conversation, invalid params naming the field,
and authentication (refused before reading; a foreign task not found, as an unknown one)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from google.protobuf import json_format

from helix_transport import ServerConfig, create_server
from helix_transport.server.auth import AuthConfig
from helix_transport.store import open_store
from tests.a2a import _updates
from tests.agents.a2a_tree import mailer_alone

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}


@pytest.fixture
async def endpoint(tmp_path: Path) -> AsyncIterator[str]:
    token_file = tmp_path / "tokens"
    token_file.write_text("".join(f"{token} {name}\n" for name, token in TOKENS.items()))
    store = await open_store(f"sqlite:///{tmp_path / 'helix.db'}")
    server = await create_server(
        mailer_alone,
        store,
        ServerConfig(a2a_port=0),
        auth=AuthConfig(tokens_file=str(token_file)),
    )
    async with server:
        assert server.a2a is not None
        yield server.a2a.url
    await store.aclose()


async def _client(url: str, who: str = "alice") -> Client:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKENS[who]}"}, timeout=30)
    return await create_client(url, client_config=ClientConfig(httpx_client=http))


def _mail(request: str, **fields: Any) -> a2a.SendMessageRequest:
    """A message whose data part is the mailer's input (its schema has no single text
    field, so a bare text would be invalid params)."""
    message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER, **fields)
    message.parts.add().data.struct_value.update({"request": request})
    return a2a.SendMessageRequest(message=message)


async def test_card_names_the_agent_its_schema_and_bearer(endpoint: str) -> None:
    async with httpx.AsyncClient() as http:  # the card is public
        card = (await http.get(endpoint + "/.well-known/agent-card.json")).json()
    assert card["name"] == "mailer" and card["capabilities"]["streaming"] is True
    assert [s["id"] for s in card["skills"]] == ["mailer"]
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    (schemas,) = [e for e in card["capabilities"]["extensions"] if "schemas" in e["uri"]]
    assert "request" in schemas["params"]["mailer"]["input_schema"]["properties"]


async def test_stream_until_input_required_then_answer(endpoint: str) -> None:
    client = await _client(endpoint)
    events = [e async for e in client.send_message(_mail("mail ops@example.com a hello"))]
    assert events[0].HasField("task")
    task_id = events[0].task.id
    sequences = _updates.sequences(events)
    assert sequences == list(range(1, len(sequences) + 1))
    last = events[-1].status_update
    assert last.status.state == a2a.TASK_STATE_INPUT_REQUIRED
    asked = json_format.MessageToDict(last.status.message.parts[0].data)["input_required"]
    assert asked[0]["tool_name"] == "send_email" and len(asked[0]["path"]) == 1
    # The answer is the next message on the task; the stream goes on from there.
    answer = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER, task_id=task_id)
    answer.parts.add().data.struct_value.update({"approved": True})
    more = [e async for e in client.send_message(a2a.SendMessageRequest(message=answer))]
    after = _updates.sequences(more)
    assert after[0] == sequences[-1] + 1 and after == list(range(after[0], after[-1] + 1))
    assert more[-1].status_update.status.state == a2a.TASK_STATE_COMPLETED
    task = await client.get_task(a2a.GetTaskRequest(id=task_id))
    assert task.status.state == a2a.TASK_STATE_COMPLETED
    (output,) = task.artifacts
    assert json_format.MessageToDict(output.parts[0].data)["sent"] is True
    listed = await client.list_tasks(a2a.ListTasksRequest())
    assert task_id in [t.id for t in listed.tasks]


async def test_invalid_input_names_the_field(endpoint: str) -> None:
    client = await _client(endpoint)
    message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER)
    message.parts.add().data.struct_value.update({"to": "x"})  # body missing
    with pytest.raises(InvalidParamsError) as raised:
        async for _ in client.send_message(a2a.SendMessageRequest(message=message)):
            pass
    assert "input_json" in str(raised.value)
    text = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER)
    text.parts.add(text="hello")
    with pytest.raises(InvalidParamsError, match=r"message\.parts\.text"):
        async for _ in client.send_message(a2a.SendMessageRequest(message=text)):
            pass


async def test_foreign_and_unknown_tasks_are_alike_not_found(endpoint: str) -> None:
    alice = await _client(endpoint)
    events = [e async for e in alice.send_message(_mail("mail ops@example.com a note"))]
    task_id = events[0].task.id
    bob = await _client(endpoint, "bob")
    for client, wanted in ((bob, task_id), (alice, "no-such-task")):
        with pytest.raises(TaskNotFoundError):
            await client.get_task(a2a.GetTaskRequest(id=wanted))
        with pytest.raises(TaskNotFoundError):
            await client.cancel_task(a2a.CancelTaskRequest(id=wanted))
    assert task_id not in [t.id for t in (await bob.list_tasks(a2a.ListTasksRequest())).tasks]


async def test_unauthenticated_is_refused_before_the_body_is_read(endpoint: str) -> None:
    async with httpx.AsyncClient() as http:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
            response = await http.post(endpoint + "/", content=b"{not json", headers=headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith("Bearer")
