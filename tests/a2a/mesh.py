"""Three service processes for the A2A tests (``tests.agents.a2a_tree``): a2a-top, with
an A2A port, asks a2a-mid, which asks the mailer; each has its own SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helix_transport.registry import address_env_var
from helix_transport.testing.processes import ServiceProcess, free_port
from services.mailer.agent import OUTBOX_ENV
from tests.helpers import ROOT

AGENTS = {
    "mailer": "services.mailer:agent",
    "a2a-mid": "tests.agents.a2a_tree:mid",
    "a2a-top": "tests.agents.a2a_tree:top",
}


@dataclass
class Mesh:
    top: ServiceProcess
    """The root's service (SIGKILL and restart it: ``kill()``, ``start()``)."""
    url: str
    """Its A2A endpoint."""
    addresses: dict[str, str]
    """Each agent type's gRPC address."""
    outbox: Path

    def sent(self) -> list[dict[str, Any]]:
        """The emails the mailer really sent, one per run of its tool."""
        if not self.outbox.exists():
            return []
        return [json.loads(line) for line in self.outbox.read_text().splitlines()]


@contextlib.asynccontextmanager
async def a2a_mesh(workdir: Path) -> AsyncIterator[Mesh]:
    """The three services, started (stopped on the way out)."""
    outbox = workdir / "outbox.jsonl"
    env = {"HELIX_SCRIPTED_DELAY_MS": "20", OUTBOX_ENV: str(outbox), "HELIX_LOG_LEVEL": "WARNING"}
    a2a_port = free_port()
    processes: dict[str, ServiceProcess] = {}
    for name, reference in AGENTS.items():
        extra = ["--lease-ttl", "1", "--drain-timeout", "0.5"]
        if name == "a2a-top":
            extra += ["--a2a-port", str(a2a_port)]
        processes[name] = ServiceProcess(
            reference,
            port=free_port(),
            store_url=f"sqlite:///{workdir / (name + '.db')}",
            log_path=workdir / f"{name}.log",
            env=dict(env),
            extra_args=extra,
            cwd=ROOT,
        )
    for process in processes.values():
        for name, other in processes.items():
            process.env[address_env_var(name)] = other.address
    try:
        await asyncio.gather(*(p.start() for p in processes.values()))
        yield Mesh(
            top=processes["a2a-top"],
            url=f"http://127.0.0.1:{a2a_port}",
            addresses={name: p.address for name, p in processes.items()},
            outbox=outbox,
        )
    finally:
        await asyncio.gather(*(p.stop() for p in processes.values()))
