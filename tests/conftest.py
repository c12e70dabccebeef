"""Shared fixtures: the offline guard, stores, and in-process agent servers."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import asyncpg  # type: ignore[import-untyped]
import pytest
import redis.asyncio as aioredis

from helix_transport import Agent, AgentClient, AgentServer, ServerConfig, create_server
from helix_transport.agent.litellm import imported as imported_litellm
from helix_transport.store import Store, open_store
from helix_transport.testing.launcher import Launcher
from helix_transport.testing.processes import ServiceProcess, exec_process

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
# The test Redis keeps nothing on disk (`make services-up`: --save "" --appendonly no),
# which a store refuses unless allowed: allowed for every store the tests open, in
# this process and in the services it starts. Tests of the refusal remove it.
os.environ["HELIX_ALLOW_VOLATILE_STORE"] = "1"

# litellm loads on a process's first model call (2 s of CPU; much more on a loaded host):
# paid here, at collection, as it was when importing an agent imported it, not inside
# the first test's timeouts. (A service's start-up without it: tests/cli.)
imported_litellm()


@pytest.fixture(scope="session", autouse=True)
def _warm_launcher() -> Iterator[None]:
    """Services the tests start are forked from one warm process per test process, with
    litellm already imported: an exec pays its import (2 s of CPU a service on a quiet
    host, 6-8 s under load) hundreds of times over. Tests of start-up itself pass
    ``spawner=exec_process``. Started on first use, so a test process that starts no
    service never pays for it."""
    launcher = Launcher()
    ServiceProcess.default_spawner = launcher.spawn
    yield
    ServiceProcess.default_spawner = exec_process
    launcher.close()


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never reach a real model provider: agents use their scripted models."""
    monkeypatch.delenv("HELIX_SCRIPTED_DELAY_MS", raising=False)
    # HELIX_MODEL, HELIX_MODEL_<TYPE> and litellm's per-agent HELIX_LLM_* settings.
    for name in [n for n in os.environ if n.startswith(("HELIX_MODEL", "HELIX_LLM_"))]:
        monkeypatch.delenv(name)


REDIS_URL = os.environ.get("HELIX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSNS = (
    [os.environ["HELIX_TEST_POSTGRES_DSN"]]
    if os.environ.get("HELIX_TEST_POSTGRES_DSN")
    else ["postgresql://postgres@127.0.0.1:5432/test", "postgresql://root@127.0.0.1:5432/test"]
)


def unreachable(message: str) -> NoReturn:
    """Skip locally, but fail under CI=true: CI must never go green without a backend."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def _probe_in_thread(probe: Callable[[], Coroutine[Any, Any, None]]) -> str:
    # asyncio.run in a thread of its own: it must not touch pytest-asyncio's loop.
    with ThreadPoolExecutor(max_workers=1) as executor:
        try:
            executor.submit(asyncio.run, probe()).result()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
    return ""


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis URL, once it answers a PING."""

    async def ping() -> None:
        client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        try:
            await client.ping()
        finally:
            await client.aclose()

    problem = _probe_in_thread(ping)
    if problem:
        unreachable(
            f"Redis is not reachable at {REDIS_URL} ({problem}); start it with "
            "`make services-up` or point HELIX_TEST_REDIS_URL at a server"
        )
    return REDIS_URL


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """A PostgreSQL DSN that accepts connections."""
    errors = []
    for dsn in POSTGRES_DSNS:

        async def connect(dsn: str = dsn) -> None:
            conn = await asyncpg.connect(dsn, timeout=3)
            await conn.close()

        problem = _probe_in_thread(connect)
        if not problem:
            return dsn
        errors.append(f"{dsn}: {problem}")
    unreachable(
        f"PostgreSQL is unreachable ({'; '.join(errors)}); start it with `make services-up` "
        "or set HELIX_TEST_POSTGRES_DSN"
    )


BACKENDS = ["memory", "sqlite", "redis", "postgres"]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Each contract test runs against every backend.

    Redis gets a key prefix of its own and PostgreSQL a schema of its own; both are
    removed afterwards.
    """
    name = f"helix_test_{uuid.uuid4().hex[:16]}"
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'helix.db'}"
    elif request.param == "redis":
        url = f"{request.getfixturevalue('redis_url')}?prefix={name}"
    else:
        url = f"{request.getfixturevalue('postgres_dsn')}?schema={name}"
    backend = await open_store(url)
    yield backend
    await backend.aclose()
    if request.param == "redis":
        client = aioredis.Redis.from_url(REDIS_URL)
        async for key in client.scan_iter(match=f"{name}:*", count=1000):
            await client.delete(key)
        await client.aclose()
    elif request.param == "postgres":
        conn = await asyncpg.connect(request.getfixturevalue("postgres_dsn"), timeout=5)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


Serve = Callable[..., AbstractAsyncContextManager[tuple[AgentServer, AgentClient]]]


@pytest.fixture
def serve(store: Store) -> Serve:
    """``async with serve(agent) as (server, client):`` an agent on 127.0.0.1."""

    @asynccontextmanager
    async def _serve(
        agent: Agent,
        **config: Any,  # ServerConfig's keywords, passed on as they are
    ) -> AsyncIterator[tuple[AgentServer, AgentClient]]:
        server = await create_server(
            agent, store, ServerConfig(**config), allow_unauthenticated=True
        )
        async with server, await AgentClient.connect(server.address) as client:
            yield server, client

    return _serve
