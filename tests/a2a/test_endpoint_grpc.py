"""A2A's gRPC binding (a2a-sdk's ``GrpcHandler``) beside the HTTP ones: the card lists it,
and the SDK's gRPC client transport streams, answers input-required, resubscribes and
gets a task through it; an unauthenticated call is refused."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.types import a2a_pb2 as a2a
from a2a.types import a2a_pb2_grpc
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import TaskNotFoundError

from helix_transport import ServerConfig, create_server
from helix_transport.server.auth import AuthConfig
from helix_transport.store import open_store
from tests.a2a import _updates
from tests.agents.a2a_tree import mailer_alone

TOKEN = "grpc-token-0123456789abcdef"


@pytest.fixture
async def endpoint(tmp_path: Path) -> AsyncIterator[str]:
    (tmp_path / "tokens").write_text(f"{TOKEN} alice\n")
    store = await open_store(f"sqlite:///{tmp_path / 'helix.db'}")
    server = await create_server(
        mailer_alone,
        store,
        ServerConfig(a2a_port=0, a2a_grpc_port=0),
        auth=AuthConfig(tokens_file=str(tmp_path / "tokens")),
    )
    async with server:
        assert server.a2a is not None
        yield server.a2a.url
    await store.aclose()


def _channel(target: str) -> grpc.aio.Channel:
    bearer = grpc.access_token_call_credentials(TOKEN)
    credentials = grpc.composite_channel_credentials(grpc.local_channel_credentials(), bearer)
    return grpc.aio.secure_channel(target, credentials)


async def _grpc_client(url: str) -> Client:
    config = ClientConfig(
        supported_protocol_bindings=[TransportProtocol.GRPC.value],
        use_client_preference=True,
        grpc_channel_factory=_channel,
    )
    return await create_client(url, client_config=config)


async def test_the_card_lists_grpc_and_the_sdk_client_uses_it(endpoint: str) -> None:
    async with httpx.AsyncClient() as http:
        card = (await http.get(endpoint + "/.well-known/agent-card.json")).json()
    bindings = {i["protocolBinding"]: i["url"] for i in card["supportedInterfaces"]}
    assert set(bindings) == {"JSONRPC", "HTTP+JSON", "GRPC"}
    client = await _grpc_client(endpoint)
    message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER)
    message.parts.add().data.struct_value.update({"request": "mail ops@example.com a hi"})
    events = [e async for e in client.send_message(a2a.SendMessageRequest(message=message))]
    task_id = events[0].task.id
    sequences = _updates.sequences(events)
    assert sequences == list(range(1, len(sequences) + 1))
    assert events[-1].status_update.status.state == a2a.TASK_STATE_INPUT_REQUIRED
    answer = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER, task_id=task_id)
    answer.parts.add().data.struct_value.update({"approved": True})
    more = [e async for e in client.send_message(a2a.SendMessageRequest(message=answer))]
    assert more[-1].status_update.status.state == a2a.TASK_STATE_COMPLETED
    assert _updates.sequences(more)[0] == sequences[-1] + 1
    replay = [e async for e in client.subscribe(a2a.SubscribeToTaskRequest(id=task_id))]
    assert _updates.sequences(replay)[-1] == _updates.sequences(more)[-1]
    task = await client.get_task(a2a.GetTaskRequest(id=task_id))
    assert task.status.state == a2a.TASK_STATE_COMPLETED
    with pytest.raises(TaskNotFoundError):
        await client.get_task(a2a.GetTaskRequest(id="no-such-task"))
    await client.close()


async def test_unauthenticated_grpc_is_refused(endpoint: str) -> None:
    async with httpx.AsyncClient() as http:
        card = (await http.get(endpoint + "/.well-known/agent-card.json")).json()
    (target,) = [i["url"] for i in card["supportedInterfaces"] if i["protocolBinding"] == "GRPC"]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.GetTask(a2a.GetTaskRequest(id="anything"))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stream = stub.SubscribeToTask(a2a.SubscribeToTaskRequest(id="anything"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stream.read()
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
