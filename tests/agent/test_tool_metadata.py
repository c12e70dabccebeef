"""A tool's ``ctx.metadata`` is the caller's metadata, nothing of the library's.

The library's entries (root session id, session and delegation paths, trace mode and
context) are stored with the session as they always were, and reach the library's own
tools typed, as ``ctx.run.lineage``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from helix_transport import AgentClient, create_server
from helix_transport._metadata import LIBRARY_KEYS, SessionLineage
from helix_transport.agent.definition import Agent
from helix_transport.agent.scripted import ScriptedTurn, finish, register_script
from helix_transport.agent.scripted import call as scripted_call
from helix_transport.agent.tools import ToolContext, tool
from helix_transport.store.memory import MemoryStore

_SEEN: dict[str, Any] = {}


class _Nothing(BaseModel):
    pass


class _Done(BaseModel):
    ok: bool


@tool
async def peek(ctx: ToolContext, args: _Nothing) -> bool:
    """Notes what the tool sees."""
    _SEEN["metadata"] = dict(ctx.metadata)
    _SEEN["lineage"] = ctx.run.lineage
    _SEEN["delegation_path"] = ctx.delegation_path
    return True


def _peeks_then_finishes(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if not any(m.get("role") == "tool" for m in messages):
        return ScriptedTurn(tool_calls=(scripted_call("peek"),))
    return finish(ok=True)


peeker = Agent(
    name="peeker",
    description="Peeks at its context.",
    input_model=_Nothing,
    output_model=_Done,
    tools=[peek],
    model=register_script("tool-metadata-peeker", _peeks_then_finishes),
)


async def test_a_tool_sees_the_callers_metadata_and_the_library_its_lineage() -> None:
    traceparent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    sent = {
        "team": "a",
        "helix.mine": "a caller's own key in the library's namespace",
        "helix.root_session_id": "root",
        "helix.session_path": json.dumps(["root", "mid"]),
        "helix.trace": "parent",
        "traceparent": traceparent,
    }
    store = MemoryStore()
    async with (
        await create_server(peeker, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start(
            "{}",
            session_id="s",
            parent_session_id="mid",
            metadata=sent,
            delegation_path=("ping", "pong"),
        )
        status = await client.wait("s")
    assert json.loads(status.output_json) == {"ok": True}
    assert _SEEN["metadata"] == {"team": "a", "helix.mine": sent["helix.mine"]}
    assert not LIBRARY_KEYS & _SEEN["metadata"].keys()
    assert _SEEN["lineage"] == SessionLineage(
        root_session_id="root",
        session_path=("root", "mid"),
        delegation_path=("ping", "pong"),
        trace_mode="parent",
        trace_context={"traceparent": traceparent},
    )
    assert _SEEN["delegation_path"] == ("ping", "pong")
    # Stored as before: the wire's keys, the delegation path among them.
    record = await store.get_session("s")
    assert record is not None
    assert {**sent, "helix.delegation_path": json.dumps(["ping", "pong"])} == record.metadata
