"""The official a2a-sdk client against a helix service's A2A endpoint, three real
service processes deep (``tests.agents.a2a_tree``: a2a-top -> a2a-mid -> the mailer
service), each with its own SQLite store:

- the delegation streams with every level's events, the helix sequence gapless;
- the mailer's request for approval, three levels down, is the root task's
  input-required; the answer, sent as the next message on the task, reaches it
  (the email goes out once) and the task completes;
- SIGKILL of the root service mid-stream, a restart, and a resubscription: nothing
  missing, nothing different from what was seen before the kill;
- CancelTask stops the whole tree.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.types import a2a_pb2 as a2a
from google.protobuf import json_format

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.a2a import _updates
from tests.a2a.mesh import Mesh, a2a_mesh

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 60.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    async with a2a_mesh(tmp_path_factory.mktemp("a2a-mesh")) as started:
        yield started


async def _client(url: str) -> Client:
    return await create_client(
        url, client_config=ClientConfig(httpx_client=httpx.AsyncClient(timeout=TIMEOUT_S))
    )


def _ask(text: str) -> a2a.SendMessageRequest:
    message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER)
    message.parts.add(text=text)  # Brief has one required text field: a bare text fills it
    return a2a.SendMessageRequest(message=message)


def _approve(task_id: str) -> a2a.SendMessageRequest:
    message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER, task_id=task_id)
    message.parts.add().data.struct_value.update({"approved": True, "reason": "fine"})
    return a2a.SendMessageRequest(message=message)


def helix(event: a2a.StreamResponse) -> dict[str, Any] | None:
    """The ``helix`` metadata of a status or artifact update (None for the task)."""
    for field in ("status_update", "artifact_update"):
        if event.HasField(field):
            metadata = json_format.MessageToDict(getattr(event, field).metadata)
            found: dict[str, Any] = metadata["helix"]
            return found
    return None


def state(event: a2a.StreamResponse) -> int:
    return event.status_update.status.state


async def _until_input_required(client: Client, request: Any) -> list[a2a.StreamResponse]:
    async with asyncio.timeout(TIMEOUT_S):
        return [e async for e in client.send_message(request)]


async def test_three_levels_stream_and_the_mailer_asks_three_levels_down(mesh: Mesh) -> None:
    client = await _client(mesh.url)
    events = await _until_input_required(client, _ask("mail ops@example.com the weekly report"))
    task_id = events[0].task.id
    seen = _updates.sequences(events)
    assert seen == list(range(1, len(seen) + 1))  # every event, in order, once
    depths = {len(h["path"]) for e in events if (h := helix(e)) is not None}
    assert depths == {1, 2, 3}  # the root's own, the middle's and the mailer's
    assert state(events[-1]) == a2a.TASK_STATE_INPUT_REQUIRED
    data = json_format.MessageToDict(events[-1].status_update.status.message.parts[0].data)
    (asked,) = data["input_required"]
    assert asked["tool_name"] == "send_email" and len(asked["path"]) == 3
    assert (await client.get_task(a2a.GetTaskRequest(id=task_id))).status.state == (
        a2a.TASK_STATE_INPUT_REQUIRED
    )
    assert mesh.sent() == []
    more = await _until_input_required(client, _approve(task_id))
    after = _updates.sequences(more)
    assert after == list(range(seen[-1] + 1, seen[-1] + 1 + len(after)))
    assert state(more[-1]) == a2a.TASK_STATE_COMPLETED
    task = await client.get_task(a2a.GetTaskRequest(id=task_id))
    assert task.status.state == a2a.TASK_STATE_COMPLETED
    output = json_format.MessageToDict(task.artifacts[0].parts[0].data)
    assert output["result"][0]["result"][0]["sent"] is True
    assert len(mesh.sent()) == 1


async def test_sigkill_mid_stream_then_resubscribe_misses_nothing(mesh: Mesh) -> None:
    client = await _client(mesh.url)
    before: list[a2a.StreamResponse] = []
    with pytest.raises(Exception):  # noqa: B017  (the connection dies with the process)
        async with asyncio.timeout(TIMEOUT_S):
            async for event in client.send_message(_ask("mail ops@example.com the minutes")):
                before.append(event)
                if len(before) == 15:
                    await mesh.top.kill()
    task_id = before[0].task.id
    await mesh.top.start()
    client = await _client(mesh.url)
    async with asyncio.timeout(TIMEOUT_S):
        after = [e async for e in client.subscribe(a2a.SubscribeToTaskRequest(id=task_id))]
    assert after[0].HasField("task")
    replayed = _updates.sequences(after)
    assert replayed == list(range(1, len(replayed) + 1))
    assert set(_updates.sequences(before)) <= set(replayed)  # nothing seen is missing
    # And the replay is what was seen, not a second run: the same text (its chunks
    # may be joined otherwise: a replay has all of it at once), the same other updates.
    assert _updates.text(after).startswith(_updates.text(before))
    by_sequence = {int(h["sequence"]): e for e in after if (h := helix(e)) is not None}
    for event in before[1:]:
        h = helix(event)
        assert h is not None and (
            _updates.is_text(event) or by_sequence[int(h["sequence"])] == event
        )
    assert state(after[-1]) == a2a.TASK_STATE_INPUT_REQUIRED
    done = await _until_input_required(client, _approve(task_id))
    assert state(done[-1]) == a2a.TASK_STATE_COMPLETED


async def test_cancel_stops_the_whole_tree(mesh: Mesh) -> None:
    client = await _client(mesh.url)
    events = await _until_input_required(client, _ask("mail ops@example.com nothing"))
    task_id = events[0].task.id
    (asked,) = json_format.MessageToDict(events[-1].status_update.status.message.parts[0].data)[
        "input_required"
    ]
    _, mid_id, mailer_id = asked["path"]
    canceled = await client.cancel_task(a2a.CancelTaskRequest(id=task_id))
    assert canceled.status.state == a2a.TASK_STATE_CANCELED
    for name, session_id in (("a2a-mid", mid_id), ("mailer", mailer_id)):
        async with await AgentClient.connect(mesh.addresses[name]) as helix_client:
            status = await helix_client.get_status(session_id, wait=timedelta(seconds=10))
            assert status.status == pb.SESSION_STATUS_INTERRUPTED, (name, status)
