"""The outbox's interrupts get a CLIENT span in their parent session's trace.

The outbox delivers a parent's commands from a loop that runs outside any span (and
possibly in a process that never ran the parent): each call names the parent it is
made for, and the service's CLIENT span goes where that parent's runs' spans go: a
root's own trace, a child's delegation span, a joined root's caller. The child's
SERVER span nests under it. Two services in this process, each traced in memory.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from helix_transport import AgentClient, create_server
from helix_transport._metadata import ROOT_SESSION_KEY, TRACE_MODE_KEY
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.delegation.cascade import Cascade
from helix_transport.store import ChildCommand, MemoryStore, SessionRecord
from helix_transport.tracing.ids import trace_id_for
from helix_transport.transport import ClientPool
from tests.agents.approvals import mailer
from tests.tracing.test_tracing import MemoryTracing

INTERRUPT = "helix.agent.v1.AgentService/Interrupt"
TREE_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
DELEGATION_SPAN = 0xB7AD6B7169203331
CALLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7


def _traceparent(trace_id: int, span_id: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def _parents() -> list[SessionRecord]:
    """A root, a child (its delegation span in its metadata), a joined root."""
    common: dict[str, Any] = {"agent_type": "parent", "input_json": "{}", "input_hash": "h"}
    return [
        SessionRecord(session_id="root", **common),
        SessionRecord(
            session_id="middle",
            parent_session_id="top",
            metadata={
                ROOT_SESSION_KEY: "top",
                "traceparent": _traceparent(TREE_TRACE, DELEGATION_SPAN),
            },
            **common,
        ),
        SessionRecord(
            session_id="joined",
            metadata={
                TRACE_MODE_KEY: "parent",
                "traceparent": _traceparent(CALLER_TRACE, CALLER_SPAN),
            },
            **common,
        ),
    ]


@pytest.mark.parametrize(
    ("parent", "trace_id", "parent_span"),
    [
        ("root", trace_id_for("root"), None),
        ("middle", TREE_TRACE, DELEGATION_SPAN),
        ("joined", CALLER_TRACE, CALLER_SPAN),
        ("gone", None, None),  # no record, no trace to join: no span
    ],
    ids=["root", "child", "joined root", "gone"],
)
async def test_an_outbox_interrupt_is_a_client_span_in_its_parent_s_trace(
    parent: str, trace_id: int | None, parent_span: int | None
) -> None:
    parents, children = MemoryTracing("parent"), MemoryTracing(mailer.name)
    store = MemoryStore()
    for record in _parents():
        await store.create_session(record)
    server = await create_server(
        mailer, MemoryStore(), tracing=children.tracing, allow_unauthenticated=True
    )
    pool = ClientPool(interceptors=parents.tracing.client_interceptors())
    try:
        async with server, await AgentClient.connect(server.address) as client:
            await client.start(json.dumps({"to": "ops@example.com"}), session_id="child")
            command = ChildCommand(
                parent_session_id=parent, child_session_id="child", address=server.address
            )
            await store.put_commands([command])
            await Cascade(store, pool).deliver([command])  # outside any span
            assert await store.list_commands() == []  # taken
            assert (await client.wait("child")).status == pb.SESSION_STATUS_INTERRUPTED
    finally:
        await pool.aclose()
        parents.close()
        children.close()

    (served,) = [s for s in children.spans() if s.name == INTERRUPT]
    calls = [s for s in parents.spans() if s.name == INTERRUPT]
    if trace_id is None:
        assert calls == []
        return
    (call,) = calls
    assert call.kind.name == "CLIENT"
    assert call.attributes["helix.session_id"] == parent
    assert call.context.trace_id == trace_id
    if parent_span is None:
        assert call.parent is None  # a root of the session's trace, as its runs are
    else:
        assert call.parent is not None and call.parent.span_id == parent_span
    assert served.context.trace_id == trace_id
    assert served.parent is not None and served.parent.span_id == call.context.span_id
