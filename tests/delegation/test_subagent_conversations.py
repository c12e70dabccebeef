"""``run_subagent``'s conversations, virtual tasks and inherited context across real
service processes (``tests.agents.subagents``), one SQLite file each.

- A conversation continued by its key three times keeps its memory, with the child's
  service SIGKILLed (and started again on its store) before every continuation.
- A key from another parent session is refused, with the reason, and nothing starts.
- A task naming no agent runs a delegator like its parent, on the parent's service, with
  the parent's ``lookup`` tool and without ``run_subagent``.
- ``inherit``: the child's first model call is shown the parent's conversation; its
  stored history (checkpoint, ``run_started``) and its later turns do not hold it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from helix_transport import AgentClient
from helix_transport._metadata import INHERITED_CONTEXT_KEY
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.delegation.conversation_keys import ConversationKey
from helix_transport.registry import address_env_var
from helix_transport.store import open_store
from tests.helpers import ROOT, ServiceProcess, free_port


def _service(name: str, port: int, workdir: Path, env: dict[str, str]) -> ServiceProcess:
    return ServiceProcess(
        f"tests.agents.subagents:{name}",
        port=port,
        store_url=f"sqlite:///{workdir / (name + '.db')}",
        log_path=workdir / f"{name}.log",
        env=env,
        extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5", "--heartbeat-interval", "0.2"],
        cwd=ROOT,
    )


@asynccontextmanager
async def mesh(workdir: Path) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess]]:
    notes_port, parent_port = free_port(), free_port()
    registry = {
        address_env_var("notetaker"): f"127.0.0.1:{notes_port}",
        # A virtual task runs on the parent's own service, found like any other.
        address_env_var("delegator"): f"127.0.0.1:{parent_port}",
    }
    notes = _service("notetaker", notes_port, workdir, registry)
    parent = _service("delegator", parent_port, workdir, registry)
    await asyncio.gather(notes.start(), parent.start())
    try:
        yield notes, parent
    finally:
        await asyncio.gather(parent.stop(), notes.stop())


def kinds(events: list[pb.StreamEvent]) -> list[str]:
    return [e.WhichOneof("payload") or "" for e in events]


async def turn(client: AgentClient, session_id: str, n: int, message: str) -> list[Any]:
    """Run the delegator's turn ``n`` (``Start`` for 1, ``Continue`` after) to its end;
    the results it answered with."""
    if n == 1:
        await client.start(json.dumps({"goal": message}), session_id=session_id)
        since = 0
    else:
        reply = await client.continue_session(session_id, message, turn=n)
        since = reply.from_sequence
    events = [e async for e in client.stream(session_id, from_sequence=since)]
    assert kinds(events)[-1] == "completed", events[-3:]
    results: list[Any] = json.loads(events[-1].completed.output_json)["results"]
    return results


async def test_a_conversation_continued_by_key_keeps_its_memory_across_child_crashes(
    tmp_path: Path,
) -> None:
    async with mesh(tmp_path) as (notes, parent):
        async with await AgentClient.connect(parent.address) as client:
            [first] = await turn(client, "root", 1, "new apple")
            key = first["conversation_key"]
            rounds = [first]
            for n, note in [(2, "banana"), (3, "cherry"), (4, "date")]:
                await notes.kill()  # between the calls: its store keeps the conversation
                await notes.start()
                [result] = await turn(client, "root", n, f"again {note}")
                rounds.append(result)
            # Another parent session of the same agent type and owner cannot use the key.
            await turn(client, "other", 1, "new fig")
            [refused] = await turn(client, "other", 2, f"key {key} grape")
        child = ConversationKey.decode(key)
        assert child is not None
        async with await AgentClient.connect(notes.address) as client:
            child_log: list[pb.StreamEvent] = []
            for _ in rounds:  # a stream ends at a turn's terminal event
                since = child_log[-1].sequence if child_log else 0
                child_log += [
                    e async for e in client.stream(child.child_session_id, from_sequence=since)
                ]
            status = await client.get_status(child.child_session_id)

    assert [r["status"] for r in rounds] == ["completed"] * 4
    assert {r["conversation_key"] for r in rounds} == {key}  # one conversation throughout
    assert [r["output"]["notes"] for r in rounds] == [
        ["apple"],
        ["apple", "banana"],
        ["apple", "banana", "cherry"],
        ["apple", "banana", "cherry", "date"],
    ]
    # One child session, four turns (one model call each): continued, never restarted.
    assert kinds(child_log).count("turn_started") == 3
    assert kinds(child_log).count("completed") == 4 and status.step_count == 4
    assert refused == {"error": "conversation_key belongs to another parent session"}

    # inherit: the first call saw the parent's conversation (its input, goal and all) ...
    assert any("new apple" in shown for shown in rounds[0]["output"]["shown"]), rounds[0]
    # ... and no later turn did: the child's history never held it.
    for later in rounds[1:]:
        assert not any('"goal"' in shown for shown in later["output"]["shown"]), later
    run_started = child_log[0].run_started
    assert INHERITED_CONTEXT_KEY not in run_started.metadata
    store = await open_store(f"sqlite:///{tmp_path / 'notetaker.db'}")
    try:
        checkpoint = await store.load_checkpoint(child.child_session_id)
        record = await store.get_session(child.child_session_id)
    finally:
        await store.aclose()
    assert checkpoint is not None and record is not None
    assert not any('"goal"' in str(m.get("content")) for m in checkpoint.messages)
    # Kept with the session (a resumed first turn still shows it), not in its history.
    assert "new apple" in record.metadata[INHERITED_CONTEXT_KEY]


async def test_a_virtual_task_runs_with_the_parents_tools_on_its_service(tmp_path: Path) -> None:
    async with (
        mesh(tmp_path) as (_, parent),
        await AgentClient.connect(parent.address) as client,
    ):
        [result] = await turn(client, "v", 1, "virtual")
        child = result["task_id"]
        children = await client.get_status("v", include_children=True)

    assert result["status"] == "completed" and result["agent"] == "delegator", result
    looked_up, dispatched = result["output"]["results"]
    # The parent's tool ran in the child's session, on the parent's service.
    assert looked_up["value"] == "value-of-k1" and looked_up["session"] != "v"
    assert looked_up["session"].startswith(f"v-task-{child}-")
    # run_subagent is not among a virtual child's tools.
    assert "error" in dispatched and "run_subagent" in dispatched["error"], dispatched
    assert children.status == pb.SESSION_STATUS_COMPLETED
