"""Fixtures for the polyglot tests: the Node.js agent service in a real process.

The Node service needs ``node`` and its ``node_modules`` (``make node-deps`` runs
``npm ci``). Without them these tests skip on a developer's machine and fail under
``CI=true``: CI must never pass by not running them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from helix_transport.testing.processes import ServiceProcess, free_port
from tests.helpers import ROOT

NODE_DIR = ROOT / "services" / "translator_node"
NODE_AGENT_TYPE = "translator-node"


def require_node() -> str:
    """The ``node`` executable, with the Node service's dependencies installed."""
    node = shutil.which("node")
    if node is None:
        problem = "node is not installed (the Node.js interop tests need it)"
    elif not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        problem = f"{NODE_DIR.relative_to(ROOT)}/node_modules is missing: run `make node-deps`"
    else:
        return node
    if os.environ.get("CI") == "true":
        pytest.fail(problem)
    pytest.skip(problem)


class NodeService(ServiceProcess):
    """``node services/translator_node/server.js`` on a fixed port, killable.

    Reuses ``ServiceProcess`` for the health wait, ``kill`` and ``terminate``; only
    the command differs. The data directory (the service's JSONL logs) survives
    restarts, so a restarted process resumes its sessions.
    """

    def __init__(
        self,
        node: str,
        *,
        port: int,
        data_dir: Path,
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__("translator-node", port=port, store_url="", log_path=log_path, env=env)
        self.node = node
        self.data_dir = data_dir

    async def start(self, *, timeout_s: float = 30.0, ready: str = "") -> None:
        # A Node.js service has no helix.model: the overall health is its readiness.
        args = [
            self.node, str(NODE_DIR / "server.js"),
            "--port", str(self.port), "--data-dir", str(self.data_dir),
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *args, cwd=NODE_DIR, env=self.env, stdout=log, stderr=log
            )
        await self.wait_serving(timeout_s=timeout_s, service=ready)


StartNode = Callable[..., AbstractAsyncContextManager[NodeService]]


@pytest.fixture
def start_node(tmp_path: Path) -> StartNode:
    """``async with start_node(delay_ms=10) as service:`` the Node service, started."""
    node = require_node()

    @asynccontextmanager
    async def _start(*, delay_ms: int = 0, name: str = "node") -> AsyncIterator[NodeService]:
        service = NodeService(
            node,
            port=free_port(),
            data_dir=tmp_path / f"{name}-data",
            log_path=tmp_path / f"{name}.log",
            env={"HELIX_SCRIPTED_DELAY_MS": str(delay_ms)},
        )
        await service.start()
        try:
            yield service
        finally:
            await service.stop()

    return _start
