"""Soak: many concurrent sessions streaming for a fixed time against a real server.

    python -m tests.soak.soak --sessions 200 --duration 60 [--store sqlite|memory|redis|postgres|URL]

Starts ``helix-mesh serve tests.agents:counter`` in its own process. Each of
``--sessions`` workers starts a session, streams it with the raw gRPC stub,
disconnects at random (dropping the call, or now and then its whole channel) and
rejoins from the last sequence it saw, until the session ends; then starts the
next one, until ``--duration`` has passed. Verified: every session completes; every
reader sees every event exactly once (each event must be last + 1, so a duplicate
or a gap fails); the store's logs are consistent afterwards. The server's RSS is
sampled every second; memory figures are ratios to the RSS after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from helix_transport._events import SessionStatus, is_terminal
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.store import open_store
from helix_transport.testing.processes import ServiceProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
RESUMABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}


@dataclass
class Figures:
    """What one soak run measured."""

    sessions_started: int = 0
    sessions_completed: int = 0
    events_seen: int = 0
    rejoins: int = 0
    channel_reconnects: int = 0
    rate_limited: int = 0
    violations: list[str] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    """The server's RSS, once a second."""
    wall_s: float = 0.0

    def memory(self, warmup: int) -> dict[str, float]:
        """Start (after ``warmup`` samples), end, peak, and the slope over the second half."""
        samples = self.rss_mib[warmup:] or self.rss_mib
        if not samples:
            return {}
        half = samples[len(samples) // 2 :]
        return {
            "rss_start_mib": round(samples[0], 1),
            "rss_end_mib": round(samples[-1], 1),
            "rss_peak_mib": round(max(samples), 1),
            "end_over_start": round(samples[-1] / samples[0], 3),
            "peak_over_start": round(max(samples) / samples[0], 3),
            "slope_mib_per_min_second_half": round(_slope(half) * 60, 2),
        }


def _slope(values: list[float]) -> float:
    """Least-squares slope per sample (samples are one second apart)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values))
    den = sum((x - mean_x) ** 2 for x in range(n))
    return num / den


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Worker:
    """One client: sessions one after another, each read with random disconnects."""

    def __init__(
        self, index: int, address: str, figures: Figures, *, until: float, rng: random.Random
    ) -> None:
        self.index = index
        self.address = address
        self.figures = figures
        self.until = until
        self.rng = rng
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = pb_grpc.AgentServiceStub(self.channel)

    async def reconnect(self) -> None:
        """Drop the whole channel (its HTTP/2 connection) and open a new one."""
        await self.channel.close()
        self.channel = grpc.aio.insecure_channel(self.address)
        self.stub = pb_grpc.AgentServiceStub(self.channel)
        self.figures.channel_reconnects += 1

    async def run(self) -> None:
        n = 0
        try:
            while time.monotonic() < self.until:
                await self.session(f"soak-{self.index}-{n}")
                n += 1
        finally:
            await self.channel.close()

    async def call(self, method: str, request: object) -> object:
        """A unary call, retried on UNAVAILABLE / RESOURCE_EXHAUSTED (rate limited)."""
        for attempt in range(50):
            try:
                return await getattr(self.stub, method)(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RESUMABLE:
                    raise
                self.figures.rate_limited += exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0) * self.rng.random())
        raise RuntimeError(f"{method} kept failing")

    async def session(self, session_id: str) -> None:
        steps = self.rng.randint(2, 6)
        request = pb.StartRequest(
            session_id=session_id, input_json=json.dumps({"steps": steps, "words": 6})
        )
        await self.call("Start", request)
        self.figures.sessions_started += 1
        last, final = 0, None
        while final is None:
            leave_after = self.rng.randint(1, 12)  # responses read before the client leaves
            call = self.stub.Stream(pb.StreamRequest(session_id=session_id, from_sequence=last))
            try:
                async for response in call:
                    for event in response.events:
                        if event.sequence != last + 1:
                            kind = "duplicate" if event.sequence <= last else "gap"
                            self.figures.violations.append(
                                f"{session_id}: {kind}: got {event.sequence} after {last}"
                            )
                            return
                        last = event.sequence
                        self.figures.events_seen += 1
                        if is_terminal(event):
                            final = event
                    leave_after -= 1
                    if final is None and leave_after <= 0:
                        break  # the client goes away mid-stream
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RESUMABLE:
                    self.figures.violations.append(
                        f"{session_id}: stream {exc.code().name}: {exc.details()}"
                    )
                    return
                self.figures.rate_limited += exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            finally:
                call.cancel()
            if final is None:
                self.figures.rejoins += 1
                if self.rng.random() < 0.2:
                    await self.reconnect()
                await asyncio.sleep(self.rng.uniform(0, 0.2))
        status = await self.call("GetStatus", pb.GetStatusRequest(session_id=session_id))
        assert isinstance(status, pb.GetStatusResponse)
        if (
            final.WhichOneof("payload") != "completed"
            or status.status != pb.SESSION_STATUS_COMPLETED
        ):
            self.figures.violations.append(f"{session_id}: ended {final.WhichOneof('payload')}")
        elif status.last_sequence != last:
            self.figures.violations.append(
                f"{session_id}: saw {last} events, log has {status.last_sequence}"
            )
        elif json.loads(status.output_json) != {"total": steps, "steps": steps}:
            self.figures.violations.append(f"{session_id}: wrong output {status.output_json}")
        else:
            self.figures.sessions_completed += 1


def store_url(spec: str, workdir: Path) -> str:
    """A store URL for ``memory``/``sqlite``/``redis``/``postgres``, isolated per run, or ``spec``."""
    name = f"soak_{uuid.uuid4().hex[:12]}"
    return {
        "memory": "memory://",
        "sqlite": f"sqlite:///{workdir / 'soak.db'}",
        "redis": f"redis://127.0.0.1:6379/0?prefix={name}",
        "postgres": f"postgresql://postgres@127.0.0.1:5432/test?schema={name}",
    }.get(spec, spec)


async def check_store(url: str, figures: Figures) -> int:
    """After the run: every log gapless from 1, one terminal event at its end."""
    if url.startswith("memory"):
        return 0  # the memory store died with the server
    store = await open_store(url)
    checked = 0
    try:
        for status in SessionStatus:
            for record in await store.list_sessions(status=status):
                events: list[pb.StreamEvent] = []
                while batch := await store.read(record.session_id, from_sequence=len(events)):
                    events += batch
                sequences = [e.sequence for e in events]
                terminal = [e for e in events if is_terminal(e)]  # soak sessions have one turn
                if sequences != list(range(1, len(events) + 1)) or terminal != events[-1:]:
                    figures.violations.append(f"store: {record.session_id}: inconsistent log")
                if status is SessionStatus.RUNNING:
                    figures.violations.append(f"store: {record.session_id}: still running")
                checked += 1
    finally:
        await store.aclose()
    return checked


async def drop_store(url: str) -> None:
    """Remove a Redis prefix's keys or a PostgreSQL schema this run made."""
    name = url.rpartition("=")[2]
    if not name.startswith("soak_"):
        return
    if url.startswith("redis"):
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url.partition("?")[0])
        async for key in client.scan_iter(match=f"{name}:*", count=1000):
            await client.delete(key)
        await client.aclose()
    elif url.startswith("postgres"):
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(url.partition("?")[0], timeout=5)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


async def run_soak(
    *,
    sessions: int,
    duration_s: float,
    store: str = "sqlite",
    delay_ms: int = 15,
    seed: int | None = None,
) -> dict[str, object]:
    """Run the soak and return its figures; ``violations`` lists whatever went wrong."""
    rng = random.Random(seed)
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="helix-soak-") as tmp:
        workdir = Path(tmp)
        url = store_url(store, workdir)
        server = ServiceProcess(
            "tests.agents:counter",
            port=free_port(),
            store_url=url,
            log_path=workdir / "server.log",
            env={"HELIX_SCRIPTED_DELAY_MS": str(delay_ms), "HELIX_LOG_LEVEL": "WARNING"},
            extra_args=["--max-running-sessions", str(max(sessions * 2, 10))],
            cwd=ROOT,
        )
        await server.start()
        assert server.proc is not None
        pid = server.proc.pid
        started = time.monotonic()
        stop_sampling = asyncio.Event()

        async def sample() -> None:
            while not stop_sampling.is_set():
                figures.rss_mib.append(rss_mib(pid))
                await asyncio.sleep(1.0)

        sampler = asyncio.create_task(sample())
        try:
            until = started + duration_s
            workers = [
                Worker(i, server.address, figures, until=until, rng=random.Random(rng.random()))
                for i in range(sessions)
            ]
            results = await asyncio.gather(*(w.run() for w in workers), return_exceptions=True)
            figures.violations += [
                f"worker: {r!r}" for r in results if isinstance(r, BaseException)
            ]
            if figures.sessions_completed != figures.sessions_started:
                figures.violations.append(
                    f"{figures.sessions_started} sessions started, {figures.sessions_completed} completed"
                )
            figures.wall_s = round(time.monotonic() - started, 1)
            stop_sampling.set()
            await sampler
            log = (workdir / "server.log").read_text()
            if "Traceback" in log:
                figures.violations.append("server log has a traceback")
        finally:
            stop_sampling.set()
            await server.terminate()
        checked = await check_store(url, figures)
        await drop_store(url)
    warmup = min(5, len(figures.rss_mib) // 4)
    summary = {k: v for k, v in asdict(figures).items() if k not in ("rss_mib", "violations")}
    summary |= figures.memory(warmup)
    summary |= {
        "concurrent_clients": sessions,
        "duration_s": duration_s,
        "store": store,
        "store_sessions_checked": checked,
        "events_per_s": round(figures.events_seen / max(figures.wall_s, 1e-9)),
        "violations": figures.violations[:20],
        "violation_count": len(figures.violations),
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--sessions", type=int, default=200, help="concurrent clients (one session each at a time)"
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds to keep starting sessions"
    )
    parser.add_argument(
        "--store", default="sqlite", help="memory, sqlite, redis, postgres, or a store URL"
    )
    parser.add_argument(
        "--delay-ms", type=int, default=15, help="scripted model delay per text chunk"
    )
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    summary = asyncio.run(
        run_soak(
            sessions=args.sessions,
            duration_s=args.duration,
            store=args.store,
            delay_ms=args.delay_ms,
            seed=args.seed,
        )
    )
    print(json.dumps(summary, indent=2))
    return 1 if summary["violation_count"] or not summary["sessions_completed"] else 0


if __name__ == "__main__":
    sys.exit(main())
