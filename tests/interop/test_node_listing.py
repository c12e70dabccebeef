"""The Node.js service's ``ListSessions``: the order, pages and errors the Python servers
keep, through ``AgentClient`` (so the two agree on the wire), and across a restart."""

from __future__ import annotations

import json

import pytest

from helix_transport import AgentClient, InvalidArgument, SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.interop.conftest import StartNode

TEXT = json.dumps({"text": "the agent reads the log", "words_per_step": 2})


async def test_node_lists_newest_first_in_pages(start_node: StartNode) -> None:
    async with start_node(delay_ms=0) as node, await AgentClient.connect(node.address) as client:
        for n in range(5):
            await client.start(TEXT, session_id=f"n-{n}")
            await client.wait(f"n-{n}")
        await client.start(TEXT, session_id="n-child", parent_session_id="n-0")
        await client.wait("n-child")
        first = await client.list_sessions(page_size=2)
        assert [s.session_id for s in first.sessions] == ["n-child", "n-4"]
        listed = [s.session_id async for s in client.iter_sessions(page_size=2)]
        assert listed == ["n-child", "n-4", "n-3", "n-2", "n-1", "n-0"]
        roots = [s.session_id async for s in client.iter_sessions(roots_only=True)]
        assert roots == ["n-4", "n-3", "n-2", "n-1", "n-0"]
        summary = (await client.list_sessions(page_size=1)).sessions[0]
        status = await client.get_status("n-child")
        assert (summary.status, summary.last_sequence, summary.parent_session_id) == (
            status.status,
            status.last_sequence,
            "n-0",
        )
        assert summary.finished_at == status.finished_at
        assert summary.status == pb.SESSION_STATUS_COMPLETED
        running = await client.list_sessions(statuses=[SessionStatus.RUNNING])
        assert list(running.sessions) == []
        other = await client.list_sessions(agent_type="researcher")
        assert list(other.sessions) == []
        with pytest.raises(InvalidArgument) as refused:
            await client.list_sessions(page_token=first.next_page_token, roots_only=True)
        assert refused.value.field == "page_token"
        for bad, field in (
            ({"page_size": -1}, "page_size"),
            ({"page_token": "nope"}, "page_token"),
            ({"agent_type": "Nope!"}, "agent_type"),
        ):
            with pytest.raises(InvalidArgument) as refused:
                await client.list_sessions(**bad)
            assert refused.value.field == field
    # A restarted service reloads its sessions from disk, and lists them the same.
    async with start_node(delay_ms=0) as node, await AgentClient.connect(node.address) as client:
        again = [s.session_id async for s in client.iter_sessions(page_size=4)]
    assert again == ["n-child", "n-4", "n-3", "n-2", "n-1", "n-0"]
