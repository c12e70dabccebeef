"""The store goes away mid-run and comes back: nothing acknowledged is lost.

A test-owned redis-server (AOF, fsync on every write) is SIGKILLed while an agent
service is streaming a session, then restarted on the same port and data. Every event
a reader saw before the crash is in the final log unchanged, the session is
resumed from its checkpoint (not failed), and the reader's stream, which broke
while the store was down, resumes gapless.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import cast

import pytest

from helix_transport import AgentClient, ClientConfig, RetryConfig
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.conftest import unreachable
from tests.helpers import ROOT, ServiceProcess, free_port


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.workdir), "--appendonly", "yes", "--appendfsync", "always",
            "--save", "", "--daemonize", "no",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(100):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    if shutil.which("redis-server") is None:
        unreachable("redis-server is not installed (make services-up installs it)")
    server = RedisServer(tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.kill()


async def test_redis_restart_mid_run_loses_no_acknowledged_event(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    service = ServiceProcess(
        "tests.agents:counter",
        port=free_port(),
        store_url=f"redis://127.0.0.1:{redis_server.port}/0",
        log_path=tmp_path / "server.log",
        env={"HELIX_SCRIPTED_DELAY_MS": "20"},
        extra_args=["--lease-ttl", "1"],
        cwd=ROOT,
    )
    await service.start()
    default_deadline = cast(timedelta, RetryConfig.default.deadline)  # 30 s by default, not None
    patient = ClientConfig(reconnect=RetryConfig(deadline=default_deadline * 2))
    try:
        async with await AgentClient.connect(service.address, config=patient) as client:
            await client.start(json.dumps({"steps": 8, "words": 5}), session_id="s1")
            seen: list[pb.StreamEvent] = []
            before_crash: list[pb.StreamEvent] = []
            async for event in client.stream("s1"):
                seen.append(event)
                if (
                    not before_crash
                    and event.WhichOneof("payload") == "step_started"
                    and event.step == 3
                ):
                    before_crash = list(seen)
                    await redis_server.kill()
                    await asyncio.sleep(1.0)
                    await redis_server.start()
            final = [e async for e in client.stream("s1")]
            status = await client.get_status("s1")
    finally:
        await service.stop()

    assert [e.sequence for e in final] == list(range(1, len(final) + 1))
    assert [e.SerializeToString() for e in final[: len(before_crash)]] == [
        e.SerializeToString() for e in before_crash
    ], "an event acknowledged before the crash changed or vanished"
    assert [e.SerializeToString() for e in seen] == [e.SerializeToString() for e in final]
    assert status.status == pb.SESSION_STATUS_COMPLETED
    assert json.loads(status.output_json) == {"total": 8, "steps": 8}
    assert [e.WhichOneof("payload") for e in final].count("run_resumed") == 1
    log = (tmp_path / "server.log").read_text()
    assert "crashed" not in log
    # Housekeeping that failed while the store was down said so once, then that it
    # worked again: not a warning at every pass (the orphan scan runs every 0.25-1 s).
    complaints = [line for line in log.splitlines() if " failed (logged again" in line]
    assert complaints, "no housekeeping call failed while the store was down"
    for what in ("orphan scan", "lease renewal", "looking for interrupts"):
        assert log.count(f"{what} failed") == log.count(f"{what} works again") <= 1, what
