"""A Redis that keeps nothing on disk is refused unless volatile data is allowed.

Each test starts its own redis-server (never the shared one): without persistence
(``--save "" --appendonly no``), with AOF, and with ``CONFIG`` renamed away as managed
Redis services do. ``tests/conftest.py`` allows volatile stores for the rest of the
suite; these tests remove that allowance.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from helix_transport import ServerConfig
from helix_transport._exceptions import UsageError
from helix_transport.server.app import serve
from helix_transport.server.auth import AuthConfig
from helix_transport.store import RedisStore, open_store
from tests.conftest import unreachable
from tests.helpers import ROOT, ServiceProcess, free_port

VOLATILE = ["--save", "", "--appendonly", "no"]
REFUSED = r"keeps nothing on disk .*--allow-volatile-store \(HELIX_ALLOW_VOLATILE_STORE=1\)"

RedisServer = Callable[..., AbstractAsyncContextManager[str]]


@pytest.fixture(autouse=True)
def _no_allowance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HELIX_ALLOW_VOLATILE_STORE", raising=False)


@pytest.fixture
def redis_server(tmp_path: Path) -> RedisServer:
    """``async with redis_server(*args) as url:`` a redis-server of this test's own."""
    if shutil.which("redis-server") is None:
        unreachable("redis-server is not installed (make services-up installs it)")

    @asynccontextmanager
    async def start(*args: str, conf: Path | None = None) -> AsyncIterator[str]:
        port = free_port()
        workdir = tmp_path / f"redis-{port}"
        workdir.mkdir()
        first = [str(conf)] if conf is not None else []  # a config file comes first
        proc = await asyncio.create_subprocess_exec(
            "redis-server", *first, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
            "--daemonize", "no", *args,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            for _ in range(100):
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.kill()
            await proc.wait()

    return start


async def test_a_redis_without_persistence_is_refused_naming_the_fix(
    redis_server: RedisServer,
) -> None:
    async with redis_server(*VOLATILE) as url:
        with pytest.raises(UsageError, match=REFUSED) as refused:
            await open_store(url)
        assert "127.0.0.1" in str(refused.value) and "appendonly yes" in str(refused.value)
        with pytest.raises(UsageError, match=REFUSED):
            await RedisStore.from_url(url)


async def test_a_redis_without_persistence_is_accepted_when_allowed(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with redis_server(*VOLATILE) as url:
        store = await open_store(url, allow_volatile=True)
        await store.aclose()
        monkeypatch.setenv("HELIX_ALLOW_VOLATILE_STORE", "1")
        store = await open_store(url)
        await store.aclose()
        # An explicit refusal wins over the environment.
        with pytest.raises(UsageError, match=REFUSED):
            await open_store(url, allow_volatile=False)


@pytest.mark.parametrize(
    "persistence",
    [["--save", "", "--appendonly", "yes"], ["--save", "3600 1", "--appendonly", "no"]],
)
async def test_a_redis_with_aof_or_snapshots_is_accepted(
    redis_server: RedisServer, persistence: list[str]
) -> None:
    async with redis_server(*persistence) as url:
        store = await open_store(url)
        await store.aclose()


async def test_where_config_is_renamed_a_warning_says_persistence_was_not_checked(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As managed Redis services do: CONFIG renamed away, and persistence unknown.
    conf = tmp_path / "managed.conf"
    conf.write_text('rename-command CONFIG ""\nsave ""\nappendonly no\n')
    async with redis_server(conf=conf) as url:
        store = await open_store(url)
        await store.aclose()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("could not check" in r.getMessage() for r in warnings)


async def test_serve_refuses_a_volatile_redis_before_serving(redis_server: RedisServer) -> None:
    from tests.agents import counter

    async with redis_server(*VOLATILE) as url:
        with pytest.raises(UsageError, match=REFUSED):
            await serve(
                counter,
                store_url=url,
                config=ServerConfig(),
                auth=AuthConfig(allow_unauthenticated=True),
            )


async def test_the_cli_flag_lets_a_real_service_start_on_a_volatile_redis(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with redis_server(*VOLATILE) as url:
        refused = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "helix_transport.cli", "serve", "tests.agents:counter",
            "--port", str(free_port()), "--store", url, "--allow-unauthenticated",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        async with asyncio.timeout(60):
            output, _ = await refused.communicate()
        assert refused.returncode == 2, output.decode()
        assert "--allow-volatile-store" in output.decode()
        service = ServiceProcess(
            "tests.agents:counter",
            port=free_port(),
            store_url=url,
            log_path=tmp_path / "server.log",
            extra_args=["--allow-volatile-store"],
            cwd=ROOT,
        )
        try:
            await service.start()
        finally:
            await service.stop()
