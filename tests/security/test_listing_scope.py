"""``ListSessions`` lists the caller's own sessions only, under the ids the caller gave
them, on a real server with token authentication and two tenants."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from helix_transport import AgentClient, ClientAuth, create_server
from helix_transport.server.auth import AuthConfig
from helix_transport.store import SqliteStore
from tests.agents import counter
from tests.security.conftest import Tokens


@asynccontextmanager
async def connect(address: str, token: str) -> AsyncIterator[AgentClient]:
    async with await AgentClient.connect(address, auth=ClientAuth(token=token)) as c:
        yield c


async def _listed(client: AgentClient, **filters: object) -> list[str]:
    return [s.session_id async for s in client.iter_sessions(page_size=1, **filters)]  # type: ignore[arg-type]


async def test_each_owner_lists_only_its_own_sessions(tokens: Tokens, tmp_path: Path) -> None:
    store = await SqliteStore.open(str(tmp_path / "scope.db"))
    server = await create_server(counter, store, auth=AuthConfig(tokens_file=str(tokens.path)))
    steps = json.dumps({"steps": 1, "words": 1})
    async with server, store:
        started = {
            "alice": ["shared", "a-1", "a-2"],
            "bob": ["shared", "b-1"],  # alice's tenant, another principal
            "carol": ["shared", "c-1"],  # another tenant
        }
        owners = {"alice": tokens.alice, "bob": tokens.bob, "carol": tokens.carol}
        for owner, ids in started.items():
            async with connect(server.address, owners[owner]) as client:
                for session_id in ids:
                    await client.start(steps, session_id=session_id)
                    await client.wait(session_id)
        for owner, ids in started.items():
            async with connect(server.address, owners[owner]) as client:
                # Un-namespaced ids, newest first, and nobody else's.
                assert await _listed(client) == list(reversed(ids)), owner
                for summary in (await client.list_sessions()).sessions:
                    assert "/" not in summary.session_id
                    assert (await client.get_status(summary.session_id)).last_sequence == (
                        summary.last_sequence
                    )
        async with connect(server.address, tokens.bob) as bob:
            token = (await bob.list_sessions(page_size=1)).next_page_token
        async with connect(server.address, tokens.alice) as alice:
            # Bob's page token in alice's hands pages through alice's sessions only.
            page = await alice.list_sessions(page_size=10, page_token=token)
            assert {s.session_id for s in page.sessions} <= {"shared", "a-1", "a-2"}
