"""A2A's ``tenant`` field maps onto the caller's own tenant, over each binding with the
official a2a-sdk client: empty or the caller's own tenant acts as the caller (its
sessions are the ones gRPC's ``ListSessions`` lists, both ways); another tenant holds
nothing of the caller's (task reads are ``TaskNotFound`` as for another principal's
task, ``ListTasks`` is empty) and a message cannot start anything there
(``InvalidParams`` naming ``tenant``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.types import a2a_pb2 as a2a
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

from helix_transport import AgentClient, ClientAuth, ServerConfig, create_server
from helix_transport.server.auth import AuthConfig
from helix_transport.store import open_store
from tests.agents.a2a_tree import mailer_alone

TOKENS = {
    "alice": "alice-token-0123456789",  # tenant acme
    "bob": "bob-token-0123456789ab",  # tenant acme, another principal
    "carol": "carol-token-0123456789",  # tenant globex
}
TENANTS = {"alice": "acme", "bob": "acme", "carol": "globex"}
BINDINGS = (TransportProtocol.JSONRPC, TransportProtocol.HTTP_JSON, TransportProtocol.GRPC)


@dataclass
class Served:
    url: str
    """The A2A endpoint (its card lists JSON-RPC, HTTP+JSON and gRPC)."""
    address: str
    """helix's own gRPC contract."""


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    token_file = tmp_path / "tokens"
    token_file.write_text("".join(f"{TOKENS[n]} {n} {TENANTS[n]}\n" for n in TOKENS))
    store = await open_store(f"sqlite:///{tmp_path / 'helix.db'}")
    server = await create_server(
        mailer_alone,
        store,
        ServerConfig(a2a_port=0, a2a_grpc_port=0),
        auth=AuthConfig(tokens_file=str(token_file)),
    )
    async with server:
        assert server.a2a is not None
        yield Served(url=server.a2a.url, address=server.address)
    await store.aclose()


async def _client(url: str, who: str, binding: TransportProtocol) -> Client:
    token = TOKENS[who]

    def channel(target: str) -> grpc.aio.Channel:
        bearer = grpc.access_token_call_credentials(token)
        local = grpc.local_channel_credentials()
        return grpc.aio.secure_channel(target, grpc.composite_channel_credentials(local, bearer))

    config = ClientConfig(
        httpx_client=httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30),
        supported_protocol_bindings=[binding.value],
        use_client_preference=True,
        grpc_channel_factory=channel,
    )
    return await create_client(url, client_config=config)


def _mail(tenant: str = "", task_id: str = "") -> a2a.SendMessageRequest:
    message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER, task_id=task_id)
    if task_id:
        message.parts.add().data.struct_value.update({"approved": True})
    else:
        message.parts.add().data.struct_value.update({"request": "mail ops@example.com a hi"})
    return a2a.SendMessageRequest(message=message, tenant=tenant)


async def _send(client: Client, request: a2a.SendMessageRequest) -> str:
    """The task the message started (its stream read to input-required)."""
    events = [e async for e in client.send_message(request)]
    assert events[-1].status_update.status.state == a2a.TASK_STATE_INPUT_REQUIRED
    return events[0].task.id


async def _grpc_listed(address: str, who: str) -> list[str]:
    auth = ClientAuth(token=TOKENS[who])
    async with await AgentClient.connect(address, auth=auth) as client:
        return [s.session_id async for s in client.iter_sessions()]


@pytest.mark.parametrize("binding", BINDINGS, ids=lambda b: b.value)
async def test_the_callers_tenant_is_the_grpc_callers_both_ways(
    served: Served, binding: TransportProtocol
) -> None:
    alice = await _client(served.url, "alice", binding)
    named = await _send(alice, _mail(tenant="acme"))
    unnamed = await _send(alice, _mail())  # empty: the caller's own tenant
    # Started over A2A, listed by gRPC's ListSessions for the same principal only.
    assert {named, unnamed} <= set(await _grpc_listed(served.address, "alice"))
    for other in ("bob", "carol"):
        assert not {named, unnamed} & set(await _grpc_listed(served.address, other))
    # Started over gRPC, an A2A task of the same principal, with or without the tenant.
    auth = ClientAuth(token=TOKENS["alice"])
    async with await AgentClient.connect(served.address, auth=auth) as grpc_alice:
        await grpc_alice.start(
            json.dumps({"request": "mail ops@example.com a note"}), session_id="g-1"
        )
    for tenant in ("acme", ""):
        listed = await alice.list_tasks(a2a.ListTasksRequest(tenant=tenant))
        assert {"g-1", named, unnamed} <= {t.id for t in listed.tasks}, tenant
        task = await alice.get_task(a2a.GetTaskRequest(id="g-1", tenant=tenant))
        assert task.id == "g-1"
    await alice.close()


@pytest.mark.parametrize("binding", BINDINGS, ids=lambda b: b.value)
async def test_another_tenant_holds_nothing_of_the_callers(
    served: Served, binding: TransportProtocol
) -> None:
    alice = await _client(served.url, "alice", binding)
    task = await _send(alice, _mail(tenant="acme"))
    before = await _grpc_listed(served.address, "alice")
    # Alice naming globex: her own task is not found there, as carol's reading of it.
    carol = await _client(served.url, "carol", binding)
    for client, tenant in ((alice, "globex"), (carol, "globex"), (carol, "")):
        with pytest.raises(TaskNotFoundError):
            await client.get_task(a2a.GetTaskRequest(id=task, tenant=tenant))
        with pytest.raises(TaskNotFoundError):
            await client.cancel_task(a2a.CancelTaskRequest(id=task, tenant=tenant))
        with pytest.raises(TaskNotFoundError):
            async for _ in client.subscribe(a2a.SubscribeToTaskRequest(id=task, tenant=tenant)):
                pass
        with pytest.raises(TaskNotFoundError):  # an answer on the task
            async for _ in client.send_message(_mail(tenant=tenant, task_id=task)):
                pass
        listed = await client.list_tasks(a2a.ListTasksRequest(tenant=tenant))
        assert task not in {t.id for t in listed.tasks}
    listed = await alice.list_tasks(a2a.ListTasksRequest(tenant="globex"))
    assert list(listed.tasks) == []
    # A message cannot start (or continue) anything in another tenant.
    continuing = _mail(tenant="globex")
    continuing.message.context_id = task  # her conversation, named in another tenant
    for request in (_mail(tenant="globex"), _mail(tenant="acme-2"), continuing):
        with pytest.raises(InvalidParamsError, match="tenant"):
            async for _ in alice.send_message(request):
                pass
    assert await _grpc_listed(served.address, "alice") == before
    assert await _grpc_listed(served.address, "carol") == []
    # Her own tenant still reads the task, waiting for her answer.
    got = await alice.get_task(a2a.GetTaskRequest(id=task, tenant="acme"))
    assert got.status.state == a2a.TASK_STATE_INPUT_REQUIRED
    await alice.close()
    await carol.close()
