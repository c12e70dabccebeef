"""The fixture A2A agent (``tests.a2a.child_fixture``) in its own process, killable."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from a2a.types import Task
from google.protobuf.json_format import Parse

from tests.helpers import ROOT, free_port


class PeerProcess:
    """``python -m tests.a2a.child_fixture``: its state (tasks, messages received) in
    ``state``, which outlives the process."""

    def __init__(self, state: Path, *, port: int | None = None) -> None:
        self.state = state
        self.port = port or free_port()
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, *, timeout_s: float = 60.0) -> None:
        args = [sys.executable, "-m", "tests.a2a.child_fixture"]
        args += ["--port", str(self.port), "--state", str(self.state)]
        with (self.state.parent / f"{self.state.name}.log").open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *args, cwd=ROOT, stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=1.0) as http:
            while True:
                try:
                    reply = await http.get(self.url + "/.well-known/agent-card.json")
                    if reply.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if self.proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the A2A fixture did not come up (port {self.port})")
                await asyncio.sleep(0.05)

    async def kill(self) -> None:
        """SIGKILL: what its task files hold is all a restart has."""
        if self.proc is not None:
            if self.proc.returncode is None:
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
            self.proc = None

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await self.proc.wait()
            except TimeoutError:
                await self.kill()
        self.proc = None

    def received(self) -> list[dict[str, Any]]:
        """Every message received, in order: ``{"message_id", "traceparent"}``."""
        path = self.state / "received.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def tasks(self) -> list[Task]:
        """The tasks its store holds."""
        return [Parse(p.read_text(), Task()) for p in (self.state / "tasks").glob("*.json")]
