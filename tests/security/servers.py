"""Servers and checks for the hostile-input, limits and fuzz tests (SQLite, a real file store)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from helix_transport import (
    Agent,
    AgentServer,
    ServerConfig,
    SessionStatus,
    create_server,
    is_terminal,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._rich_status import RichDetails, read_details
from helix_transport.store import Store, open_store

T = TypeVar("T")

ServeSqlite = Callable[..., AbstractAsyncContextManager[AgentServer]]


@pytest.fixture
def serve_sqlite(tmp_path: Path) -> ServeSqlite:
    """``async with serve_sqlite(agent, limits=...) as server:`` on 127.0.0.1 over SQLite."""

    @asynccontextmanager
    async def _serve(agent: Agent, **config: object) -> AsyncIterator[AgentServer]:
        store = await open_store(f"sqlite:///{tmp_path / 'helix.db'}")
        try:
            server = await create_server(
                agent,
                store,
                ServerConfig(**config),  # type: ignore[arg-type]
                allow_unauthenticated=True,
            )
            async with server:
                yield server
        finally:
            await store.aclose()

    return _serve


def details(error: grpc.aio.AioRpcError) -> RichDetails:
    """The google.rpc details a failed call carried."""
    return read_details(error.code(), error.trailing_metadata())


class BackgroundLoop:
    """An event loop in a thread of its own, for sync tests (hypothesis) that need an
    async server: ``loop.run(coro)`` runs ``coro`` there and returns its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def log_is_consistent(events: list[pb.StreamEvent]) -> bool:
    """Gapless from 1, ``run_started`` first, a terminal event last, and any earlier
    terminal event (the end of a turn) followed by the next turn's ``turn_started``."""
    if not events or events[0].WhichOneof("payload") != "run_started":
        return False
    if [e.sequence for e in events] != list(range(1, len(events) + 1)):
        return False
    ends = [i for i, e in enumerate(events) if is_terminal(e)]
    return (
        bool(ends)
        and ends[-1] == len(events) - 1
        and all(events[i + 1].WhichOneof("payload") == "turn_started" for i in ends[:-1])
    )


async def assert_store_consistent(store: Store, *, settle_s: float = 30) -> int:
    """Every session's log is gapless from 1, starts with ``run_started``, and a finished
    session ends with exactly one terminal event at ``last_sequence``. Waits up to
    ``settle_s`` for running sessions to finish first. Returns how many were checked."""
    deadline = asyncio.get_running_loop().time() + settle_s
    while await store.list_sessions(status=SessionStatus.RUNNING):
        assert asyncio.get_running_loop().time() < deadline, "sessions still running"
        await asyncio.sleep(0.1)
    checked = 0
    for status in SessionStatus:
        for record in await store.list_sessions(status=status):
            events: list[pb.StreamEvent] = []
            while batch := await store.read(record.session_id, from_sequence=len(events)):
                events += batch
            where = f"session {record.session_id!r} ({status})"
            assert [e.sequence for e in events] == list(range(1, len(events) + 1)), where
            assert events and events[0].WhichOneof("payload") == "run_started", where
            assert log_is_consistent(events), where
            assert record.last_sequence == events[-1].sequence, where
            assert json.loads(record.input_json) is not None or record.input_json == "null"
            checked += 1
    return checked
