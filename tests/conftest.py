"""Shared fixtures: the offline guard, stores, and in-process agent servers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from helix_transport import Agent, AgentClient, AgentServer, ServerConfig, create_server
from helix_transport.store import MemoryStore, SqliteStore, Store

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never reach a real model provider: agents use their scripted models."""
    monkeypatch.delenv("HELIX_MODEL", raising=False)
    monkeypatch.delenv("HELIX_SCRIPTED_DELAY_MS", raising=False)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Each contract test runs against every embedded backend."""
    backend: Store
    if request.param == "memory":
        backend = MemoryStore()
    else:
        backend = await SqliteStore.open(str(tmp_path / "helix.db"))
    yield backend
    await backend.aclose()


Serve = Callable[..., AbstractAsyncContextManager[tuple[AgentServer, AgentClient]]]


@pytest.fixture
def serve(store: Store) -> Serve:
    """``async with serve(agent) as (server, client):`` an agent on 127.0.0.1."""

    @asynccontextmanager
    async def _serve(
        agent: Agent, **config: object
    ) -> AsyncIterator[tuple[AgentServer, AgentClient]]:
        server = await create_server(agent, store, ServerConfig(**config))  # type: ignore[arg-type]
        async with server, await AgentClient.connect(server.address) as client:
            yield server, client

    return _serve
