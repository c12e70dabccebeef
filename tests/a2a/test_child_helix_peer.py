"""Both directions at once: a helix parent whose A2A child is a helix service's own A2A
endpoint (the mailer, behind its bearer tokens). The tool takes the mailer's schema from
its card; the mailer's request for approval, an A2A ``input-required`` with the helix
request as its data, reaches the parent's root as an approval; the root's answer goes
back as the follow-up message on the same task, and the email is sent once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helix_transport import AgentClient, ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a.child import a2a_agent_tool_from_card
from helix_transport.agent.definition import Agent
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    steps_taken,
    user_input,
)
from helix_transport.server._identity import Principal
from helix_transport.server._ownership import storage_id
from helix_transport.server.auth import AuthConfig
from helix_transport.store import MemoryStore, open_store, pages
from helix_transport.transport import ClientAuth
from tests.agents.a2a_tree import Brief, Relayed, mailer_alone

TOKEN = "parent-token-0123456789"


def _relay(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(call("email", **user_input(messages)),))
    return finish(result=[value for _, value in step_results(messages)])


async def _log(store: Any, session_id: str) -> Any:
    async for events in pages(store, session_id):
        for event in events:
            if event.WhichOneof("payload") == "text_delta":
                yield event


def _inner(event: pb.StreamEvent) -> pb.StreamEvent:
    while event.WhichOneof("payload") == "child_event":
        event = event.child_event.event
    return event


async def test_a_helix_service_over_a2a_is_a_child_that_asks(
    tmp_path: Path, monkeypatch: Any
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    monkeypatch.setenv("HELIX_MAILER_OUTBOX", str(outbox))
    (tmp_path / "tokens").write_text(f"{TOKEN} parent\n")
    store = await open_store(f"sqlite:///{tmp_path / 'mailer.db'}")
    mailer = await create_server(
        mailer_alone,
        store,
        ServerConfig(a2a_port=0),
        auth=AuthConfig(tokens_file=str(tmp_path / "tokens")),
    )
    async with mailer:
        assert mailer.a2a is not None
        tool = await a2a_agent_tool_from_card(mailer.a2a.url, name="email")
        assert set(tool.parameters or {}) >= {"properties"}
        assert "request" in (tool.parameters or {})["properties"]  # the mailer's own schema
        relay = Agent(
            name="relay",
            description="Has an A2A agent send an email.",
            input_model=Brief,
            output_model=Relayed,
            tools=[tool],
            model=register_script("a2a-child-relay", _relay),
        )
        async with (
            await create_server(
                relay,
                MemoryStore(),
                allow_unauthenticated=True,
                client_auth=ClientAuth(token=TOKEN),
            ) as parent,
            await AgentClient.connect(parent.address) as client,
        ):
            await client.start(
                json.dumps({"request": "mail ops@example.com a hello"}), session_id="root"
            )
            asked: pb.InputRequired | None = None
            async for event in client.stream("root"):
                if _inner(event).WhichOneof("payload") == "input_required":
                    asked = _inner(event).input_required
                if event.WhichOneof("payload") == "suspended":
                    break
            assert asked is not None and asked.kind == pb.INPUT_KIND_APPROVAL
            assert asked.path[0] == "root" and len(asked.path) == 2
            reply = await client.submit_input(
                "root", asked.request_id, path=list(asked.path), approved=True, reason="ok"
            )
            assert reply.applied
            events = [e async for e in client.stream("root")]
        key = storage_id(Principal(name="parent"), asked.path[1])  # the mailer's own session
        said = [e.text_delta.text async for e in _log(store, key)]
    await store.aclose()
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    (result,) = json.loads(events[-1].completed.output_json)["result"]
    assert result["sent"] is True
    assert len(outbox.read_text().splitlines()) == 1  # sent once
    child = [e.child_event.event for e in events if e.WhichOneof("payload") == "child_event"]
    assert [e.sequence for e in child] == list(range(1, len(child) + 1))
    # What the mailer said streamed as its `text` artifact: all of it once, across the
    # break of its stream at input-required and the rejoin after the answer (deltas
    # the peer's stream was behind on come joined, as one part).
    chunks = [
        json.loads(e.tool_end.result_json)["parts"]
        for e in child
        if e.WhichOneof("payload") == "tool_end" and e.tool_end.tool_call_id.startswith("text:")
    ]
    assert "".join(part for chunk in chunks for part in chunk) == "".join(said)
    answered = [e for e in child if e.WhichOneof("payload") == "input_answered"]
    assert [a.input_answered.request_id for a in answered] == [asked.request_id]
